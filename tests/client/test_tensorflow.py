"""Real TensorFlow under `teye run` with a live agent: the reference workload's own Reporter is the oracle.

workloads/train.py reports its phases through its Reporter (job "ref") while zero-code phases report the
same run (job "zc"): one process, one run, two views of the same steps.  A loop that reads a Python
generator (naive) and Keras Model.fit take their batches where Python cannot time them: steps only, and
the evidence says the input wait was not observed (no ratio rather than a guess).
"""
from __future__ import annotations

import sys

import pytest

from tests.client.helpers import LiveAgent, base_env, teye_run

pytest.importorskip("tensorflow", reason="the workloads-cpu extra")

STEPS = 30
FIT = """
import time
import numpy as np
import tensorflow as tf
import keras

def slow(x, y):
    time.sleep(0.004)
    return x, y

x = np.random.default_rng(0).normal(size=(24 * 16, 8)).astype("float32")
y = x.sum(axis=1, keepdims=True)
ds = tf.data.Dataset.from_tensor_slices((x, y)).map(
    lambda a, b: tf.numpy_function(slow, [a, b], [tf.float32, tf.float32])).map(
    lambda a, b: (tf.ensure_shape(a, (8,)), tf.ensure_shape(b, (1,)))).batch(16)
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
h = model.fit(ds, epochs=1, verbose=0)
print("loss %.6f" % h.history["loss"][-1])
"""


@pytest.fixture
def agent(sockdir):
    a = LiveAgent(sockdir)
    yield a
    a.close()


def _train(agent, tmp_path, pipeline):
    args = [sys.executable, "-m", "workloads.train", "--model", "simple_cnn", "--batch-size", "16", "--steps",
            str(STEPS), "--warmup-steps", "0", "--pipeline", pipeline, "--io-latency-ms", "2",
            "--synthetic-samples", "512", "--no-progress", "--train-job", "ref", "--results",
            str(tmp_path / "r.json")]
    run = teye_run(args, socket_path=agent.path, job="zc", env=base_env(TEYE_PHASE_SOCKET=agent.path),
                   timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return agent.jobs()


def test_tf_data_loop_matches_the_runs_own_reporter(agent, tmp_path):
    jobs = _train(agent, tmp_path, "tfdata")
    ref, zc = jobs["ref"], jobs["zc"]
    assert (ref.source, zc.source) == ("client", "tf.data")
    assert zc.steps == ref.steps == STEPS and zc.samples == ref.samples
    assert zc.input_bound_ratio == pytest.approx(ref.input_bound_ratio, abs=0.03)
    assert zc.verdict.kind == ref.verdict.kind
    assert "phases from zero-code: tf.data" in zc.verdict.evidence


def test_what_python_cannot_time_is_reported_as_not_observed(agent, tmp_path):
    jobs = _train(agent, tmp_path, "naive")
    ref, zc = jobs["ref"], jobs["zc"]
    assert ref.input_bound_ratio > 0.2  # the run was input-bound: a 0 % would be a wrong answer, not a missing one
    assert (zc.source, zc.steps, zc.input_bound_ratio) == ("tf-steps", STEPS, None)
    assert "input wait not observed" in zc.verdict.evidence
    fit = teye_run([sys.executable, "-c", FIT], socket_path=agent.path, job="fit", timeout=300)
    assert fit.returncode == 0 and fit.stdout.startswith("loss "), fit.stderr[-2000:]
    j = agent.jobs()["fit"]
    assert (j.source, j.steps, j.input_bound_ratio) == ("tf-steps", 24, None)  # 24 batches: 24 train-function calls
    assert "input wait not observed" in j.verdict.evidence
