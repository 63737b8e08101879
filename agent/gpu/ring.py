"""Integrating the driver's utilization-sample ring (pure logic, no NVML).

NVML keeps a ring of recent GPU utilization samples (``nvmlDeviceGetSamples`` with
``NVML_GPU_UTILIZATION_SAMPLES``): each sample is the percent of time, during its sample
period, that one or more kernels ran; its ``timeStamp`` (CPU wall clock, µs) ends that
period, which began at the previous sample's timestamp (1/6 s earlier on the GPUs NVML's
documentation describes; 200 ms on an H100 with driver 580.159.04, measured in
tests/data/gpu/h100-duty.jsonl: the period is read off the samples, never assumed).  The
ring holds only a few seconds, so it is read every poll with the newest timestamp seen so
far (NVML returns only newer samples).

Accounting, per GPU:

- The first read is a baseline: the ring's backlog predates the agent, so counting starts
  at the newest sample then seen.  Samples at or before the last-seen timestamp are
  dropped, so a sample is never counted twice even if a driver returns it again.
- Busy time is ``period x value/100`` summed over samples (the fraction of the period that
  kernels ran), not "the whole period when value > threshold": at driver resolution that is
  exact, so ``busy_seconds_total`` / ``sampled_seconds_total`` is the true busy ratio.
- Loss: if the oldest sample of a read is more than ``loss_factor`` (1.5) sample periods
  after the last one seen, the ring overran between polls: ``round(gap/period) - 1``
  samples are counted lost, the first sample after the hole is integrated over one period
  only, and the hole is neither sampled nor busy time.  The period is the median interval
  between consecutive samples within reads (the nominal 1/6 s until one is seen).  A driver
  that pauses sampling for longer than 1.5 periods would also count as a loss.
- Idle gaps: consecutive samples with ``value/100 <= busy_threshold`` form an idle stretch.
  When a busy sample ends it, the stretch's length is observed into the histogram: the
  stretch's periods plus the idle parts of the busy samples on either side (the idle time
  adjoining the gap, assuming it is contiguous with it).  A gap shorter than one sample
  period never yields a whole idle sample and cannot be seen; a gap of two periods or more
  always can.  A stretch broken by lost samples is dropped (its length is unknown), and a
  stretch still open is observed only once it ends.
"""
from __future__ import annotations

import bisect
from collections import deque
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

from ..metrics import HistogramValue, histogram_value

NOMINAL_PERIOD_US = 1e6 / 6
DEFAULT_GAP_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

Interval = Tuple[int, int, float]  # (start µs, end µs, busy ratio), CPU wall clock


class GapHistogram:
    """Counts of idle-gap lengths (seconds) per upper bound, plus +Inf, and their sum."""

    def __init__(self, bounds: Sequence[float] = DEFAULT_GAP_BUCKETS):
        self.bounds = tuple(sorted(float(b) for b in bounds))
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1  # le semantics: v <= bound
        self.sum += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)

    def value(self) -> HistogramValue:
        return histogram_value(self.bounds, self.counts, self.sum)


class UtilRing:
    """Per-GPU state of the utilization-ring reader; see the module docstring for the rules."""

    def __init__(self, busy_threshold: float = 0.0, buckets: Sequence[float] = DEFAULT_GAP_BUCKETS,
                 nominal_period_us: float = NOMINAL_PERIOD_US, loss_factor: float = 1.5):
        self.busy_threshold = float(busy_threshold)
        self.loss_factor = float(loss_factor)
        self.last_ts: Optional[int] = None
        self.busy_s = 0.0
        self.sampled_s = 0.0
        self.lost = 0
        self.samples = 0
        self.gaps = GapHistogram(buckets)
        self._intervals: deque = deque(maxlen=64)
        self._period = float(nominal_period_us)
        self._in_gap = False
        self._gap_us = 0.0
        self._gap_start = 0.0
        self._prev_idle_us = 0.0  # idle part of the previous busy sample (leading edge of the next gap)
        self.on_gap: Optional[Callable[[float, float], None]] = None  # (start µs, end µs) of each gap observed

    @property
    def period_us(self) -> float:
        return self._period

    @property
    def last_seen(self) -> int:
        """The timestamp to pass to nvmlDeviceGetSamples (0 before the first read: the whole ring)."""
        return self.last_ts or 0

    def feed(self, samples: Iterable[Tuple[int, float]]) -> List[Interval]:
        """Integrate one read of the ring; returns the intervals integrated, oldest first."""
        last = self.last_ts
        new = sorted({int(ts): float(v) for ts, v in samples if last is None or ts > last}.items())
        if not new:
            return []
        for (a, _), (b, _) in zip(new, new[1:]):
            self._intervals.append(b - a)
        if self._intervals:
            self._period = _median(self._intervals)
        if last is None:  # baseline
            self.last_ts = new[-1][0]
            return []
        out: List[Interval] = []
        prev = last
        for i, (ts, pct) in enumerate(new):
            start = prev
            if i == 0 and ts - prev > self.loss_factor * self._period:
                self.lost += max(1, int(round((ts - prev) / self._period)) - 1)
                self._in_gap = False
                self._prev_idle_us = 0.0
                start = max(prev, int(round(ts - self._period)))
            self._integrate(start, ts, pct, out)
            prev = ts
        self.last_ts = prev
        return out

    def _integrate(self, start: int, end: int, pct: float, out: List[Interval]) -> None:
        span = end - start
        ratio = min(1.0, max(0.0, pct / 100.0))
        self.busy_s += span * ratio / 1e6
        self.sampled_s += span / 1e6
        self.samples += 1
        out.append((start, end, ratio))
        if ratio <= self.busy_threshold:
            if not self._in_gap:
                self._in_gap = True
                self._gap_us = self._prev_idle_us
                self._gap_start = start - self._prev_idle_us
            self._gap_us += span
            return
        idle_part = (1.0 - ratio) * span
        if self._in_gap:
            self.gaps.observe((self._gap_us + idle_part) / 1e6)
            if self.on_gap is not None:
                self.on_gap(self._gap_start, self._gap_start + self._gap_us + idle_part)
            self._in_gap = False
            self._prev_idle_us = 0.0  # already attributed to the gap it closed
        else:
            self._prev_idle_us = idle_part


def _median(values) -> float:
    """The median (statistics.median's, without importing statistics: fractions and decimal, half a MiB of
    an idle agent's memory)."""
    v = sorted(values)
    n = len(v)
    return float(v[n // 2]) if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2.0
