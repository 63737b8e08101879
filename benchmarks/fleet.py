"""A synthetic fleet of teye nodes scraped by one real Prometheus with the project's rules.

    python benchmarks/fleet.py [--nodes 10,100,1000] [--seconds 255] [--repeats 5] [--compare-rules GIT_REF]
    python benchmarks/fleet.py --nodes 1000 --ib-history-hours 24    # the port-down alert's day of history
    python benchmarks/fleet.py --nodes 1000 --gpu-history-hours 1.5  # the fleet GPU-hours rule's hour
    python benchmarks/fleet.py --nodes 1000 --ranks-per-node 8       # a data-parallel job of 8 ranks per node

1. Capture: one real `teye agent` replays the synthetic 8-GPU trace
   (tests/data/gpu/synthetic-8gpu.jsonl), reads the node_exporter fixture trees for the host
   (CPU, memory, disks, InfiniBand, NFS) and receives phases from three small training jobs
   (workloads.phases.Reporter: GPUs 0-3, 4-5 and 7), and with --ranks-per-node K a fourth job,
   "ddp", of K processes that say their rank (0..K-1), one per GPU.  /metrics is read twice, 10 s apart:
   the first reading gives every series' value, the difference its rate.
2. Fleet: N nodes are served from this one process, each as its own scrape target
   (/node/<i> on one port; Prometheus gives each target its own instance label, gpu-node-<i>).
   Every scrape renders the captured exposition with the node's counters advanced by
   rate x elapsed time; training jobs are named per node (3 per node).  Node roles:
     * every 4th node (i % 4 == 0) holds its GPUs idle: busy seconds advance at 2 % of the rate;
     * i % 10 == 1 vanishes (the scrape fails) from 30 s to --seconds - 30 s and comes back
       restarted: every counter starts again from zero;
     * i % 10 == 3 loses all its GPUs at 30 s (fallen off the bus, as the agent exports it:
       teye_gpu_up 0, the counters stay, the gauges and processes are gone).
3. One Prometheus (Debian's binary) scrapes the fleet every 15 s and evaluates
   deploy/prometheus/rules/*.yml every 15 s.  At the end of the bad-input phase the firing
   alerts are checked; after --seconds, with every node back:
     * series per node, ingested samples/s (prometheus_tsdb_head_samples_appended_total over
       the last minute), head series, Prometheus RSS;
     * prometheus_rule_group_last_duration_seconds of every rule group, every evaluation after
       the first 2 minutes (p50 and max): "live", while Prometheus ingests the fleet;
     * every panel query of dashboards/json/*.json over the last hour (range queries: start =
       now - 1 h, step 15 s; instant queries at now), run --repeats times: p50 and p95, live.
       Variables: $__rate_interval = 1m (4 x the scrape interval, Grafana's rule),
       $__interval = 15s, $__range = 1h; cluster dashboard: every node, GPU and job (All);
       node dashboard: one node (it selects a single node), all its GPUs; job dashboard: one
       training job and "All" its nodes (the node variable lists the job's nodes: one here).
   Then the fleet leaves service discovery (scraping stops) and, on a Prometheus doing nothing
   else, each rule group's expressions run one after the other as instant queries and the
   panels run again, at a moment before the stop: "idle".  On a small shared host the live
   figures mostly measure the contention with ingestion; the idle ones the queries' own cost.
   With --compare-rules, the rule groups of deploy/prometheus/rules at that git revision run
   too, repeat by repeat in alternation with the current ones, on the same data: a rule change
   measured side by side in one run.
   History is what the run itself scraped (about --seconds + 1 min, not a full hour): the
   hour-long queries read every sample that exists.  Say so next to any figure.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.procs import REPO, Agent, free_port, http_get, wait_http  # noqa: E402

TRACE = os.path.join(REPO, "tests", "data", "gpu", "synthetic-8gpu.jsonl")
FIXTURES = os.path.join(REPO, "tests", "data", "node_exporter")
RULES = sorted(os.path.join(REPO, "deploy", "prometheus", "rules", f)
               for f in os.listdir(os.path.join(REPO, "deploy", "prometheus", "rules")) if f.endswith(".yml"))
DASHBOARDS = os.path.join(REPO, "dashboards", "json")
SCRAPE_S = 15
JOBS = (("resnet", "0,1,2,3"), ("bert", "4,5"), ("llm", "7"))   # train_job, CUDA_VISIBLE_DEVICES
WORKLOAD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[2])
    from workloads.phases import Reporter
    rep = Reporter(train_job=sys.argv[1], rank=int(sys.argv[3]) if len(sys.argv) > 3 else None,
                   world_size=int(sys.argv[4]) if len(sys.argv) > 4 else None)
    while True:
        with rep.phase("data_wait"):
            time.sleep(0.02)
        with rep.phase("compute"):
            time.sleep(0.06)
        rep.step(samples=64)
""")
SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$")
GPU_RE = re.compile(r'\bgpu="([^"]*)"')


