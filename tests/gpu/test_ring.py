"""The utilization ring through the real backend and source, against ground-truth timelines."""
from __future__ import annotations

import random

import pytest

from agent.gpu.ring import DEFAULT_GAP_BUCKETS, UtilRing
from tests.gpu.conftest import MONO_OFFSET_NS, make_source
from tests.gpu.fake_pynvml import FakeGpu, FakeNvml, Timeline

P = 166_667  # µs, the fake driver's sample period
T0 = 1_700_000_000_000_000


def _fake(timeline, capacity=100, **kw):
    return FakeNvml([FakeGpu(0, timeline=timeline, period_us=P, ring_start_us=T0 - 200 * P)],
                    now_us=T0, ring_capacity=capacity, **kw)


def _grid_samples(start_us, end_us):
    """Number of driver samples with a timestamp in (start, end]."""
    return (end_us - T0) // P - (start_us - T0) // P


def test_ring_reads_every_sample_once_across_irregular_polls():
    tl = Timeline([(T0 + 3_000_000 * k, T0 + 3_000_000 * k + 1_700_000) for k in range(-10, 40)])
    fake = _fake(tl)
    src = make_source(fake)
    src.collect()  # baseline: the ring's backlog predates us
    baseline = src.devices[0].ring.last_ts
    rng = random.Random(3)
    for _ in range(60):
        fake.advance(rng.uniform(0.05, 2.5))  # always well inside the 16.7 s the ring holds
        src.collect()
    g = src.collect().gpu("0")
    last = src.devices[0].ring.last_ts
    assert g.samples_lost == 0
    assert src.devices[0].ring.samples == _grid_samples(baseline, last)
    assert g.sampled_seconds == pytest.approx((last - baseline) / 1e6, abs=1e-9)
    truth = tl.busy_us(baseline, last) / 1e6
    assert g.busy_seconds == pytest.approx(truth, rel=0.01)


def test_a_driver_returning_the_last_seen_sample_again_is_not_double_counted():
    tl = Timeline([(T0 - 10_000_000, T0 + 100_000_000)])  # always busy
    fake = _fake(tl)
    fake.samples_inclusive = True  # returns the sample AT lastSeenTimeStamp too
    src = make_source(fake)
    src.collect()
    baseline = src.devices[0].ring.last_ts
    for _ in range(20):
        fake.advance(1.0)
        src.collect()
    g = src.collect().gpu("0")
    last = src.devices[0].ring.last_ts
    assert src.devices[0].ring.samples == _grid_samples(baseline, last)
    assert g.busy_seconds == pytest.approx((last - baseline) / 1e6)
    assert g.sampled_seconds == pytest.approx((last - baseline) / 1e6)


def test_no_new_sample_is_notfound_and_counts_nothing():
    fake = _fake(Timeline([(T0 - 10_000_000, T0 + 100_000_000)]))
    src = make_source(fake)
    src.collect()
    fake.advance(0.05)  # shorter than one sample period: NVML answers NotFound
    g = src.collect().gpu("0")
    assert (g.sampled_seconds, g.busy_seconds, g.samples_lost) == (0.0, 0.0, 0.0)
    assert fake.calls["nvmlDeviceGetSamples"] == 2


def test_ring_overrun_is_detected_and_counted():
    fake = _fake(Timeline([(T0 - 10_000_000, T0 + 100_000_000)]), capacity=100)
    src = make_source(fake)
    src.collect()
    fake.advance(1.0)
    before = src.collect().gpu("0")
    assert before.samples_lost == 0
    last = src.devices[0].ring.last_ts
    fake.advance(30.0)  # 180 samples produced, the ring keeps 100: 80 lost
    after = src.collect().gpu("0")
    assert after.samples_lost == 80
    # the 100 samples still in the ring are integrated (the first over one period), the hole is not
    assert after.sampled_seconds - before.sampled_seconds == pytest.approx(100 * P / 1e6, rel=1e-6)
    assert after.busy_seconds - before.busy_seconds == pytest.approx(100 * P / 1e6, rel=1e-6)
    fake.advance(1.0)
    assert src.collect().gpu("0").samples_lost == 80  # no loss afterwards
    assert src.devices[0].ring.last_ts > last


def _random_timeline(rng, start, seconds):
    """Busy stretches of 0.2-3 s and idle gaps that are either < 1 period (invisible) or >= 2 periods,
    kept at least 50 ms away from every histogram bucket bound."""
    busy, gaps, t = [], [], start
    end = start + int(seconds * 1e6)
    while t < end:
        b = int(rng.uniform(0.2, 3.0) * 1e6)
        busy.append((t, t + b))
        t += b
        while True:
            u = rng.random()
            if u < 0.25:
                g = rng.uniform(0.02, 0.15)  # < one sample period
            elif u < 0.85:
                g = 10 ** rng.uniform(-0.45, 0.6)  # 0.35 s .. 4 s
            else:
                g = 10 ** rng.uniform(0.6, 1.6)  # 4 s .. 40 s
            if all(abs(g - bound) > 0.05 for bound in DEFAULT_GAP_BUCKETS):
                break
        gaps.append((t, t + int(g * 1e6)))
        t += int(g * 1e6)
    return Timeline(busy), gaps


