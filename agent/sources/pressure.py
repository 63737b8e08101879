"""Pressure stall information (PSI), from <procfs>/pressure/{cpu,io,memory,irq}.

Each file has a ``some`` and/or a ``full`` line:
``some avg10=0.18 avg60=0.34 avg300=0.10 total=159886802``; the averages are
percentages of wall time over 10/60/300 s windows, ``total`` is cumulative stall
time in microseconds (Documentation/accounting/psi.rst).  ``irq`` (6.1+) has only
``full``.  A kernel without PSI (or booted with psi=0) has no /proc/pressure: the
source then reports itself unavailable.
"""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Dict, Iterator, NamedTuple, Tuple

from ..errors import ParseError, SourceUnavailable, parse_float, parse_int
from ..metrics import COUNTER, GAUGE, Point, metric, point
from ._files import FileRefused, KeptFiles, KeptFilesSource, Refusals, counting, refused_points, under

RESOURCES = ("cpu", "io", "memory", "irq")
KINDS = ("some", "full")
WINDOWS = (("avg10", "10s"), ("avg60", "60s"), ("avg300", "300s"))

STALLED_SECONDS = metric(
    "teye_pressure_stalled_seconds_total", COUNTER,
    "Seconds in which some (kind=some) or all (kind=full) non-idle tasks were stalled waiting for the resource "
    "(/proc/pressure/<resource> total=, microseconds / 1e6). System-wide cpu full is undefined and not exported.",
    ["resource", "kind"])
STALLED_RATIO = metric(
    "teye_pressure_stalled_ratio", GAUGE,
    "Share of wall time (0-1) that some/all non-idle tasks were stalled on the resource, kernel moving average "
    "over the window (/proc/pressure/<resource> avg10/avg60/avg300 percent / 100).",
    ["resource", "kind", "window"])


class PsiLine(NamedTuple):
    """One line of a PSI file: moving averages as ratios (0-1) and the cumulative stall time in seconds."""

    avg10: float
    avg60: float
    avg300: float
    total_seconds: float


def parse_psi(text: str, path: str = "pressure") -> Dict[str, PsiLine]:
    """Parse one /proc/pressure/<resource> file -> {'some': PsiLine, 'full': PsiLine} (those present)."""
    out: Dict[str, PsiLine] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        kind = fields[0]
        if kind not in KINDS:
            raise ParseError(path, f"line {lineno}: expected 'some' or 'full', got {kind!r}")
        values = {}
        for item in fields[1:]:
            key, sep, val = item.partition("=")
            if not sep:
                raise ParseError(path, f"line {lineno}: expected key=value, got {item!r}")
            values[key] = val
        missing = [k for k in ("avg10", "avg60", "avg300", "total") if k not in values]
        if missing:
            raise ParseError(path, f"line {lineno}: {kind} is missing {', '.join(missing)} (truncated?)")
        avgs = [parse_float(values[k], path, f"line {lineno} {kind} {k}") for k, _ in WINDOWS]
        if any(not 0 <= a <= 100 for a in avgs):
            raise ParseError(path, f"line {lineno}: {kind}: averages must be percentages 0-100, got {avgs}")
        total_us = parse_int(values["total"], path, f"line {lineno} {kind} total")
        if total_us < 0:
            raise ParseError(path, f"line {lineno}: {kind}: negative total {total_us}")
        out[kind] = PsiLine(*(a / 100.0 for a in avgs), total_us / 1e6)
    if not out:
        raise ParseError(path, "file is empty")
    return out


@dataclass(frozen=True)
class PressureReading:
    """resource ('cpu', 'io', 'memory', 'irq') -> kind ('some', 'full') -> PsiLine, for the files present."""

    resources: Dict[str, Dict[str, PsiLine]]
    refused: Tuple[Tuple[str, int], ...] = ()   # files refused so far, by reason

    def points(self) -> Iterator[Point]:
        for res, kinds in self.resources.items():
            for kind, line in kinds.items():
                if res == "cpu" and kind == "full":
                    continue  # undefined system-wide; kernels 5.13+ print zeros for compatibility
                yield point(STALLED_SECONDS, line.total_seconds, res, kind)
                for (attr, window) in WINDOWS:
                    yield point(STALLED_RATIO, getattr(line, attr), res, kind, window)
        yield from refused_points("pressure", self.refused)


class PressureSource(KeptFilesSource):
    name = "pressure"
    KEPT = len(RESOURCES)   # one file per resource

    def __init__(self, procfs: str = "/proc"):
        self.dir = under(procfs, "pressure")
        self._refusals = Refusals(self.name)
        self._files = KeptFiles()

    def collect(self) -> PressureReading:
        with counting(self._refusals):
            return self._collect()

    def _collect(self) -> PressureReading:
        if not os.path.isdir(self.dir):
            raise SourceUnavailable(f"{self.dir}: no such directory (kernel without PSI: needs 4.20+ with "
                                    "CONFIG_PSI, not booted with psi=0)")
        resources: Dict[str, Dict[str, PsiLine]] = {}
        for res in RESOURCES:
            path = os.path.join(self.dir, res)
            try:
                text = self._files.read_text(path)
            except FileRefused:
                continue  # a FIFO or device in its place (or far too large): counted and named once, others kept
            except FileNotFoundError:
                continue  # e.g. irq needs 6.1+ and CONFIG_IRQ_TIME_ACCOUNTING
            except OSError as e:
                if e.errno == errno.EOPNOTSUPP:
                    raise SourceUnavailable(f"{path}: PSI is disabled (boot with psi=1)") from None
                raise
            resources[res] = parse_psi(text, path)
        if not resources:
            raise SourceUnavailable(f"{self.dir}: none of {', '.join(RESOURCES)} present")
        return PressureReading(resources, self._refusals.counts())


def from_config(cfg, ctx=None) -> PressureSource:
    return PressureSource(cfg["procfs"])
