"""`teye report` end to end: a real Prometheus scrapes two live agents (scripted GPU driver, processes in
Slurm jobs) while phase-reporting loops run, plus one scripted target that restarts and vanishes.

Oracles: the scripted driver's busy shares and memory (tests/report/scripted.py), the loops' own
perf_counter timing (input-bound share, samples/s), the loops' step and sample counts, and PromQL
evaluated by Prometheus itself at the report's window (energy, idle time by phase, step-time quantiles).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import PROCFS
from tests.phases.helpers import shared_tmpdir
from tests.procs import REPO, Agent, Prometheus, free_port, prometheus_binary
from tests.report import scripted

# the report's input-bound shares and rates against the loops' own perf_counter, for every test of the cluster
pytestmark = [pytest.mark.e2e, pytest.mark.measures("the report's shares against the loops' own perf_counter")]

try:
    USER = __import__("pwd").getpwuid(scripted.UID).pw_name
except KeyError:
    USER = str(scripted.UID)

OFF = ("disk", "network", "infiniband", "nfs", "nfsd", "pressure", "pmu")
LOOP = textwrap.dedent("""
    import json, sys, time
    from workloads.phases import Reporter
    rep = Reporter(train_job=sys.argv[1])
    n, dw, cp = int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    wait = total = 0.0
    t_start = time.time()
    for _ in range(n):
        a = time.perf_counter()
        with rep.phase("data_wait"):
            time.sleep(dw)
        b = time.perf_counter()
        with rep.phase("compute"):
            time.sleep(cp)
        rep.step(samples=32)
        c = time.perf_counter()
        wait += b - a
        total += c - a
    rep.close() if hasattr(rep, "close") else None
    print(json.dumps({"wait": wait, "total": total, "steps": n, "samples": 32 * n, "start": t_start,
                      "end": time.time()}))
""")


# A steps-only loop: unmodified PyTorch without a DataLoader, its own slow input (50 ms a batch), under the
# zero-code hook with the step's parts off (source torch-steps): the agent sees its steps and nothing of its
# input wait.
STEPS_ONLY = textwrap.dedent("""
    import json, sys, time
    import torch
    m = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    n = int(sys.argv[1])
    t_start = time.time()
    a = time.perf_counter()
    for _ in range(n):
        time.sleep(0.05)     # reading its own batches
        x = torch.ones(8, 4)
        opt.zero_grad(); m(x).sum().backward(); opt.step()
    total = time.perf_counter() - a
    print(json.dumps({"steps": n, "start": t_start, "end": time.time(), "total": total}))
""")


class Scripted:
    """Target C: Slurm job 4250 on one GPU, 50 % busy; the agent restarts at 5 s (counters from zero)
    and the node does not answer from 8 s to 11 s; the job's process exits at 14 s."""

    def __init__(self, render=None):
        self.t0 = None   # its clock starts at Prometheus' first scrape
        if render is not None:
            self.render = render
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                if outer.t0 is None:
                    outer.t0 = time.monotonic()
                body = outer.render(time.monotonic() - outer.t0)
                if body is None:
                    self.send_error(503)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.port = free_port()
        self.srv = ThreadingHTTPServer(("127.0.0.1", self.port), H)
        self.srv.daemon_threads = True
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    @staticmethod
    def render(el):
        if 8.0 <= el < 11.0:
            return None
        since = el - 5.0 if el >= 5.0 else el
        out = ["# TYPE teye_gpu_busy_seconds_total counter", f'teye_gpu_busy_seconds_total{{gpu="0"}} {0.5 * since}',
               "# TYPE teye_gpu_sampled_seconds_total counter", f'teye_gpu_sampled_seconds_total{{gpu="0"}} {since}']
        if el < 14.0:
            out += ["# TYPE teye_gpu_process_info gauge",
                    'teye_gpu_process_info{gpu="0",pid="7",user="carol",slurm_job="4250",pod_uid=""} 1']
        return ("\n".join(out) + "\n").encode()

    def stop(self):
        self.srv.shutdown()


SKEW_S = 20.0


