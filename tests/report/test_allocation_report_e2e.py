"""GPUs allocated but never busy, end to end: a Slurm job given 4 GPUs (mapping directory written by the
shipped prolog) runs one process on one of them; a pod is given 2 more GPUs (a fake kubelet pod-resources
server).  A live agent (scripted NVML trace, the job's cgroup in a captured tree) is scraped by a real
Prometheus; the metrics, PromQL and `teye report` must all say: 4 allocated, 3 never busy.

Oracles: the trace's script (only GPU 1 busy, 60 %; pid 5001 on GPU 1 in job 5150), the prolog's input
(GPUs 0-3), the fake kubelet's answer (GPUs 4 and 5), the cgroup tree's numbers (tests/data/cgroups).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import DATA, PROCFS
from tests.procs import REPO, Agent, Prometheus, prometheus_binary
from tests.report import scripted

pytestmark = pytest.mark.e2e
grpc = pytest.importorskip("grpc")
from tests.sources.test_allocation import PROLOG, FakeKubelet, response, slurm_script  # noqa: E402

JOB = "5150"
BUSY = (0.0, 0.6, 0.0, 0.0, 0.0, 0.0)
PIDS = (None, scripted.PIDS[0], None, None, None, None)     # the procfs tree puts PIDS[0] in job 5150
GiB = 1 << 30


def uuid(i):
    return f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}"    # the fake driver's UUIDs (tests/gpu/fake_pynvml.py)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    if not prometheus_binary():
        pytest.skip("prometheus not installed (./dev.sh test installs it)")
    tmp = tmp_path_factory.mktemp("alloc")
    trace = scripted.write_trace(str(tmp / "trace.jsonl"), seconds=60, proc_seconds=10_000, busy=BUSY, pids=PIDS)
    procfs = scripted.procfs_tree(str(tmp / "proc"), PROCFS, slurm=(JOB,))
    # the job's cgroup: job 2001 of the captured v2 tree (known values), renamed to the job
    cg = tmp / "cgroup"
    shutil.copytree(os.path.join(DATA, "cgroups", "v2_slurm"), cg)
    scope = cg / "system.slice" / "slurmstepd.scope"
    os.rename(scope / "job_2001", scope / f"job_{JOB}")
    mapdir = str(tmp / "gpu-jobs")
    slurm_script(PROLOG, mapdir, JOB, "0,1,2,3")
    kubelet = FakeKubelet(response([("ml", "loader-0", [("main", [("nvidia.com/gpu", [uuid(4), uuid(5)])], [])])]))
    conf = tmp / "teye.yml"
    conf.write_text(
        "collectors:\n" + "".join(f"  {c}: {{enabled: false}}\n"
                                  for c in ("disk", "network", "infiniband", "nfs", "nfsd", "pressure", "pmu"))
        + "  jobs: {interval_seconds: 1}\n  allocation: {interval_seconds: 1}\n"
        + f"allocation:\n  slurm_mapping_dir: {mapdir}\n  kubelet_socket: {kubelet.path}\n"
        + "  kubelet_refresh_seconds: 0.5\n")
    agent = prom = None
    try:
        agent = Agent(["--config", str(conf), "--procfs", procfs, "--cgroupfs", str(cg), "--gpu-replay", trace],
                      log_path=str(tmp / "agent.log"))
        prom = Prometheus(str(tmp), [f"127.0.0.1:{agent.port}"])
        prom.wait_for("count(teye_gpu_allocation_info) == 6", timeout=40)
        prom.wait_for(f'teye_gpu_process_info{{slurm_job="{JOB}"}}', timeout=30)
        # several scrapes of the busy GPU (each holds 6 driver samples of exactly its share; the report's
        # ratio read 0.6 from the first ones, a fixed 12 s here waited for nothing it checks)
        prom.wait_for('count_over_time(teye_gpu_busy_seconds_total{gpu="1"}[1m]) >= 5', timeout=30)
        yield {"prom": prom, "agent": agent, "tmp": tmp}
    finally:
        if prom:
            prom.stop()
        if agent:
            agent.stop()
        kubelet.stop()


def report(node, *args, fmt="json"):
    p = subprocess.run([sys.executable, "-m", "agent", "report", "--prometheus", node["prom"].url, "--format", fmt,
                        *args], capture_output=True, text=True, timeout=60, cwd=REPO)
    return p.returncode, (json.loads(p.stdout) if fmt == "json" else p.stdout), p.stderr


def test_metrics_show_every_allocated_gpu_busy_or_not(node):
    prom = node["prom"]
    got = {tuple(r["metric"].get(k, "") for k in ("gpu", "slurm_job", "namespace", "pod", "container"))
           for r in prom.query("teye_gpu_allocation_info")}
    assert got == {("0", JOB, "", "", ""), ("1", JOB, "", "", ""), ("2", JOB, "", "", ""), ("3", JOB, "", "", ""),
                   ("4", "", "ml", "loader-0", "main"), ("5", "", "ml", "loader-0", "main")}
    assert [r["metric"]["gpu"] for r in prom.query(f'teye_gpu_process_info{{slurm_job="{JOB}"}}')] == ["1"]
    idle = prom.query(f'count(teye_gpu_allocation_info{{slurm_job="{JOB}"}} unless on (instance, gpu) '
                      f'teye_gpu_process_info)')
    assert float(idle[0]["value"][1]) == 3
    assert prom.query("teye_kubelet_pod_resources_up")[0]["value"][1] == "1"


def test_report_counts_allocated_gpus_never_busy(node):
    rc, doc, err = report(node, "--slurm-job", JOB, "--since", "10m")
    assert rc in (11, 12), err            # still running; no phases reported
    j = doc["jobs"][0]
    assert sorted(g["gpu"] for g in j["gpus"]) == ["0", "1", "2", "3"]
    never = [g["gpu"] for g in j["gpus"] if g["busy_ratio"] is not None and g["busy_ratio"] < 0.01]
    assert never == ["0", "2", "3"]
    busy = [g for g in j["gpus"] if g["gpu"] == "1"][0]["busy_ratio"]
    assert busy == pytest.approx(0.6, abs=0.02)
    assert j["notes"][0].startswith("3 of 4 allocated GPUs never busy: Only one GPU of 4 did work (GPU 1 on ")
    # host figures from the job's own cgroup (the captured tree's job: 7 GiB peak, 16 GiB limit, 2 MiB read)
    assert j["cpu"]["source"] == "job_cgroup" and j["cpu"]["cgroup_cpus"] == 3
    assert j["memory"] == {**j["memory"], "source": "job_cgroup", "peak_bytes": 7 * GiB, "limit_bytes": 16 * GiB,
                           "requested_bytes": 16 * GiB}
    # the job's counters appear with its cgroup: counted from zero, the whole of them is the job's
    assert j["io"] == {"read_bytes": 2 * 1048576, "written_bytes": 2097152, "source": "job_cgroup"}
    assert j["cpu"]["job_seconds"] == 40.0
    rc, text, _ = report(node, "--slurm-job", JOB, "--since", "10m", fmt="text")
    assert "3 of 4 allocated GPUs never busy" in text
    assert "of 3 allocated cores (the job's cgroup)" in text
