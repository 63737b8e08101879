"""Load average, from <procfs>/loadavg (node_exporter's ``loadavg`` collector: node_load1/5/15).

The file is ``0.21 0.37 0.39 1/719 19737``: the run-queue averages over 1, 5 and 15 minutes, the
runnable and total scheduling entities, and the last pid handed out (proc(5)).  The same pass reads the
kernel's file-handle table and random pool (agent/sources/kernel.py: node_exporter's ``filefd`` and ``entropy``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator, Optional

from ..errors import ParseError, parse_float, parse_int
from ..metrics import GAUGE, Point, metric, point
from ._files import KeptFiles, KeptFilesSource, under
from .kernel import KernelTables, KernelTablesReader

LOAD1 = metric("teye_load1", GAUGE, "1-minute load average: runnable plus uninterruptible tasks, exponentially "
               "averaged (/proc/loadavg; node_exporter's node_load1).")
LOAD5 = metric("teye_load5", GAUGE, "5-minute load average (/proc/loadavg; node_exporter's node_load5).")
LOAD15 = metric("teye_load15", GAUGE, "15-minute load average (/proc/loadavg; node_exporter's node_load15).")
RUNNABLE = metric("teye_load_runnable_tasks", GAUGE,
                  "Tasks (threads) runnable now, the 4th field's numerator in /proc/loadavg.")
TASKS = metric("teye_load_tasks", GAUGE, "Tasks (threads) that exist now, the 4th field's denominator in "
               "/proc/loadavg.")


@dataclass(frozen=True)
class LoadReading:
    load1: float
    load5: float
    load15: float
    runnable: int
    tasks: int
    tables: Optional[KernelTables] = None   # file handles and entropy, read in the same pass

    def points(self) -> Iterator[Point]:
        yield point(LOAD1, self.load1)
        yield point(LOAD5, self.load5)
        yield point(LOAD15, self.load15)
        yield point(RUNNABLE, self.runnable)
        yield point(TASKS, self.tasks)
        if self.tables is not None:
            yield from self.tables.points()


def parse_loadavg(text: str, path: str = "loadavg") -> LoadReading:
    """Parse /proc/loadavg. Raises ParseError on a truncated, garbled or negative field."""
    fields = text.split()
    if len(fields) < 4:
        raise ParseError(path, f"expected 5 fields 'l1 l5 l15 r/t last', got {len(fields)} (truncated?)")
    loads = [parse_float(f, path, name) for f, name in zip(fields[:3], ("load1", "load5", "load15"))]
    if any(not (v >= 0 and v != float("inf")) for v in loads):  # NaN fails >= 0
        raise ParseError(path, f"load averages must be finite and >= 0, got {fields[:3]}")
    r, sep, t = fields[3].partition("/")
    if not sep:
        raise ParseError(path, f"4th field: expected 'runnable/total', got {fields[3]!r}")
    runnable, tasks = parse_int(r, path, "runnable tasks"), parse_int(t, path, "total tasks")
    if runnable < 0 or tasks < 0:
        raise ParseError(path, f"4th field: negative count in {fields[3]!r}")
    return LoadReading(loads[0], loads[1], loads[2], runnable, tasks)


class LoadavgSource(KeptFilesSource):
    name = "loadavg"
    KEPT = 1   # loadavg

    def __init__(self, procfs: str = "/proc"):
        self.path = under(procfs, "loadavg")
        self.tables = KernelTablesReader(procfs)
        self._files = KeptFiles()

    def collect(self) -> LoadReading:
        return replace(parse_loadavg(self._files.read_text(self.path), self.path), tables=self.tables.read())


def from_config(cfg, ctx=None) -> LoadavgSource:
    return LoadavgSource(cfg["procfs"])