# ------------------------------------------------------------------- capture

def capture(procfs: str, sysfs: str, ranks: int = 0) -> Tuple[str, str, float]:
    """Two /metrics readings of a real agent, 10 s apart, with three jobs reporting phases (and the ranks of
    a data-parallel one)."""
    tmp = tempfile.mkdtemp(prefix="teye-fleet-capture-")
    sock = os.path.join(tmp, "phases.sock")
    agent = Agent(["--gpu-replay", TRACE, "--procfs", procfs, "--sysfs", sysfs, "--phase-socket", sock])
    senders = []
    try:
        for name, devices in JOBS:
            env = {**os.environ, "TEYE_PHASE_SOCKET": sock, "CUDA_VISIBLE_DEVICES": devices}
            senders.append(subprocess.Popen([sys.executable, "-c", WORKLOAD, name, REPO], env=env))
        for r in range(ranks):
            env = {**os.environ, "TEYE_PHASE_SOCKET": sock, "CUDA_VISIBLE_DEVICES": str(r % 8)}
            senders.append(subprocess.Popen([sys.executable, "-c", WORKLOAD, "ddp", REPO, str(r), str(ranks)],
                                            env=env))
        time.sleep(8)
        t0, first = time.monotonic(), agent.metrics()
        time.sleep(10)
        t1, second = time.monotonic(), agent.metrics()
        return first, second, t1 - t0
    finally:
        for p in senders:
            p.terminate()
            p.wait(10)
        agent.stop()
        shutil.rmtree(tmp, ignore_errors=True)


class Line:
    __slots__ = ("prefix", "value", "rate", "counter", "gpu", "name")

    def __init__(self, prefix, value, rate, counter, gpu, name):
        self.prefix, self.value, self.rate, self.counter, self.gpu, self.name = prefix, value, rate, counter, gpu, name


