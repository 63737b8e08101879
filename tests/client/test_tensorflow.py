"""Real TensorFlow custom loops under `teye run` with a live agent; the loop's own clock is the oracle.

workloads/train.py runs without its own Reporter (--no-reporter: a process with its own Reporter is that
reporter's job alone, zero-code phases stand aside) and measures its input wait itself (perf_counter right
around next(): results["loop_clock"]).  A loop over tf.data is observed; a loop over a Python generator
(naive) takes its batches where Python cannot time them: steps only, no ratio and no guessed verdict.
Keras Model.fit: tests/client/test_keras.py.
"""
from __future__ import annotations

import json
import sys

import pytest

from tests.client.helpers import base_env, teye_run

pytest.importorskip("tensorflow", reason="the workloads-cpu extra")

STEPS = 30


def _train(agent, tmp_path, pipeline):
    args = [sys.executable, "-m", "workloads.train", "--model", "simple_cnn", "--batch-size", "16", "--steps",
            str(STEPS), "--warmup-steps", "0", "--pipeline", pipeline, "--io-latency-ms", "2",
            "--synthetic-samples", "512", "--no-progress", "--no-reporter", "--results", str(tmp_path / "r.json")]
    run = teye_run(args, socket_path=agent.path, job="zc", timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    jobs = agent.jobs()
    assert list(jobs) == ["zc"]
    return jobs["zc"], json.loads((tmp_path / "r.json").read_text())["loop_clock"]


@pytest.mark.measures("the input share against the loop's own perf_counter (loop_clock)")
def test_tf_data_loop_matches_the_loops_own_clock(agent, tmp_path):
    zc, loop = _train(agent, tmp_path, "tfdata")
    assert zc.source == "tf.data" and zc.steps == loop["steps"] == STEPS and zc.samples == 16 * STEPS
    # the loop's clock spans its steps from the first next(); teye's from the first batch's wait as well; the
    # first call of the loop's tf.function traced and compiled it: teye's compile phase, outside the steps
    compile_s = dict(zc.phase_seconds)["compile"]
    assert compile_s == pytest.approx(loop["first_call_s"], abs=0.02)
    assert zc.input_bound_ratio == pytest.approx(loop["input_wait_fraction_steps"], abs=0.03)
    assert (zc.verdict.kind == "input") is (zc.input_bound_ratio >= 0.2)
    assert "phases from zero-code: tf.data" in zc.verdict.evidence


@pytest.mark.measures("the input share against the loop's own perf_counter (loop_clock)")
def test_what_python_cannot_time_is_reported_as_not_observed(agent, tmp_path):
    zc, loop = _train(agent, tmp_path, "naive")
    assert loop["input_wait_fraction"] > 0.2  # the run was input-bound: compute would be a wrong answer
    assert (zc.source, zc.steps, zc.input_bound_ratio, zc.samples) == ("tf-steps", STEPS, None, None)
    assert [p for p, _ in zc.phase_seconds] == ["compile"]   # the first call traced: seen without input waits
    assert zc.verdict.kind == "not_observed" and "input wait not observed" in zc.verdict.evidence
