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
from typing import Callable, Dict, Iterable, Iterator, List

from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily,
                                    Metric)
from prometheus_client.registry import Collector, CollectorRegistry

from agent import __version__
from agent.logutil import RateLimitedLog
from agent.metrics import COUNTER, GAUGE, HISTOGRAM, MetricSpec, Point, metric, registered

log = logging.getLogger("teye.exporter")

COLLECTOR_UP = metric("teye_collector_up", GAUGE,
                      "1 if the collector's last read succeeded (and is not stuck), else 0. "
                      "Sources are sampled in the background, so a scrape reports their latest read.",
                      ["collector"])
COLLECTOR_DURATION = metric("teye_collector_duration_seconds", GAUGE,
                            "Seconds the collector's last read took.", ["collector"])
COLLECTOR_AGE = metric("teye_collector_last_read_age_seconds", GAUGE,
                       "Seconds since the collector's last completed read.", ["collector"])
COLLECTOR_FAILURES = metric("teye_collector_failures_total", COUNTER,
                            "Reads of the collector that failed since the agent started.", ["collector"])
BUILD_INFO = metric("teye_build_info", GAUGE, "Always 1; the version label says which teye runs.", ["version"])


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
                 clock: Callable[[], int] = time.monotonic_ns):
        self._get = get_snapshot
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
        for name, st in snap.sources.items():
            up = snap.is_up(name, now, self._stale)
            body: List[Point] = []
            if up and st.reading is not None:
                try:
                    body = list(st.reading.points())
                except Exception:  # a formatting bug in one source must not fail the scrape
                    self._rlog.error(f"{name}:points", "formatting collector %s failed", name, exc_info=True)
                    up, body = False, []
            pts.append(Point(COLLECTOR_UP, (name,), 1.0 if up else 0.0))
            pts.append(Point(COLLECTOR_DURATION, (name,), st.duration_s))
            if st.updated_ns:
                pts.append(Point(COLLECTOR_AGE, (name,), max(0.0, (now - st.updated_ns) / 1e9)))
            pts.append(Point(COLLECTOR_FAILURES, (name,), float(st.failures)))
            pts.extend(body)
        return pts

    def collect(self) -> Iterator[Metric]:
        yield from families(self.points())


def make_registry(get_snapshot: Callable, stale_after_s: float = 10.0) -> CollectorRegistry:
    """A fresh registry holding only teye's collector (no process/platform defaults).

    It carries ``teye_exposition``, the prepared renderer the HTTP server uses for /metrics
    (exporters/render.py); prometheus_client's encoders still work on the registry itself.
    """
    from .render import Exposition  # render builds on this module
    reg = CollectorRegistry(auto_describe=True)
    reg.register(SnapshotCollector(get_snapshot, stale_after_s))
    reg.teye_exposition = Exposition(get_snapshot, stale_after_s, fallback=reg)
    return reg
