"""A producer thread that fills a queue from a DataLoader (issue 47): the first step starts where the training
thread can begin it (its optimizer made), not at the producer's first fetch, so it holds no model
construction; a step's samples are the batches it took, not the queue's fill.  A real, unmodified PyTorch job
under `teye run`; oracle: the script's own perf_counter clock of its steps and its own samples per step."""
from __future__ import annotations

import os
import sys

import pytest

from tests import reference
from tests.client.helpers import HERE, base_env, last_json, teye_run

pytest.importorskip("torch")
pytestmark = [pytest.mark.e2e, pytest.mark.measures("step time against the training thread's own perf_counter")]

SCRIPT = os.path.join(HERE, "torch_producer.py")
ENV = base_env(OMP_NUM_THREADS="1")
# the job without teye, whose status and output the run under teye must keep (tests/reference.py)
BARE_DIES = reference.Bare("producer-dies", [sys.executable, SCRIPT, "40", "dies"], {"OMP_NUM_THREADS": "1"})


def test_a_producer_threads_loop_is_timed_from_the_training_thread(agent):
    run = teye_run([sys.executable, SCRIPT, "40"], socket_path=agent.path, job="producer", env=ENV)
    assert run.returncode == 0, run.stderr
    own = last_json(run.stdout)
    j = agent.jobs()["producer"]
    print("own", own, "teye", j.steps, j.samples, j.step_hist)
    assert j.steps == own["steps"] == 40 and j.samples == own["samples"], (j.steps, j.samples, own)
    # within 10 % of the script's own steps' time: the 0.8 s construction is not in the first step (it was:
    # 2.8-3.4 s against 1.5-1.6 s in the issue)
    assert j.step_hist.sum == pytest.approx(own["step_s"], rel=0.10), (j.step_hist.sum, own["step_s"])
    # no step credited with the queue's fill: every step's batch is 6 samples, so none is above 6 per step
    # on average over the histogram's steps, and the first step is as short as the others (no 0.8 s one)
    first_bucket_over_half_s = dict(j.step_hist.buckets).get(0.5)
    assert first_bucket_over_half_s == j.steps, j.step_hist


def test_a_producer_that_dies_leaves_the_steps_it_fed(agent):
    """Bad input: the producer raises after 10 batches; the loop trains on what it queued and stops. The run's
    exit status and output are what they are without teye; its steps and samples are the script's."""
    bare = BARE_DIES.result()
    run = teye_run(BARE_DIES.command(), socket_path=agent.path, job="producer-dies", env=ENV)
    assert run.returncode == bare.returncode == 0, run.stderr
    own = last_json(run.stdout)
    j = agent.jobs()["producer-dies"]
    print("own", own, "teye", j.steps, j.samples)
    assert own["steps"] == 10 and j.steps == 10 and j.samples == own["samples"] == 60, (j.steps, j.samples, own)
