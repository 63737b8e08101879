"""A trace recorded on a real H100 (driver 580.159.04) against the host-side truth of the same run.

``benchmarks/gpu_truth.py`` drove the GPU in segments of known busy/idle pattern (fp16 matrix
products for ``busy`` ms, then ``idle`` ms with nothing queued), with 3 s of idle between
segments, while ``teye record`` wrote tests/data/gpu/h100-duty.jsonl and a live agent and
nvidia-smi watched.  h100-duty-truth.json holds the bursts as measured on the host (first launch
to the end of ``torch.cuda.synchronize()``, an upper bound on the GPU's busy time) and what the
live agent read.  Here the trace is replayed through the same backend and source as
``teye agent --gpu-replay``: the values must agree with the truth, and with the live agent.
"""
from __future__ import annotations

import bisect
import json
import os

import pytest

from agent.context import AgentContext
from agent.gpu.replay import Replay
from agent.gpu.source import GpuSource
from tests.gpu.conftest import GPU_DATA, GPU_PROCFS

TRACE = os.path.join(GPU_DATA, "h100-duty.jsonl")
TRUTH = os.path.join(GPU_DATA, "h100-duty-truth.json")
POLL_US = 250_000


@pytest.fixture(scope="module")
def run():
    """Replay the whole trace, polling every 250 ms; (truth, trace start µs, [(t µs since start, GpuReading)])."""
    with open(TRUTH, encoding="utf-8") as fh:
        truth = json.load(fh)
    now = [5_000_000_000_000_000]
    rp = Replay.load(TRACE, wall_us=lambda: now[0], sleep=lambda s: None)
    src = GpuSource(lambda: rp, procfs=GPU_PROCFS, ctx=AgentContext(clock=lambda: now[0] * 1000 - 10 ** 18),
                    wall_ns=lambda: now[0] * 1000, events=False)
    try:
        src.collect()
        wall0 = now[0]
        polls = []
        while now[0] - wall0 + POLL_US < rp.duration_us:
            now[0] += POLL_US
            polls.append((now[0] - wall0, src.collect()))
    finally:
        src.close()
    return truth, rp.header["start_unix_us"], polls


def _reading(polls, t_us):
    """The last poll at or before t_us (µs since the trace start)."""
    return polls[bisect.bisect_right([t for t, _ in polls], t_us) - 1][1]


def _at(polls, t_us):
    """GPU 0 as read by the last poll at or before t_us."""
    return _reading(polls, t_us).gpu("0")


def _around(run, seg):
    """Readings inside the idle pauses on either side of a segment (1.5 s before and after it)."""
    truth, start, polls = run
    return _at(polls, seg["start_us"] - start - 1_500_000), _at(polls, seg["end_us"] - start + 1_500_000)


def _gaps(g, lo, hi):
    """Idle gaps observed with lo < length <= hi (cumulative histogram)."""
    b = dict(g.idle_gaps.buckets)
    return b[hi] - b[lo]


def test_the_trace_is_what_the_header_and_truth_say(run):
    truth, _, polls = run
    g = polls[-1][1].gpu("0")
    assert truth["gpu"] == g.name == "NVIDIA H100 80GB HBM3"
    assert g.driver_version == "580.159.04" and g.up
    assert [s["job"] for s in truth["segments"]] == ["duty-100-0", "duty-200-300", "duty-50-50", "duty-20-180"]
    # PCIe 5.0 x16: 32 GT/s x 16 lanes x 128/130 / 8 bits
    assert g.pcie_max == pytest.approx(32e9 * 16 * 128 / 130 / 8)
    assert g.samples_lost == 0


def test_busy_seconds_agree_with_the_truth_and_with_the_live_agent(run):
    truth = run[0]
    for k, seg in enumerate(truth["segments"]):
        before, after = _around(run, seg)
        busy = after.busy_seconds - before.busy_seconds
        # The host's bursts bound the GPU's busy time from above; launches and the final
        # synchronize cost the GPU a few % of each burst (the most for 20 ms bursts).
        assert 0.85 * seg["truth_busy_s"] <= busy <= seg["truth_busy_s"], seg["job"]
        # The replay integrates the very samples the live agent integrated in that run.
        assert busy == pytest.approx(truth["observed"]["teye_agent_busy_s"][k], abs=0.002), seg["job"]
        # nvidia-smi's 1 s averages read lower still (peer figure of the same run, not asserted against)
        assert truth["observed"]["nvidia_smi_busy_s"][k] < busy


