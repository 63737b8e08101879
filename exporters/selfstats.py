"""The agent's own process metrics (``process_*``), exactly as prometheus_client's process collector defines them.

Every Prometheus exporter exports them (CPU seconds, resident and virtual memory, open and maximum file
descriptors, start time), so fleet dashboards and alerts written for node_exporter or dcgm-exporter
work on teye unchanged.  The values are read here from ``/proc/self`` (the agent's own process, never
the ``--procfs`` tree it monitors) the way client_python's ``ProcessCollector`` reads them (the same
fields, units and HELP text; tests/test_selfstats.py holds the two equal), without importing
prometheus_client: its package pulls in http.server, wsgiref and email, about 3 MiB of an idle agent's
RSS (docs/operations.md "Agent footprint").  They reach the renderers as (Layout, values), the shape of
the web server's counters (:meth:`exporters.webstats.WebStats.state`), and :func:`chain` joins such
producers into one.
"""
from __future__ import annotations

import os
import resource
import time
from typing import Callable, Dict, List, Sequence, Tuple

from agent.metrics import COUNTER, GAUGE, MetricSpec

from .specs import TIME_SECONDS, Layout

Producer = Callable[[], Tuple[Layout, Sequence[float]]]

# The families client_python's ProcessCollector exports on Linux, with its HELP text (for the catalog;
# at run time the collector's own text is used, so a client_python that changes it is followed).
PROCESS_FAMILIES = (
    ("process_virtual_memory_bytes", GAUGE, "Virtual memory size in bytes."),
    ("process_resident_memory_bytes", GAUGE, "Resident memory size in bytes."),
    ("process_start_time_seconds", GAUGE, "Start time of the process since unix epoch in seconds."),
    ("process_cpu_seconds_total", COUNTER, "Total user and system CPU time spent in seconds."),
    ("process_open_fds", GAUGE, "Number of open file descriptors."),
    ("process_max_fds", GAUGE, "Maximum number of open file descriptors."),
)
SPECS = tuple(MetricSpec(n, k, h, (), "", "exporters/selfstats.py") for n, k, h in PROCESS_FAMILIES)


class ProcessStats:
    """``state()`` -> (Layout, values) of the ``process_*`` families for this process (every family changes
    with every scrape: all of them are per-scrape).  A family whose file cannot be read is left out
    (stat: the first four; limits or fd: the last two), as client_python does."""

    def __init__(self, proc: str = "/proc", pid: Callable[[], object] = lambda: "self"):
        self._proc, self._pid = proc, pid
        try:
            self._ticks = float(os.sysconf("SC_CLK_TCK"))
        except (ValueError, OSError):
            self._ticks = 100.0
        self._btime = 0.0   # 0: /proc cannot be read, no family at all
        try:
            with open(os.path.join(proc, "stat"), "rb") as fh:
                for line in fh:
                    if line.startswith(b"btime "):
                        self._btime = float(line.split()[1])
                        break
        except OSError:
            pass
        self._specs = {name: MetricSpec(name, kind, doc, (), "", "exporters/selfstats.py")
                       for name, kind, doc in PROCESS_FAMILIES}
        self._layouts: Dict[Tuple[str, ...], Layout] = {}

    def _read(self) -> Tuple[List[str], List[float]]:
        if not self._btime:
            return [], []
        base = os.path.join(self._proc, str(self._pid()).strip())
        names: List[str] = []
        values: List[float] = []
        try:
            with open(os.path.join(base, "stat"), "rb") as fh:
                f = fh.read().split(b")")[-1].split()   # after the command name, which may hold spaces
            names += ["process_virtual_memory_bytes", "process_resident_memory_bytes",
                      "process_start_time_seconds", "process_cpu_seconds_total"]
            values += [float(f[20]), float(f[21]) * resource.getpagesize(), float(f[19]) / self._ticks + self._btime,
                       float(f[11]) / self._ticks + float(f[12]) / self._ticks]
        except (OSError, IndexError, ValueError):
            pass
        try:
            max_fds = None
            with open(os.path.join(base, "limits"), "rb") as fh:
                for line in fh:
                    if line.startswith(b"Max open file"):
                        max_fds = float(line.split()[3])
                        break
            open_fds = float(len(os.listdir(os.path.join(base, "fd"))))
            if max_fds is not None:
                names += ["process_open_fds", "process_max_fds"]
                values += [open_fds, max_fds]
        except (OSError, IndexError, ValueError):
            pass
        return names, values

    def state(self) -> Tuple[Layout, List[float]]:
        names, values = self._read()
        key = tuple(names)
        layout = self._layouts.get(key)
        if layout is None:
            entries = tuple((self._specs[n], ()) for n in names)
            layout = self._layouts[key] = Layout(entries, len(entries))
        return layout, values


_WALL_CLOCK = Layout(((TIME_SECONDS, ()),), 1)


def wall_clock(clock: Callable[[], float] = time.time) -> Producer:
    """``teye_time_seconds``: the wall clock when the scrape is answered (node_exporter's node_time_seconds)."""
    def state() -> Tuple[Layout, List[float]]:
        return _WALL_CLOCK, [clock()]
    return state


def chain(*producers: Producer) -> Producer:
    """One producer of (Layout, values) from several: their per-scrape families first (in order), then the
    rest; the joined Layout is the same object for as long as every part's is."""
    cache: List[tuple] = [(), None]

    def state() -> Tuple[Layout, List[float]]:
        parts = [p() for p in producers]
        layouts = tuple(layout for layout, _ in parts)
        if len(cache[0]) != len(layouts) or not all(a is b for a, b in zip(cache[0], layouts)):
            entries = tuple(e for lay in layouts for e in lay.entries[:lay.per_scrape]) + \
                tuple(e for lay in layouts for e in lay.entries[lay.per_scrape:])
            cache[0], cache[1] = layouts, Layout(entries, sum(lay.per_scrape for lay in layouts))
        values = [v for lay, vals in parts for v in list(vals)[:lay.per_scrape]] + \
            [v for lay, vals in parts for v in list(vals)[lay.per_scrape:]]
        return cache[1], values

    return state
