"""The exporter's own metric families: per-collector self-metrics and the build info.

Declared once here, beside nothing that renders them, so both renderers (the
prometheus_client collector in :mod:`exporters.prometheus` and the prepared body in
:mod:`exporters.render`) import them from one place and the imports run one way:
prometheus -> render -> specs.
"""
from __future__ import annotations

from typing import NamedTuple, Tuple

from agent.metrics import COUNTER, GAUGE, MetricSpec, metric

COLLECTOR_UP = metric("teye_collector_up", GAUGE,
                      "1 if the collector's last read succeeded (and is not stuck), else 0. "
                      "Sources are sampled in the background, so a scrape reports their latest read.",
                      ["collector"])
COLLECTOR_ABSENT = metric("teye_collector_absent", GAUGE,
                          "1 if the node has no such hardware (no NVIDIA driver or GPU, no PMU, no InfiniBand "
                          "device, no NFS server) and the collector never read anything nor was turned on "
                          "explicitly, else 0. An absent collector has teye_collector_up 0 and does not alert.",
                          ["collector"])
COLLECTOR_DURATION = metric("teye_collector_duration_seconds", GAUGE,
                            "Seconds the collector's last read took.", ["collector"])
COLLECTOR_AGE = metric("teye_collector_last_read_age_seconds", GAUGE,
                       "Seconds since the collector's last completed read.", ["collector"])
COLLECTOR_FAILURES = metric("teye_collector_failures_total", COUNTER,
                            "Reads of the collector that failed since the agent started.", ["collector"])
TIME_SECONDS = metric("teye_time_seconds", GAUGE, "The node's wall clock at the scrape, seconds since the Unix "
                      "epoch (written by the HTTP server when it answers, as node_exporter's node_time_seconds; "
                      "compare with timestamp() for a clock that is off).")
BUILD_INFO = metric("teye_build_info", GAUGE, "Always 1; the version label says which teye runs.", ["version"])


class Layout(NamedTuple):
    """Which series a producer of per-scrape points exports, in order, grouped by family (see
    :meth:`exporters.webstats.WebStats.state`): the same object for as long as the set of series stays
    the same, so a renderer can prepare the text around the values once per layout."""

    entries: Tuple[Tuple[MetricSpec, Tuple[str, ...]], ...]   # (spec, label values) per series
    per_scrape: int   # the first entries, whole families, whose values change with (nearly) every scrape
