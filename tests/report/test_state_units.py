"""A report's state (issue 47): a training job runs while its agents say so (teye_job_running and its last
message's age); a Slurm job also while a process of it holds a GPU, or its cgroup exists, at the report's end
(its loop may end before its epilogue).  A training job asked for by name has ended where its agents say so,
whatever the Slurm job it ran in still holds.  Hand-made series on a 10 s grid over 100 s; truth by hand."""
from __future__ import annotations

import pytest

from agent.report.build import Fetched, Request, _assemble

GRID = [float(t) for t in range(0, 101, 10)]


def fetched():
    """Training job "tj" on node n-a: steps from 0 to 50 s, then its processes exit (teye_job_running 0, its
    last message ever older)."""
    f = Fetched(GRID[0], GRID[-1], 10.0, GRID)
    f.jinfo[("n-a", "tj")] = [(t, 1.0) for t in GRID]
    f.up["n-a"] = [(t, 1.0) for t in GRID]
    f.job[("teye_job_steps_total", "n-a", "tj", "", "", "")] = [(t, min(t, 50.0)) for t in GRID]
    f.job[("teye_job_phase_seconds_total", "n-a", "tj", "compute", "", "")] = [(t, min(t, 50.0)) for t in GRID]
    f.job[("teye_job_running", "n-a", "tj", "", "", "")] = [(t, 1.0 if t <= 50 else 0.0) for t in GRID]
    f.job[("teye_job_last_message_age_seconds", "n-a", "tj", "", "", "")] = [(t, max(0.0, t - 50)) for t in GRID]
    f.index()
    return f


@pytest.mark.parametrize("held_until, asked, state", [
    (100.0, "slurm", "running"),      # the Slurm job still holds its GPU at the end: it runs
    (50.0, "slurm", "finished"),      # it let the GPU go with its loop: it ended
    (100.0, "train", "finished"),     # the training job asked for by name ended, whatever its Slurm job holds
])
def test_a_slurm_job_runs_while_it_holds_its_gpu_a_training_job_while_it_says_so(held_until, asked, state):
    job = _assemble(fetched(), Request(train_jobs=["tj"]), 200.0, "77", ["tj"], {("n-a", "0"): (0.0, held_until)},
                    "", False, slurm_asked=asked == "slurm")
    assert job["state"] == state, (job["state"], job["conditions"])
    assert any(c["kind"] == "running" for c in job["conditions"]) == (state == "running")
