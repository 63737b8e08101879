"""Real cgroups on this machine: two Slurm-style jobs, one burning a core and one idle, under a live agent
and a real Prometheus.  Each job's CPU seconds must match its process's own getrusage() (within 5 %).

Needs root and a cgroup v1 cpuacct hierarchy (the Debian test VM mounts cpuacct, cpu, memory, blkio);
the job cgroups are created under <cgroupfs>/<controller>/slurm/uid_0/job_<id>/step_0, as Slurm's
task plugin lays them out, and removed afterwards.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.procs import REPO, Agent, Prometheus

pytestmark = pytest.mark.e2e

CGROUPFS = "/sys/fs/cgroup"
CONTROLLERS = ("cpuacct", "cpu", "memory", "blkio")
BURN_S = 3.0

CHILD = r"""
import json, os, resource, sys, time
dirs, burn, out = sys.argv[1].split(":"), float(sys.argv[2]), sys.argv[3]
for d in dirs:
    with open(os.path.join(d, "cgroup.procs"), "w") as fh:
        fh.write(str(os.getpid()))
r0 = resource.getrusage(resource.RUSAGE_SELF)      # from here on, the cgroup counts this process
buf = bytearray(64 << 20)                          # charged to the job's memory cgroup: touch every page
buf[::4096] = b"\x01" * len(buf[::4096])
t0 = time.process_time()                           # burn CPU seconds, not wall seconds (the machine is shared)
x = 0
while burn and time.process_time() - t0 < burn:
    x += 1
r1 = resource.getrusage(resource.RUSAGE_SELF)
with open(out + ".tmp", "w") as fh:
    json.dump({"user": r1.ru_utime - r0.ru_utime, "system": r1.ru_stime - r0.ru_stime}, fh)