def skewed(el):
    """Target D: Slurm job 4260, 40 % busy, from a node whose clock is SKEW_S ahead: its samples carry their
    own timestamps (as an edge Prometheus of the central tier stamps them with its clock)."""
    ms = int((time.time() + SKEW_S) * 1000)
    out = ["# TYPE teye_gpu_busy_seconds_total counter", f'teye_gpu_busy_seconds_total{{gpu="0"}} {0.4 * el} {ms}',
           "# TYPE teye_gpu_sampled_seconds_total counter", f'teye_gpu_sampled_seconds_total{{gpu="0"}} {el} {ms}',
           "# TYPE teye_gpu_process_info gauge",
           f'teye_gpu_process_info{{gpu="0",pid="8",user="dan",slurm_job="4260",pod_uid=""}} 1 {ms}']
    return ("\n".join(out) + "\n").encode()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if not prometheus_binary():
        pytest.skip("prometheus not installed (./dev.sh test installs it)")
    tmp = tmp_path_factory.mktemp("report")
    d = shared_tmpdir()
    trace = scripted.write_trace(str(tmp / "trace.jsonl"), seconds=180, proc_seconds=30)
    # node b joins job 4242 later (its GPU 0 process starts 15 s into its trace, after Prometheus first scraped
    # it): a node that joins after the start has not vanished.  Job 4244 takes its GPU 1 at 22 s, after the
    # training job "early-b" used that GPU (its series outlive it, but it is not part of 4244)
    trace_b = scripted.write_trace(str(tmp / "trace-b.jsonl"), seconds=180, proc_seconds=30, proc_from=(15, 22))
    conf = tmp / "teye.yaml"
    conf.write_text("collectors:\n" + "".join(f"  {c}: {{enabled: false}}\n" for c in OFF))
    procs_a = scripted.procfs_tree(str(tmp / "proc-a"), PROCFS)
    procs_b = scripted.procfs_tree(str(tmp / "proc-b"), PROCFS, slurm=("4242", "4244"))
    agents, loops, prom, target, ahead = [], {}, None, None, None
    try:
        for name, procfs, tr in (("a", procs_a, trace), ("b", procs_b, trace_b)):
            sock = os.path.join(d, f"{name}.sock")
            ag = Agent(["--config", str(conf), "--procfs", procfs, "--phase-socket", sock, "--gpu-replay", tr],
                       log_path=str(tmp / f"agent-{name}.log"))
            ag.sock = sock
            agents.append(ag)
        target, ahead = Scripted(), Scripted(skewed)
        prom = Prometheus(str(tmp), [f"127.0.0.1:{a.port}" for a in agents] +
                          [f"127.0.0.1:{target.port}", f"127.0.0.1:{ahead.port}"])
        prom.wait_for("count(up == 1) == 4", timeout=30)   # Prometheus' first scrapes come ~6 s after start
        env = {**os.environ, "PYTHONPATH": REPO}
        runs = [("a", "in-4242", agents[0], "0", ("200", "0.03", "0.01")),
                ("a", "cmp-4243", agents[0], "1", ("250", "0.001", "0.03")),
                ("b", "in-4242", agents[1], "0", ("130", "0.05", "0.01")),
                ("a", "cpu-only", agents[0], "", ("100", "0.002", "0.02")),     # no GPU, no Slurm job
                ("b", "early-b", agents[1], "1", ("40", "0.01", "0.02"))]
        ps = {(node, job): subprocess.Popen([sys.executable, "-c", LOOP, job, *args], stdout=subprocess.PIPE,
                                            env={**env, "TEYE_PHASE_SOCKET": ag.sock, "CUDA_VISIBLE_DEVICES": cvd})
              for node, job, ag, cvd, args in runs}
        site = os.path.join(REPO, "teye_client", "_site")
        ps[("a", "steps-only")] = subprocess.Popen(
            [sys.executable, "-c", STEPS_ONLY, "60"], stdout=subprocess.PIPE,
            env={**env, "PYTHONPATH": os.pathsep.join([site, REPO]), "TEYE_PHASE_SOCKET": agents[0].sock,
                 "TEYE_TRAIN_JOB": "steps-only", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
                 # the parts off: no forward's start, so its own input cannot be placed (steps only; with the
                 # parts on it is torch-forward, tests/client/test_torch_data_work.py)
                 "TEYE_STEP_PARTS": "0"})
        for k, p in ps.items():
            out, _ = p.communicate(timeout=60)
            assert p.returncode == 0
            loops[k] = json.loads(out)
        # the Slurm jobs end when the scripted processes exit (30 s into the trace); wait for Prometheus to see it
        deadline = time.monotonic() + 40
        while prom.query('teye_gpu_process_info{slurm_job=~"4242|4250"}') and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(2.0)
        yield {"prom": prom, "agents": agents, "loops": loops, "tmp": tmp,
               "nodes": [f"127.0.0.1:{a.port}" for a in agents], "c": f"127.0.0.1:{target.port}",
               "d": f"127.0.0.1:{ahead.port}"}
    finally:
        if prom:
            prom.stop()
        for t in (target, ahead):
            if t:
                t.stop()
        for a in agents:
            a.stop()
        shutil.rmtree(d, ignore_errors=True)


