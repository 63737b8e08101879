"""The step's parts, zero-code (issue 45): unmodified PyTorch scripts with known costs (tests/client/
torch_parts.py: a module whose forward sleeps, an autograd Function whose backward sleeps, an optimizer whose
step sleeps) under `teye run` beside a live agent.  The oracle is the script's own perf_counter around its own
calls to model(x), loss.backward() and opt.step(); each part's share of compute must be within 5 points of
the script's, the parts add up to the compute, and the job's output and exit status are what they are
without teye."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from teye_client.reporter import BACKSTOP_NS
from tests import reference
from tests.client.helpers import HERE, LiveAgent, base_env, last_json, teye_run
from tests.procs import REPO, free_port

pytestmark = pytest.mark.measures("each part of the step against the script's own perf_counter")

torch = pytest.importorskip("torch", reason="the torch extra (./dev.sh test installs it)")

SCRIPT = os.path.join(HERE, "torch_parts.py")
STEPS = 40
PARTS = ("forward", "backward", "optimizer", "h2d_copy", "other")
MODES = ["plain", "hooks", "eval", "accum", "gan", "raise"]

# the jobs without teye, whose losses and output the runs under teye must keep (tests/reference.py)
BARE = {mode: reference.Bare(f"parts-{mode}", [sys.executable, SCRIPT, mode, str(STEPS)],
                             {"OMP_NUM_THREADS": "1"}) for mode in MODES}
BARE["custom"] = reference.Bare("parts-custom", [sys.executable, SCRIPT, "custom", "12"])
BARE["fork"] = reference.Bare("parts-fork", [sys.executable, os.path.join(HERE, "torch_small.py"), "6", "fork"])


def _own_shares(own, steps=STEPS):
    """The script's own shares of its compute.  Its clock around opt.step() also holds teye's first-step set-up
    (the reporter is made in the optimizer's post hook at the first step: teye's one-time cost, in the compute
    of both clocks, which teye counts as other, not optimizer): the optimizer's own figure is its other steps'
    mean times the steps."""
    opt = own["optimizer_rest"] * steps / (steps - 1)
    c = own["compute"]
    sh = {"forward": own["forward"] / c, "backward": own["backward"] / c, "optimizer": opt / c, "h2d_copy": 0.0}
    sh["other"] = 1 - sum(sh.values())
    return sh


def _teye_shares(parts, compute):
    return {p: s / compute for p, s in parts}


def _losses(out):
    return [line for line in out.splitlines() if line.startswith("step ")]


@pytest.mark.parametrize("mode", MODES)
def test_each_part_within_5_points_of_the_scripts_own_clock(agent, mode):
    job = "parts-" + mode
    run = teye_run(BARE[mode].args, socket_path=agent.path, job=job, env=base_env(OMP_NUM_THREADS="1"), timeout=300)
    assert run.returncode == 0, run.stderr
    own = last_json(run.stdout)
    j = agent.jobs()[job]
    # gan: the critic's optimizer steps every other iteration, so the step teye counts (the optimizer that steps
    # least: docs/zero-code.md "Several optimizers", issue 47) is two of the script's iterations
    assert (j.steps, j.source) == (STEPS // 2 if mode == "gan" else STEPS, "torch")
    compute = dict(j.phase_seconds)["compute"]
    parts = j.inside.part_seconds
    assert [p for p, _s in parts] == list(PARTS)
    assert sum(s for _p, s in parts) == pytest.approx(compute, rel=1e-9)          # they add up to compute
    assert all(s >= 0 for _p, s in parts)
    got, truth = _teye_shares(parts, compute), _own_shares(own)
    print(mode, {p: round(100 * got[p], 1) for p in PARTS}, {p: round(100 * truth[p], 1) for p in PARTS})
    for p in PARTS:
        assert got[p] == pytest.approx(truth[p], abs=0.05), (p, got, truth)
    assert got["forward"] > 0.15 and got["backward"] > 0.2 and got["optimizer"] > 0.1   # the branches were taken
    # the forward was timed through hooks on the model alone after the first steps (_torch._Forwards), not
    # through PyTorch's global module hooks (each module call's slow path): the shares above hold with them
    assert own["global_forward_hooks"] == 0, own
    # the job's own output is what it is without teye: same losses bit for bit, same status, nothing from teye
    bare = BARE[mode].result()
    assert bare.returncode == 0
    assert _losses(run.stdout) == _losses(bare.stdout) and len(_losses(run.stdout)) == STEPS
    assert "teye" not in run.stderr


def test_an_optimizer_of_its_own_class_has_no_steps_and_the_job_is_unchanged(agent):
    """An optimizer that is not torch.optim's: PyTorch's hooks never see its steps, so teye sees none (no job,
    no part); the script's losses and status are its own."""
    run = teye_run(BARE["custom"].args, socket_path=agent.path, job="parts-custom", timeout=300)
    bare = BARE["custom"].result()
    assert run.returncode == bare.returncode == 0, run.stderr
    assert _losses(run.stdout) == _losses(bare.stdout) and len(_losses(bare.stdout)) == 12
    assert "parts-custom" not in agent.jobs()


