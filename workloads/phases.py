"""Phase client: tell the teye agent what the training loop is doing (standard library only).

    from workloads.phases import Reporter
    rep = Reporter(train_job="resnet50-bs64")   # socket from TEYE_PHASE_SOCKET or the default
    with rep.phase("data_wait"):
        batch = next(it)
    with rep.phase("compute"):
        train_step(batch)
    rep.step(samples=64)

Phases are buffered and sent as one datagram per step (or every ``max_batch`` records,
or when the oldest buffered record is ``max_delay_s`` old) to the agent's Unix datagram
socket; see docs/phases.md for the protocol.  The reporter never blocks and never
raises into the training loop: with no agent, a bad path, a full socket buffer or bad
arguments it drops the records and counts them (``dropped``, ``dropped_messages``),
and the count travels with the next datagram that gets through.  Exceptions raised
inside ``with rep.phase(...)`` propagate unchanged (the phase is still recorded).
"""
from __future__ import annotations

import atexit
import os
import re
import socket
import sys
import tempfile
import threading
import time
import weakref
from json.encoder import encode_basestring_ascii as _json_str

__all__ = ["Reporter", "PHASES", "default_socket_path"]

PHASES = ("data_wait", "compute", "host", "communication", "checkpoint", "eval")
VERSION = 1
_BAD_CHARS = re.compile(r"[^A-Za-z0-9_.:@+=-]")
_RESOLVE_EVERY_NS = 5 * 10**9
_monotonic_ns = time.monotonic_ns


def _candidates():
    out = ["/run/teye/phases.sock"]
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        out.append(os.path.join(xdg, "teye", "phases.sock"))
    out.append(os.path.join(tempfile.gettempdir(), f"teye-{os.getuid()}", "phases.sock"))
    return out


def default_socket_path() -> str:
    """TEYE_PHASE_SOCKET, else the first default location that exists (else the first default)."""
    env = os.environ.get("TEYE_PHASE_SOCKET")
    if env:
        return env
    cands = _candidates()
    for p in cands:
        if os.path.exists(p):
            return p
    return cands[0]


def _job_name(name) -> str:
    """A valid protocol job name from anything (never raises)."""
    if not name:
        name = os.environ.get("TEYE_TRAIN_JOB") or os.path.splitext(os.path.basename(sys.argv[0] or ""))[0] or "job"
    name = _BAD_CHARS.sub("_", str(name))[:128]
    if not name[:1].isalnum() or not name[:1].isascii():
        name = ("j" + name)[:128]
    return name


class _Phase:
    __slots__ = ("_rep", "_name", "_start")

    def __init__(self, rep: "Reporter", name: str):
        self._rep = rep
        self._name = name
        self._start = 0

    def __enter__(self):
        self._start = _monotonic_ns()
        return self

    def __exit__(self, exc_type, exc, tb):
        self._rep.record_phase(self._name, self._start, _monotonic_ns())
        return False  # never swallow the training loop's exceptions


