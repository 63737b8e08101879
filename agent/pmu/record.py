"""``teye record --pmu --output FILE``: write the raw counter reads of the ``pmu`` source as JSON lines.

:class:`RecordingReader` wraps the live reader: every group read passes through unchanged
and its raw values are kept; after each poll :meth:`RecordingReader.flush` writes one line
``{"t": seconds since the start, "reads": [...]}`` (docs/pmu-trace-format.md).
"""
from __future__ import annotations

import json
import os
import socket
import time
from typing import Any, Callable, Dict, List, Optional, TextIO

from .. import __version__
from ..errors import SourceUnavailable
from . import trace


class RecordingReader:
    def __init__(self, inner, out: TextIO, clock_ns: Callable[[], int] = time.monotonic_ns,
                 header: Optional[Dict[str, Any]] = None):
        self.inner = inner
        self.out = out
        self._clock = clock_ns
        self.start_ns = clock_ns()
        self._pending: List[Dict[str, Any]] = []
        head = {"format": trace.FORMAT, "version": trace.VERSION, "host": socket.gethostname(),
                "tool": f"teye record --pmu {__version__}", "start_unix_ns": time.time_ns()}
        head.update(header or {})
        self.out.write(json.dumps(head, separators=(",", ":")) + "\n")

    def open(self, g):
        return self.inner.open(g)

    def read(self, g, handle):
        enabled, running, values = self.inner.read(g, handle)
        for e, v in zip(g.events, values):
            self._pending.append({"pmu": e.pmu, "event": e.event, "cpu": g.cpu, "value": int(v),
                                  "enabled_ns": int(enabled), "running_ns": int(running)})
        return enabled, running, values

    def close(self, handle) -> None:
        self.inner.close(handle)

    @property
    def open_fds(self) -> int:
        return self.inner.open_fds

    def flush(self, t_ns: Optional[int] = None) -> None:
        """Write the reads of one poll as one line (t = seconds since the recording started)."""
        t = ((self._clock() if t_ns is None else t_ns) - self.start_ns) / 1e9
        self.out.write(json.dumps({"t": round(t, 6), "reads": self._pending}, separators=(",", ":")) + "\n")
        self._pending = []


def record(path: str, duration_s: float, interval_s: float, sysfs: str, procfs: str, inner=None,
           sleep: Callable[[float], None] = time.sleep, clock_ns: Callable[[], int] = time.monotonic_ns) -> int:
    """Poll the pmu source through a RecordingReader for duration_s; returns the number of polls written.
    SourceUnavailable (no PMU, no permission) propagates and the partial file is removed."""
    from .events import read_cpuinfo
    from .source import LiveReader, PmuSource
    cpu = read_cpuinfo(procfs)
    header = {"cpu": {"vendor": cpu.vendor, "family": cpu.family, "model": cpu.model, "name": cpu.name}} if cpu else {}
    polls = 0
    try:
        with open(path, "w", encoding="utf-8") as out:
            rec = RecordingReader(inner if inner is not None else LiveReader(), out, clock_ns, header)
            src = PmuSource(lambda: rec, sysfs=sysfs, procfs=procfs, clock=clock_ns)
            try:
                start = clock_ns()
                while True:
                    src.collect()
                    rec.flush()
                    polls += 1
                    if (clock_ns() - start) / 1e9 + interval_s >= duration_s - 1e-9:
                        break
                    sleep(interval_s)
            finally:
                src.close()
    except SourceUnavailable:
        if os.path.exists(path):
            os.unlink(path)
        raise
    return polls
