"""Real PyTorch on CPU, an unmodified script under `teye run` with a live agent (issue 22).

The oracle is the script's own wall-clock split (time.perf_counter() around next() and the step,
tests/client/torch_job.py), not anything teye sends.
"""
from __future__ import annotations

import sys

import pytest

from tests import reference
from tests.client.helpers import HERE, last_json, teye_run

torch = pytest.importorskip("torch", reason="the torch extra (./dev.sh test installs it)")

SCRIPT = f"{HERE}/torch_job.py"
STEPS = 60
CASES = [("slow", 0, "input"), ("slow", 2, "input"), ("fast", 0, "compute")]
# the jobs without teye, whose losses the runs under teye must keep (tests/reference.py)
BARE = {(kind, workers): reference.Bare(f"torch-{kind}-{workers}", [sys.executable, SCRIPT, kind, str(workers),
                                                                     str(STEPS)])
        for kind, workers, _ in CASES}


@pytest.mark.measures("the input share against the script's own perf_counter (torch_job.py)")
@pytest.mark.parametrize("kind,workers,verdict", CASES)
def test_unmodified_script_reports_its_own_split(agent, kind, workers, verdict):
    job = f"pt-{kind}-{workers}"
    run = teye_run(BARE[kind, workers].command(), socket_path=agent.path, job=job)
    assert run.returncode == 0, run.stderr
    own = last_json(run.stdout)
    jobs = agent.jobs()
    assert list(jobs) == [job]
    j = jobs[job]
    assert (j.steps, j.samples, j.processes, j.source) == (STEPS, STEPS * 8, 1, "torch")  # workers send nothing
    truth = own["wait_s"] / own["total_s"]
    assert j.input_bound_ratio == pytest.approx(truth, abs=0.03), (j.input_bound_ratio, truth)
    assert j.verdict.kind == verdict
    assert "zero-code: torch DataLoader" in j.verdict.evidence
    assert j.client_dropped == 0
    # the job's own output is what it is without teye: same losses, same exit status, nothing on stderr from teye
    bare = BARE[kind, workers].result()
    assert bare.returncode == 0
    losses = [line for line in run.stdout.splitlines() if line.startswith("step ")]
    assert len(losses) == STEPS and losses == [line for line in bare.stdout.splitlines() if line.startswith("step ")]
    assert "teye" not in run.stderr


ACCUM = f"{HERE}/torch_accum.py"


@pytest.mark.measures("the input share against the script's own perf_counter (torch_accum.py)")
@pytest.mark.parametrize("args", [("accumulate", "12", "4"), ("epoch", "5")], ids=["accumulate-4", "epoch-per-step"])
def test_several_batches_per_optimizer_step(agent, args):
    """Gradient accumulation (4 batches per step, across epoch ends) and a whole epoch inside one step: every
    batch's wait is data_wait and every batch's samples count, against the script's own clock and count."""
    job = "accum-" + args[0]
    run = teye_run([sys.executable, ACCUM, *args], socket_path=agent.path, job=job)
    assert run.returncode == 0, run.stderr
    own = last_json(run.stdout)
    j = agent.jobs()[job]
    assert (j.steps, j.samples, j.processes, j.source, j.client_dropped) == \
        (own["steps"], own["samples"], 1, "torch", 0)
    assert own["samples"] > own["steps"] * 8 * 3   # several batches per step: the branch under test was taken
    truth = own["wait_s"] / own["total_s"]
    assert 0.3 < truth < 0.9, own                  # the split is not a trivial 0 or 1
    assert j.input_bound_ratio == pytest.approx(truth, abs=0.03), (j.input_bound_ratio, truth)
    phases = dict(j.phase_seconds)
    assert phases["data_wait"] == pytest.approx(own["wait_s"], rel=0.05, abs=0.005)
    assert phases["data_wait"] + phases["compute"] == pytest.approx(own["total_s"], rel=0.05)
def test_collectives_that_are_not_plain_functions_are_left_alone():
    """patch_collectives checks each name first; the wrappers pass results and exceptions through."""
    import types
    from teye_client import _torch
    from teye_client.auto import session

    def all_reduce(t, op=None, group=None, async_op=False):
        if t is None:
            raise ValueError("no tensor")
        return ("reduced", t, op)

    class Work:
        def wait(self, timeout=None):
            return True

    mod = types.ModuleType("fake_c10d")
    mod.all_reduce, mod.broadcast, mod.Work = all_reduce, len, Work  # broadcast: a builtin, not expected
    session.reset()
    assert _torch.patch_collectives(mod) == ["all_reduce", "Work.wait"]
    assert mod.broadcast is len and mod.all_reduce.__wrapped__ is all_reduce
    assert mod.all_reduce(3, op="sum") == ("reduced", 3, "sum") and Work().wait() is True
    with pytest.raises(ValueError, match="no tensor"):
        mod.all_reduce(None)
    assert len(session.comms) == 3 and session.in_comm == 0  # the exception's call is timed too
    assert _torch.patch_collectives(mod) == []  # never wrapped twice
    session.reset()