class Reporter:
    """Buffers phase and step records and sends them to the teye agent; never blocks, never raises."""

    def __init__(self, train_job: str = None, socket_path: str = None, *, max_batch: int = 64,
                 max_delay_s: float = 1.0):
        self.train_job = _job_name(train_job)
        self._explicit = socket_path or None
        self.socket_path = socket_path or default_socket_path()
        self.max_batch = max(1, int(max_batch))
        self._max_delay_ns = int(max_delay_s * 1e9)
        self._cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        self._phases = []
        self._steps = []
        self._oldest_ns = 0
        self._step_start = None     # where the next step starts: the previous step's end ...
        self._open_start = None     # ... or, before the first step, the earliest phase since (never the buffer)
        self._lock = threading.Lock()
        self._sock = None
        self._resolved_ns = _monotonic_ns()
        self.sent = 0               # datagrams sent
        self.sent_records = 0
        self.dropped = 0            # records dropped (phases + steps)
        self.dropped_messages = 0   # datagrams that could not be sent
        self.last_error = None      # why the last datagram was dropped (an errno name), for debugging
        self._closed = False
        ref = weakref.ref(self)
        atexit.register(_flush_ref, ref)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=lambda: _reinit_ref(ref))

    # -- recording ---------------------------------------------------------------------------
    def phase(self, name: str) -> _Phase:
        """Context manager timing one phase with CLOCK_MONOTONIC."""
        return _Phase(self, name)

    def record_phase(self, name: str, start_ns: int, end_ns: int) -> None:
        """Record an already-timed phase (CLOCK_MONOTONIC ns, e.g. from time.monotonic_ns())."""
        try:
            s = int(start_ns)
            e = int(end_ns)
            rec = [name if type(name) is str else str(name), s, e]
            if len(rec[0]) > 64:
                rec[0] = rec[0][:64]
        except (TypeError, ValueError, OverflowError):
            self._count_drop(1, "bad-argument")
            return
        if e < s or s < 0:
            self._count_drop(1, "bad-interval")
            return
        if self._step_start is None and (self._open_start is None or s < self._open_start):
            self._open_start = s
        self._add(self._phases, rec, s)

    def step(self, samples: int = 0, start_ns: int = None, end_ns: int = None) -> None:
        """Close one training step (default: from the previous step's end, or the first phase, to now)."""
        try:
            e = _monotonic_ns() if end_ns is None else int(end_ns)
            if start_ns is not None:
                s = int(start_ns)
            elif self._step_start is not None:
                s = self._step_start
            elif self._open_start is not None:  # phases already flushed still belong to this step
                s = min(self._open_start, e)
            else:
                s = e
            n = int(samples)
        except (TypeError, ValueError, OverflowError):
            self._count_drop(1, "bad-argument")
            return
        self._step_start = e
        self._open_start = None
        if e < s or n < 0:
            self._count_drop(1, "bad-interval")
            return
        self._add(self._steps, [s, e, n], s, flush=True)

    def _add(self, buf, rec, t_ns, flush=False) -> None:
        with self._lock:
            if not self._phases and not self._steps:
                self._oldest_ns = t_ns
            buf.append(rec)
            full = len(self._phases) + len(self._steps) >= self.max_batch
            stale = rec[-1] - self._oldest_ns > self._max_delay_ns if buf is self._phases else False
        if flush or full or stale:
            self.flush()

    # -- sending -----------------------------------------------------------------------------
    def flush(self) -> None:
        """Send what is buffered now (one datagram)."""
        with self._lock:
            phases, steps = self._phases, self._steps
            if not phases and not steps:
                return
            self._phases, self._steps = [], []
            dropped = self.dropped
        n = len(phases) + len(steps)
        try:
            data = _encode(self.train_job, phases, steps, self._cvd, dropped)
        except (TypeError, ValueError):
            self._count_drop(n, "encode")
            return
        # The socket is connected once (a send then skips the kernel's path lookup); an agent that
        # restarted refuses the old connection, so connect again to its new socket and retry once.
        for retry in (False, True):
            try:
                sock = self._sock
                if sock is None:
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    try:
                        sock.setblocking(False)
                        sock.connect(self.socket_path)
                    except OSError:
                        sock.close()
                        raise
                    self._sock = sock
                sock.send(data)
            except (FileNotFoundError, ConnectionRefusedError) as e:
                stale, self._sock = self._sock, None
                if stale is not None:
                    stale.close()
                    if not retry:
                        continue
                self._count_drop(n, type(e).__name__, messages=1)
                self._maybe_resolve()
            except OSError as e:  # BlockingIOError (queue full), PermissionError, EMSGSIZE, bad path ...
                self._count_drop(n, type(e).__name__, messages=1)
            else:
                self.sent += 1
                self.sent_records += n
            return

    def _maybe_resolve(self) -> None:
        """No agent at the path: look for it again now and then (it may start later)."""
        if self._explicit:
            return
        now = _monotonic_ns()
        if now - self._resolved_ns >= _RESOLVE_EVERY_NS:
            self._resolved_ns = now
            self.socket_path = default_socket_path()

    def _count_drop(self, records: int, why: str, messages: int = 0) -> None:
        self.dropped += records
        self.dropped_messages += messages
        self.last_error = why

    def close(self) -> None:
        """Send what is buffered and release the socket (the reporter stays usable: it reopens)."""
        self.flush()
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _encode(job: str, phases, steps, cvd, dropped: int) -> bytes:
    """The datagram: byte for byte what ``json.dumps(obj, separators=(",", ":"))`` writes, without its generality.

    Records are [str, int, int] and [int, int, int] (record_phase and step make them so).
    """
    out = ['{"v":%d,"job":%s,"phases":[' % (VERSION, _json_str(job)),
           ",".join(["[%s,%d,%d]" % (_json_str(p), s, e) for p, s, e in phases]),
           '],"steps":[', ",".join(["[%d,%d,%d]" % tuple(r) for r in steps]), "]"]
    if cvd is not None:
        out.append(',"cvd":' + _json_str(cvd))
    if dropped:
        out.append(',"dropped":%d' % dropped)
    out.append("}")
    return "".join(out).encode()


def _flush_ref(ref) -> None:
    rep = ref()
    if rep is not None:
        rep.close()  # close() handles every OSError itself


def _reinit_ref(ref) -> None:
    rep = ref()
    if rep is not None:  # a forked child must not inherit a lock held by another thread, nor the buffer
        rep._lock = threading.Lock()
        rep._phases, rep._steps = [], []
        rep._step_start = rep._open_start = None
        rep._sock = None
