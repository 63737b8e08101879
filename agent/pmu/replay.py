"""``--pmu-replay FILE``: serve recorded counter reads to the ``pmu`` source.

:class:`ReplayReader` has the methods of :class:`agent.pmu.source.LiveReader` (open, read,
close), so the source's decoding (plan from ``--sysfs``/``--procfs``, multiplex scaling,
totals, bytes and operations) runs unchanged on recorded values.  Replay time starts at
the first line's ``t`` when the source first opens its counters and runs with the monotonic
clock: a read gets the values of the latest line at or before the current trace time (the
lines play at their recorded pace).  A
group whose events are not all in that line fails as the kernel would for an offline CPU
(ENODEV), so it is absent; one never recorded fails to open (ENOENT).  Past the last
line the trace loops (its length is the last ``t`` minus the first plus the last interval); the counters
then restart from their first values, which the source counts as counters started afresh,
so totals keep growing.
"""
from __future__ import annotations

import bisect
import errno
import time
from typing import Callable, Dict, List, Optional, Tuple

from . import trace
from .perf import PerfError


class ReplayReader:
    def __init__(self, header: dict, lines, clock: Callable[[], int] = time.monotonic_ns):
        self.header = header
        self._times: List[float] = [t for t, _ in lines]
        self._reads: List[Dict[Tuple[str, str, int], Tuple[int, int, int]]] = [
            {(r["pmu"], r["event"], r["cpu"]): (r["value"], r["enabled_ns"], r["running_ns"]) for r in reads}
            for _, reads in lines]
        self._known = set().union(*self._reads) if self._reads else set()
        step = self._times[-1] - self._times[-2] if len(self._times) > 1 else 1.0
        self.first = self._times[0] if self._times else 0.0
        self.length = (self._times[-1] - self.first + max(step, 1e-3)) if self._times else 0.0
        self._clock = clock
        self._start: Optional[int] = None
        self.open_fds = 0

    @classmethod
    def load(cls, path: str, clock: Callable[[], int] = time.monotonic_ns) -> "ReplayReader":
        header, lines = trace.read(path)
        return cls(header, lines, clock)

    def _line(self) -> Optional[Dict[Tuple[str, str, int], Tuple[int, int, int]]]:
        if not self._times:
            return None
        now = self._clock()
        if self._start is None:
            self._start = now
        t = self.first + ((now - self._start) / 1e9) % self.length
        i = bisect.bisect_right(self._times, t) - 1
        return self._reads[i] if i >= 0 else None

    def open(self, g):
        missing = [e.event for e in g.events if (e.pmu, e.event, g.cpu) not in self._known]
        if missing:
            raise PerfError(errno.ENOENT, f"replay: {g.pmu}/{','.join(missing)}/ on cpu {g.cpu} never recorded")
        if self._start is None:
            self._start = self._clock()
        self.open_fds += len(g.events)
        return g

    def read(self, g, handle) -> Tuple[int, int, Tuple[int, ...]]:
        line = self._line() or {}
        got = [line.get((e.pmu, e.event, g.cpu)) for e in g.events]
        if any(x is None for x in got):
            raise PerfError(errno.ENODEV, f"replay: {g.what} on cpu {g.cpu} not in the trace at this time")
        _, enabled, running = got[0]
        return enabled, running, tuple(x[0] for x in got)

    def close(self, handle) -> None:
        self.open_fds -= len(handle.events)
