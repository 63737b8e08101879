"""The GPU collector (over the fake NVML driver) feeds the phase attribution: known overlaps, end to end.

The fake driver's ground truth is a set of busy intervals on the CPU wall clock; the GPU
source reads its utilization ring, maps it to CLOCK_MONOTONIC and publishes the samples;
the job table receives the phases *before* the samples that cover them (as in the agent,
where the ring is read once a second) and credits the idle time once they arrive.
"""
from __future__ import annotations

import os

import pytest

from agent.context import AgentContext
from agent.gpu.source import GpuSource
from agent.phases.jobs import JobTable
from agent.phases.protocol import encode
from tests.gpu.fake_pynvml import FakeGpu, FakeNvml, Timeline
from tests.phases.helpers import MS, S, phases_cfg

MONO_OFFSET_NS = 1_699_000_000_000_000_000  # the simulated CLOCK_MONOTONIC runs this far behind the wall clock
START_US = 1_700_000_000_000_000
PERIOD_US = 100_000                          # one driver sample every 100 ms


def _mono(wall_us: int) -> int:
    return wall_us * 1000 - MONO_OFFSET_NS


def _run(steps, step_plan, pid, steps_only=None):
    """Simulate `steps` training steps; step_plan(t_us) -> [(phase, start_us, end_us, busy_us_list)].
    ``steps_only``: the job sends its steps and no phases, from that source (its first datagram's src)."""
    busy = []
    plan = []
    t = START_US + 2 * PERIOD_US
    for _ in range(steps):
        phases = step_plan(t)
        for name, a, b, busy_ivs in phases:
            busy.extend(busy_ivs)
        plan.append((t, phases))
        t = phases[-1][2]
    gpu = FakeGpu(0, timeline=Timeline(busy), period_us=PERIOD_US, ring_start_us=START_US)
    gpu.processes = [(pid, 2 * 1024 ** 3)]
    fake = FakeNvml([gpu], now_us=START_US + PERIOD_US)
    ctx = AgentContext(clock=lambda: fake.now_us * 1000 - MONO_OFFSET_NS)
    src = GpuSource(lambda: fake, ctx=ctx, wall_ns=lambda: fake.now_us * 1000, procfs="/proc", events=False,
                    gpm=False)
    table = JobTable(phases_cfg(attribution_max_delay_seconds=30.0), ctx, own_uid=0)
    src.collect()  # baseline read of the ring; the process list tells which GPU the pid holds
    assert ctx.gpu_pids.get(pid) == frozenset({"0"})
    next_poll = fake.now_us + 1_000_000
    for t0, phases in plan:
        end = phases[-1][2]
        while next_poll <= end:  # the GPU collector polls once a second of simulated time
            fake.now_us = next_poll
            src.collect()
            table.attribute(ctx.clock())
            next_poll += 1_000_000
        fake.now_us = end
        if steps_only:
            msg = encode("sim", [], [(_mono(t0), _mono(end), 0)])
            if t0 == plan[0][0]:
                msg = msg[:-1] + b',"src":"%s"}' % steps_only.encode()
        else:
            msg = encode("sim", [(n, _mono(a), _mono(b)) for n, a, b, _ in phases], [(_mono(t0), _mono(end), 32)])
        assert table.handle(msg, pid, 0) == "accepted"
    for _ in range(3):  # the last samples arrive after the last phases
        fake.now_us = next_poll
        src.collect()
        table.attribute(ctx.clock())
        next_poll += 1_000_000
    views, _, attributed, pending = table.views(ctx.clock())
    src.close()
    return views[0], dict(attributed), pending


def test_idle_during_data_wait_and_half_busy_host_step():
    """Per step: data_wait 300 ms (GPU idle), compute 500 ms (busy), host 100 ms (busy for the first 50 ms).

    Phase boundaries fall on sample boundaries, so the driver samples resolve them exactly:
    idle in data_wait = 0.3 s, in compute = 0, in host = 0.05 s per step.
    """
    def plan(t):
        return [("data_wait", t, t + 300_000, []),
                ("compute", t + 300_000, t + 800_000, [(t + 300_000, t + 800_000)]),
                ("host", t + 800_000, t + 900_000, [(t + 800_000, t + 850_000)])]

    job, attributed, pending = _run(20, plan, os.getpid())
    idle = {(g, p): s for g, p, s in job.gpu_idle_seconds}
    assert idle[("0", "data_wait")] == pytest.approx(20 * 0.300, rel=0.05)
    assert idle[("0", "compute")] == pytest.approx(0.0, abs=0.05)
    assert idle[("0", "host")] == pytest.approx(20 * 0.050, rel=0.05)
    assert pending == 0 and attributed["late"] == 0 and attributed["complete"] == 20 * 4
    assert job.gpu_idle_ratio == pytest.approx(7.0 / 18.0, rel=0.05)
    assert job.verdict.kind == "input"


@pytest.mark.parametrize("source", ["tf-steps", "torch-steps"])
def test_steps_only_job_is_judged_by_its_gpus_never_by_a_guess(source):
    """Steps only (the input wait is not observed): the GPU idles 400 ms of each 1 s step (an input wait teye
    cannot see) -> idle, with the idle share the samples show; the GPU busy through each step -> compute."""
    def waits(t):
        return [("compute", t, t + 1_000_000, [(t + 400_000, t + 1_000_000)])]

    def busy(t):
        return [("compute", t, t + 1_000_000, [(t, t + 1_000_000)])]

    job, _, pending = _run(12, waits, os.getpid(), steps_only=source)
    assert (job.source, job.steps, job.phase_seconds, job.input_bound_ratio) == (source, 12, (), None)
    assert pending == 0 and job.gpu_idle_ratio == pytest.approx(0.4, abs=0.02)
    assert job.verdict.kind == "idle" and "input wait not observed" in job.verdict.evidence
    job, _, _ = _run(12, busy, os.getpid(), steps_only=source)
    assert job.gpu_idle_ratio == pytest.approx(0.0, abs=0.02)
    assert job.verdict.kind == "compute" and "the GPU is the limit" in job.verdict.evidence


