"""Phase timing for ``model.fit`` users: a Keras callback feeding the same PhaseTimer.

    timer = PhaseTimer(sink=reporter)
    probe = InputProbe()                             # optional: lets the callback see input waits
    model.fit(probe.wrap(my_generator()), steps_per_epoch=100, epochs=3,
              callbacks=[PhaseCallback(timer, inputs=probe)])

Keras fetches each batch *inside* its compiled train function, so a callback cannot
time ``next()`` directly.  The phases are therefore approximate:

* ``host``: from the end of one batch to the beginning of the next (Keras' own
  bookkeeping, other callbacks);
* ``data_wait``: from the beginning of batch k until the generator wrapped in
  :class:`InputProbe` yielded its k-th batch, when that came later (Keras consumes
  generator batches in order, so the k-th one yielded is the k-th one trained on; with
  ``steps_per_execution=1``).  Without ``inputs`` (e.g. a ``tf.data`` dataset) the input
  wait stays inside ``compute``;
* ``compute``: the rest of the batch, until the loss is on the host (the callback
  reads it, which waits for the step to finish).

For exact phases use the custom loop in ``workloads.train``.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Iterable, Optional

import keras

from .timing import PhaseTimer

__all__ = ["InputProbe", "PhaseCallback"]


def _batch_len(batch) -> int:
    first = batch[0] if isinstance(batch, (tuple, list)) else batch
    try:
        return int(len(first))
    except TypeError:
        return 0


class InputProbe:
    """Remembers when each batch of a wrapped iterable was yielded, and its size.

    ``model.fit`` accepts Python generators only as real generator objects, so
    :meth:`wrap` returns one.
    """

    def __init__(self, clock=time.monotonic_ns):
        self._clock = clock
        self._lock = threading.Lock()
        self._yielded = collections.deque()   # (index, ready_ns, samples)
        self._count = 0

    def wrap(self, batches: Iterable):
        """A generator yielding ``batches`` unchanged while recording each one's ready time."""
        for batch in batches:
            now = self._clock()
            with self._lock:
                self._yielded.append((self._count, now, _batch_len(batch)))
                self._count += 1
            yield batch

    def ready(self, index: int):
        """(ready_ns, samples) of the ``index``-th batch yielded, or None if not yet (older ones are dropped)."""
        with self._lock:
            while self._yielded and self._yielded[0][0] < index:
                self._yielded.popleft()
            if self._yielded and self._yielded[0][0] == index:
                return self._yielded[0][1], self._yielded[0][2]
        return None


class PhaseCallback(keras.callbacks.Callback):
    """Reports each ``model.fit`` batch as data_wait / compute / host phases and a step."""

    def __init__(self, timer: PhaseTimer, inputs: Optional[InputProbe] = None, batch_size: int = 0,
                 clock=time.monotonic_ns):
        super().__init__()
        self.timer = timer
        self.inputs = inputs
        self.batch_size = int(batch_size)
        self._clock = clock
        self._begin = None
        self._prev_end = None
        self._index = 0

    def on_train_begin(self, logs=None):
        self._prev_end = None
        self.timer.restart()

    def on_train_batch_begin(self, batch, logs=None):
        now = self._clock()
        if self._prev_end is not None:
            self.timer.record_phase("host", self._prev_end, now)
        self._begin = now

    def on_train_batch_end(self, batch, logs=None):
        if logs and "loss" in logs:
            float(logs["loss"])  # reading the loss waits until the step's result is ready
        end = self._clock()
        begin = self._begin if self._begin is not None else end
        compute_start = begin
        samples = self.batch_size
        info = self.inputs.ready(self._index) if self.inputs is not None else None
        if info is not None:
            ready_ns, n = info
            samples = samples or n
            if ready_ns > begin:
                compute_start = min(ready_ns, end)
                self.timer.record_phase("data_wait", begin, compute_start)
        self.timer.record_phase("compute", compute_start, end)
        self.timer.step(samples=samples)
        self._prev_end = end
        self._index += 1

    def on_epoch_end(self, epoch, logs=None):
        self._prev_end = None  # validation/epoch bookkeeping is not a training step
        self.timer.restart()
