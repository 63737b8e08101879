"""The GPU collector's pace (issue 38): the driver's utilization ring read as rarely as its depth allows,
faster while training jobs wait for its samples, and no sample lost at the defaults' cadence.

Each test drives the source the way the sampler does: after every poll it asks ``next_interval_s`` for
the wait until the next one, with the embedded default ``collectors.gpu.interval_seconds``; the ring
model (replay or fake) drops what a real ring would drop, so a lost sample shows in
``teye_gpu_samples_lost_total`` and in the integrated seconds (the oracle: the trace's own truth)."""
from __future__ import annotations

import os

import pytest

from agent.config import defaults
from agent.context import AgentContext
from agent.gpu.replay import Replay
from agent.gpu.source import MIN_RING_INTERVAL_S, GpuSource
from tests.gpu.conftest import GPU_DATA, GPU_PROCFS, TRACE_8GPU, make_source
from tests.gpu.fake_pynvml import FakeGpu, FakeNvml, Timeline

CFG = defaults()
DEFAULT_S = CFG["collectors"]["gpu"]["interval_seconds"]
WAITING_S = CFG["gpu"]["waiting_interval_seconds"]


def _replay(path):
    now = [5_000_000_000_000_000]
    rp = Replay.load(path, wall_us=lambda: now[0], sleep=lambda s: None)
    src = GpuSource(lambda: rp, procfs=GPU_PROCFS, ctx=AgentContext(clock=lambda: now[0] * 1000 - 10 ** 18),
                    wall_ns=lambda: now[0] * 1000, events=False, waiting_interval_seconds=WAITING_S)
    return src, now, rp


def _drive(src, now, seconds):
    """Poll as the sampler does for `seconds`; (the intervals used, each GPU's baseline sample µs)."""
    used = []
    start = now[0]
    src.collect()
    base = {d.label: d.ring.last_ts for d in src.devices}
    while now[0] - start < seconds * 1e6:
        iv = src.next_interval_s(DEFAULT_S)
        used.append(iv)
        now[0] += int(iv * 1e6)
        src.collect()
    return used, base


def test_the_defaults_read_the_ring_every_5_s_and_lose_no_sample_of_the_8gpu_replay():
    assert DEFAULT_S == 5.0 and WAITING_S == 1.0
    src, now, rp = _replay(TRACE_8GPU)
    t = rp.header["truth"]
    used, base = _drive(src, now, 2 * rp.duration_us / 1e6)     # two loops of the 90 s trace
    assert used[0] == WAITING_S                                  # after the baseline read: see the last test
    assert set(used[1:]) == {5.0}                                # the 100-sample ring (16.7 s) allows 5 s
    r = src.collect()
    for dev in src.devices:
        g = r.gpu(dev.label)
        assert g.samples_lost == 0, dev.label
        elapsed = (dev.ring.last_ts - base[dev.label]) / 1e6     # replay seconds integrated, no hole
        assert g.sampled_seconds == pytest.approx(elapsed, abs=1e-3)
        loops = elapsed / (rp.duration_us / 1e6)
        assert 2.0 <= loops < 2.1
        # busy seconds: two whole loops of the truth plus the start of the third, within the first sample
        assert g.busy_seconds >= 2 * t[dev.label]["busy_s"] - 0.2, dev.label


def test_the_h100_recording_is_read_every_5_s_without_loss():
    src, now, rp = _replay(os.path.join(GPU_DATA, "h100-duty.jsonl"))
    used, base = _drive(src, now, rp.duration_us / 1e6)
    d = src.devices[0]
    assert d.ring_span_s > 10.0                                  # its first read showed 71 samples over 14 s
    assert used[0] == WAITING_S and set(used[1:]) == {5.0}
    g = src.collect().gpu("0")
    assert g.samples_lost == 0
    assert g.sampled_seconds == pytest.approx((d.ring.last_ts - base["0"]) / 1e6, abs=1e-3)


def test_a_shallow_ring_is_read_at_half_its_depth_and_loses_nothing_where_5_s_would():
    period = 166_667
    t0 = 1_700_000_000_000_000
    busy = Timeline([(t0 + k * 700_000, t0 + k * 700_000 + 300_000) for k in range(-50, 200)])

    def fake(capacity):
        return FakeNvml([FakeGpu(0, timeline=busy, period_us=period, ring_start_us=t0 - 40 * period)],
                        now_us=t0, ring_capacity=capacity)

    # 24 samples (4 s): the first read shows 3.8 s, so the ring is read every 1.9 s
    f = fake(24)
    src = make_source(f)
    src.collect()
    used = []
    for _ in range(40):
        iv = src.next_interval_s(DEFAULT_S)
        used.append(iv)
        f.advance(iv)
        g = src.collect().gpu("0")
    assert used == [WAITING_S] + [pytest.approx(0.5 * 23 * period / 1e6)] * 39
    assert g.samples_lost == 0
    assert g.busy_seconds == pytest.approx(busy.busy_us(src.devices[0].ring.last_ts - int(sum(used) * 1e6),
                                                        src.devices[0].ring.last_ts) / 1e6, abs=0.05)
    # the same ring read every 5 s (the configured interval, no cap) loses what the cap saved
    f = fake(24)
    src = make_source(f)
    src.collect()
    for _ in range(10):
        f.advance(DEFAULT_S)
        g = src.collect().gpu("0")
    assert g.samples_lost > 0
    # a ring that shows only a short backlog (a driver just loaded) is never read more often than 1 s for it
    f = fake(3)
    src = make_source(f)
    src.collect()
    f.advance(1.0)
    src.collect()
    assert src.next_interval_s(DEFAULT_S) == MIN_RING_INTERVAL_S


def test_the_ring_is_read_every_second_while_phase_intervals_wait_for_its_samples():
    src, now, rp = _replay(TRACE_8GPU)
    src.collect()
    # the first read is a baseline that puts nothing on the timeline: until the next one the phase path would
    # not know the GPUs are sampled and would credit a starting job's intervals to none, so it comes soon
    assert src.ctx.timeline.gpus() == [] and src.next_interval_s(DEFAULT_S) == WAITING_S
    now[0] += 1_000_000
    src.collect()
    assert len(src.ctx.timeline.gpus()) == 8
    assert src.next_interval_s(DEFAULT_S) == 5.0                 # no job waits
    src.ctx.timeline.covered_until("0")                          # the phase path asks: an interval waits
    assert src.next_interval_s(DEFAULT_S) == WAITING_S
    assert src.next_interval_s(DEFAULT_S) == 5.0                 # nobody asked since the last poll
    src.ctx.timeline.covered_until("3")
    assert src.next_interval_s(0.25) == 0.25                     # `teye profile`'s faster pace is kept
