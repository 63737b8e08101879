"""A prometheus_client Collector that formats the sampler's latest Snapshot.

A scrape never touches hardware: it only turns readings into metric families, so it
is fast and cannot hang on a stuck NFS mount or a lost GPU.  A source that fails (or
whose ``points()`` raises) shows as ``teye_collector_up{collector}=0``; the scrape
itself never fails.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Callable, Dict, FrozenSet, Iterable, Iterator, List, Optional

from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily,
                                    Metric)
from prometheus_client.registry import Collector, CollectorRegistry

from agent import __version__
from agent.logutil import RateLimitedLog
from agent.metrics import COUNTER, HISTOGRAM, MetricSpec, Point, registered

from .render import Exposition
from .specs import (BUILD_INFO, COLLECTOR_ABSENT, COLLECTOR_AGE, COLLECTOR_DURATION, COLLECTOR_FAILURES,  # noqa: F401
                    COLLECTOR_UP)

log = logging.getLogger("teye.exporter")

def new_family(spec: MetricSpec) -> Metric:
    labels = list(spec.labels)
    if spec.kind == COUNTER:
        return CounterMetricFamily(spec.name, spec.help, labels=labels)
    if spec.kind == HISTOGRAM:
        return HistogramMetricFamily(spec.name, spec.help, labels=labels)
    return GaugeMetricFamily(spec.name, spec.help, labels=labels)


def _add(family: Metric, spec: MetricSpec, labels, value) -> None:
    if spec.kind == HISTOGRAM:
        buckets = [(_le(le), c) for le, c in value.buckets]
        family.add_metric(list(labels), buckets, value.sum)
    else:
        family.add_metric(list(labels), float(value))


def _le(le: float) -> str:
    return "+Inf" if math.isinf(le) else repr(float(le))


def families(points: Iterable[Point]) -> List[Metric]:
    """Group points into metric families (one per spec, in first-seen order); absent values are skipped."""
    out: Dict[str, Metric] = {}
    seen = set()
    for p in points:
        v = p.value
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue  # unsupported values are absent, not NaN
        key = (p.spec.name, p.labels)
        if key in seen:
            continue  # never emit a duplicate series
        seen.add(key)
        fam = out.get(p.spec.name)
        if fam is None:
            fam = out[p.spec.name] = new_family(p.spec)
        _add(fam, p.spec, p.labels, v)
    return list(out.values())


class SnapshotCollector(Collector):
    """Formats ``get_snapshot()``; ``stale_after_s`` marks a stuck read as down."""

    def __init__(self, get_snapshot: Callable, stale_after_s: float = 10.0,
                 clock: Callable[[], int] = time.monotonic_ns, extra: Optional[Callable[[], tuple]] = None,
                 hidden: FrozenSet[str] = frozenset()):
        """``extra``: series exported on every scrape besides the snapshot's, as (Layout, values) (the web
        server's counters: :meth:`exporters.webstats.WebStats.state`); ``hidden``: collectors whose own
        families are left out (sampled for the analysis only: the node_exporter mode), their
        ``teye_collector_*`` series kept."""
        self._get = get_snapshot
        self._hidden = hidden
        self._extra = extra
        self._stale = stale_after_s
        self._clock = clock
        self._rlog = RateLimitedLog(log)

    def describe(self) -> Iterator[Metric]:
        for spec in registered().values():
            yield new_family(spec)

    def points(self) -> List[Point]:
        snap = self._get()
        now = self._clock()
        pts: List[Point] = [Point(BUILD_INFO, (__version__,), 1.0)]
        # the extra points follow the age family (whose values also change with every scrape), or end the list
        extra = []
        if self._extra is not None:
            layout, values = self._extra()
            extra = [Point(spec, labels, float(v)) for (spec, labels), v in zip(layout.entries, values)]
        for name, st in snap.sources.items():
            up = snap.is_up(name, now, self._stale)
            body: List[Point] = []
            if up and st.reading is not None and name not in self._hidden:
                try:
                    body = list(st.reading.points())
                except Exception:  # a formatting bug in one source must not fail the scrape
                    self._rlog.error(f"{name}:points", "formatting collector %s failed", name, exc_info=True)
                    up, body = False, []
            pts.append(Point(COLLECTOR_UP, (name,), 1.0 if up else 0.0))
            pts.append(Point(COLLECTOR_ABSENT, (name,), 1.0 if st.absent else 0.0))
            pts.append(Point(COLLECTOR_DURATION, (name,), st.duration_s))
            if st.updated_ns:
                pts.append(Point(COLLECTOR_AGE, (name,), max(0.0, (now - st.updated_ns) / 1e9)))
                pts.extend(extra)
                extra = []
            pts.append(Point(COLLECTOR_FAILURES, (name,), float(st.failures)))
            pts.extend(body)
        pts.extend(extra)
        return pts

    def collect(self) -> Iterator[Metric]:
        yield from families(self.points())


def make_registry(get_snapshot: Callable, stale_after_s: float = 10.0,
                  extra: Optional[Callable[[], tuple]] = None, hidden: FrozenSet[str] = frozenset()
                  ) -> CollectorRegistry:
    """A fresh registry holding only teye's collector (no process/platform defaults).

    It carries ``teye_exposition``, the prepared renderer the HTTP server uses for /metrics
    (exporters/render.py); prometheus_client's encoders still work on the registry itself.
    ``extra`` gives series exported on every scrape besides the snapshot's (the web server's own
    counters: :meth:`exporters.webstats.WebStats.state`).
    """
    reg = CollectorRegistry(auto_describe=True)
    reg.register(SnapshotCollector(get_snapshot, stale_after_s, extra=extra, hidden=hidden))
    reg.teye_exposition = Exposition(get_snapshot, stale_after_s, fallback=reg, extra=extra, hidden=hidden)
    return reg