def _ring_timestamps():
    """The timestamps (µs since the trace start) of every utilization sample the driver returned."""
    ts = set()
    with open(TRACE, encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            if rec.get("fn") == "nvmlDeviceGetSamples" and "ret" in rec:
                ts.update(t for t, _ in rec["ret"]["s"])
    return sorted(ts)


def test_the_driver_samples_every_200_ms_and_no_sample_is_lost(run):
    _, _, polls = run
    ts = _ring_timestamps()
    steps = [b - a for a, b in zip(ts, ts[1:])]
    assert sorted(steps)[len(steps) // 2] == pytest.approx(200_000, abs=100)  # not the 1/6 s of older GPUs
    g = polls[-1][1].gpu("0")
    assert g.samples_lost == 0
    # every sample after the baseline (the newest one the first read saw) is integrated once, over
    # its own period: sampled time is exactly the span from the baseline to the newest sample
    baseline = max(t for t in ts if t <= 0)
    newest = max(t for t in ts if t <= polls[-1][0])
    assert g.sampled_seconds == pytest.approx((newest - baseline) / 1e6, abs=1e-6)


def test_idle_gaps_longer_than_a_sample_period_are_seen_shorter_ones_are_not(run):
    truth = run[0]
    by_job = {s["job"]: s for s in truth["segments"]}
    # 300 ms idle per 500 ms step, 200 ms samples: a sample falls wholly inside a gap in half
    # the steps (the sampling grid shifts by 100 ms per step), and the gap then measures its
    # idle sample plus the idle parts of its neighbours: about 300 ms.
    b, a = _around(run, by_job["duty-200-300"])
    steps = by_job["duty-200-300"]["steps"]
    assert 0.4 * steps <= _gaps(a, 0.25, 0.5) - _gaps(b, 0.25, 0.5) <= 0.6 * steps + 1
    assert _gaps(a, 0.1, 0.25) == _gaps(b, 0.1, 0.25)
    # 0 ms, 50 ms and 180 ms idle are shorter than a sample: no sub-second gap at all
    for job in ("duty-100-0", "duty-50-50", "duty-20-180"):
        b, a = _around(run, by_job[job])
        assert _gaps(a, 0.1, 1.0) == _gaps(b, 0.1, 1.0), job


def test_each_pause_between_segments_is_one_gap_of_its_length(run):
    truth, start, polls = run
    segs = truth["segments"]
    seen = []
    for left, right in zip(segs, segs[1:]):
        # read once the left segment's gaps have all been observed (a gap is observed when the
        # sample that ends it arrives), and again once the first burst after the pause has ended it
        b = _at(polls, left["end_us"] - start + 1_000_000)
        a = _at(polls, right["bursts"][0][1] - start + 450_000)
        assert _gaps(a, 2.5, 5.0) - _gaps(b, 2.5, 5.0) == 1
        assert a.idle_gaps.count - b.idle_gaps.count == 1
        # The truth: from the end of the last burst to the first burst after the pause (the next
        # segment's first step begins with its idle part).  The gap is its idle samples plus the
        # idle parts of the two busy samples around it, taken as contiguous with it: never shorter
        # than the truth (but for 1 % rounding of the sample values), and at most one sample
        # period longer per edge, where an edge sample also idled on the far side of its burst.
        idle = (right["bursts"][0][0] - left["bursts"][-1][1]) / 1e6
        got = a.idle_gaps.sum - b.idle_gaps.sum
        assert idle - 0.005 <= got <= idle + 2 * 0.2, (left["job"], right["job"], got, idle)
        seen.append(got - idle)
    # on average the edges add less than half a period
    assert sum(seen) / len(seen) < 0.1, seen


def test_gpm_clocks_and_power_follow_the_load(run):
    truth, start, polls = run
    mids = {s["job"]: _at(polls, (s["start_us"] + s["end_us"]) // 2 - start) for s in truth["segments"]}
    full = mids["duty-100-0"]
    gpm = dict(full.gpm)
    assert gpm["sm_active"] > 0.85 and gpm["tensor_active"] > 0.8  # fp16 matrix products run on tensor cores
    assert gpm["fp32_active"] == gpm["fp64_active"] == 0.0
    # near the 700 W cap, with the clock-event reason that says so and lowered SM clocks
    assert full.power_watts > 600 and dict(full.clock_events)["power_cap"]
    assert full.sm_clock_hz < mids["duty-20-180"].sm_clock_hz
    # SM activity is ordered like the duty cycles (100 % > 50 % > 40 % > 10 %)
    order = [dict(mids[j].gpm)["sm_active"] for j in ("duty-100-0", "duty-50-50", "duty-200-300", "duty-20-180")]
    assert order == sorted(order, reverse=True)
    idle = polls[-1][1].gpu("0")
    assert dict(idle.gpm)["sm_active"] == 0.0 and idle.power_watts < 200


def test_the_process_holding_the_gpu_is_the_workload(run):
    truth, start, polls = run
    seg = truth["segments"][0]
    held = _reading(polls, (seg["start_us"] + seg["end_us"]) // 2 - start).processes
    assert [(p.gpu, p.pid) for p in held] == [("0", truth["pid"])]
    # its fp16 operands and PyTorch's workspace: hundreds of MiB, well under the card
    assert 256 << 20 < held[0].memory_used < 4 << 30
