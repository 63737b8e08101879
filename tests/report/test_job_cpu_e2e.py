"""The report's CPU efficiency of a job outside Slurm from its own processes (issue 47), through a real agent on
the real /proc and a real Prometheus: tests/client/cpu_job.py burns CPU in its main process, in a child it reaps
and in a child that stays alive, and says its own clock (os.times(); the live child's own, over a pipe).

Oracle: that clock, not the agent's counters.  The job holds its processes until Prometheus has scraped their
whole CPU time, so the last reading is the whole job's."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.client.helpers import base_env
from tests.phases.helpers import shared_tmpdir
from tests.procs import REPO, Agent, Prometheus, prometheus_binary

pytestmark = [pytest.mark.e2e,
              pytest.mark.not_measuring("CPU seconds of the same kernel counters on both sides (os.times, "
                                        "/proc/<pid>/stat): load stretches the job, never one against the other")]
OFF = ("disk", "network", "infiniband", "nfs", "nfsd", "pressure", "pmu", "netstat", "netclass", "filesystem", "gpu")
SCRIPT = os.path.join(REPO, "tests", "client", "cpu_job.py")


def test_a_job_outside_slurm_is_judged_by_its_own_processes_cpu(tmp_path):
    if not prometheus_binary():
        pytest.skip("prometheus not installed (./dev.sh test installs it)")
    d = shared_tmpdir()
    sock = os.path.join(d, "phases.sock")
    conf = tmp_path / "teye.yaml"
    conf.write_text("collectors:\n" + "".join(f"  {c}: {{enabled: false}}\n" for c in OFF))
    agent = Agent(["--config", str(conf), "--phase-socket", sock], log_path=str(tmp_path / "agent.log"))
    prom = job = None
    try:
        prom = Prometheus(str(tmp_path), [f"127.0.0.1:{agent.port}"])
        prom.wait_for("up == 1", timeout=30)
        job = subprocess.Popen([sys.executable, SCRIPT, sock], env=base_env(), cwd=REPO, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        own = json.loads(job.stdout.readline())
        clock = own["own_s"] + own["reaped_s"] + own["live_s"]
        # its processes stay until Prometheus holds their whole CPU time (the agent reads them each second)
        prom.wait_for(f'teye_job_cpu_seconds_total{{train_job="cpu_job"}} >= {clock - 0.03}', timeout=30)
        out, err = job.communicate("", timeout=60)
        assert job.returncode == 0, err[-2000:]
        rep = subprocess.run([sys.executable, "-m", "agent", "report", "--prometheus", prom.url, "--train-job",
                              "cpu_job", "--format", "json", "--since", "5m"], capture_output=True, text=True,
                             timeout=120, cwd=REPO, env=base_env())
        assert rep.stdout.strip(), (rep.returncode, rep.stderr)
        (j,) = json.loads(rep.stdout)["jobs"]
        text = subprocess.run([sys.executable, "-m", "agent", "report", "--prometheus", prom.url, "--train-job",
                               "cpu_job", "--since", "5m"], capture_output=True, text=True, timeout=120, cwd=REPO,
                              env=base_env()).stdout
    finally:
        if job is not None and job.poll() is None:
            job.kill()
        if prom is not None:
            prom.stop()
        agent.stop()
    cpu = j["cpu"]
    print("cpu", cpu, "own", own)
    cpus = len(os.sched_getaffinity(0))
    assert cpu["source"] == "job_processes" and cpu["allocated_cores"] == cpus, cpu
    assert clock - 0.03 <= cpu["job_seconds"] <= clock + 0.15, (cpu, own)
    assert not cpu["short_run"] and cpu["efficiency"] is not None, cpu
    assert 0 < cpu["efficiency"] <= cpu["job_seconds"] / cpus / max(j["run_seconds"], 1e-9), (cpu, j["run_seconds"])
    assert f"of {cpus} CPUs they may run on (the job's processes and their workers" in text, text