def template(first: str, second: str, dt: float) -> Tuple[List[str], List[Line]]:
    """(HELP/TYPE lines, sample lines) of the second reading with each series' rate from the first."""
    types: Dict[str, str] = {}
    for text_line in second.splitlines():
        if text_line.startswith("# TYPE "):
            _, _, fam, kind = text_line.split(" ", 3)
            types[fam] = kind
    before = {}
    for text_line in first.splitlines():
        m = SAMPLE_RE.match(text_line)
        if m:
            before[(m.group(1), m.group(2) or "")] = float(m.group(3))
    headers, lines = [], []
    for text_line in second.splitlines():
        if text_line.startswith("#"):
            headers.append(text_line)
            continue
        m = SAMPLE_RE.match(text_line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        fam = next((f for f in (name, re.sub(r"_(total|bucket|sum|count|created)$", "", name)) if f in types), name)
        counter = types.get(fam) in ("counter", "histogram", "summary") and not name.endswith("_created")
        rate = max(0.0, (value - before.get((name, labels), value)) / dt) if counter else 0.0
        gpu = GPU_RE.search(labels)
        lines.append(Line(f"{name}{labels} ", value, rate, counter, gpu.group(1) if gpu else None, name))
    return headers, lines


# ---------------------------------------------------------------- the fleet

GPU_GAUGES_WHEN_LOST = ("teye_gpu_up", "teye_gpu_info")   # families a lost GPU keeps besides its counters


class Node:
    """One synthetic node: the captured exposition, its own job names, counters that advance."""

    def __init__(self, i: int, headers: List[str], lines: List[Line], t0: float, bad_from: float, bad_to: float):
        self.i = i
        self.idle = i % 4 == 0
        self.vanishes = i % 10 == 1
        self.loses_gpus = i % 10 == 3
        self.t0, self.bad_from, self.bad_to = t0, bad_from, bad_to
        rename = lambda s: re.sub(r'train_job="([^"]*)"', lambda m: f'train_job="{m.group(1)}-{i:04d}"', s)
        self.head = "\n".join(headers) + "\n"
        self.lines = []
        for ln in lines:
            rate = ln.rate * (0.02 if self.idle and ln.name == "teye_gpu_busy_seconds_total" else 1.0)
            self.lines.append((rename(ln.prefix), ln.value, rate, ln.counter, ln.gpu, ln.name))

    def render(self, now: float) -> Optional[bytes]:
        """The exposition at `now` (monotonic), None while the node is gone."""
        el = now - self.t0
        if self.vanishes and self.bad_from <= el < self.bad_to:
            return None
        restarted = self.vanishes and el >= self.bad_to
        lost = self.loses_gpus and el >= self.bad_from
        out = [self.head]
        for prefix, value, rate, counter, gpu, name in self.lines:
            if lost and gpu is not None:
                if name == "teye_gpu_up":
                    out.append(prefix + "0\n")
                    continue
                if not counter and name not in GPU_GAUGES_WHEN_LOST:
                    continue   # gauges of a GPU that does not answer are absent
                if counter:   # frozen at the moment the GPUs fell off the bus
                    out.append(f"{prefix}{value + rate * self.bad_from!r}\n")
                    continue
            if counter:
                v = rate * (el - self.bad_to) if restarted else value + rate * el
                out.append(f"{prefix}{v!r}\n")
            else:
                out.append(f"{prefix}{value!r}\n")
        return "".join(out).encode()


def serve(nodes: List[Node]) -> Tuple[ThreadingHTTPServer, int]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            m = re.fullmatch(r"/node/(\d+)", self.path)
            body = nodes[int(m.group(1))].render(time.monotonic()) if m and int(m.group(1)) < len(nodes) else None
            if body is None:
                self.send_error(503 if m else 404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 1024

    port = free_port()
    srv = Server(("127.0.0.1", port), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, port


# ---------------------------------------------------------------- Prometheus

def start_prometheus(tmp: str, port: int, n: int) -> Tuple[subprocess.Popen, str]:
    """Prometheus on tmp/data (blocks already there are loaded) scraping nodes 0..n-1 of the server at port."""
    groups = [{"targets": [f"127.0.0.1:{port}"],
               "labels": {"__metrics_path__": f"/node/{i}", "instance": f"gpu-node-{i:04d}"}} for i in range(n)]
    with open(os.path.join(tmp, "fleet.json"), "w") as fh:
        json.dump(groups, fh)
    rules = "".join(f"\n  - {r}" for r in RULES)
    cfg = os.path.join(tmp, "prometheus.yml")
    with open(cfg, "w") as fh:
        fh.write(f"""global:
  scrape_interval: {SCRAPE_S}s
  scrape_timeout: 10s
  evaluation_interval: {SCRAPE_S}s
rule_files:{rules}
scrape_configs:
  - job_name: teye
    file_sd_configs:
      - files: [{os.path.join(tmp, 'fleet.json')}]
""")
    prom_port = free_port()
    log = open(os.path.join(tmp, "prometheus.log"), "w")
    proc = subprocess.Popen([shutil.which("prometheus"), f"--config.file={cfg}", f"--storage.tsdb.path={tmp}/data",
                             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{prom_port}"
    wait_http(url + "/-/ready", timeout=60, proc=proc)
    return proc, url


def self_metrics(url: str) -> Dict[Tuple[str, str], float]:
    out = {}
    for text_line in http_get(url + "/metrics", timeout=30).splitlines():
        m = SAMPLE_RE.match(text_line)
        if m:
            out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


def api(url: str, path: str, **params) -> Tuple[dict, float]:
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(f"{url}/api/v1/{path}?{urllib.parse.urlencode(params)}", timeout=120) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{path} {params}: HTTP {e.code}: {e.read()[:500]!r}") from None
    dt = time.perf_counter() - t0
    if body.get("status") != "success":
        raise RuntimeError(f"{path} {params}: {body}")
    return body["data"], dt


def query(url: str, expr: str) -> list:
    return api(url, "query", query=expr)[0]["result"]


# ------------------------------------------------------------------- queries

def panel_queries() -> List[Tuple[str, str, str, bool]]:
    """(dashboard, panel title, expr with Grafana's variables, instant) of every panel target."""
    out = []
    for fname in sorted(os.listdir(DASHBOARDS)):
        with open(os.path.join(DASHBOARDS, fname)) as fh:
            d = json.load(fh)
        stack = list(d.get("panels", []))
        while stack:
            p = stack.pop(0)
            stack[0:0] = p.get("panels", [])
            for t in p.get("targets") or []:
                if t.get("expr"):
                    out.append((d["uid"], p.get("title", ""), t["expr"], bool(t.get("instant"))))
    return out


def substitute(expr: str, variables: Dict[str, str]) -> str:
    for name in sorted(variables, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", variables[name]).replace("$" + name, variables[name])
    if "$" in expr:
        raise ValueError(f"unsubstituted variable in {expr!r}")
    return expr


def variables_for(uid: str) -> Dict[str, str]:
    common = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h", "__range_s": "3600",
              "datasource": "unused"}
    if uid == "teye-node":
        return dict(common, node="gpu-node-0002", gpu=".*", train_job=".*")
    if uid == "teye-job":   # "All" nodes of the job = the nodes it reports from (node 2 only)
        return dict(common, node="(gpu-node-0002)", gpu=".*", train_job="resnet-0002")
    return dict(common, node=".*", gpu=".*", train_job=".*")


def pct(xs: List[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


# ---------------------------------------------------------------------- run

def check_bad_input(url: str, n: int) -> List[Tuple[str, bool, str]]:
    """At the end of the bad-input phase: the alerts that should fire do, nothing is negative or NaN."""
    vanished = {f"gpu-node-{i:04d}" for i in range(n) if i % 10 == 1}
    lost = {f"gpu-node-{i:04d}" for i in range(n) if i % 10 == 3}
    firing = query(url, 'ALERTS{alertstate="firing"}')
    down = {r["metric"]["instance"] for r in firing if r["metric"]["alertname"] == "TeyeAgentDown"}
    gpu_lost = {r["metric"]["instance"] for r in firing if r["metric"]["alertname"] == "TeyeGPULost"}
    negative = query(url, '{__name__=~"teye:.+"} < 0')
    nan = [r for r in query(url, '{__name__=~"teye:.+"}') if r["value"][1].lower() == "nan"]
    phantom = query(url, 'count(teye:gpu_utilization:ratio5m{instance=~"%s"})' % "|".join(sorted(lost)) or "none")
    present = float(query(url, "teye:fleet_gpus:count")[0]["value"][1])
    direct = float(query(url, "count(teye_gpu_info)")[0]["value"][1])
    return [
        ("TeyeAgentDown fires for exactly the vanished nodes", down == vanished, f"{len(down)}/{len(vanished)}"),
        ("TeyeGPULost fires for exactly the nodes that lost their GPUs", gpu_lost == lost, f"{len(gpu_lost)}/{len(lost)}"),
        ("no negative recorded value", not negative, f"{len(negative)} negative"),
        ("no NaN recorded value", not nan, f"{len(nan)} NaN"),
        ("lost GPUs have no utilization (no phantom idle GPUs)", not phantom, f"{phantom and phantom[0]['value'][1]}"),
        ("fleet GPU count excludes the vanished nodes", present == 8 * (n - len(vanished)),
         f"recorded {present:.0f}, count(teye_gpu_info) {direct:.0f}, expected {8 * (n - len(vanished))}"),
    ]


WARMUP_S = 120   # the first scrapes create 1,304 series per node: rule groups are timed after that


def rule_groups(ref: Optional[str] = None) -> List[Tuple[str, List[str]]]:
    """(file/group, rule expressions) of every rule file: "alerts/teye-jobs", "recording/teye-jobs";
    with `ref`, the rule files as they were at that git revision (the peer of --compare-rules)."""
    import yaml
    out = []
    for path in RULES:
        if ref:
            rel = os.path.relpath(path, REPO)
            text = subprocess.run(["git", "show", f"{ref}:{rel}"], cwd=REPO, capture_output=True, text=True,
                                  check=True).stdout
        else:
            with open(path) as fh:
                text = fh.read()
        out.extend((f"{os.path.basename(path)[5:-4]}/{g['name']}", [r["expr"] for r in g["rules"]])
                   for g in yaml.safe_load(text)["groups"])
    return out


def time_panels(url: str, at: float, repeats: int) -> list:
    out = []
    for uid, title, expr, instant in panel_queries():
        e = substitute(expr, variables_for(uid))
        times, nseries = [], 0
        for _ in range(repeats):
            if instant:
                data, dt = api(url, "query", query=e, time=at)
            else:
                data, dt = api(url, "query_range", query=e, start=at - 3600, end=at, step=SCRAPE_S)
            times.append(dt)
            nseries = len(data["result"])
        out.append((uid, title, e, instant, statistics.median(times), pct(times, 0.95), nseries))
    return out


def time_rule_groups(url: str, at: float, repeats: int,
                     ref: Optional[str] = None) -> Tuple[Dict[str, Tuple[float, float]], Dict[str, Tuple[float, float]]]:
    """Each group's rules run one after the other as instant queries at `at` (wrapped in count() so
    that no result is shipped): (p50, p95) of the group's total over the repeats.  With `ref`, the
    same for the rule files at that git revision, on the same data (they read raw series and records
    that the current rules still write), each repeat of the peer right before the current rules' one
    so that both see the same moments of a shared host; else the second dict is empty."""
    def total(exprs):
        return sum(api(url, "query", query=f"count({e})", time=at)[1] for e in exprs)

    peer = dict(rule_groups(ref)) if ref else {}
    out, out_peer = {}, {}
    for name, exprs in rule_groups():
        totals, totals_peer = [], []
        for _ in range(repeats):
            if name in peer:
                totals_peer.append(total(peer[name]))
            totals.append(total(exprs))
        out[name] = (statistics.median(totals), pct(totals, 0.95))
        if totals_peer:
            out_peer[name] = (statistics.median(totals_peer), pct(totals_peer, 0.95))
    return out, out_peer


def run_fleet(n: int, headers, lines, seconds: float, repeats: int, compare: Optional[str] = None) -> dict:
    from benchmarks._proc import cpu_seconds, rss_mib
    tmp = tempfile.mkdtemp(prefix=f"teye-fleet-{n}-")
    t0 = time.monotonic()
    nodes = [Node(i, headers, lines, t0, 30.0, seconds - 30.0) for i in range(n)]
    srv, port = serve(nodes)
    proc, url = start_prometheus(tmp, port, n)
    res: dict = {"n": n, "series_per_node": len(lines), "evals": {}, "compare": compare}
    try:
        def poll_groups():
            m = self_metrics(url)
            if time.monotonic() - t0 >= WARMUP_S:
                stamps = {labels: v for (name, labels), v in m.items()
                          if name == "prometheus_rule_group_last_evaluation_timestamp_seconds"}
                for (name, labels), v in m.items():
                    if name == "prometheus_rule_group_last_duration_seconds":
                        f, g = re.search(r'rule_group="([^"]*);([^"]*)"', labels).groups()
                        g = f"{os.path.basename(f)[5:-4]}/{g}"   # teye-jobs is a group in two files
                        res["evals"].setdefault(g, {})[stamps.get(labels)] = v   # one value per evaluation
            return m

        while time.monotonic() - t0 < seconds - 35:
            time.sleep(5)
            poll_groups()
        res["checks"] = check_bad_input(url, n)
        while time.monotonic() - t0 < seconds:
            time.sleep(5)
            poll_groups()
        a, ta, cpu_a, self_a = poll_groups(), time.monotonic(), cpu_seconds(proc.pid), cpu_seconds(os.getpid())
        while time.monotonic() - ta < 60:
            time.sleep(5)
            b = poll_groups()
        tb, cpu_b, self_b = time.monotonic(), cpu_seconds(proc.pid), cpu_seconds(os.getpid())
        key = ("prometheus_tsdb_head_samples_appended_total", '{type="float"}')
        if key not in a:
            key = ("prometheus_tsdb_head_samples_appended_total", "")
        res["samples_per_s"] = (b[key] - a[key]) / (tb - ta)
        res["prometheus_cores"] = (cpu_b - cpu_a) / (tb - ta)
        res["simulator_cores"] = (self_b - self_a) / (tb - ta)
        res["head_series"] = b[("prometheus_tsdb_head_series", "")]
        res["rss_mib"] = rss_mib(proc.pid)
        res["scraped_per_node"] = statistics.median(
            float(r["value"][1]) for r in query(url, 'scrape_samples_scraped{job="teye"}'))
        # Each rule's own last evaluation time, read three times one evaluation apart: which rules
        # make a group slow (the API lists every alert instance too, so it is read only here).
        per_rule: Dict[Tuple[str, str], list] = {}
        for k in range(3):
            if k:
                time.sleep(15)
            for g in api(url, "rules")[0]["groups"]:
                for r in g["rules"]:
                    per_rule.setdefault((g["name"], r["name"]), []).append(float(r.get("evaluationTime", 0.0)))
        res["rules"] = sorted(((g, name, statistics.median(v)) for (g, name), v in per_rule.items()),
                              key=lambda r: -r[2])
        # Alert instances pending or firing: Prometheus expands every label and annotation of each
        # one at every evaluation, so they, more than the expressions, set an alert group's time.
        res["alerts"] = sorted(((r["metric"]["alertname"], r["metric"]["alertstate"], int(float(r["value"][1])))
                                for r in query(url, "count by (alertname, alertstate) (ALERTS)")),
                               key=lambda a: -a[2])
        # Live: panel queries while Prometheus keeps scraping and evaluating.
        res["queries"] = time_panels(url, time.time(), repeats)
        res["rss_mib_after_queries"] = rss_mib(proc.pid)
        # Idle: stop scraping (the fleet leaves service discovery), then time the rule groups'
        # expressions and the panels at a moment before the stop, on a server doing nothing else.
        at = time.time() - 20
        with open(os.path.join(tmp, "fleet.json"), "w") as fh:
            json.dump([], fh)
        time.sleep(20)
        res["idle_groups"], peer = time_rule_groups(url, at, repeats, compare)
        if compare:
            res["idle_groups_compare"] = peer
        res["idle_queries"] = time_panels(url, at, repeats)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        srv.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    return res


IB_RAW = ("max by (job, instance, device, port) (teye_infiniband_port_state) < 4"
          " and on (job, instance, device, port)"
          " max by (job, instance, device, port) (max_over_time(teye_infiniband_port_state[1d])) >= 4")
IB_RECORDED = ("max by (job, instance, device, port) (teye_infiniband_port_state) < 4"
               " and on (job, instance, device, port)"
               " max_over_time(teye:infiniband_port_state:max1h[1d]) >= 4")


def backfill_ib(tmp: str, lines: List[Line], n: int, hours: float) -> int:
    """Write `hours` of InfiniBand port states (every 15 s) for n nodes, and what
    teye:infiniband_port_state:max1h would have recorded (every 5 min), as TSDB blocks in tmp/data.
    Every port ACTIVE (4) all along, then DOWN (1) for the last 30 minutes on node 0: the alert
    must find exactly node 0's ports with either expression.  Returns the number of raw samples."""
    ports = [ln for ln in lines if ln.name == "teye_infiniband_port_state"]
    end = int(time.time()) // 15 * 15 - 15
    steps = int(hours * 3600 // 15)
    om = os.path.join(tmp, "ib.om")
    with open(om, "w") as fh:
        for name, every in (("teye_infiniband_port_state", 15), ("teye:infiniband_port_state:max1h", 300)):
            fh.write(f"# HELP {name} InfiniBand port state (backfilled)\n# TYPE {name} gauge\n")
            for i in range(n):
                for ln in ports:
                    labels = ln.prefix[len(ln.name) + 1:-2]
                    if name != ln.name:   # the recorded series keeps only job, instance, device, port
                        labels = ",".join(p for p in labels.split(",") if p.split("=")[0] in ("device", "port"))
                    series = f'{name}{{job="teye",instance="gpu-node-{i:04d}",{labels}}}'
                    for k in range(0, steps, every // 15):
                        ts = end - (steps - 1 - k) * 15
                        down = i == 0 and name == ln.name and ts > end - 1800
                        fh.write(f"{series} {1 if down else 4} {ts}\n")
        fh.write("# EOF\n")
    subprocess.run([shutil.which("promtool"), "tsdb", "create-blocks-from", "openmetrics", om,
                    os.path.join(tmp, "data")], check=True, stdout=subprocess.DEVNULL)
    os.remove(om)
    return n * len(ports) * steps


@contextlib.contextmanager
def history_server(prefix: str, backfill: Callable[[str], Any]):
    """A Prometheus (with the project's rules, scraping nothing) on the TSDB blocks that backfill(tmp)
    writes into tmp/data; yields (url, what backfill returned, seconds it took).  Removes it all after."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    proc = None
    try:
        t = time.monotonic()
        got = backfill(tmp)
        took = time.monotonic() - t
        proc, url = start_prometheus(tmp, free_port(), 0)
        yield url, got, took
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)


def run_ib_history(n: int, lines: List[Line], hours: float, repeats: int) -> dict:
    """The port-down alert's day of history, from raw samples against the 5-minute record."""
    with history_server(f"teye-fleet-ib-{n}-", lambda tmp: backfill_ib(tmp, lines, n, hours)) as (url, samples, took):
        res = {"n": n, "hours": hours, "raw_samples": samples, "backfill_s": took}
        for key, expr in (("raw", IB_RAW), ("recorded", IB_RECORDED)):
            times = []
            for _ in range(repeats):
                data, dt = api(url, "query", query=expr, time=time.time() - 15)
                times.append(dt)
            res[key] = (statistics.median(times), pct(times, 0.95),
                        sorted({r["metric"]["instance"] for r in data["result"]}))
    return res


def report_ib(r: dict) -> None:
    print(f"\n-- TeyeInfinibandPortDown over {r['hours']:g} h of history, N={r['n']} "
          f"({r['raw_samples']} raw samples backfilled in {r['backfill_s']:.0f} s) --")
    for key, label in (("raw", "raw samples, [1d] (before)"), ("recorded", "5-minute record, [1d] (after)")):
        p50, p95, firing = r[key]
        print(f"{label:<44}p50 {p50:.3f} s  p95 {p95:.3f} s  firing on {firing}")
    print(f"{'ratio of p50 (before / after)':<44}{r['raw'][0] / r['recorded'][0]:.1f}")


GPU_HOURS_RAW = "sum(increase(teye_gpu_busy_seconds_total[1h])) / 3600"   # the rule before
GPU_HOURS_RECORDED = "avg_over_time(teye:fleet_gpus_busy:sum5m[1h])"          # the rule now


def backfill_gpu_busy(tmp: str, n: int, hours: float) -> Tuple[int, float, int]:
    """Write `hours` of teye_gpu_busy_seconds_total (every 15 s) for n nodes of 8 GPUs, each GPU busy at
    its own constant share, and what teye:fleet_gpus_busy:sum5m records meanwhile (every minute: the
    sum of the shares), as TSDB blocks in tmp/data.  Returns (raw samples, the true GPU-hours per hour,
    the time of the last sample: query there, before the rules of the running server write anything)."""
    end = int(time.time()) // 60 * 60 - 60
    steps = int(hours * 3600 // 15)
    share = lambda i, g: 0.05 + 0.9 * ((i * 8 + g) % 19) / 18   # noqa: E731
    om = os.path.join(tmp, "busy.om")
    with open(om, "w") as fh:
        fh.write("# HELP teye_gpu_busy_seconds GPU busy seconds (backfilled)\n# TYPE teye_gpu_busy_seconds counter\n")
        for i in range(n):
            for g in range(8):
                series = f'teye_gpu_busy_seconds_total{{job="teye",instance="gpu-node-{i:04d}",gpu="{g}"}}'
                r = share(i, g)
                fh.write("".join(f"{series} {(k + 1) * 15 * r:.3f} {end - (steps - 1 - k) * 15}\n"
                                 for k in range(steps)))
        total = sum(share(i, g) for i in range(n) for g in range(8))
        fh.write("# HELP teye:fleet_gpus_busy:sum5m GPUs busy (backfilled)\n# TYPE teye:fleet_gpus_busy:sum5m gauge\n")
        fh.write("".join(f"teye:fleet_gpus_busy:sum5m {total:.6f} {end - (steps // 4 - 1 - k) * 60}\n"
                         for k in range(steps // 4)))
        fh.write("# EOF\n")
    subprocess.run([shutil.which("promtool"), "tsdb", "create-blocks-from", "openmetrics", om,
                    os.path.join(tmp, "data")], check=True, stdout=subprocess.DEVNULL)
    os.remove(om)
    return n * 8 * steps, total, end


def run_gpu_history(n: int, hours: float, repeats: int) -> dict:
    """teye:fleet_gpu_hours_used:1h from an hour of raw busy counters against the record of the busy sum."""
    with history_server(f"teye-fleet-busy-{n}-", lambda tmp: backfill_gpu_busy(tmp, n, hours)) as \
            (url, (samples, truth, at), took):
        res = {"n": n, "hours": hours, "raw_samples": samples, "backfill_s": took, "truth": truth}
        for _ in range(repeats):   # alternate, so machine noise hits both alike
            for key, expr in (("raw", GPU_HOURS_RAW), ("recorded", GPU_HOURS_RECORDED)):
                data, dt = api(url, "query", query=expr, time=at)
                res.setdefault(key, ([], float(data["result"][0]["value"][1])))[0].append(dt)
    return res


def report_gpu_history(r: dict) -> None:
    print(f"\n-- teye:fleet_gpu_hours_used:1h over {r['hours']:g} h of history, N={r['n']} "
          f"({r['raw_samples']} raw samples backfilled in {r['backfill_s']:.0f} s; truth {r['truth']:.2f}) --")
    for key, label in (("raw", "increase() of every GPU's counter (before)"),
                       ("recorded", "avg_over_time() of the busy-sum record (after)")):
        times, value = r[key]
        print(f"{label:<50}p50 {statistics.median(times):.3f} s  p95 {pct(times, 0.95):.3f} s  value {value:.2f}")
    print(f"{'ratio of p50 (before / after)':<50}{statistics.median(r['raw'][0]) / statistics.median(r['recorded'][0]):.0f}")


def report(results: List[dict]) -> None:
    ns = [r["n"] for r in results]
    col = lambda vals, w=14: "".join(f"{v:>{w}}" for v in vals)
    print("\n== fleet (history = the run itself, not a full hour) ==")
    print(f"{'nodes':<44}{col(ns)}")
    rows = (("series per node (exposition lines)", "series_per_node", "{:.0f}"),
            ("samples scraped per node (median)", "scraped_per_node", "{:.0f}"),
            ("ingested samples/s", "samples_per_s", "{:.0f}"), ("head series", "head_series", "{:.0f}"),
            ("Prometheus CPU, cores (while ingesting)", "prometheus_cores", "{:.2f}"),
            ("this simulator's CPU, cores", "simulator_cores", "{:.2f}"),
            ("Prometheus RSS MiB (before queries)", "rss_mib", "{:.0f}"),
            ("Prometheus RSS MiB (after queries)", "rss_mib_after_queries", "{:.0f}"))
    for label, key, fmt in rows:
        print(f"{label:<44}{col(fmt.format(r[key]) for r in results)}")
    print(f"\n-- rule groups, seconds: live = prometheus_rule_group_last_duration_seconds p50/max over the "
          f"evaluations after the first {WARMUP_S} s [count]; idle = the group's expressions as queries on the "
          f"server after scraping stopped, p50/p95 --")
    for g, _ in rule_groups():
        vals = []
        for r in results:
            ev = [v for v in r["evals"].get(g, {}).values()]
            live = f"{statistics.median(ev):.3f}/{max(ev):.3f}[{len(ev)}]" if ev else "-"
            idle = "{:.3f}/{:.3f}".format(*r["idle_groups"][g])
            vals.append(f"{live} {idle}")
        print(f"{g:<24}{col(vals, 34)}")
    if "idle_groups_compare" in results[0]:
        print(f"\n-- rule groups, idle p50/p95 seconds: the rules at {results[0]['compare']} | these rules "
              f"(same server, same moment; ratio of p50) --")
        names = {g: None for r in results for g in (*r["idle_groups_compare"], *r["idle_groups"])}
        for g in names:
            vals = []
            for r in results:
                a, b = r["idle_groups_compare"].get(g), r["idle_groups"].get(g)
                vals.append(("{:.3f}/{:.3f}".format(*a) if a else "-") + " | "
                            + ("{:.3f}/{:.3f}".format(*b) if b else "-")
                            + (f" {a[0] / b[0]:.1f}x" if a and b and b[0] > 0 else ""))
            print(f"{g:<24}{col(vals, 34)}")
    print("\n-- panel queries over the last hour, seconds: live p50/p95 | idle p50/p95 [series returned] --")
    for k, q in enumerate(results[0]["queries"]):
        uid, title, expr, instant = q[:4]
        vals = [f"{r['queries'][k][4]:.3f}/{r['queries'][k][5]:.3f}|{r['idle_queries'][k][4]:.3f}/"
                f"{r['idle_queries'][k][5]:.3f}[{r['queries'][k][6]}]" for r in results]
        label = f"{uid[5:]}: {title[:30]}{' (i)' if instant else ''}"
        print(f"{label:<44}{col(vals, 30)}")
    print()
    for label, fn in (("slowest rule group, live max", lambda r: max(max(v.values()) for v in r["evals"].values())),
                      ("slowest rule group, idle p95", lambda r: max(v[1] for v in r["idle_groups"].values())),
                      ("slowest panel query, live p95", lambda r: max(q[5] for q in r["queries"])),
                      ("slowest panel query, idle p95", lambda r: max(q[5] for q in r["idle_queries"]))):
        print(f"{label:<44}{col(f'{fn(r):.3f}' for r in results)}")
    print("\n-- the slowest rules while ingesting (evaluationTime, median of 3 evaluations, seconds) --")
    for r in results:
        for g, name, t in r.get("rules", [])[:12]:
            print(f"N={r['n']:<5} {t:.3f}  {g}: {name}")
    print("\n-- alert instances at the end of the run (pending/firing; each costs its labels' and annotations' "
          "template expansions at every evaluation) --")
    for r in results:
        print(f"N={r['n']:<5} " + ", ".join(f"{name} {state} {k}" for name, state, k in r.get("alerts", [])))
    print("\n-- bad input (checked at the end of the bad-input phase) --")
    for r in results:
        for name, ok, detail in r["checks"]:
            print(f"N={r['n']:<5} {'ok  ' if ok else 'FAIL'} {name} ({detail})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="10,100,1000", help="comma-separated fleet sizes")
    ap.add_argument("--seconds", type=float, default=255.0, help="run length per fleet size (>= 240)")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each panel query")
    ap.add_argument("--ib-history-hours", type=float, default=0.0,
                    help="instead of the fleet: backfill this many hours of InfiniBand port states for each N "
                         "and time the port-down alert on raw samples against the 5-minute record")
    ap.add_argument("--gpu-history-hours", type=float, default=0.0,
                    help="instead of the fleet: backfill this many hours of GPU busy counters for each N and time "
                         "the fleet GPU-hours rule on raw samples against the record of the busy sum")
    ap.add_argument("--compare-rules", metavar="GIT_REF",
                    help="also time the rule groups of deploy/prometheus/rules at this git revision on the same "
                         "idle server (their expressions as queries, in alternation with the current ones)")
    ap.add_argument("--ranks-per-node", type=int, default=0,
                    help="a data-parallel job of this many ranks on every node (its teye_job_rank_* series)")
    ap.add_argument("--json", metavar="FILE", help="also write the raw results there (after each N)")
    ap.add_argument("--procfs", default=os.path.join(FIXTURES, "proc"))
    ap.add_argument("--sysfs", default=os.path.join(FIXTURES, "sys"))
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))   # run the finally blocks: stop what was started
    if not shutil.which("prometheus"):
        print("prometheus not installed (apt-get install prometheus)", file=sys.stderr)
        return 2
    if args.gpu_history_hours:
        for n in (int(x) for x in args.nodes.split(",")):
            report_gpu_history(run_gpu_history(n, args.gpu_history_hours, args.repeats))
        return 0
    if args.seconds < 240 and not args.ib_history_hours:
        print("--seconds must be >= 240 (TeyeAgentDown needs 2 minutes of failed scrapes)", file=sys.stderr)
        return 2
    first, second, dt = capture(args.procfs, args.sysfs, args.ranks_per_node)
    headers, lines = template(first, second, dt)
    print(f"captured {len(lines)} series from the replay agent ({sum(l.counter for l in lines)} counters), "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}", flush=True)
    if args.ib_history_hours:
        for n in (int(x) for x in args.nodes.split(",")):
            report_ib(run_ib_history(n, lines, args.ib_history_hours, args.repeats))
        return 0
    results = []
    for n in (int(x) for x in args.nodes.split(",")):
        t = time.monotonic()
        results.append(run_fleet(n, headers, lines, args.seconds, args.repeats, args.compare_rules))
        print(f"N={n}: done in {time.monotonic() - t:.0f} s, load {os.getloadavg()[0]:.2f}", flush=True)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(results, fh)
    report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
