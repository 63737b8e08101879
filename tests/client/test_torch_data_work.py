"""Data work on the training thread is not compute (issue 47): a loop that reads its DataLoader through a
generator of its own and augments each batch on the main thread (most of its step by its own clock), a pure
generator loop and a get_batch loop.  With the forward's start known (issue 45's step parts), the training
thread's time before each forward is the loop's own data work: ``data_wait``, source ``torch-forward``, its
share within 5 points of the script's own clock, the verdict ``input`` (before the forward's start was used:
steps only; before that, 8-11 % input-bound and ``compute`` for the first).  With the parts switched off
(``TEYE_STEP_PARTS=0``) teye cannot place it: steps only, never ``compute``.  Oracle: the script's own clock of
its data work and its own counts.
"""
from __future__ import annotations

import os
import sys

import pytest

from tests.client.helpers import HERE, base_env, last_json, plain_run, teye_run

pytest.importorskip("torch")
pytestmark = [pytest.mark.e2e, pytest.mark.measures("step time against the script's own perf_counter")]

SCRIPT = os.path.join(HERE, "torch_genwrap.py")
ENV = base_env(OMP_NUM_THREADS="1")


@pytest.mark.parametrize("mode", ["wrap", "pure", "get_batch"])
def test_data_work_on_the_training_thread_is_input(agent, mode):
    args = [sys.executable, SCRIPT, "60", mode]
    run = teye_run(args, socket_path=agent.path, job=f"data-{mode}", env=ENV)
    assert run.returncode == 0, run.stderr
    own = last_json(run.stdout)
    j = agent.jobs()[f"data-{mode}"]
    print("own", own, "teye", j.steps, j.samples, j.input_bound_ratio, j.verdict.kind, j.evidence.source)
    assert own["data_share"] > 0.5, own          # the loop's own data work dominates its step
    assert j.steps == own["steps"] == 60 and j.evidence.source == "torch-forward"
    # samples: counted where a DataLoader hands them over (wrap); a generator's are not seen (absent, not 0)
    assert j.samples == (own["samples"] if mode == "wrap" else None), (j.samples, own)
    assert j.input_bound_ratio == pytest.approx(own["data_share"], abs=0.05), (j.input_bound_ratio, own)
    assert j.verdict.kind == "input", j.verdict
    assert "prepares its batches itself" in j.verdict.recommendation, j.verdict.recommendation
    assert j.step_hist.sum == pytest.approx(own["step_s"], rel=0.1), (j.step_hist.sum, own)


@pytest.mark.parametrize("mode", ["wrap", "get_batch"])
def test_without_the_forwards_start_the_data_work_is_steps_only_never_compute(agent, mode):
    """TEYE_STEP_PARTS=0: no forward hook, so the data work cannot be placed: steps only, as before."""
    args = [sys.executable, SCRIPT, "30", mode]
    run = teye_run(args, socket_path=agent.path, job=f"off-{mode}", env={**ENV, "TEYE_STEP_PARTS": "0"})
    assert run.returncode == 0, run.stderr
    own = last_json(run.stdout)
    j = agent.jobs()[f"off-{mode}"]
    assert j.steps == own["steps"] == 30 and j.evidence.source == "torch-steps", j.evidence.source
    assert j.input_bound_ratio is None, j.input_bound_ratio    # not a confident 8-11 %
    assert j.verdict.kind == "not_observed", j.verdict          # never compute (no GPU here: not_observed)
    assert j.step_hist.sum == pytest.approx(own["step_s"], rel=0.1), (j.step_hist.sum, own)
