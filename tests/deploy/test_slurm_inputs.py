"""deploy/slurm/: the GPU prolog/epilog and the report epilog take only numbers from Slurm's environment
(issue 36).  Each script runs for real (sh) against a mapping directory one level below a parent the test
watches: a GPU "index" such as ``..`` must never make a file appear outside the directory."""
from __future__ import annotations

import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLURM = os.path.join(REPO, "deploy", "slurm")
PROLOG = os.path.join(SLURM, "teye-gpu-prolog.sh")
GPU_EPILOG = os.path.join(SLURM, "teye-gpu-epilog.sh")
EPILOG = os.path.join(SLURM, "teye-epilog.sh")


def run(script, env_extra, cwd):
    env = {"PATH": os.environ["PATH"], **env_extra}
    p = subprocess.run(["sh", script], env=env, capture_output=True, text=True, timeout=30, cwd=cwd)
    assert p.returncode == 0, p.stderr          # never fails the job
    return p


def tree(root):
    """Every path under root (relative), files and directories, to compare before and after."""
    out = set()
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            out.add(os.path.relpath(os.path.join(d, n), root))
    return out


def contents(mapdir):
    return {n: open(os.path.join(mapdir, n)).read() for n in sorted(os.listdir(mapdir)) if not n.startswith(".")}


BAD_GPUS = ["..", ".", "../x", "1..2", "1.", ".1", "1.2.3", "0/../..", "*", "$(touch pwned)", "-1", "1 x", "²"]


@pytest.mark.parametrize("bad", BAD_GPUS)
def test_prolog_refuses_a_gpu_that_is_not_an_index_and_writes_nothing_outside(tmp_path, bad):
    parent = tmp_path / "run" / "teye"
    mapdir = parent / "gpu-jobs"
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / "7").write_text("")     # a "*" globbed in the cwd must not become a GPU either
    p = run(PROLOG, {"TEYE_GPU_JOB_DIR": str(mapdir), "SLURM_JOB_ID": "4242",
                     "SLURM_JOB_GPUS": f"0,{bad},2.1"}, cwd=str(tmp_path / "cwd"))
    # the good indices around it are written, the bad one named in one clear line
    assert contents(str(mapdir)) == {"0": "4242\n", "2.1": "4242\n"}
    lines = [ln for ln in p.stderr.splitlines() if "not a GPU index" in ln]
    assert len(lines) >= 1 and all(ln.startswith("teye-gpu-prolog: job 4242: skipping GPU") for ln in lines)
    # nothing anywhere else: only the directory, its lock and the two files
    assert tree(str(tmp_path / "run")) == {"teye", "teye/gpu-jobs", "teye/gpu-jobs/.lock", "teye/gpu-jobs/0",
                                           "teye/gpu-jobs/2.1"}
    assert tree(str(tmp_path / "cwd")) == {"7"}


BAD_JOBS = ["..", "1/../2", "12; rm -rf /", "", "-1", " 1", "1 ", "1_", "_", "1_2", "0x10", "４２"]


@pytest.mark.parametrize("bad", BAD_JOBS)
def test_gpu_prolog_and_epilog_refuse_a_job_id_that_is_not_a_number(tmp_path, bad):
    mapdir = tmp_path / "teye" / "gpu-jobs"
    run(PROLOG, {"TEYE_GPU_JOB_DIR": str(mapdir), "SLURM_JOB_ID": "77", "SLURM_JOB_GPUS": "0,1"}, str(tmp_path))
    before = {n: (tmp_path / "teye" / "gpu-jobs" / n).stat().st_mtime_ns for n in ("0", "1")}
    p = run(PROLOG, {"TEYE_GPU_JOB_DIR": str(mapdir), "SLURM_JOB_ID": bad, "SLURM_JOBID": "",
                     "SLURM_JOB_GPUS": "0,3"}, str(tmp_path))
    assert "not a number; nothing written" in p.stderr and p.stderr.count("\n") == 1
    p = run(GPU_EPILOG, {"TEYE_GPU_JOB_DIR": str(mapdir), "SLURM_JOB_ID": bad, "SLURM_JOBID": ""}, str(tmp_path))
    assert "not a number; nothing changed" in p.stderr and p.stderr.count("\n") == 1
    assert contents(str(mapdir)) == {"0": "77\n", "1": "77\n"}
    assert {n: (mapdir / n).stat().st_mtime_ns for n in ("0", "1")} == before
    assert tree(str(tmp_path)) == {"teye", "teye/gpu-jobs", "teye/gpu-jobs/.lock", "teye/gpu-jobs/0",
                                   "teye/gpu-jobs/1"}


def test_gpu_epilog_touches_only_index_named_files(tmp_path):
    mapdir = tmp_path / "gpu-jobs"
    run(PROLOG, {"TEYE_GPU_JOB_DIR": str(mapdir), "SLURM_JOB_ID": "77", "SLURM_JOB_GPUS": "0,1.1"}, str(tmp_path))
    for odd in ("1.", ".1", "1.1.1", "notes"):       # files someone else put there naming the job: left alone
        (mapdir / odd).write_text("77\n")
    run(GPU_EPILOG, {"TEYE_GPU_JOB_DIR": str(mapdir), "SLURM_JOB_ID": "77"}, str(tmp_path))
    assert contents(str(mapdir)) == {"1.": "77\n", "1.1.1": "77\n", "notes": "77\n"}
    assert sorted(os.listdir(mapdir)) == sorted([".lock", "1.", ".1", "1.1.1", "notes"])


REPORT_BAD_JOBS = ["..", "1/../2", "12; rm -rf /", "_", "1_", "_1", "1__2", "1_2_3", "-1", "1 2", "$(id)"]


@pytest.mark.parametrize("bad", REPORT_BAD_JOBS)
def test_report_epilog_refuses_a_job_id_that_is_not_a_number(tmp_path, bad):
    from tests.report import slurm_fakes
    calls = str(tmp_path / "sacctmgr.calls")
    env = {**slurm_fakes.install(str(tmp_path / "bin"), calls), "SLURM_JOB_ID": bad, "SLURM_JOBID": "",
           "TEYE_PROMETHEUS_URL": "http://127.0.0.1:1"}
    p = run(EPILOG, env, str(tmp_path))
    assert "not a number; nothing stored" in p.stderr and p.stderr.count("\n") == 1
    assert slurm_fakes.stored(calls) == []
    assert not os.path.exists(calls)


@pytest.mark.parametrize("good", ["4242", "4242_7"])
def test_report_epilog_takes_a_number_and_an_array_task(tmp_path, good):
    from tests.report import slurm_fakes
    calls = str(tmp_path / "sacctmgr.calls")
    env = {**slurm_fakes.install(str(tmp_path / "bin"), calls), "SLURM_JOB_ID": good,
           "TEYE_PROMETHEUS_URL": "http://127.0.0.1:1"}
    run(EPILOG, env, str(tmp_path))
    (c,) = slurm_fakes.stored(calls)
    assert c.startswith(f'teye1:{{"v":1,"job":"{good}"')
