"""Several optimizers in a real, unmodified PyTorch job under `teye run` (issue 47): a GAN-shaped loop that
steps its discriminator twice per iteration and its generator once counts one step per loop iteration (the
optimizer that steps least), with the iteration's samples and time; two optimizers where one never steps count
the other's steps.  Oracle: the script's own iteration count, samples and perf_counter clock."""
from __future__ import annotations

import os
import sys

import pytest

from tests.client.helpers import HERE, base_env, last_json, teye_run

pytest.importorskip("torch")
pytestmark = [pytest.mark.e2e,
              pytest.mark.measures("step time of the loop iteration against the script's own perf_counter")]

SCRIPT = os.path.join(HERE, "torch_gan.py")
ENV = base_env(OMP_NUM_THREADS="1")


@pytest.mark.parametrize("args", [["30", "2"], ["20", "1", "never"]], ids=["d-twice", "one-never-steps"])
def test_the_step_is_the_loop_iteration(agent, args):
    run = teye_run([sys.executable, SCRIPT, *args], socket_path=agent.path, job="gan", env=ENV)
    assert run.returncode == 0, run.stderr
    own = last_json(run.stdout)
    j = agent.jobs()["gan"]
    print("own", own, "teye", j.steps, j.samples, j.step_hist.sum, j.input_bound_ratio)
    assert j.steps == own["iterations"], (j.steps, own)            # 60 before issue 47 for d-twice
    assert j.samples == own["samples"], (j.samples, own)
    assert j.step_hist.sum == pytest.approx(own["train_s"], rel=0.1), (j.step_hist.sum, own)
    assert abs(j.input_bound_ratio - own["wait_share"]) <= 0.03, (j.input_bound_ratio, own)
