"""Metric specifications: the declared contract between sources and exporters.

Every metric family teye exports is declared once, at import time, by the module
that produces it (``metric(...)``).  Readings turn into :class:`Point` values that
refer to those declarations, so exporters never build names from data and the
catalog (``docs/metrics.md``) is generated from the declarations themselves.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Dict, Iterable, NamedTuple, Optional, Tuple

COUNTER = "counter"
GAUGE = "gauge"
HISTOGRAM = "histogram"
_KINDS = (COUNTER, GAUGE, HISTOGRAM)

# Unit suffixes allowed by the naming convention (base units only).
_UNITS = ("bytes", "seconds", "ratio", "celsius", "watts", "hertz", "joules",
          "bytes_per_second", "info", "active", "up")


@dataclass(frozen=True)
class MetricSpec:
    """One metric family: name, type, HELP text, label names, and where it is defined."""

    name: str
    kind: str
    help: str
    labels: Tuple[str, ...] = ()
    unit: str = ""
    source_file: str = ""
    buckets: Tuple[float, ...] = ()


class HistogramValue(NamedTuple):
    """A histogram's state: cumulative counts per upper bound (last bound is +Inf), and the sum."""

    buckets: Tuple[Tuple[float, float], ...]  # ((le, cumulative_count), ...), ends with (inf, count)
    sum: float

    @property
    def count(self) -> float:
        return self.buckets[-1][1] if self.buckets else 0.0


class Point(NamedTuple):
    """One exported sample: a spec, its label values (in spec.labels order), and a value."""

    spec: MetricSpec
    labels: Tuple[str, ...]
    value: object  # float, or HistogramValue for histograms


_REGISTRY: Dict[str, MetricSpec] = {}
_FORBIDDEN_LABELS = {"job", "instance"}


def _repo_relative(path: str) -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.abspath(path)
    return os.path.relpath(path, root) if path.startswith(root) else path


def metric(name: str, kind: str, help: str, labels: Iterable[str] = (), unit: str = "",
           buckets: Iterable[float] = ()) -> MetricSpec:
    """Declare a metric family (call at module import time).

    Raises ValueError on a convention violation, so a bad declaration fails the
    import (and every test) rather than producing a bad exposition.
    """
    labels = tuple(labels)
    if kind not in _KINDS:
        raise ValueError(f"{name}: kind must be one of {_KINDS}")
    if not name.startswith("teye_"):
        raise ValueError(f"{name}: metric names start with teye_")
    if kind == COUNTER and not name.endswith("_total"):
        raise ValueError(f"{name}: counters end in _total")
    if kind != COUNTER and name.endswith("_total"):
        raise ValueError(f"{name}: only counters end in _total")
    if not help or not help.strip():
        raise ValueError(f"{name}: HELP text is required")
    bad = _FORBIDDEN_LABELS.intersection(labels)
    if bad:
        raise ValueError(f"{name}: label(s) {sorted(bad)} belong to Prometheus; use train_job")
    caller = sys._getframe(1).f_code.co_filename  # inspect.stack() reads every frame's source: slow
    spec = MetricSpec(name, kind, " ".join(help.split()), labels, unit, _repo_relative(caller),
                      tuple(float(b) for b in buckets))
    old = _REGISTRY.get(name)
    if old is not None and (old.kind, old.labels) != (spec.kind, spec.labels):
        raise ValueError(f"{name}: declared twice with different type or labels")
    _REGISTRY[name] = spec
    return spec


def registered() -> Dict[str, MetricSpec]:
    """All declared specs so far, by name."""
    return dict(_REGISTRY)


def point(spec: MetricSpec, value, *labels: object) -> Point:
    """Build a Point, checking the label arity against the spec."""
    if len(labels) != len(spec.labels):
        raise ValueError(f"{spec.name}: expected labels {spec.labels}, got {labels!r}")
    return Point(spec, tuple(map(str, labels)), value)


def histogram_value(bounds: Iterable[float], counts: Iterable[float], total: float) -> HistogramValue:
    """Histogram from per-bucket (non-cumulative) counts; ``counts`` has one more entry (+Inf) than ``bounds``."""
    bounds = list(bounds)
    counts = list(counts)
    if len(counts) != len(bounds) + 1:
        raise ValueError("counts needs one entry per bound plus +Inf")
    acc = 0.0
    out = []
    for le, c in zip(bounds + [float("inf")], counts):
        acc += c
        out.append((float(le), acc))
    return HistogramValue(tuple(out), float(total))


def unit_of(name: str) -> Optional[str]:
    """The base unit a metric name carries, for the catalog (None when unitless)."""
    base = name[:-len("_total")] if name.endswith("_total") else name
    for u in sorted(_UNITS, key=len, reverse=True):
        if base.endswith("_" + u):
            return u
    return None
