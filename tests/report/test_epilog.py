"""deploy/slurm/teye-epilog.sh against fake scontrol/sacctmgr: it never fails or holds the job."""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from tests.procs import free_port
from tests.report import slurm_fakes

pytestmark = pytest.mark.e2e


def run_epilog(tmp_path, env_extra, **fakes):
    calls = str(tmp_path / "sacctmgr.calls")
    env = {**os.environ, **slurm_fakes.install(str(tmp_path / "bin"), calls, **fakes), **env_extra}
    t0 = time.monotonic()
    p = subprocess.run(["sh", slurm_fakes.EPILOG], env=env, capture_output=True, text=True, timeout=60)
    return p, time.monotonic() - t0, slurm_fakes.stored(calls), calls


def test_prometheus_down_still_exits_0_and_stores_the_error(tmp_path):
    p, _, comments, calls = run_epilog(tmp_path, {"SLURM_JOB_ID": "4242",
                                                  "TEYE_PROMETHEUS_URL": f"http://127.0.0.1:{free_port()}"})
    assert p.returncode == 0
    (c,) = comments
    assert c.startswith("teye1:") and json.loads(c[6:]) == {"v": 1, "job": "4242", "err": 3}
    args = open(calls).read().split("\n")
    assert args[:5] == ["-i", "modify", "job", "where", "jobid=4242"]


def test_a_hung_report_is_cut_at_the_timeout(tmp_path):
    p, took, comments, _ = run_epilog(tmp_path, {"SLURM_JOB_ID": "4242", "TEYE_EPILOG_TIMEOUT": "1",
                                                 "TEYE_PROMETHEUS_URL": "http://127.0.0.1:1"}, teye_sleep=30)
    assert p.returncode == 0 and took < 8
    (c,) = comments
    assert json.loads(c[6:])["err"] == 124     # timeout(1)'s status for a killed command


def test_no_job_id_does_nothing(tmp_path):
    p, _, comments, _ = run_epilog(tmp_path, {"SLURM_JOB_ID": "", "SLURM_JOBID": ""})
    assert p.returncode == 0 and comments == []
    p, _, comments, _ = run_epilog(tmp_path, {"SLURM_JOB_ID": "12; rm -rf /"})
    assert p.returncode == 0 and comments == []