def report(cluster, *args, fmt="json"):
    p = subprocess.run([sys.executable, "-m", "agent", "report", "--prometheus", cluster["prom"].url,
                        "--format", fmt, *args], capture_output=True, text=True, timeout=60, cwd=REPO)
    doc = json.loads(p.stdout) if fmt == "json" and p.stdout.strip() else p.stdout
    return p.returncode, doc, p.stderr


def promql(cluster, expr, at):
    res = cluster["prom"].api("query", query=expr, time=f"{at:.3f}")["result"]
    return {tuple(sorted((k, v) for k, v in r["metric"].items() if k != "job")): float(r["value"][1]) for r in res}


def counter_diff(cluster, sel, a, b):
    """PromQL truth: the counter's value at b minus its value at a (0 where it did not exist yet), summed."""
    expr = f"sum(({sel}) - (({sel} offset {int(round((b - a) * 1000))}ms) or ({sel}) * 0))"
    return sum(promql(cluster, expr, b).values())


def rel(x, y, tol=0.02):
    return x == pytest.approx(y, rel=tol)


def test_input_bound_two_node_job_and_compute_bound_job(cluster):
    rc, doc, err = report(cluster, "--slurm-job", "4242", "--slurm-job", "4243")
    assert rc == 0, err
    jobs = {j["slurm_job"]: j for j in doc["jobs"]}
    a, b = cluster["nodes"]
    step = doc["step_seconds"]
    # --- job 4242: two nodes, input bound on GPU 0 of each (30 % busy in the scripted driver)
    j = jobs["4242"]
    assert j["state"] == "finished" and j["complete"] and j["conditions"] == []
    assert j["nodes"] == sorted([a, b]) and j["train_jobs"] == ["in-4242"] and j["user"] == USER
    assert sorted((g["node"], g["gpu"]) for g in j["gpus"]) == sorted([(a, "0"), (b, "0")])
    assert rel(j["gpu_busy_ratio"], scripted.BUSY[0])
    for g in j["gpus"]:
        assert rel(g["busy_ratio"], scripted.BUSY[0])
        assert g["memory_peak_bytes"] == 2 * 2**30 + scripted.PROC_MEM
    assert j["gpu_memory_peak_bytes"] == 2 * 2**30 + scripted.PROC_MEM
    # the loops' own timing: data_wait share and throughput
    la, lb = cluster["loops"][("a", "in-4242")], cluster["loops"][("b", "in-4242")]
    assert rel(j["input_bound_ratio"], (la["wait"] + lb["wait"]) / (la["total"] + lb["total"]))
    assert j["steps"] == la["steps"] + lb["steps"] and j["samples"] == la["samples"] + lb["samples"]
    (tj,) = j["train_job_details"]
    per = {p["node"]: p for p in tj["per_node"]}
    assert rel(per[a]["samples_per_second"], la["samples"] / la["total"])
    assert rel(per[b]["samples_per_second"], lb["samples"] / lb["total"])
    assert rel(j["samples_per_second"], la["samples"] / la["total"] + lb["samples"] / lb["total"])
    assert j["slowest_node"] == b   # 50 ms data waits there, 30 ms on a
    # the train job's active window is the loops' own wall-clock span, to the sampling chain: the agent's phases
    # read (1 s), Prometheus' scrape (1 s) and the report's query step each delay the first sample up to one step
    # (2 steps + 0.5 s missed it by 0.24 s once, x21)
    assert abs(per[a]["start"] - la["start"]) <= 3 * step + 0.5 and abs(per[a]["end"] - la["end"]) <= 3 * step + 0.5
    # verdict over the job's life, its cause, notes
    assert j["verdict"] == "input" and j["verdict_shares"]["input"] >= 0.8
    assert j["input_cause"] in ("storage", "unknown")   # sleeping in data_wait: little CPU (procfs is a fixture)
    # a Reporter that did not say which framework it runs: the neutral advice of verdict.recommendation
    assert j["source"] == "client"
    from agent.phases.verdict import recommendation
    assert f"Verdict input (cause {j['input_cause']}): {recommendation('input', j['input_cause'], 'client')}" \
        in j["notes"]
    assert any(n.startswith("GPU busy 30 %") for n in j["notes"])
    # PromQL truth over the report's own window (from one step before the start to the end), by Prometheus'
    # instant-vector rule at both ends (the newest sample at or before each: what a range query's grid reads;
    # a max/min over the samples inside the window differs from it by a scrape wherever a scrape came late)
    energy = gaps_n = 0.0
    for g in j["gpus"]:     # each GPU over the time the job held it, from one step before
        for name in ("teye_gpu_energy_joules_total", "teye_gpu_idle_gap_seconds_count"):
            sel = f'{name}{{gpu="{g["gpu"]}",instance="{g["node"]}"}}'
            d = int(round((g["end"] - g["start"] + step) * 1000))
            # (a series the agent created inside the window counts from its first sample, as the report does)
            (v,) = promql(cluster, f"{sel} - ({sel} offset {d}ms or min_over_time({sel}[{d}ms]))", g["end"]).values()
            if name.startswith("teye_gpu_energy"):
                energy += v
            else:
                gaps_n += v
    assert rel(j["gpu_energy_joules"], energy)
    assert j["gpu_energy_kwh"] == pytest.approx(j["gpu_energy_joules"] / 3.6e6, rel=1e-3)
    for phase in ("data_wait", "compute"):
        sel = f'teye_job_gpu_idle_seconds_total{{train_job="in-4242",phase="{phase}"}}'
        truth = counter_diff(cluster, sel, tj["start"] - step, tj["end"])
        assert rel(j["gpu_idle_seconds_by_phase"][phase], truth), phase
    # step time (issue 39): the mean is the histogram's own _sum / _count over the window, and the loops' own
    # clock; a quantile is the bucket Prometheus' estimate lies in (histogram_quantile interpolates inside it)
    from agent.phases.jobs import STEP_BUCKETS
    ta, tb = tj["start"] - step, tj["end"]
    s_sum = counter_diff(cluster, 'teye_job_step_seconds_sum{train_job="in-4242"}', ta, tb)
    s_count = counter_diff(cluster, 'teye_job_step_seconds_count{train_job="in-4242"}', ta, tb)
    assert s_count == la["steps"] + lb["steps"]
    assert j["step_seconds_mean"] == pytest.approx(s_sum / s_count, rel=1e-12)
    assert rel(j["step_seconds_mean"], (la["total"] + lb["total"]) / (la["steps"] + lb["steps"]), 0.05)
    for q, key in ((0.5, "step_seconds_p50_bounds"), (0.95, "step_seconds_p95_bounds")):
        b_sel = 'teye_job_step_seconds_bucket{train_job="in-4242"}'
        expr = (f"histogram_quantile({q}, sum by (le) (({b_sel}) - (({b_sel} offset {int(round((tb - ta) * 1000))}ms) "
                f"or ({b_sel}) * 0)))")
        (truth,) = promql(cluster, expr, tb).values()
        lo, hi = j[key]
        assert lo < truth <= hi and hi in STEP_BUCKETS, key
        assert lo == 0 or STEP_BUCKETS.index(hi) == STEP_BUCKETS.index(lo) + 1, key     # one bucket
    assert j["idle_gaps"]["count"] == gaps_n
    # when each node held GPU 0 for the job: the first and last sample of its process, to the report's step
    for g in j["gpus"]:
        sel = f'timestamp(teye_gpu_process_info{{slurm_job="4242",instance="{g["node"]}"}})'
        d = int((j["end"] - j["start"] + 60) * 1000)
        (first,) = promql(cluster, f"min_over_time({sel}[{d}ms:100ms])", j["end"] + 5).values()
        (last,) = promql(cluster, f"max_over_time({sel}[{d}ms:100ms])", j["end"] + 5).values()
        assert first - 0.01 <= g["start"] <= first + step + 0.01 and last - 0.01 <= g["end"] <= last + step + 0.01
    assert j["start"] == min(g["start"] for g in j["gpus"]) and j["end"] == max(g["end"] for g in j["gpus"])
    assert j["run_seconds"] == pytest.approx(j["end"] - j["start"], abs=1e-3)
    # the verdict's shares: the time-average of teye_job_bottleneck over each node's active window
    for kind in ("input", "compute"):
        avgs = []
        for p in tj["per_node"]:
            d = int(round((p["end"] - p["start"] + step) * 1000))
            (v,) = promql(cluster, f'avg_over_time(teye_job_bottleneck{{train_job="in-4242",kind="{kind}",'
                                   f'instance="{p["node"]}"}}[{d}ms])', p["end"]).values()
            avgs.append(v)
        assert j["verdict_shares"][kind] == pytest.approx(sum(avgs) / len(avgs), abs=0.02), kind
    # host memory peak: the nodes' peaks over the job (whole nodes)
    d = int(round((j["end"] - j["start"] + step) * 1000))
    (mem,) = promql(cluster, f'sum(max_over_time(teye_memory_used_bytes{{instance=~"{a}|{b}"}}[{d}ms]))',
                    j["end"]).values()
    assert j["memory"]["peak_bytes"] == mem
    # --- job 4243: one node, compute bound on GPU 1 (90 % busy)
    k = jobs["4243"]
    assert k["nodes"] == [a] and k["train_jobs"] == ["cmp-4243"] and k["slowest_node"] is None
    assert rel(k["gpu_busy_ratio"], scripted.BUSY[1])
    lc = cluster["loops"][("a", "cmp-4243")]
    # (~4 %: within a point, as the input-bound job's share above is (2 % of about 75 %); 5 % of this small share,
    # the bound before, is 0.2 points: a run read 3.77 % against 4.02 %, the loop's edges outside the scrapes)
    assert k["input_bound_ratio"] == pytest.approx(lc["wait"] / lc["total"], abs=0.01)
    assert k["verdict"] == "compute" and k["verdict_shares"]["compute"] >= 0.8 and k["input_cause"] is None
    assert any(n.startswith("Verdict compute") for n in k["notes"])
    assert not any(n.startswith("GPU busy") for n in k["notes"])
    assert doc["queries"] <= 12