@pytest.mark.parametrize("seed", [1, 2])
def test_idle_gaps_and_busy_time_match_ground_truth(seed):
    rng = random.Random(seed)
    start = T0 - 25 * P + rng.randrange(P)  # gaps are not aligned with the sample grid
    tl, gaps = _random_timeline(rng, start, 400)
    fake = _fake(tl)
    src = make_source(fake)
    src.collect()
    ring = src.devices[0].ring
    baseline = ring.last_ts
    seen = []
    ring.on_gap = lambda a, b: seen.append((a, b))
    for _ in range(400):
        fake.advance(1.0)
        src.collect()
    g = src.collect().gpu("0")
    last = ring.last_ts
    # ground truth: gaps of >= 2 sample periods that lie inside the integrated window
    truth = [(a, b) for a, b in gaps if b - a >= 2 * P and a > baseline + P and b < last - P]
    assert len(truth) > 40
    matched = [any(abs(a - sa) < 20_000 and abs(b - sb) < 20_000 for sa, sb in seen) for a, b in truth]
    recall = sum(matched) / len(truth)
    assert recall >= 0.95
    # the histogram counts per bucket are those of the true gap lengths (gaps < 1 period are invisible)
    hist = dict(g.idle_gaps.buckets)
    for le in DEFAULT_GAP_BUCKETS:
        assert hist[le] == sum(1 for a, b in truth if (b - a) / 1e6 <= le), le
    assert hist[float("inf")] == len(truth)
    assert g.idle_gaps.sum == pytest.approx(sum(b - a for a, b in truth) / 1e6, abs=0.01 * len(truth))
    # busy time within 1 % of the truth over the same window
    assert g.busy_seconds == pytest.approx(tl.busy_us(baseline, last) / 1e6, rel=0.01)
    assert g.sampled_seconds == pytest.approx((last - baseline) / 1e6)


def test_timeline_published_to_the_context_matches_the_truth():
    rng = random.Random(7)
    tl, _ = _random_timeline(rng, T0 - 25 * P + 12_345, 120)
    fake = _fake(tl)
    src = make_source(fake)
    src.collect()
    baseline = src.devices[0].ring.last_ts
    for _ in range(100):
        fake.advance(1.0)
        src.collect()
    last = src.devices[0].ring.last_ts
    got = src.ctx.timeline.window("0", 0, 1 << 62)
    assert len(got) == _grid_samples(baseline, last)
    # CLOCK_MONOTONIC ns = wall µs * 1000 - (wall - monotonic) offset, contiguous, one per driver sample
    assert got[0].start_ns == baseline * 1000 - MONO_OFFSET_NS
    assert got[-1].end_ns == last * 1000 - MONO_OFFSET_NS
    for prev, cur in zip(got, got[1:]):
        assert cur.start_ns == prev.end_ns
    for s in got:
        a, b = (s.start_ns + MONO_OFFSET_NS) // 1000, (s.end_ns + MONO_OFFSET_NS) // 1000
        assert s.busy == pytest.approx(tl.busy_us(a, b) / (b - a), abs=0.005 + 1e-9)
    total = sum((s.end_ns - s.start_ns) / 1e9 * s.busy for s in got)
    assert total == pytest.approx(src.collect().gpu("0").busy_seconds, rel=1e-9)


def test_ring_unit_rules():
    r = UtilRing(busy_threshold=0.0, nominal_period_us=100)
    assert r.feed([(1000, 50)]) == []  # baseline
    out = r.feed([(1100, 100), (1200, 0), (1300, 0), (1400, 40), (1400, 40)])
    assert out == [(1000, 1100, 1.0), (1100, 1200, 0.0), (1200, 1300, 0.0), (1300, 1400, 0.4)]
    # the gap: two idle periods plus the idle 60 % of the closing sample
    assert r.gaps.count == 1 and r.gaps.sum == pytest.approx(260e-6)
    assert r.busy_s == pytest.approx(140e-6) and r.sampled_s == pytest.approx(400e-6)
    assert r.feed([(1300, 0), (1400, 40)]) == []  # already seen: dropped
    r.feed([(1800, 100)])  # 3 samples missing between 1400 and 1800
    assert r.lost == 3 and r.sampled_s == pytest.approx(500e-6)
