"""Evaluation apart from training (issue 29, item 1) in real Keras 3 Model.fit jobs (TensorFlow backend,
CPU) under `teye run` with a live agent: fit's validation, model.evaluate() and model.predict() between
epochs and after training are the `eval` phase; steps, samples, the step histogram and the input-bound
share count training only.  The oracle is the script's own clock (tests/client/keras_eval.py: a Keras
callback around each training step and each evaluation) and its own sample count; the losses and metrics
Keras computed must be those of the run without teye (rel 1e-6, as tests/client/test_keras.py accepts).
"""
from __future__ import annotations

import json
import os
import sys

import pytest

from tests import reference
from tests.client.helpers import HERE, base_env, last_json, teye_run

pytestmark = [pytest.mark.tf, pytest.mark.e2e]
pytest.importorskip("tensorflow", reason="the workloads-cpu extra")
pytest.importorskip("keras", reason="the workloads-cpu extra")

SCRIPT = os.path.join(HERE, "keras_eval.py")
EPOCHS, STEPS, BATCH = 3, 20, 16
ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "OMP_NUM_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1",
       "TF_NUM_INTRAOP_THREADS": "1"}
LOOP = os.path.join(HERE, "tf_eval_loop.py")
# the jobs without teye, whose figures the runs under teye must keep (tests/reference.py)
BARE_FIT = reference.Bare("keras-eval-fit", [sys.executable, SCRIPT, str(EPOCHS * STEPS), str(STEPS), "--out",
                                             reference.OUT], ENV)
BARE_LOOP = reference.Bare("keras-eval-loop", [sys.executable, LOOP, "30", "10"], ENV)


def _same(a, b):
    """Keras' figures with teye equal those without, to float32 rounding (rel 1e-6)."""
    assert a["losses"] == pytest.approx(b["losses"], rel=1e-6)
    assert a["predictions"] == pytest.approx(b["predictions"], rel=1e-6)
    for k in ("history", "evaluate"):
        assert a[k].keys() == b[k].keys()
        for m in a[k]:
            assert a[k][m] == pytest.approx(b[k][m], rel=1e-6), (k, m)