def test_text_and_markdown_show_bars_nodes_and_notes(cluster):
    a, b = cluster["nodes"]
    rc, out, _ = report(cluster, "--slurm-job", "4242", fmt="text")
    assert rc == 0
    assert "Slurm job 4242" in out and a in out and b in out and "<- slowest" in out
    assert "[" + "|" * 12 + " " * 28 + "]   30 %" in out          # 30 % of a 40-character bar
    assert "Verdict: input" in out and "; phases from client" in out
    assert "GPU idle n/a" not in out and re.search(r"data_wait .* s, GPU idle \d+\.\d s", out), out
    rc, md, _ = report(cluster, "--train-job", "in-4242", fmt="markdown")
    assert rc == 0 and md.startswith("# teye job report") and "## Slurm job 4242" in md and "### Notes" in md


def test_train_job_report_finds_its_slurm_job_and_links_the_dashboard(cluster, tmp_path):
    conf = tmp_path / "teye.yml"
    conf.write_text("grafana:\n  url: https://grafana.example/\n")
    rc, doc, _ = report(cluster, "--train-job", "cmp-4243", "--config", str(conf))
    assert rc == 0
    (j,) = doc["jobs"]
    assert j["slurm_job"] == "4243" and j["train_jobs"] == ["cmp-4243"] and j["verdict"] == "compute"
    assert j["grafana_url"] == (f"https://grafana.example/d/teye-job/teye-job?from={int(j['start'] * 1000)}"
                                f"&to={int(j['end'] * 1000)}&var-node={cluster['nodes'][0]}&var-train_job=cmp-4243")


