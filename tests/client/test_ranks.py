"""Data-parallel jobs (issue 30): real PyTorch DDP (gloo, CPU) under torchrun, 4 ranks on this node.

The oracle is each rank's own wall-clock timing, printed by the script (tests/client/torch_ddp_ranks.py):
the time it spent in next() of its DataLoader (and in its all_reduce calls) over the time of its steps."""
from __future__ import annotations

import json
import os
import sys

import pytest

from tests import reference
from tests.client.helpers import HERE, LiveAgent, base_env, teye_run
from tests.procs import free_port

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not __import__("importlib").util.find_spec("torch"),
                                 reason="the torch extra (./dev.sh test installs it)")]
SCRIPT = os.path.join(HERE, "torch_ddp_ranks.py")


def _command(nproc, steps, slow, slow_ms, mode, port):
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port", str(port),
            SCRIPT, str(steps), str(slow), str(slow_ms), mode]


# the jobs without teye, whose losses the runs under teye must keep (tests/reference.py)
BARE = {mode: reference.Bare(f"ranks-{mode}", _command(nproc, steps, slow, slow_ms, mode, reference.PORT),
                             {"OMP_NUM_THREADS": "1"}, needs="torch")
        for nproc, steps, slow, slow_ms, mode in ((4, 30, 1, 30, "allreduce"), (4, 30, 2, 60, "ddp_compute"),
                                                  (2, 20, 1, 40, "fsdp"))}