os.rename(out + ".tmp", out)
time.sleep(3600)                                   # stays in its cgroup (idle) until the test ends
"""


def _usable() -> str:
    if os.geteuid() != 0:
        return "needs root to create cgroups"
    for c in CONTROLLERS:
        if not os.path.exists(os.path.join(CGROUPFS, c, "cgroup.procs")):
            return f"no cgroup v1 {c} hierarchy at {CGROUPFS}/{c}"
    return ""


class JobCgroups:
    """job_<id>/step_0 in each v1 hierarchy; removed (deepest first) by cleanup()."""

    def __init__(self, job_id: int):
        self.job_id = job_id
        self.created = []
        for c in CONTROLLERS:
            path = os.path.join(CGROUPFS, c)
            for part in ("slurm", "uid_0", f"job_{job_id}", "step_0"):
                path = os.path.join(path, part)
                if not os.path.isdir(path):
                    os.mkdir(path)
                    self.created.append(path)
        with open(os.path.join(CGROUPFS, "cpu", "slurm", "uid_0", f"job_{job_id}", "cpu.cfs_quota_us"), "w") as fh:
            fh.write("200000")   # 2 CPUs over the default 100 ms period

    def steps(self):
        return [os.path.join(CGROUPFS, c, "slurm", "uid_0", f"job_{self.job_id}", "step_0") for c in CONTROLLERS]



def cleanup(*jobs: JobCgroups) -> None:
    """Remove what the jobs created, deepest first (the shared slurm/uid_0 after both jobs)."""
    for path in sorted({p for j in jobs for p in j.created}, key=len, reverse=True):
        for _ in range(20):
            try:
                os.rmdir(path)
                break
            except FileNotFoundError:
                break
            except OSError:       # EBUSY for a moment after the killed process
                time.sleep(0.1)


@pytest.mark.measures("each job's CPU seconds against its process's getrusage; the jobs burn CPU")
@pytest.mark.skipif(bool(_usable()), reason=_usable() or "ok")
def test_two_jobs_cpu_seconds_match_their_processes_getrusage(tmp_path):
    base = 900000 + os.getpid() % 50000
    burner, idler = JobCgroups(base), JobCgroups(base + 1)
    procs = []
    agent = prom = None
    try:
        cfg = tmp_path / "teye.yml"
        cfg.write_text("collectors:\n  jobs:\n    interval_seconds: 0.5\n  gpu:\n    enabled: false\n"
                       "  pmu:\n    enabled: false\n")
        agent = Agent(["--config", str(cfg), "--cgroupfs", CGROUPFS])
        prom = Prometheus(str(tmp_path), [f"127.0.0.1:{agent.port}"])
        prom.wait_for('up{job="teye"} == 1')      # Prometheus scrapes the agent before the jobs start
        outs = {}
        for job, burn in ((burner, BURN_S), (idler, 0.0)):
            out = str(tmp_path / f"rusage-{job.job_id}.json")
            outs[job.job_id] = out
            procs.append(subprocess.Popen([sys.executable, "-c", CHILD, ":".join(job.steps()), str(burn), out]))
        usage = {}
        deadline = time.monotonic() + 20 * BURN_S
        while len(usage) < 2 and time.monotonic() < deadline:
            for jid, out in outs.items():
                if jid not in usage and os.path.exists(out):
                    with open(out) as fh:
                        usage[jid] = json.load(fh)
            time.sleep(0.2)
        assert len(usage) == 2, "the job processes did not report their rusage"
        time.sleep(2.5)    # the agent reads every 0.5 s, Prometheus scrapes every 1 s: both saw the final counters
        # a run time of several scrapes, so that the report's efficiency has a window to speak of
        prom.wait_for(f'count_over_time(teye_slurm_job_cpu_seconds_total{{slurm_job="{base + 1}",mode="user"}}[1m])'
                      f' >= 6', timeout=30)
        got = {}
        for r in prom.query(f'teye_slurm_job_cpu_seconds_total{{slurm_job=~"{base}|{base + 1}"}}'):
            got[(int(r["metric"]["slurm_job"]), r["metric"]["mode"])] = float(r["value"][1])
        for jid, u in usage.items():
            own = u["user"] + u["system"]
            seen = got[(jid, "user")] + got[(jid, "system")]
            if jid == base:
                assert own >= BURN_S, u                 # it really burned a core for BURN_S
                assert seen == pytest.approx(own, rel=0.05), (jid, got, u)
            else:
                # idle but for touching its 64 MiB (tens of ms of page faults, more on a loaded machine): its
                # own seconds, none of the burner's
                assert own < 0.1 * BURN_S, u
                assert seen == pytest.approx(own, abs=0.02), (jid, got, u)
        cpus = {int(r["metric"]["slurm_job"]): float(r["value"][1])
                for r in prom.query(f'teye_slurm_job_cpus{{slurm_job=~"{base}|{base + 1}"}}')}
        assert cpus == {base: 2.0, base + 1: 2.0}      # from cpu.cfs_quota_us / cfs_period_us
        mem = {int(r["metric"]["slurm_job"]): float(r["value"][1])
               for r in prom.query(f'teye_slurm_job_memory_used_bytes{{slurm_job=~"{base}|{base + 1}"}}')}
        assert set(mem) == {base, base + 1} and all(v >= 64 << 20 for v in mem.values()), mem   # 64 MiB each
        # teye report: each job its own CPU efficiency, from its own cgroup; the node-wide figure is another
        p = subprocess.run([sys.executable, "-m", "agent", "report", "--prometheus", prom.url, "--format", "json",
                            "--slurm-job", str(base), "--slurm-job", str(base + 1), "--cpus", "2", "--since", "10m"],
                           capture_output=True, text=True, timeout=60, cwd=REPO)
        doc = json.loads(p.stdout)
        jobs = {int(j["slurm_job"]): j for j in doc["jobs"]}
        assert set(jobs) == {base, base + 1}, p.stderr
        for jid, j in jobs.items():
            own = usage[jid]["user"] + usage[jid]["system"]
            assert j["cpu"]["source"] == "job_cgroup" and j["cpu"]["allocated_cores"] == 2
            assert j["cpu"]["job_seconds"] == pytest.approx(own, rel=0.05, abs=0.02)
            expected = own / (2 * (j["run_seconds"] + doc["step_seconds"]))     # CPU s / (cores x run time)
            assert j["cpu"]["efficiency"] == pytest.approx(expected, rel=0.05, abs=0.005), (jid, j["cpu"])
            assert j["cpu"]["node_busy_seconds"] > j["cpu"]["job_seconds"] + 0.05 or jid == base   # the whole node
        assert jobs[base]["cpu"]["efficiency"] > 0.1 > jobs[base + 1]["cpu"]["efficiency"]
        assert all(n.startswith("CPU cores mostly idle") and "whole-node" not in n
                   for n in jobs[base + 1]["notes"] if "CPU" in n)
        anon = {int(r["metric"]["slurm_job"]): float(r["value"][1])
                for r in prom.query(f'teye_slurm_job_memory_anon_bytes{{slurm_job=~"{base}|{base + 1}"}}')}
        assert all(v >= 64 << 20 for v in anon.values()) and len(anon) == 2, anon
    finally:
        for p in procs:
            p.kill()
            p.wait()
        if prom:
            prom.stop()
        if agent:
            agent.stop()
        cleanup(burner, idler)
    for c in CONTROLLERS:
        assert not os.path.exists(os.path.join(CGROUPFS, c, "slurm")), "cgroups left behind"
