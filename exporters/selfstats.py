"""The agent's own process metrics (``process_*``), exactly as prometheus_client's process collector defines them.

Every Prometheus exporter exports them (CPU seconds, resident and virtual memory, open and maximum file
descriptors, start time), so fleet dashboards and alerts written for node_exporter or dcgm-exporter
work on teye unchanged.  The values come from prometheus_client's own ``ProcessCollector`` (it reads
``/proc/self``: the agent's own process, never the ``--procfs`` tree it monitors); this module only
hands them to the renderers as (Layout, values), the shape of the web server's counters
(:meth:`exporters.webstats.WebStats.state`), and :func:`chain` joins such producers into one.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

from prometheus_client.process_collector import ProcessCollector

from agent.metrics import COUNTER, GAUGE, MetricSpec

from .specs import Layout

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
    with every scrape: all of them are per-scrape)."""

    def __init__(self, proc: str = "/proc", pid: Callable[[], object] = lambda: "self"):
        self._collector = ProcessCollector(registry=None, proc=proc, pid=pid)
        self._specs: Dict[Tuple[str, str, str], MetricSpec] = {}
        self._layout: Optional[Layout] = None

    def _spec(self, name: str, kind: str, doc: str) -> MetricSpec:
        key = (name, kind, doc)
        spec = self._specs.get(key)
        if spec is None:
            spec = self._specs[key] = MetricSpec(name, kind, doc, (), "", "exporters/selfstats.py")
        return spec

    def state(self) -> Tuple[Layout, List[float]]:
        entries = []
        values: List[float] = []
        for fam in self._collector.collect():   # empty where /proc/self cannot be read
            kind = COUNTER if fam.type == "counter" else GAUGE
            for s in fam.samples:
                if s.name.endswith("_created"):
                    continue
                entries.append((self._spec(s.name, kind, fam.documentation), ()))
                values.append(s.value)
        entries = tuple(entries)
        if self._layout is None or self._layout.entries != entries:
            self._layout = Layout(entries, len(entries))
        return self._layout, values


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