def test_misaligned_phases_match_the_sample_level_truth():
    """Phases of 130/170/40 ms that do not line up with the 100 ms samples.

    The truth at driver resolution: each sample's idle fraction (from the fake's busy
    intervals, rounded to the percent the driver reports) times its overlap with each phase.
    """
    def plan(t):
        return [("data_wait", t, t + 130_000, []),
                ("compute", t + 130_000, t + 300_000, [(t + 140_000, t + 300_000)]),
                ("communication", t + 300_000, t + 340_000, [])]

    pid = os.getpid()
    job, attributed, _ = _run(25, plan, pid)
    # Rebuild the truth independently from the busy intervals, sample by sample.
    busy, t = [], START_US + 2 * PERIOD_US
    phases = []
    for _ in range(25):
        for name, a, b, ivs in plan(t):
            busy.extend(ivs)
            phases.append((name, a, b))
        t = phases[-1][2]
    tl = Timeline(busy)
    truth = {}
    for name, a, b in phases:
        s = (a - START_US) // PERIOD_US
        while START_US + s * PERIOD_US < b:
            lo, hi = START_US + s * PERIOD_US, START_US + (s + 1) * PERIOD_US
            pct = round(100.0 * tl.busy_us(lo, hi) / PERIOD_US)
            ov = max(0, min(b, hi) - max(a, lo))
            truth[name] = truth.get(name, 0.0) + (1 - pct / 100.0) * ov / 1e6
            s += 1
    idle = {p: v for g, p, v in job.gpu_idle_seconds}
    for name in ("data_wait", "compute", "communication"):
        assert idle[name] == pytest.approx(truth[name], rel=0.05), name
    # and the physical truth is close too: data_wait and communication are fully idle
    assert idle["data_wait"] + idle["communication"] + idle["compute"] == pytest.approx(
        25 * (0.130 + 0.010 + 0.040), rel=0.05)


TRACE_8GPU = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "gpu",
                          "synthetic-8gpu.jsonl")


def test_replayed_8gpu_trace_faceNet_case():
    """The synthetic 8-GPU trace, replayed on a simulated clock: GPU 0 runs a step busy [k, k+0.6) s every
    second and idles 0.4 s before the next one (the FaceNet case); its process is pid 41000.

    A job reporting compute [k, k+0.6) and data_wait [k+0.6, k+1) from that pid: the GPU idle time
    per phase matches a brute-force integration of the replayed samples, and the total matches the
    trace's ground truth (0.4 s idle per step); the verdict is input.
    """
    from agent.gpu.replay import Replay
    from tests.phases.helpers import oracle_idle

    wall = [START_US * 1000]
    replay = Replay.load(TRACE_8GPU, wall_us=lambda: wall[0] // 1000, sleep=lambda s: None)
    ctx = AgentContext(clock=lambda: wall[0] - MONO_OFFSET_NS)
    src = GpuSource(lambda: replay, ctx=ctx, wall_ns=lambda: wall[0], procfs="/proc", events=False, gpm=False)
    src.collect()                       # nvmlInit: trace time 0 is now
    t0 = ctx.clock()
    table = JobTable(phases_cfg(), ctx, own_uid=0)
    phases = []
    wall[0] += S
    for k in range(1, 31):              # steps 1..30 (the trace's checkpoint gap starts at step 40)
        src.collect()                   # the GPU collector's once-a-second read ...
        table.attribute(ctx.clock())
        wall[0] += S                    # ... step k runs [k, k+1) s and reports when it ends,
        step = [("compute", t0 + k * S, t0 + k * S + 600 * MS), ("data_wait", t0 + k * S + 600 * MS, t0 + (k + 1) * S)]
        phases.extend(step)             # before the samples covering it have been read
        assert table.handle(encode("facenet", step, [(t0 + k * S, t0 + (k + 1) * S, 64)]), 41000, 0) == "accepted"
    assert ctx.gpu_pids.get(41000) == frozenset({"0"})  # the replayed NVML process list
    views, _, attributed, pending = table.views(ctx.clock())
    assert pending > 0                  # the last step still waits for its samples
    for _ in range(2):
        wall[0] += S
        src.collect()
        table.attribute(ctx.clock())
    (job,), _, attributed, pending = table.views(ctx.clock())
    assert pending == 0 and dict(attributed)["late"] == 0
    samples = ctx.timeline.window("0", phases[0][1], phases[-1][2])
    want = oracle_idle(samples, phases)
    idle = {p: s for g, p, s in job.gpu_idle_seconds if g == "0"}
    for name in ("compute", "data_wait"):
        assert idle[name] == pytest.approx(want[name], rel=0.05), (name, idle, want)
    assert idle["compute"] + idle["data_wait"] == pytest.approx(30 * 0.4, rel=0.05)   # the trace's truth
    assert idle["data_wait"] > 0.8 * 30 * 0.4                       # most of it falls in data_wait
    assert job.verdict.kind == "input"
