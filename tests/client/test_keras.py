"""Keras 3 Model.fit (TensorFlow backend) under `teye run` with a live agent: its input wait observed.

Unmodified fit scripts (tests/client/keras_fit.py) with a slow and a fast tf.data map: teye's data_wait
share over the profiled batches against the TensorFlow profiler's input-pipeline analysis of the same
batches (xprof, headless, as workloads/tfprofile.py reads it: the oracle), the verdicts input / compute,
and the losses fit computed, equal with and without teye to float32 rounding (rel 1e-6: the batch enters
the compiled step as an argument, so TensorFlow may order a reduction differently).  Then the bad inputs
of issue 28: each observed, or steps only with the reason (TEYE_DEBUG=1) and no guessed verdict, the
job's losses, output and exit status unchanged.  Small on purpose: 16 batches of 64 through a 2-layer CNN,
steps of about 10 ms (with 1 ms steps, the fixed cost of an eager fetch, 0.1-0.2 ms of Python and op
dispatch that the profiler does not count as input, was 10 points of the share on a loaded 2-core machine).
"""
from __future__ import annotations

import json
import os
import sys

import pytest

from tests import reference
from tests.client.helpers import HERE, LiveAgent, base_env, teye_run

pytestmark = [pytest.mark.tf, pytest.mark.e2e]
pytest.importorskip("tensorflow", reason="the workloads-cpu extra")
pytest.importorskip("keras", reason="the workloads-cpu extra")

SCRIPT = os.path.join(HERE, "keras_fit.py")
STEPS = 16
FIRST, LAST = 4, 13          # the batches the profiler traces (after the first steps' tracing and warm-up)
ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "OMP_NUM_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1",
       "TF_NUM_INTRAOP_THREADS": "1"}


def _losses(path):
    return json.loads(open(path).read())["losses"]


# the fast variant without teye (tests/reference.py)
BARE_FAST = reference.Bare("keras-fast", [sys.executable, SCRIPT, "fast", str(STEPS), reference.OUT], ENV)


@pytest.fixture(scope="module")
def bare():
    """The fast variant without teye: the losses every variant must reproduce (same data, seed and math)."""
    r = BARE_FAST.result()
    assert r.returncode == 0, r.stderr[-2000:]
    return {"losses": json.loads(r.out)["losses"], "stdout": r.stdout}


def _fit(agent, tmp_path, variant, *extra, job=None):
    out = tmp_path / f"{variant}.json"
    r = teye_run([sys.executable, SCRIPT, variant, str(STEPS), str(out), *extra], socket_path=agent.path,
                 job=job or variant, env=base_env(TEYE_DEBUG="1", **ENV), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r, _losses(out), agent.jobs()[job or variant]


def _share_over(recorded, job, first, last):
    """teye's data_wait share over steps first..last of the job, from the intervals the agent received."""
    steps = [(s, e) for j, p, s, e in recorded if j == job and p == "step"]
    assert len(steps) == STEPS, len(steps)
    lo, hi = steps[first][0], steps[last][1]
    wait = sum(min(e, hi) - max(s, lo) for j, p, s, e in recorded
               if j == job and p == "data_wait" and e > lo and s < hi)
    return wait / sum(e - s for s, e in steps[first:last + 1])


@pytest.mark.measures("the input share against the TensorFlow profiler's analysis of the same batches")
@pytest.mark.parametrize("variant, input_bound", [("slow", True), ("fast", False)])
def test_fit_input_wait_against_the_tf_profiler(sockdir, tmp_path, bare, variant, input_bound):
    pytest.importorskip("xprof")
    from workloads.tfprofile import input_analysis, says_input_bound
    agent = LiveAgent(sockdir, record_intervals=4096)
    try:
        tb = tmp_path / "tb"
        r, losses, j = _fit(agent, tmp_path, variant, str(tb), str(FIRST), str(LAST))
        recorded = list(agent.src.table.recorded)
        share = _share_over(recorded, variant, FIRST, LAST)
    finally:
        agent.close()
    assert losses == pytest.approx(bare["losses"], rel=1e-6) and r.stdout == bare["stdout"]  # same batches, math
    assert (j.source, j.steps, j.samples) == ("keras", STEPS, 64 * STEPS)
    assert dict(j.phase_seconds)["data_wait"] > 0 and j.input_bound_ratio is not None
    prof = input_analysis(str(tb))
    assert abs(share - prof["percent"] / 100) <= 0.05, (share, prof)
    # The first call of the compiled step traced it: compile, between the first step (its fetch) and the second
    steps = [(s, e) for n, p, s, e in recorded if n == variant and p == "step"]
    assert [(s, e) for n, p, s, e in recorded if n == variant and p == "compile"] == [(steps[0][1], steps[1][0])]
    # ... and left out of the agent's share of the run (16 steps: on a loaded machine their pace varies by more
    # than 5 points between the profiled batches and the run, 31 % against 20.5 % once, so the run against the
    # profiler is benchmarks/keras_profiler.py's: 120 steps, the profiler over all but the first two)
    ph = dict(j.phase_seconds)
    run_share = ph["data_wait"] / (sum(ph.values()) - ph["compile"])
    assert j.input_bound_ratio == pytest.approx(run_share, abs=0.01) and ph["compile"] > 0
    assert says_input_bound(prof) is input_bound, prof["text"]
    assert j.verdict.kind == ("input" if input_bound else "compute"), j.verdict.evidence
    assert "phases from zero-code: Keras Model.fit" in j.verdict.evidence


@pytest.mark.parametrize("variant, observed", [
    ("generator", True),    # Keras wraps it in tf.data.Dataset.from_generator: the wait for the generator is seen
    ("numpy", True),        # Keras makes the tf.data pipeline
    ("custom", True),       # its own train_step: Keras' compiled one-step function still calls it
    ("eager", True),        # run_eagerly=True: the same fetch, the step ends in the optimizer's apply
    ("spe8", "steps_per_execution is 8"),
    ("mirrored", "a distribution strategy (MirroredStrategy)"),
])
@pytest.mark.measures("the input share against the TensorFlow profiler's analysis of the same batches")
def test_fit_bad_inputs_are_observed_or_steps_only_with_the_reason(sockdir, tmp_path, bare, variant, observed):
    agent = LiveAgent(sockdir)
    try:
        r, losses, j = _fit(agent, tmp_path, variant)
    finally:
        agent.close()
    assert r.stdout == bare["stdout"]
    if variant == "spe8":      # Keras logs once per 8 batches: the running mean at batches 8 and 16
        assert losses == pytest.approx([bare["losses"][7], bare["losses"][15]], rel=1e-6)
    else:
        assert losses == pytest.approx(bare["losses"], rel=1e-6)
    if observed is True:
        assert (j.source, j.steps, j.samples) == ("keras", STEPS, 64 * STEPS)
        assert j.input_bound_ratio is not None and j.verdict.kind in ("compute", "input")
        assert "Model.fit input wait not observed" not in r.stderr
    else:  # steps only, the reason on stderr (TEYE_DEBUG=1), no guessed verdict (no GPU samples here)
        assert f"Model.fit input wait not observed (steps only): {observed}" in r.stderr
        assert (j.source, j.input_bound_ratio, j.samples) == ("tf-steps", None, None)
        assert [p for p, _ in j.phase_seconds] == ["compile"]  # its first call traced: seen without input waits
        assert j.verdict.kind == "not_observed" and j.steps > 0