def test_job_without_phases_omits_those_sections(cluster):
    rc, doc, err = report(cluster, "--slurm-job", "4244")
    assert rc == 12, err
    (j,) = doc["jobs"]
    assert j["nodes"] == [cluster["nodes"][1]] and rel(j["gpu_busy_ratio"], scripted.BUSY[1])
    assert j["phase_seconds"] is None and j["verdict"] is None and "no training job reported phases" in \
        j["phases_omitted"]
    assert j["train_jobs"] == []      # early-b ran on that GPU before the job, and its series were still there
    assert [c["kind"] for c in j["conditions"]] == ["no_phases"] and j["complete"]


def test_unknown_job(cluster):
    rc, doc, err = report(cluster, "--slurm-job", "999999", "--slurm-job", "4243")
    assert rc == 7
    assert doc["unknown_jobs"] == ["999999"] and [j["slurm_job"] for j in doc["jobs"]] == ["4243"]
    assert "unknown job 999999" in err
    # dates as dates (issue 47: the message printed raw Unix timestamps)
    assert re.search(r"unknown job 999999: no series in Prometheus between \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ and "
                     r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ", err), err


def test_running_job_is_reported_so_far(cluster):
    _, full, _ = report(cluster, "--slurm-job", "4242")
    j = full["jobs"][0]
    mid = (j["start"] + j["end"]) / 2
    rc, doc, err = report(cluster, "--slurm-job", "4242", "--until", f"{mid:.3f}")
    assert rc == 11, err
    (r,) = doc["jobs"]
    assert r["state"] == "running" and not r["complete"] and "still running" in err
    assert r["end"] <= mid + 1e-3 and r["run_seconds"] < j["run_seconds"]
    assert rel(r["gpu_busy_ratio"], scripted.BUSY[0])


def test_node_that_vanished_and_restarted(cluster):
    rc, doc, err = report(cluster, "--slurm-job", "4250")
    assert rc == 8, err
    (j,) = doc["jobs"]
    kinds = {c["kind"]: c for c in j["conditions"]}
    assert set(kinds) == {"node_vanished", "counter_reset", "no_phases"} and not j["complete"]
    assert cluster["c"] in kinds["node_vanished"]["message"]
    (gone,) = [n["missing_seconds"] for n in j["per_node"]]
    assert 2.0 <= gone <= 5.0     # 3 s without an answer, to a scrape interval each side
    # the increase is summed across the restart: the share stays the scripted 50 %
    assert rel(j["gpu_busy_ratio"], 0.5)


def test_epilog_stores_a_bounded_summary(cluster, tmp_path):
    """What the epilog stored with the job (sacctmgr's AdminComment), against the scripted allocation
    (scontrol: 6 CPUs, 64G), the scripted driver's busy share and the loops' own clocks."""
    from tests.report import slurm_fakes
    calls, bin_dir = str(tmp_path / "calls"), str(tmp_path / "bin")
    env = {**os.environ, **slurm_fakes.install(bin_dir, calls, cpus=6, mem="64G"),
           "SLURM_JOB_ID": "4242", "TEYE_PROMETHEUS_URL": cluster["prom"].url}
    p = subprocess.run(["sh", slurm_fakes.EPILOG], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0
    args = slurm_fakes.teye_args(bin_dir)
    assert args[args.index("--cpus") + 1] == "6" and args[args.index("--mem") + 1] == "64G"   # scontrol's figures
    (c,) = slurm_fakes.stored(calls)
    s = json.loads(c[len("teye1:"):])
    assert len(c) <= 1024 + 6
    la, lb = cluster["loops"][("a", "in-4242")], cluster["loops"][("b", "in-4242")]
    assert s["job"] == "4242" and s["vd"] == "input" and s["n"] == sorted(cluster["nodes"]) and s["x"] == 0
    assert s["gb"] == pytest.approx(100 * scripted.BUSY[0], abs=1.0)
    assert s["ib"] == pytest.approx(100 * (la["wait"] + lb["wait"]) / (la["total"] + lb["total"]), abs=2.0)
    assert s["tj"] == ["in-4242"]
    # the allocation's notes: 64G asked, the node fixture used less.  No cgroup of the job was seen, so no
    # CPU efficiency and no "CPU cores mostly idle": the nodes' idle CPUs (the fixture's /proc/stat does not
    # move) are every process's, never the job's (issue 47)
    assert "Memory requested far above use" in s["notes"] and "CPU cores mostly idle" not in s["notes"]
    # a job scontrol says nothing about: no allocation, no allocation notes
    open(calls, "w").close()
    env_none = {**env, **slurm_fakes.install(bin_dir, calls, cpus="", mem="")}
    assert subprocess.run(["sh", slurm_fakes.EPILOG], env=env_none, timeout=60).returncode == 0
    assert "--cpus" not in slurm_fakes.teye_args(bin_dir) and "--mem" not in slurm_fakes.teye_args(bin_dir)
    (c,) = slurm_fakes.stored(calls)
    s = json.loads(c[len("teye1:"):])
    assert s["job"] == "4242" and not {"Memory requested far above use", "CPU cores mostly idle"} & set(s["notes"])
    # a tight bound drops the optional parts first, and the result still parses
    env["TEYE_EPILOG_MAX_BYTES"] = "120"
    open(calls, "w").close()
    assert subprocess.run(["sh", slurm_fakes.EPILOG], env=env, timeout=60).returncode == 0
    (c,) = slurm_fakes.stored(calls)
    s = json.loads(c[len("teye1:"):])
    assert len(c) - len("teye1:") <= 120 and s["t"] == 1 and s["vd"] == "input" and "notes" not in s


def test_the_lowest_exit_status_wins(cluster):
    """docs/report.md: when several conditions apply, the lowest status is returned and every one is said."""
    rc, doc, err = report(cluster, "--slurm-job", "4242", "--slurm-job", "999999")
    assert rc == 7 and doc["unknown_jobs"] == ["999999"], err      # a complete job and an unknown one
    rc, doc, err = report(cluster, "--slurm-job", "4244", "--slurm-job", "999999")
    assert rc == 7 and "unknown job 999999" in err and "4244: no_phases" in err      # 7 and 12: 7
    rc, doc, err = report(cluster, "--slurm-job", "4250", "--slurm-job", "4244", "--slurm-job", "999999")
    assert rc == 7 and "4250: node_vanished" in err                                   # 7, 8, 10, 12: 7
    rc, doc, err = report(cluster, "--slurm-job", "4250", "--slurm-job", "4244")
    assert rc == 8 and {j["slurm_job"]: j["exit_status"] for j in doc["jobs"]} == {"4250": 8, "4244": 12}


def test_all_jobs_of_a_user_in_a_time_range(cluster):
    rc, doc, err = report(cluster, "--user", USER, "--since", "1h")
    assert [j["slurm_job"] for j in doc["jobs"]] == ["4242", "4243", "4244"]
    assert rc == 12, err          # 4244 reported no phases; the other two are complete
    rc, doc, _ = report(cluster, "--user", "carol", "--since", "1h")
    assert [j["slurm_job"] for j in doc["jobs"]] == ["4250"] and rc == 8
    first = min(j["start"] for j in report(cluster, "--user", USER, "--since", "1h")[1]["jobs"])
    rc, doc, _ = report(cluster, "--user", USER, "--since", "1h", "--until", f"{first - 30:.0f}")
    assert doc["jobs"] == [] and rc == 0


def test_clock_skew(cluster):
    rc, doc, err = report(cluster, "--slurm-job", "4260")
    assert rc == 9, err
    (j,) = doc["jobs"]
    (c,) = [c for c in j["conditions"] if c["kind"] == "clock_skew"]
    assert cluster["d"] in c["message"]
    ahead = float(c["message"].split(" s ahead")[0].rsplit(" ", 1)[1])
    assert SKEW_S - 3 <= ahead <= SKEW_S + 1
    assert rel(j["gpu_busy_ratio"], 0.4)
    rc, _, _ = report(cluster, "--slurm-job", "4243")
    assert rc == 0          # the other nodes are on time


def test_training_job_outside_slurm_without_gpus(cluster):
    rc, doc, err = report(cluster, "--train-job", "cpu-only")
    assert rc == 0, err
    (j,) = doc["jobs"]
    lp = cluster["loops"][("a", "cpu-only")]
    assert j["slurm_job"] is None and j["train_jobs"] == ["cpu-only"] and j["gpus"] == []
    assert j["nodes"] == [cluster["nodes"][0]] and j["gpu_busy_ratio"] is None and j["gpu_energy_joules"] is None
    assert j["steps"] == 100 and j["samples"] == 3200 and j["verdict"] == "compute"
    assert rel(j["samples_per_second"], lp["samples"] / lp["total"])
    assert not any(n.startswith("GPU") or "GPU(s)" in n for n in j["notes"])
    # no GPU samples, no GPU figures (issue 29 item 7): null in JSON, n/a in text and Markdown, never "0.0 s"
    assert j["gpu_idle_seconds_by_phase"] is None and j["phase_seconds"]["compute"] > 0
    assert j["train_job_details"][0]["gpu_idle_seconds_by_phase"] is None
    for fmt in ("text", "markdown"):
        rc, out, err = report(cluster, "--train-job", "cpu-only", fmt=fmt)
        assert rc == 0, err
        lines = [x for x in out.splitlines() if x.strip().startswith(("compute ", "data_wait "))]
        assert len(lines) == 2 and all(x.endswith(" s, GPU idle n/a") for x in lines), out
        assert "GPU idle 0.0" not in out, out


def test_steps_only_job_is_timed_by_its_steps_and_never_called_compute(cluster):
    """A loop teye sees steps of only (torch-steps, slow input it cannot observe): its phase counters are
    absent, so its steps time it; the report says finished (its series outlive it until they expire), run
    time to a scrape interval of the loop's own clock, its steps and step time, no sample rate (it never
    counted samples), and no compute verdict: without GPU samples, not_observed."""
    rc, doc, err = report(cluster, "--train-job", "steps-only")
    assert rc == 0, err
    (j,) = doc["jobs"]
    lp = cluster["loops"][("a", "steps-only")]
    step = doc["step_seconds"]
    assert j["state"] == "finished" and j["conditions"] == [] and j["complete"]
    assert abs(j["run_seconds"] - (lp["end"] - lp["start"])) <= step + 0.1
    # (each end: the flush, the sampler and the scrape after it, on the report's grid: as the phased loops)
    # (its first counters show at the first scrape after its first flush, on the next grid point: a scrape late
    # under the fixture's six processes on two cores read 2.6 s)
    assert abs(j["start"] - lp["start"]) <= 3 * step + 0.5 and abs(j["end"] - lp["end"]) <= 3 * step + 0.5
    assert j["steps"] == 60 and j["samples"] is None and j["samples_per_second"] is None
    # the first step's start is unknown to a steps-only source (it counts 0 s): 59 steps' time over 60
    (tj,) = j["train_job_details"]
    assert tj["step_seconds_mean"] == pytest.approx(lp["total"] * 59 / 60 / 60, rel=0.05)
    assert j["step_seconds_p50_bounds"] == [0.05, 0.1]     # its 50 ms sleeps and a little torch work
    assert j["phase_seconds"] == {} and j["input_bound_ratio"] is None
    assert j["verdict"] == "not_observed" and "compute" not in {k for k, v in j["verdict_shares"].items() if v}
    # its advice speaks its own framework (zero-code torch-steps): feed the loop from a DataLoader, not tf.data
    assert j["source"] == "torch-steps" and j["source_text"].startswith("zero-code: torch optimizer steps")
    (note,) = [n for n in j["notes"] if n.startswith("Verdict not_observed")]
    assert "DataLoader" in note and "tf.data" not in note, note