def run_ddp(sockdir, nproc, steps, slow, slow_ms, mode="ddp"):
    agent = LiveAgent(sockdir)
    try:
        r = teye_run(_command(nproc, steps, slow, slow_ms, mode, free_port()),
                     socket_path=agent.path, env=base_env(OMP_NUM_THREADS="1"), timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        own = {o["rank"]: o for o in map(json.loads, r.stdout.splitlines())}
        assert sorted(own) == list(range(nproc))
        jobs = agent.jobs()
    finally:
        agent.close()
    assert list(jobs) == ["torch_ddp_ranks"]
    return jobs["torch_ddp_ranks"], own


def assert_same_losses_without_teye(own, nproc, steps, slow, slow_ms, mode):
    """The job run again without teye: each rank's final loss is the one it printed under teye."""
    bare = BARE[mode]
    assert bare.args == _command(nproc, steps, slow, slow_ms, mode, reference.PORT)   # the run under teye's
    bare = bare.result()
    assert bare.returncode == 0, bare.stderr[-2000:]
    assert {o["rank"]: o["loss"] for o in map(json.loads, bare.stdout.splitlines())} == \
        {r: o["loss"] for r, o in own.items()}


@pytest.mark.measures("the ranks' shares against their own monotonic clock (torch_ddp_ranks.py)")
def test_one_slow_rank_is_the_jobs_verdict_and_is_named(sockdir):
    j, own = run_ddp(sockdir, 4, 40, slow=3, slow_ms=30)   # (20 ms: 0.46 once, under CI, against the 0.5 the
    # scenario needs: 4 ranks share 2 cores, and the slow rank's compute grew with them)
    truth = own[3]["wait_s"] / own[3]["step_s"]  # the slow rank's own wait share, by its own clock
    assert truth > 0.5 and all(own[r]["wait_s"] / own[r]["step_s"] < 0.1 for r in (0, 1, 2))
    assert j.input_bound_ratio == pytest.approx(truth, abs=0.05)
    assert (j.verdict.kind, j.critical_rank, j.world_size) == ("input", 3, 4)
    pid3 = next(r.pid for r in j.ranks if r.rank == 3)
    assert j.verdict.evidence.startswith(f"rank 3 (pid {pid3}) waits {100 * j.input_bound_ratio:.0f} % of its step "
                                         "on input; ranks 0–2 wait for it")
    # every rank's own share, within 5 points of its own clock
    assert {r.rank: round(r.input_bound_ratio, 2) for r in j.ranks} == \
        pytest.approx({r: own[r]["wait_s"] / own[r]["step_s"] for r in own}, abs=0.05)
    # global steps counted once; samples stay the sum over the ranks
    assert (j.steps, j.step_hist.count, j.samples, j.processes) == (40, 40, 4 * 40 * 4, 4)
    assert [r.steps for r in j.ranks] == [40] * 4


@pytest.mark.measures("the ranks' shares against their own monotonic clock (torch_ddp_ranks.py)")
def test_no_slow_rank_names_nobody_and_ddps_timers_never_exceed_the_ranks_clocks(sockdir):
    """No slow rank: nobody is named, and the job's verdict is its ranks' own (a tiny model on 4 ranks
    sharing 2 cores exchanges most of each step: teye said `compute` until issue 37).  In steps of 3-5 ms
    DDP's timers see less than the script's clock (oracle as in the slow-rank test): DDP's own work per
    bucket is in its backward computation, and so is a rank descheduled between its last gradient and
    the exchange (up to 20 points of one rank's step, measured on this VM), so teye's share is bounded by
    the clock from above only, and never counts more."""
    j, own = run_ddp(sockdir, 4, 30, slow=-1, slow_ms=0)
    assert all(o["wait_s"] / o["step_s"] < 0.15 for o in own.values())
    comm = {r.rank: dict(r.phase_seconds).get("communication", 0.0) / r.step_seconds for r in j.ranks}
    truth = {r: max(0.0, own[r]["bwd_s"] - own[r]["alone_s"]) / own[r]["step_s"] for r in own}
    print(f"\nteye's exchange share per rank {comm}; own clocks {truth}")
    assert all(0 < comm[r] <= truth[r] + 0.05 for r in own)
    # even ranks: no critical rank exported (issue 39), the evidence says they are even; the verdict is judged
    # on the rank with the largest own wait, whose exchange share decides communication or compute
    assert j.verdict.evidence.startswith("no rank waits on its own input or host work")
    assert "ranks on this node are even" in j.verdict.evidence and j.critical_rank is None
    kinds = {"communication" if c >= 0.2 else "compute" for c in comm.values()}
    assert j.verdict.kind in kinds and j.steps == 30
    assert j.input_bound_ratio == pytest.approx(max(o["wait_s"] / o["step_s"] for o in own.values()), abs=0.05)


@pytest.mark.measures("the ranks' shares against their own monotonic clock (torch_ddp_ranks.py)")
def test_collectives_called_from_python_are_communication_and_change_nothing(sockdir):
    """An explicit dist.all_reduce loop where rank 1 does more work: the others wait in all_reduce, and
    teye says so per rank, within 5 points of each rank's own clock; the losses are those of the job
    run without teye."""
    j, own = run_ddp(sockdir, 4, 30, slow=1, slow_ms=30, mode="allreduce")
    for r in j.ranks:
        comm = dict(r.phase_seconds)["communication"] / r.step_seconds
        assert comm == pytest.approx(own[r.rank]["comm_s"] / own[r.rank]["step_s"], abs=0.05), r.rank
    assert all(own[r]["comm_s"] / own[r]["step_s"] > 0.6 for r in (0, 2, 3))
    assert j.critical_rank == 1
    assert "rank 1 (pid" in j.verdict.evidence and "ranks 0, 2, 3 wait for it in their collectives" in \
        j.verdict.evidence
    assert_same_losses_without_teye(own, 4, 30, 1, 30, "allreduce")


@pytest.mark.measures("the ranks' shares against their own monotonic clock (torch_ddp_ranks.py)")
def test_a_rank_slow_in_compute_is_named_and_the_others_wait_in_ddps_exchange(sockdir):
    """Issue 37: DDP (gloo), rank 2 computes 60 ms more per step; the others wait for it inside DDP's
    gradient exchange, in backward().  Oracle, each rank's own clock around backward() and the optimizer
    step, less what they take on a copy of the model that exchanges nothing (the script times it)."""
    j, own = run_ddp(sockdir, 4, 30, slow=2, slow_ms=60, mode="ddp_compute")
    comm = {r.rank: dict(r.phase_seconds).get("communication", 0.0) / r.step_seconds for r in j.ranks}
    truth = {r: max(0.0, own[r]["bwd_s"] - own[r]["alone_s"]) / own[r]["step_s"] for r in own}
    print(f"\nteye's exchange share per rank {comm}; own clocks {truth}")
    assert all(truth[r] > 0.5 for r in (0, 1, 3)) and truth[2] < 0.3
    assert comm == pytest.approx(truth, abs=0.05)
    assert j.critical_rank == 2
    print(j.verdict)
    assert_same_losses_without_teye(own, 4, 30, 2, 60, "ddp_compute")


@pytest.mark.measures("the ranks' shares against their own monotonic clock (torch_ddp_ranks.py)")
def test_fsdp_collective_waits_are_communication_by_the_scripts_own_clock(sockdir):
    """Issue 37: FSDP (fully_shard, gloo, 2 ranks), rank 1 computes 40 ms more per step: rank 0 waits in
    FSDP's all-gathers and reduce-scatters.  Oracle: the script's own wrappers around the collectives FSDP
    calls (comm_s); the losses are those of the job without teye."""
    j, own = run_ddp(sockdir, 2, 20, slow=1, slow_ms=40, mode="fsdp")
    comm = {r.rank: dict(r.phase_seconds).get("communication", 0.0) / r.step_seconds for r in j.ranks}
    truth = {r: own[r]["comm_s"] / own[r]["step_s"] for r in own}
    print(f"\nteye's collective share per rank {comm}; own clocks {truth}")
    assert truth[0] > 0.4 and truth[0] - truth[1] > 0.2
    assert comm == pytest.approx(truth, abs=0.05)
    assert j.critical_rank == 1
    assert_same_losses_without_teye(own, 2, 20, 1, 40, "fsdp")