def test_a_process_that_forks_sends_no_part_above_its_compute(agent):
    """torch_small.py fork: the parent forks after its steps, the child trains 2 steps and exits: each
    process's parts are its own, and the job's add up to its compute."""
    run = teye_run(BARE["fork"].args, socket_path=agent.path, job="parts-fork", timeout=300)
    bare = BARE["fork"].result()
    assert run.returncode == bare.returncode == 0, run.stderr
    assert run.stdout == bare.stdout
    j = agent.jobs()["parts-fork"]
    assert j.steps == 14 and j.processes == 2
    parts = dict(j.inside.part_seconds)
    assert sum(parts.values()) == pytest.approx(dict(j.phase_seconds)["compute"], rel=1e-9)
    assert parts["forward"] > 0 and parts["backward"] > 0 and parts["optimizer"] > 0
    for p in j.inside.processes:
        assert sum(s for _n, s in p.part_seconds) > 0


def test_ddp_two_ranks_parts_per_rank_and_the_exchange_still_carved_out(sockdir):
    """DDP, gloo, 2 ranks under torchrun: rank 1's forward takes 12 ms longer, so rank 0 waits for it inside
    its backward.  Per rank, forward and optimizer within 5 points of the rank's own clock, and backward plus
    communication within 5 points of its own backward (the exposed exchange is communication, not backward);
    rank 0's communication is most of rank 1's extra forward."""
    agent = LiveAgent(sockdir)
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
           SCRIPT, "ddp", str(STEPS)]
    try:
        run = teye_run(cmd, socket_path=agent.path, job="parts-ddp", env=base_env(OMP_NUM_THREADS="1"), timeout=300)
        jobs = agent.jobs()
    finally:
        agent.close()
    assert run.returncode == 0, run.stderr[-3000:]
    own = {o["rank"]: o for o in (json.loads(line) for line in run.stdout.splitlines() if line.startswith("{"))}
    j = jobs["parts-ddp"]
    assert sorted(r.rank for r in j.ranks) == [0, 1]
    for r in j.ranks:
        ins = [p for p in j.inside.processes if p.rank == r.rank][0]
        phases = dict(r.phase_seconds)
        parts = dict(ins.part_seconds)
        assert sum(parts.values()) == pytest.approx(phases["compute"], rel=1e-9)
        # the rank's step less its input wait: compute + communication, as the script's compute
        c = phases["compute"] + phases.get("communication", 0.0)
        truth = _own_shares(own[r.rank])
        got = {p: parts[p] / c for p in parts}
        comm = phases.get("communication", 0.0) / c
        print("rank", r.rank, {p: round(100 * got[p], 1) for p in PARTS}, "comm", round(100 * comm, 1),
              {p: round(100 * truth[p], 1) for p in PARTS})
        assert got["forward"] == pytest.approx(truth["forward"], abs=0.05)
        assert got["optimizer"] == pytest.approx(truth["optimizer"], abs=0.05)
        assert got["backward"] + comm == pytest.approx(truth["backward"], abs=0.05)
        if r.rank == 0:
            assert comm > 0.15, comm        # it waits ~12 ms of a ~33 ms step for rank 1
            assert got["backward"] < truth["backward"] - 0.1


def _memory(agent, job):
    reading = agent.src.collect(force=True)
    (m,) = [m for m in reading.memory if m.train_job == job]
    (j,) = [j for j in reading.jobs if j.train_job == job]
    return m.total("host_resident"), j.steps


@pytest.mark.parametrize("mode,per_step", [("leak", 4_000_000), ("cache", 0), ("saw", 0)])
def test_the_memory_series_grows_by_what_the_loop_keeps(agent, mode, per_step):
    """A loop that keeps 4 MB a step: the resident memory the agent reads grows by 4 MB a step (within 10 %)
    between step 20 and step 60 (the script pauses there); one that filled a cache once by step 20 and a
    sawtooth that frees what it keeps every 10 steps are back where they were."""
    steps = 60
    env = base_env(OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "agent", "run", "--socket", agent.path, "--job", "mem-" + mode, "--",
           sys.executable, SCRIPT, mode, str(steps), "4000000"]
    p = subprocess.Popen(cmd, env=env, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    seen = []
    try:
        for line in p.stdout:
            if line.startswith("paused"):
                # paused, the loop records no more: its last steps go with the flush thread's backstop
                agent.jobs(settle_s=BACKSTOP_NS / 1e9 + 0.3)
                seen.append(_memory(agent, "mem-" + mode))
                p.stdin.write("\n")
                p.stdin.flush()
        assert p.wait(300) == 0
    finally:
        if p.poll() is None:
            p.kill()
    (rss0, s0), (rss1, s1) = seen
    assert (s0, s1) == (20, 60)
    growth = (rss1 - rss0) / (s1 - s0)
    print(mode, "grew", growth, "a step")
    if per_step:
        assert growth == pytest.approx(per_step, rel=0.1)
    else:
        assert growth < 0.1 * 4_000_000
