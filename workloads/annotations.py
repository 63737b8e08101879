"""Grafana annotations for a training run: job start, epoch boundaries, job end.

``python -m workloads.train --grafana-url URL --grafana-token TOKEN`` (or the environment
variables ``TEYE_GRAFANA_URL`` / ``TEYE_GRAFANA_TOKEN``) posts, through
:func:`teye.grafana.annotate` (standard library: no extra needed), annotations tagged ``["teye", <train_job>, kind]`` that the
training-job dashboard shows:

* ``start`` when the training loop starts,
* ``epoch`` at the end of each epoch (``--epochs`` only; ``--steps`` runs have no epochs),
* ``end`` when training ends: a region from start to end whose text is the summary line, or
  the failure reason.

Only the chief (worker 0) annotates.  Posting happens on one background thread, so a slow or
unreachable Grafana never stalls a training step; ``annotate`` never raises and times out
after :data:`TIMEOUT_S`, and :meth:`JobAnnotations.end` waits at most :data:`CLOSE_WAIT_S`
for what is still queued.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Optional

TIMEOUT_S = 3.0       # per annotation request
CLOSE_WAIT_S = 6.0    # the most end() waits for queued annotations to be posted


def _now_ms() -> int:
    return int(time.time() * 1000)


class JobAnnotations:
    """Posts start/epoch/end annotations for one training job (a no-op when disabled)."""

    def __init__(self, url: Optional[str], token: str, train_job: str, *, post: Optional[Callable] = None):
        self.enabled = bool(url)
        self.url = url
        self.token = token or ""
        self.train_job = train_job
        self.start_ms: Optional[int] = None
        self.ended = False
        self._post = post
        self._queue: "queue.Queue" = queue.Queue()
        self._thread: Optional[threading.Thread] = None

    @classmethod
    def from_args(cls, args, worker_index: int, log: Callable[[str], None]) -> "JobAnnotations":
        """Enabled when --grafana-url is set and this is the chief."""
        url = getattr(args, "grafana_url", None)
        if not url or worker_index != 0:
            return cls(None, "", args.train_job)
        from teye.grafana import annotate
        return cls(url, args.grafana_token or "", args.train_job, post=annotate)

    # -- posting on a background thread --
    def _worker(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            text, kind, t0, t1 = item
            self._post(self.url, self.token, self.train_job, text, kind, t0, t1, TIMEOUT_S)

    def _send(self, text: str, kind: str, time_ms: int, time_end_ms: Optional[int] = None) -> None:
        if not self.enabled:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._worker, name="teye-annotations", daemon=True)
            self._thread.start()
        self._queue.put((text, kind, time_ms, time_end_ms))

    # -- events --
    def start(self, text: str) -> None:
        self.start_ms = _now_ms()
        self._send(text, "start", self.start_ms)

    def epoch(self, epoch: int, epochs: int, text: str = "") -> None:
        if self.start_ms is None:
            return
        self._send(f"epoch {epoch} of {epochs} done" + (f": {text}" if text else ""), "epoch", _now_ms())

    def end(self, text: str) -> None:
        """The end region (start..now); then waits briefly for the queue to drain.  Once only."""
        if self.start_ms is None or self.ended:
            return
        self.ended = True
        self._send(text, "end", self.start_ms, max(self.start_ms, _now_ms()))
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(CLOSE_WAIT_S)
