"""CPU time per CPU and mode, from <procfs>/stat."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Tuple

from ..errors import ParseError, parse_int
from ..metrics import COUNTER, GAUGE, Point, metric, point
from ._files import KeptFiles, KeptFilesSource, under

# Column order of the cpuN lines in /proc/stat (proc(5)); guest columns are already
# included in user/nice by the kernel, so they are exported separately, not added.
MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
GUEST_MODES = ("guest", "guest_nice")

CPU_SECONDS = metric("teye_cpu_seconds_total", COUNTER,
                     "Seconds each CPU spent in each mode (/proc/stat).", ["cpu", "mode"])
CPU_GUEST_SECONDS = metric("teye_cpu_guest_seconds_total", COUNTER,
                           "Seconds each CPU spent running guests (already included in user/nice).",
                           ["cpu", "mode"])
CPUS = metric("teye_cpus", GAUGE, "Number of CPUs listed in /proc/stat.")
CONTEXT_SWITCHES = metric("teye_context_switches_total", COUNTER, "Context switches (/proc/stat ctxt).")
INTERRUPTS = metric("teye_interrupts_total", COUNTER, "Interrupts serviced (/proc/stat intr).")
FORKS = metric("teye_forks_total", COUNTER, "Processes created (/proc/stat processes).")
PROCS_RUNNING = metric("teye_procs_running", GAUGE, "Processes in runnable state (/proc/stat).")
PROCS_BLOCKED = metric("teye_procs_blocked", GAUGE, "Processes blocked waiting for I/O (/proc/stat).")
BOOT_TIME = metric("teye_boot_time_seconds", GAUGE, "Boot time, seconds since the Unix epoch (/proc/stat btime).")


@dataclass(frozen=True)
class CpuReading:
    """Per-CPU cumulative seconds by mode (CPU id as a string, e.g. '0'), plus system-wide counters.

    A system-wide value whose line is missing from the file is None (absent from the export).
    """

    seconds: Dict[str, Tuple[float, ...]]        # cpu -> seconds in MODES order
    guest_seconds: Dict[str, Tuple[float, ...]]  # cpu -> seconds in GUEST_MODES order (those present)
    context_switches: Optional[int] = None
    interrupts: Optional[int] = None
    forks: Optional[int] = None
    procs_running: Optional[int] = None
    procs_blocked: Optional[int] = None
    boot_time: Optional[int] = None

    def points(self) -> Iterator[Point]:
        for cpu, values in self.seconds.items():
            for mode, v in zip(MODES, values):
                yield point(CPU_SECONDS, v, cpu, mode)
        for cpu, values in self.guest_seconds.items():
            for mode, v in zip(GUEST_MODES, values):
                yield point(CPU_GUEST_SECONDS, v, cpu, mode)
        yield point(CPUS, len(self.seconds))
        yield point(CONTEXT_SWITCHES, self.context_switches)
        yield point(INTERRUPTS, self.interrupts)
        yield point(FORKS, self.forks)
        yield point(PROCS_RUNNING, self.procs_running)
        yield point(PROCS_BLOCKED, self.procs_blocked)
        yield point(BOOT_TIME, self.boot_time)


def parse_stat(text: str, path: str = "stat", user_hz: int = 100) -> CpuReading:
    """Parse /proc/stat. Raises ParseError on a truncated or garbled cpu line.

    Every cpu line of one file has the same number of columns (the kernel's version
    decides it); a cpu line shorter than the others is a truncated file.
    """
    seconds: Dict[str, Tuple[float, ...]] = {}
    guest: Dict[str, Tuple[float, ...]] = {}
    scalars = {}
    ncols = None
    for lineno, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        key = fields[0]
        if key.startswith("cpu"):
            if ncols is None:
                ncols = len(fields)
            elif len(fields) != ncols:
                raise ParseError(path, f"line {lineno}: {key} has {len(fields) - 1} columns, the cpu lines "
                                 f"before it {ncols - 1} (truncated?)")
        if key.startswith("cpu") and key != "cpu":
            cpu = key[3:]
            if not (cpu.isascii() and cpu.isdigit()):
                raise ParseError(path, f"line {lineno}: bad CPU name {key!r}")
            if len(fields) < 1 + len(MODES) - 1:  # steal appeared in 2.6.11; older lines have 7 columns
                raise ParseError(path, f"line {lineno}: {key} has {len(fields) - 1} columns, expected >= 7")
            ticks = [parse_int(f, path, f"line {lineno} {key}") for f in fields[1:]]
            ticks += [0] * (len(MODES) - len(ticks[:len(MODES)]))
            seconds[cpu] = tuple(t / user_hz for t in ticks[:len(MODES)])
            if len(ticks) > len(MODES):  # guest since 2.6.24, guest_nice since 2.6.33
                guest[cpu] = tuple(t / user_hz for t in ticks[len(MODES):len(MODES) + len(GUEST_MODES)])
        elif key in ("ctxt", "processes", "procs_running", "procs_blocked", "btime", "intr"):
            if len(fields) < 2:
                raise ParseError(path, f"line {lineno}: {key} has no value")
            scalars[key] = parse_int(fields[1], path, f"line {lineno} {key}")
    if not seconds:
        raise ParseError(path, "no cpuN lines")
    return CpuReading(seconds, guest, scalars.get("ctxt"), scalars.get("intr"), scalars.get("processes"),
                      scalars.get("procs_running"), scalars.get("procs_blocked"), scalars.get("btime"))


class CpuSource(KeptFilesSource):
    name = "cpu"
    KEPT = 1   # stat

    def __init__(self, procfs: str = "/proc"):
        self.path = under(procfs, "stat")
        self.user_hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._files = KeptFiles()

    def collect(self) -> CpuReading:
        return parse_stat(self._files.read_text(self.path), self.path, self.user_hz)


def from_config(cfg, ctx=None) -> CpuSource:
    return CpuSource(cfg["procfs"])
