"""Data work on the training thread is not compute (issue 47): a loop that reads its DataLoader through a
generator of its own and augments each batch on the main thread (most of its step by its own clock), a pure
generator loop and a get_batch loop.  teye cannot place their data work without the forward's start (issue
45's step parts): they are steps only, with steps and samples exact, no input-bound share (absent, not a
wrong one) and never the verdict `compute` (before: 8-11 % input-bound and `compute` for the first).  Oracle:
the script's own clock of its data work and its own counts."""
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
def test_data_work_on_the_training_thread_is_never_compute(agent, mode):
    args = [sys.executable, SCRIPT, "60", mode]
    run = teye_run(args, socket_path=agent.path, job=f"data-{mode}", env=ENV)
    assert run.returncode == 0, run.stderr
    own = last_json(run.stdout)
    j = agent.jobs()[f"data-{mode}"]
    print("own", own, "teye", j.steps, j.samples, j.input_bound_ratio, j.verdict.kind, j.evidence.source)
    assert own["data_share"] > 0.5, own          # the loop's own data work dominates its step
    assert j.steps == own["steps"] == 60
    # samples: counted where a DataLoader hands them over (wrap); a generator's are not seen (absent)
    assert j.samples == (own["samples"] if mode == "wrap" else None), (j.samples, own)
    assert j.input_bound_ratio is None, j.input_bound_ratio    # not a confident 8-11 %
    assert j.verdict.kind != "compute", j.verdict              # never compute (no GPU here: not_observed)
    assert j.verdict.kind == "not_observed", j.verdict
    assert j.step_hist.sum == pytest.approx(own["step_s"], rel=0.1), (j.step_hist.sum, own)
