"""The job's own CPU time from its processes (issue 47: a job outside Slurm has no cgroup of its own; its CPU is
its processes'), against the job's own clock: os.times() of its main process and of the children it reaped,
and a live child's own os.times() sent over a pipe.  A real process tree, a real /proc, a live agent."""
import json
import os
import subprocess
import sys

import pytest

from tests.client.helpers import REPO, LiveAgent, base_env

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.not_measuring("both sides read the same kernel CPU counters (os.times, /proc/<pid>/stat): load "
                           "stretches the job's wall time, never one CPU figure against the other")
def test_the_jobs_cpu_is_its_processes_by_their_own_clock(tmp_path):
    agent = LiveAgent(str(tmp_path))
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "cpu_job.py"), agent.path], env=base_env(), cwd=REPO,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        own = json.loads(p.stdout.readline())      # its clock, with its live child still alive
        jobs = agent.jobs()
        reading = agent.src.collect(force=True)
    finally:
        out, err = p.communicate("", timeout=60)
        agent.close()
    assert p.returncode == 0, err[-2000:]
    (cpu,) = [c for c in reading.cpu if c.train_job == "cpu_job"]
    clock = own["own_s"] + own["reaped_s"] + own["live_s"]
    assert own["reaped_s"] >= 0.45 and own["live_s"] >= 0.35 and own["own_s"] >= 0.55, own   # (10 ms ticks)
    # the same kernel ticks on both sides: the agent reads no less than the job's clock said (less two ticks of
    # rounding) and no more than what the job could spend after it (waiting on its stdin)
    assert clock - 0.03 <= cpu.seconds <= clock + 0.15, (cpu, own)
    assert cpu.cpus == len(os.sched_getaffinity(0))
    assert jobs["cpu_job"].steps == 7
