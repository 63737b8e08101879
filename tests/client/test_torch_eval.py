"""Evaluation apart from training (issue 29, item 1), in a real unmodified PyTorch job under `teye run`:
the waits of loaders no optimizer step follows (a validation pass under model.eval()/no_grad(), a batch-size
probe) are the `eval` phase; steps, samples, the step histogram and the input-bound share count training
only.  The oracle is the script's own clock of its training steps and its own sample count."""
from __future__ import annotations

import os
import sys

import pytest

from tests import reference
from tests.client.helpers import HERE, last_json, teye_run

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e

SCRIPT = os.path.join(HERE, "torch_eval.py")
# the job without teye, whose output the run under teye must keep (tests/reference.py)
BARE_OPTSTEP = reference.Bare("torch-eval-optstep", [sys.executable, SCRIPT, "20", "10", "optstep"])
EDGE_S = 0.0005   # what moves between the two clocks' steps (a flush of the client's buffer): at most this


@pytest.mark.measures("evaluation and training seconds against the script's own perf_counter (own_clock.py)")
def test_evaluation_is_reported_apart_from_training(agent):
    run = teye_run([sys.executable, SCRIPT, "40", "10"], socket_path=agent.path, job="with-eval")
    assert run.returncode == 0, run.stderr
    own = last_json(run.stdout)
    j = agent.jobs()["with-eval"]
    phases = dict(j.phase_seconds)
    print("own", own, "teye", phases, j.steps, j.samples, j.input_bound_ratio, j.step_hist)
    # steps and samples are what the script trained: not the probe's batch, not the validation batches
    assert j.steps == own["steps"] == 40 and j.samples == own["samples"] == 160, (j.steps, j.samples)
    # evaluation is exported as the eval phase: the script's 4 validation passes (6 batches of 4 samples
    # sleeping 4 ms: ~0.1 s each, the last one at exit) and the probe (from it to the first training batch)
    assert 0.95 * own["eval_s"] <= phases.get("eval", 0.0) <= own["eval_s"] + 0.1, (phases, own)
    # the training steps' time and input-bound share are the script's own, to 3 points
    total = phases["data_wait"] + phases["compute"]
    assert total == pytest.approx(own["train_s"], rel=0.05), (phases, own)
    assert abs(phases["data_wait"] / total - own["wait_share"]) <= 0.03, (phases, own)
    assert abs(j.input_bound_ratio - own["wait_share"]) <= 0.03, (j.input_bound_ratio, own)
    assert j.step_hist.sum == pytest.approx(own["train_s"], rel=0.05), (j.step_hist, own)
    # the step histogram is the script's own steps' (no "step" holding a validation pass of ~0.1 s): per
    # bucket, the script's own count of steps at most that long, give or take 2 at the bucket edges, and a step
    # within EDGE_S of a bucket's bound on either side: teye's step ends at the optimizer's step hook, the
    # script's where its loop reads its clock, and what the client does between them (its flush, on the training
    # thread every 100 ms while the loop records: x26 read 5 of this script's 10 ms steps in the next bucket)
    # falls in one clock's step and the other's next
    times = own["step_times"]
    for le, n in j.step_hist.buckets:
        lo, hi = sum(t <= le - EDGE_S for t in times), sum(t <= le + EDGE_S for t in times)
        assert lo - 2 <= n <= hi + 2, (le, j.step_hist, times)


@pytest.mark.measures("evaluation and training seconds against the script's own perf_counter (own_clock.py)")
def test_an_evaluation_loop_that_steps_the_optimizer_is_training(agent):
    """Bad input: a 'validation' loop that calls optimizer.step() trains, by definition: its batches are
    steps and samples, its time and input wait are training's.  The job runs the same without teye."""
    bare = BARE_OPTSTEP.result()
    run = teye_run(BARE_OPTSTEP.command(), socket_path=agent.path, job="eval-steps")
    assert run.returncode == bare.returncode == 0, run.stderr
    assert run.stdout.splitlines()[:-1] == bare.stdout.splitlines()[:-1] and run.stderr == bare.stderr
    own = last_json(run.stdout)
    j = agent.jobs()["eval-steps"]
    phases = dict(j.phase_seconds)
    print("own", own, "teye", phases, j.steps, j.samples, j.input_bound_ratio)
    assert own["opt_in_eval"] == 2 * 6          # two passes of 6 batches
    assert j.steps == own["steps"] + own["opt_in_eval"], (j.steps, own)
    assert j.samples == own["samples"] + 4 * own["opt_in_eval"]
    # nothing but the probe is evaluation: the whole run from the first training batch is training, with
    # the waits of both loaders
    assert phases.get("eval", 0.0) <= own["probe_s"] + 0.01, (phases, own)
    train_s, wait_s = own["train_s"] + own["eval_s"], own["wait_s"] + own["eval_wait_s"]
    total = phases["data_wait"] + phases["compute"]
    assert total == pytest.approx(train_s, rel=0.05), (phases, own)
    assert abs(j.input_bound_ratio - wait_s / train_s) <= 0.03, (j.input_bound_ratio, own)
