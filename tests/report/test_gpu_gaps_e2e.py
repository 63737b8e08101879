"""The report's GPU figures against a replayed GPU trace with known idle gaps (issue 47): a real agent replays a
scripted driver whose GPU 0, held by Slurm job 4242's process, is busy through every sample but five stretches
of whole idle samples of known lengths; a real Prometheus scrapes it; `teye report --slurm-job 4242`.

Oracle: the trace's own timeline (tests/gpu/fake_pynvml.Timeline.gaps: its idle stretches), not the agent's
counters: the gaps' count, their seconds and mean, and the busy share over the report's window."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.conftest import PROCFS
from tests.gpu.fake_pynvml import Timeline
from tests.procs import REPO, Agent, Prometheus, prometheus_binary
from tests.report import scripted

pytestmark = pytest.mark.e2e

P = scripted.PERIOD_US
# (second into the trace, whole idle samples): 0.5, 1.0, 2.0, 0.17 and 1.5 s, after Prometheus' first scrapes
GAPS = ((16, 3), (22, 6), (28, 12), (34, 1), (40, 9))
HELD_S, TRACE_S = 46, 70
OFF = ("disk", "network", "infiniband", "nfs", "nfsd", "pressure", "pmu", "netstat", "netclass", "filesystem")


def gappy_timeline() -> Timeline:
    """Busy through every sample period except GAPS (whole samples idle): busy intervals that touch are one."""
    idle = set()
    for sec, n in GAPS:
        k0 = int(sec * scripted.S / P)
        idle.update(range(k0, k0 + n))
    busy = [(scripted.START_US + k * P, scripted.START_US + (k + 1) * P)
            for k in range(-120, int(TRACE_S * scripted.S / P) + 2) if k not in idle]
    merged = []
    for a, b in busy:
        if merged and merged[-1][1] == a:
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return Timeline(merged)


def test_the_reports_gpu_busy_share_and_idle_gaps_are_the_traces(tmp_path):
    if not prometheus_binary():
        pytest.skip("prometheus not installed (./dev.sh test installs it)")
    tl = gappy_timeline()
    truth = [(b - a) / 1e6 for a, b in tl.gaps(scripted.START_US, scripted.START_US + TRACE_S * scripted.S)]
    assert len(truth) == len(GAPS)   # (the oracle's own check: the five stretches, nothing else)
    trace = scripted.write_trace(str(tmp_path / "trace.jsonl"), seconds=TRACE_S, proc_seconds=HELD_S,
                                 busy=(1.0, 1.0), pids=(scripted.PIDS[0], None), timelines=[tl])
    conf = tmp_path / "teye.yaml"
    conf.write_text("collectors:\n" + "".join(f"  {c}: {{enabled: false}}\n" for c in OFF))
    procfs = scripted.procfs_tree(str(tmp_path / "proc"), PROCFS)
    agent = Agent(["--config", str(conf), "--procfs", procfs, "--gpu-replay", trace],
                  log_path=str(tmp_path / "agent.log"))
    prom = None
    try:
        prom = Prometheus(str(tmp_path), [f"127.0.0.1:{agent.port}"])
        prom.wait_for("count(up == 1) == 1", timeout=30)
        deadline = time.monotonic() + HELD_S + 40
        while not prom.query('teye_gpu_process_info{slurm_job="4242"}') and time.monotonic() < deadline:
            time.sleep(0.5)
        while prom.query('teye_gpu_process_info{slurm_job="4242"}') and time.monotonic() < deadline:
            time.sleep(0.5)   # the job ends when its process leaves GPU 0 (HELD_S into the trace)
        time.sleep(2.0)
        p = subprocess.run([sys.executable, "-m", "agent", "report", "--prometheus", prom.url, "--format", "json",
                            "--slurm-job", "4242"], capture_output=True, text=True, timeout=60, cwd=REPO)
    finally:
        if prom:
            prom.stop()
        agent.stop()
    doc = json.loads(p.stdout)
    (j,) = doc["jobs"]
    # (no training loop reports phases here: the report says so, and its exit status with it)
    assert [c["kind"] for c in j["conditions"]] == ["no_phases"] and p.returncode == 12, p.stderr[-2000:]
    assert j["state"] == "finished", j["state"]
    window = j["end"] - j["start"]
    busy = 1 - sum(truth) / window
    print(f"report: busy {j['gpu_busy_ratio']:.4f} over {window:.1f} s, gaps {j['idle_gaps']}; trace: "
          f"{len(truth)} gaps, {sum(truth):.3f} s, mean {sum(truth) / len(truth):.4f} s, busy {busy:.4f}")
    gaps = j["idle_gaps"]
    assert gaps["count"] == len(truth)
    assert gaps["seconds"] == pytest.approx(sum(truth), abs=0.01)
    assert gaps["mean_seconds"] == pytest.approx(sum(truth) / len(truth), abs=0.005)
    # the window's edges are Prometheus' scrapes (1 s apart): the share to within what a second more or less moves it
    assert j["gpu_busy_ratio"] == pytest.approx(busy, abs=sum(truth) / window ** 2 * 2 + 0.002)
    assert [g["gpu"] for g in j["gpus"]] == ["0"]
