"""GPU idle seconds per phase against ground truth: hand-computed cases and brute-force integration."""
from __future__ import annotations

import random
from collections import deque

import pytest

from agent.context import UtilSample, UtilTimeline
from agent.phases import attribution
from agent.phases.jobs import JobTable
from agent.phases.protocol import encode
from tests.phases.helpers import MS, S, ctx_with_clock, oracle_idle, phases_cfg, random_phases, random_samples

NAMES = ("data_wait", "compute", "host", "communication")


def test_hand_computed_overlaps():
    samples = [UtilSample(0, 100 * MS, 0.25), UtilSample(100 * MS, 200 * MS, 1.0), UtilSample(200 * MS, 300 * MS, 0.0)]
    got = attribution.attribute([("data_wait", 50 * MS, 150 * MS), ("compute", 150 * MS, 250 * MS),
                                 ("host", 280 * MS, 400 * MS)], samples)
    assert got["data_wait"] == pytest.approx((0.75 * 0.050, 0.100))
    assert got["compute"] == pytest.approx((0.050, 0.100))
    # only 20 ms of the host phase is covered by samples: the uncovered 100 ms is not idle, not observed
    assert got["host"] == pytest.approx((0.020, 0.020))
    assert attribution.overlap_ns(0, 10, 10, 20) == 0
    assert attribution.idle_observed(samples, 300 * MS, 400 * MS) == (0.0, 0.0)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_random_streams_match_brute_force(seed):
    rng = random.Random(seed)
    t0, t1 = 1000 * S, 1010 * S
    samples = random_samples(rng, t0, t1, period_ns=rng.choice([20, 100, 167]) * MS)
    phases = random_phases(rng, t0 + 5 * MS, t1 - 5 * MS, NAMES)
    want = oracle_idle(samples, phases, t0, t1)
    got = attribution.attribute([(n, s, e) for n, s, e in phases], samples)
    for name in NAMES:
        assert got[name][0] == pytest.approx(want[name], rel=0.05, abs=1e-6)
        assert got[name][0] == pytest.approx(want[name], rel=1e-6, abs=1e-9)  # exact in fact


def _fill(tl: UtilTimeline, gpu: str, samples):
    for s in samples:
        tl.add(gpu, s.start_ns, s.end_ns, s.busy)


