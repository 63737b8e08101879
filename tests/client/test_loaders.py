"""Several loaders per step (issue 39): every batch read on the stepping thread between two optimizer steps is
training input, whichever loader it came from and in whatever order; evaluation only where a loader's batches
are not followed by a step while it is in use (the batch-size probe here).  A real unmodified PyTorch job
under `teye run`; the oracle is its own perf_counter around each next() and its own step and sample counts."""
from __future__ import annotations

import os
import sys

import pytest

from tests.client.helpers import HERE, last_json, plain_run, teye_run

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e

SCRIPT = os.path.join(HERE, "torch_loaders.py")


@pytest.mark.measures("the input share against the script's own perf_counter around each next()")
@pytest.mark.parametrize("mode", ["ab", "ba", "zip", "three", "alt", "cycle"])
def test_every_loader_a_step_reads_is_training(agent, mode):
    args = [sys.executable, SCRIPT, mode, "30"]
    run = teye_run(args, socket_path=agent.path, job="loaders-" + mode)
    assert run.returncode == 0, run.stderr
    own = last_json(run.stdout)
    j = agent.jobs()["loaders-" + mode]
    phases = dict(j.phase_seconds)
    print("own", own, "teye", phases, j.steps, j.samples, j.input_bound_ratio)
    assert j.steps == own["steps"] == 30
    # the samples of every loader the steps read (a cycle's replays read no loader: docs/zero-code.md)
    assert j.samples == own["read"], (j.samples, own)
    # no evaluation but the probe (to the first training batch asked for): the slow loader's waits are
    # training's whichever comes first
    assert phases.get("eval", 0.0) <= own["probe_s"] + 0.005, (phases, own)
    assert own["wait_share"] > 0.4   # the job is input-bound (its compute slows on a loaded host): the bug read 0.04-0.06
    total = phases["data_wait"] + phases["compute"]
    assert total == pytest.approx(own["train_s"], rel=0.05), (phases, own)
    assert abs(phases["data_wait"] / total - own["wait_share"]) <= 0.03, (phases, own)
    assert abs(j.input_bound_ratio - own["wait_share"]) <= 0.03, (j.input_bound_ratio, own)


@pytest.mark.measures("evaluation seconds against the script's own perf_counter")
def test_a_validation_pass_between_two_loader_steps_is_eval(agent):
    """Two training loaders, and every 10 steps a validation pass run to its end over an iterator the job
    still holds at the next step: that loader ended before the step, so it is evaluation (the script's own
    clock of it: from the pass's start to the next training batch asked for), and training stays training."""
    run = teye_run([sys.executable, SCRIPT, "val", "30"], socket_path=agent.path, job="loaders-val")
    assert run.returncode == 0, run.stderr
    own = last_json(run.stdout)
    j = agent.jobs()["loaders-val"]
    phases = dict(j.phase_seconds)
    print("own", own, "teye", phases, j.steps, j.samples, j.input_bound_ratio)
    assert (j.steps, j.samples) == (30, own["read"])
    assert 0.95 * own["eval_s"] <= phases.get("eval", 0.0) <= own["eval_s"] + own["probe_s"] + 0.01, (phases, own)
    total = phases["data_wait"] + phases["compute"]
    assert total == pytest.approx(own["train_s"], rel=0.05), (phases, own)
    assert abs(j.input_bound_ratio - own["wait_share"]) <= 0.03, (j.input_bound_ratio, own)


@pytest.mark.not_measuring("the job's output with teye against without; the script's clock is not compared")
def test_several_loaders_leave_the_job_as_it_was(agent):
    args = [sys.executable, SCRIPT, "three", "6"]
    bare = plain_run(args)
    run = teye_run(args, socket_path=agent.path, job="loaders-same")
    assert run.returncode == bare.returncode == 0, run.stderr
    assert run.stdout.splitlines()[:-1] == bare.stdout.splitlines()[:-1] and run.stderr == bare.stderr