@pytest.mark.measures("evaluation and training seconds against the script's own perf_counter")
def test_fit_validation_evaluate_and_predict_are_eval(agent, tmp_path):
    bare = BARE_FIT.result()
    assert bare.returncode == 0, bare.stderr[-2000:]
    out = tmp_path / "teye.json"
    run = teye_run(BARE_FIT.command(str(out)), socket_path=agent.path, job="keras-eval",
                   env=base_env(TEYE_DEBUG="1", **ENV), timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines()[:-1] == bare.stdout.splitlines()[:-1]   # the last line: its own clock
    _same(json.loads(out.read_text()), json.loads(bare.out))
    own = last_json(run.stdout)
    j = agent.jobs()["keras-eval"]
    phases = dict(j.phase_seconds)
    print("own", {k: v for k, v in own.items() if k != "step_times"},
          "teye", phases, j.steps, j.samples, j.input_bound_ratio, j.step_hist)
    assert j.source == "keras" and "Model.fit input wait not observed" not in run.stderr
    # steps and samples are what fit trained: not the validation, evaluate or predict batches
    assert j.steps == own["steps"] == EPOCHS * STEPS and j.samples == own["samples"] == EPOCHS * STEPS * BATCH
    # evaluation is exported as eval: 3 validation passes, a predict between epochs, an evaluate and a predict
    # after fit (each ~0.12 s of 30 ms batches, plus the test and predict functions' tracing).  teye's eval is
    # each call of evaluate/predict: at least the callback's on_test_begin..on_test_end, at most the time
    # between the epochs' batches and around the calls after fit
    assert 0.97 * own["eval_s"] <= phases.get("eval", 0.0) <= own["outer_s"], (phases, own)
    # the training steps' time is the script's own (teye's step also holds what runs between two batches); the
    # batches that traced the train step (the script's Traced layer ran) are compile, out of the steps: their
    # time less their map's reads by the script's clock, teye's the train function's call alone
    train = phases["data_wait"] + phases["compute"]
    compiled = phases["compile"]
    assert own["traced"] and compiled == pytest.approx(own["compile_s"], rel=0.05, abs=0.02), (phases, own)
    assert train + compiled == pytest.approx(own["train_s"], rel=0.05, abs=0.02), (phases, own)
    assert j.step_hist.sum == pytest.approx(train, rel=1e-6)
    # training share of the job's time: teye's against the script's clock (its training steps, each from the end
    # of the one before as the protocol counts a step; the time between two epochs' batches and around the
    # calls after fit, where the evaluations run), to 3 points
    share = (train + compiled) / (train + compiled + phases["eval"])
    assert abs(share - own["loop_s"] / (own["loop_s"] + own["outer_s"])) <= 0.03, (share, own)
    # the training input wait: the time the training map itself spent reading, plus the eager fetch's own cost
    # beyond it (dispatch, the handoff to tf.data's thread and back, the wake-ups around the map's sleep), as
    # the script timed it on a twin of its pipeline (fetch_s: 1.0-1.7 ms a batch here, idle to two CPU hogs;
    # teye's wait above the reading was within 0.35 ms a batch of it in each of those runs), never
    # evaluation's (predict's batches are fetched eagerly too: 8 of 30 ms)
    most = own["wait_s"] + 1.5 * own["fetch_s"] + 0.0005 * own["reads"]
    assert own["wait_s"] <= phases["data_wait"] <= most, (phases, own)
    steps_s = own["train_s"] - own["compile_s"]
    assert own["wait_s"] / steps_s - 0.03 <= j.input_bound_ratio <= most / steps_s + 0.03, \
        (j.input_bound_ratio, own)
    # no step holds an evaluation (each is >= 0.1 s) or a compile: the steps above 50 ms are the script's own
    # but those that traced, give or take one at the bucket edge
    slow = [t for i, t in enumerate(own["step_times"]) if i not in own["traced"]]
    for le, n in j.step_hist.buckets:
        if le >= 0.05:
            assert abs((j.steps - n) - sum(t > le for t in slow)) <= 1, (le, j.step_hist)


@pytest.mark.measures("evaluation seconds and the input share against the loop's own perf_counter")
def test_custom_tf_loop_validation_is_eval(agent):
    """A custom TensorFlow loop (tests/client/tf_eval_loop.py): eager batches from tf.data iterators, a
    tf.function applying a Keras optimizer; a probe, a validation pass every 10 steps and a final one, each over
    its own iterator: eval by the rule PyTorch's loaders follow (an iterator no step follows does not train)."""
    bare = BARE_LOOP.result()
    assert bare.returncode == 0, bare.stderr[-2000:]
    run = teye_run(BARE_LOOP.command(), socket_path=agent.path, job="tf-eval", env=base_env(**ENV), timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    # its losses are its own: identical with and without teye (the same eager batches, the same tf.functions)
    assert run.stdout.splitlines()[:-1] == bare.stdout.splitlines()[:-1]
    own = last_json(run.stdout)
    j = agent.jobs()["tf-eval"]
    phases = dict(j.phase_seconds)
    print("own", {k: v for k, v in own.items() if k != "step_times"}, "teye", phases, j.steps, j.samples,
          j.input_bound_ratio, j.step_hist)
    assert j.source == "tf.data"
    assert j.steps == own["steps"] == 30 and j.samples == own["samples"] == 240, (j.steps, j.samples)
    # the probe (from it to the first training batch asked for) and 3 validation passes (5 batches of 6 ms,
    # the last at exit), each from its first batch asked for: making its iterator comes before, and is neither
    assert 0.95 * own["eval_s"] <= phases.get("eval", 0.0) <= 1.05 * own["eval_s"], (phases, own)
    # the first call of its train step traced it: compile (the loop's own clock of that call), out of the steps
    assert phases["compile"] == pytest.approx(own["compile_s"], abs=0.01) and own["compile_s"] > 0, (phases, own)
    total = phases["data_wait"] + phases["compute"]
    assert total == pytest.approx(own["train_s"] - own["compile_s"], rel=0.05, abs=0.01), (phases, own)
    assert abs(j.input_bound_ratio - own["wait_share_steps"]) <= 0.03, (j.input_bound_ratio, own)


@pytest.mark.not_measuring("exact step and sample counts; the loop's clock is not compared")
def test_custom_tf_loop_evaluation_that_applies_the_optimizer_is_training(agent):
    """Bad input: a 'validation' step that applies the optimizer trains, by definition."""
    run = teye_run([sys.executable, LOOP, "20", "10", "optstep"], socket_path=agent.path, job="tf-opt",
                   env=base_env(**ENV), timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    own = last_json(run.stdout)
    j = agent.jobs()["tf-opt"]
    assert own["opt_in_eval"] == 2 * 5          # two passes of 5 batches
    assert j.steps == own["steps"] + own["opt_in_eval"], (j.steps, own)
    assert j.samples == own["samples"] + 8 * own["opt_in_eval"]