def test_incremental_samples_arrive_after_phases():
    """Phases reach the table before the GPU samples that cover them; the result still matches the oracle."""
    rng = random.Random(7)
    ctx, clock = ctx_with_clock()
    t0, t1 = 1000 * S, 1008 * S
    samples = random_samples(rng, t0, t1, 100 * MS)
    phases = random_phases(rng, t0 + 10 * MS, t1 - 10 * MS, NAMES)
    want = oracle_idle(samples, phases, t0, t1)
    ctx.gpu_pids[4242] = frozenset({"0"})
    table = JobTable(phases_cfg(attribution_max_delay_seconds=60.0), ctx, own_uid=0)

    # The GPU source has delivered only the first second so far.
    first = [s for s in samples if s.end_ns <= t0 + S]
    _fill(ctx.timeline, "0", first)
    clock.t = t1 + 100 * MS
    for i in range(0, len(phases), 10):  # one datagram per 10 phases, like a client batching
        assert table.handle(encode("job", phases[i:i + 10]), 4242, 0) == "accepted"
    table.attribute(clock())
    views, _, attributed, pending = table.views(clock())
    done = dict(attributed)["complete"]
    assert 0 < done < len(phases) and pending == len(phases) - done  # only intervals covered so far

    # The rest of the samples arrive in three late batches; attribution catches up incrementally.
    rest = samples[len(first):]
    for k in range(3):
        _fill(ctx.timeline, "0", rest[k * len(rest) // 3:(k + 1) * len(rest) // 3])
        table.attribute(clock())
    views, _, attributed, pending = table.views(clock())
    assert pending == 0 and dict(attributed) == {"complete": len(phases), "late": 0, "overflow": 0}
    got = {p: s for g, p, s in views[0].gpu_idle_seconds if g == "0"}
    for name in NAMES:
        assert got[name] == pytest.approx(want[name], rel=0.05)
        assert got[name] == pytest.approx(want[name], rel=1e-6)


def test_two_gpus_by_cuda_visible_devices_and_by_nvml():
    ctx, clock = ctx_with_clock()
    t0 = 1000 * S
    # GPU 0 idle for the first half, GPU 1 idle throughout; GPU 2 busy (not used by the job).
    for g, busy in (("0", [0.0, 1.0]), ("1", [0.0, 0.0]), ("2", [1.0, 1.0])):
        ctx.timeline.add(g, t0, t0 + 500 * MS, busy[0])
        ctx.timeline.add(g, t0 + 500 * MS, t0 + S, busy[1])
    clock.t = t0 + 2 * S
    table = JobTable(phases_cfg(), ctx, own_uid=0)
    table.attribute(clock.t)  # learns which GPUs the agent samples
    # CUDA_VISIBLE_DEVICES naming GPUs 0 and 1 plus one the agent does not know (ignored).
    table.handle(encode("a", [("data_wait", t0, t0 + 400 * MS), ("compute", t0 + 400 * MS, t0 + S)],
                        cvd="0,1,GPU-unknown"), 10, 0)
    # NVML says pid 11 holds GPU 2 (its CUDA_VISIBLE_DEVICES claim is overridden).
    ctx.gpu_pids[11] = frozenset({"2"})
    table.handle(encode("b", [("data_wait", t0, t0 + S)], cvd="0"), 11, 0)
    table.attribute(clock.t)
    views = {v.train_job: v for v in table.views(clock.t)[0]}
    a = {(g, p): s for g, p, s in views["a"].gpu_idle_seconds}
    assert a == pytest.approx({("0", "data_wait"): 0.4, ("0", "compute"): 0.1,
                               ("1", "data_wait"): 0.4, ("1", "compute"): 0.6})
    b = {(g, p): s for g, p, s in views["b"].gpu_idle_seconds}
    assert b == {("2", "data_wait"): 0.0}


def test_uncovered_intervals_wait_then_time_out():
    ctx, clock = ctx_with_clock()
    t0 = 1000 * S
    ctx.timeline.add("0", t0, t0 + 300 * MS, 0.0)  # samples stop at +300 ms (a lost GPU, a slow ring read)
    ctx.gpu_pids[5] = frozenset({"0"})
    table = JobTable(phases_cfg(attribution_max_delay_seconds=2.0), ctx, own_uid=0)
    clock.t = t0 + S
    table.handle(encode("j", [("data_wait", t0, t0 + 200 * MS), ("data_wait", t0 + 200 * MS, t0 + 600 * MS)]), 5, 0)
    table.attribute(clock.t)
    _, _, attributed, pending = table.views(clock.t)
    assert dict(attributed)["complete"] == 1 and pending == 1
    clock.t = t0 + 600 * MS + 2 * S + 1  # the second interval waited longer than the limit
    table.attribute(clock.t)
    views, _, attributed, pending = table.views(clock.t)
    assert pending == 0 and dict(attributed)["late"] == 1
    # credited with what was there: 200 ms + 100 ms covered and idle
    assert views[0].gpu_idle_seconds == (("0", "data_wait", pytest.approx(0.3)),)


def test_take_ready_stops_at_first_uncovered_interval():
    pend = deque(attribution.Pending(i, i * 10, i * 10 + 10, ("0",)) for i in range(100))
    ready, late = attribution.take_ready(pend, lambda g: 255, now_ns=300, max_delay_ns=10**9)
    assert [p.key for p in ready] == list(range(25)) and not late and len(pend) == 75
    ready, late = attribution.take_ready(pend, lambda g: 255, now_ns=300, max_delay_ns=10**9, force=True)
    assert len(ready) == 75 and len(late) == 75 and not pend


def test_pending_queue_is_bounded():
    ctx, clock = ctx_with_clock()
    ctx.gpu_pids[5] = frozenset({"0"})
    ctx.timeline.add("0", 0, 1, 0.0)
    table = JobTable(phases_cfg(max_pending_intervals=100), ctx, own_uid=0)
    t = clock.t - S
    for i in range(10):   # 500 distinct intervals (copies of one would count once: issue 39)
        table.handle(encode("j", [("compute", t + (50 * i + k) * MS, t + (50 * i + k + 1) * MS)
                                  for k in range(50)]), 5, 0)
    _, _, attributed, pending = table.views(clock.t)
    assert pending == 100 and dict(attributed)["overflow"] == 400


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_ring_read_added_at_once_is_each_sample_added_in_turn(seed):
    """UtilTimeline.add_many (one lock for a GPU's whole ring read, issue 49) leaves the timeline add() would:
    overlapping samples clipped, empty ones and those a clip empties dropped, the horizon and the bound kept,
    busy clamped to 0-1.  The oracle is add() itself, sample by sample, on random reads."""
    rng = random.Random(seed)
    one, many = UtilTimeline(horizon_s=2.0, max_samples=50), UtilTimeline(horizon_s=2.0, max_samples=50)
    t = 1000 * S
    for _ in range(40):          # reads of 0-30 samples, some overlapping the last read or each other
        batch = []
        for _ in range(rng.randrange(0, 31)):
            start = t - rng.choice([0, 0, 0, 5, 40]) * MS
            end = start + rng.choice([0, 20, 167, 200]) * MS
            batch.append((start, end, rng.uniform(-0.2, 1.2)))
            t = max(t, end)
        for gpu in ("0", "1"):
            for interval in batch:
                one.add(gpu, *interval)
            many.add_many(gpu, batch)
        t += rng.choice([0, 100, 3000]) * MS
    assert one.gpus() == many.gpus() == ["0", "1"]
    for gpu in ("0", "1"):
        assert list(one._data[gpu]) == list(many._data[gpu])
        assert len(many._data[gpu]) > 10
    clipped = UtilTimeline()
    clipped.add_many("0", [(0, 10, 0.5), (5, 20, 2.0), (15, 18, 0.1), (30, 30, 0.0)])
    assert list(clipped._data["0"]) == [UtilSample(0, 10, 0.5), UtilSample(10, 20, 1.0)]
