"""Scrape latency and CPU of `teye agent` side by side with Debian's prometheus-node-exporter.

    python benchmarks/scrape.py [--scrapes 200] [--gpus 1,8,16] [--jobs 0,10,100]
                                [--fresh-scrapes 20] [--cpu-seconds 60] [--baseline DIR]
                                [--prometheus-headers]

All exporters run on this host at once: node_exporter with its default collectors (it
collects at scrape time), teye with all collectors at their defaults (sampling in the
background) on the synthetic GPU replay (``tests/data/gpu/make_synthetic_trace.py --gpus G``,
written to a temp dir) and J training jobs reporting 1 step/s each over the phase socket
(``phases.max_jobs`` raised to 128 so 100 jobs fit).  ``--baseline DIR`` runs a second teye
from another checkout (e.g. ``git archive 7803461 | tar -x -C DIR``) beside it, for
before/after ratios taken in the same run.

1. Back to back: for every (G, J), --scrapes rounds of one scrape of each exporter in turn,
   so machine noise hits all alike: p50/p99 latency, series count, µs per series.
2. Fresh: at G=8, J=0, --fresh-scrapes rounds 1.1 s apart, so every 1 s collector has a new
   reading at each scrape and a 5 s one at every fifth (what a Prometheus scraping every 15 s
   sees: since issue 38 most collectors read every 5 s, docs/operations.md "Agent footprint").
3. CPU: at G=8, J=0, every exporter left running for --cpu-seconds with a scrape every 15 s;
   CPU time (utime+stime from /proc/<pid>/stat) as a share of one core, and peak RSS.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.procs import REPO, free_port, wait_http  # noqa: E402
from benchmarks._proc import cpu_seconds, peak_rss_mib  # noqa: E402

NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
TRACE_TOOL = os.path.join(REPO, "tests", "data", "gpu", "make_synthetic_trace.py")


HEADERS: dict = {}  # --prometheus-headers: what Prometheus 2.x sends
PROMETHEUS_HEADERS = {"Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                                "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
                      "Accept-Encoding": "gzip"}


def scrape(url: str) -> tuple:
    t0 = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(url, headers=HEADERS), timeout=10) as r:
        body = r.read()
    dt = time.perf_counter() - t0
    if r.headers.get("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    return dt, body


def series(body: bytes) -> int:
    return sum(1 for ln in body.splitlines() if ln and not ln.startswith(b"#"))


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


class Exporter:
    def __init__(self, name, argv, cwd, url, sock=None):
        self.name, self.url, self.sock = name, url, sock
        self.proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


def start_teye(name: str, tree: str, tmp: str, trace: str) -> Exporter:
    port = free_port()
    conf = os.path.join(tmp, f"{name}.yaml")
    with open(conf, "w") as fh:
        fh.write("phases:\n  max_jobs: 128\n  max_jobs_per_user: 128\n")
    sock = os.path.join(tmp, f"{name}.sock")
    ex = Exporter(name, [sys.executable, "-m", "agent", "agent", "--config", conf, "--listen", f"127.0.0.1:{port}",
                         "--gpu-replay", trace, "--phase-socket", sock, "--log-level", "warning"],
                  tree, f"http://127.0.0.1:{port}/metrics", sock)
    wait_http(f"http://127.0.0.1:{port}/healthz", proc=ex.proc)
    return ex


class Jobs(threading.Thread):
    """n training jobs, each sending one step (data_wait + compute phases, one step record) a second."""

    def __init__(self, n: int, sockets):
        super().__init__(daemon=True)
        self.n, self.sockets, self.stop = n, sockets, threading.Event()

    def run(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        while self.n and not self.stop.wait(1.0):
            t = time.monotonic_ns()
            for j in range(self.n):
                msg = json.dumps({"v": 1, "job": f"job-{j}", "phases": [["data_wait", t - 900_000_000, t - 600_000_000],
                                                                         ["compute", t - 600_000_000, t]],
                                  "steps": [[t - 900_000_000, t, 64]]}, separators=(",", ":")).encode()
                for path in self.sockets:
                    try:
                        s.sendto(msg, path)
                    except OSError:
                        pass


def rounds(exporters, n: int, spacing_s: float = 0.0):
    lat = {e.name: [] for e in exporters}
    body = {}
    for _ in range(n):
        for e in exporters:
            dt, body[e.name] = scrape(e.url)
            lat[e.name].append(dt)
        if spacing_s:
            time.sleep(spacing_s)
    return lat, {k: series(b) for k, b in body.items()}, {k: len(b) for k, b in body.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--gpus", default="1,8,16")
    ap.add_argument("--jobs", default="0,10,100")
    ap.add_argument("--fresh-scrapes", type=int, default=20)
    ap.add_argument("--cpu-seconds", type=float, default=60.0)
    ap.add_argument("--baseline", metavar="DIR", help="another teye checkout to run beside this one (before/after)")
    ap.add_argument("--prometheus-headers", action="store_true",
                    help="ask for OpenMetrics and gzip as Prometheus does (default: plain text, no compression)")
    args = ap.parse_args()
    if args.prometheus_headers:
        HEADERS.update(PROMETHEUS_HEADERS)
    if not NODE_EXPORTER:
        print("prometheus-node-exporter not found: apt-get install prometheus-node-exporter", file=sys.stderr)
        return 2
    gpus = [int(g) for g in args.gpus.split(",")]
    jobs = [int(j) for j in args.jobs.split(",")]
    trees = {"teye": REPO}
    if args.baseline:
        trees["before"] = os.path.abspath(args.baseline)
    tmp = tempfile.mkdtemp(prefix="teye-scrape-bench-")
    traces = {}
    for g in sorted(set(gpus) | {8}):
        traces[g] = os.path.join(tmp, f"synthetic-{g}gpu.jsonl")
        subprocess.run([sys.executable, TRACE_TOOL, traces[g], "--gpus", str(g)], check=True, cwd=REPO,
                       stdout=subprocess.DEVNULL)
    np_ = free_port()
    node = Exporter("node_exporter", [NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{np_}"], None,
                    f"http://127.0.0.1:{np_}/metrics")
    wait_http(node.url)
    table = []
    try:
        for g in gpus:
            for j in jobs:
                teyes = [start_teye(k, tree, tmp, traces[g]) for k, tree in trees.items()]
                sender = Jobs(j, [t.sock for t in teyes])
                sender.start()
                try:
                    time.sleep(3.5)  # every collector read, every job reported (1 s collectors)
                    lat, n, size = rounds(teyes + [node], args.scrapes)
                finally:
                    sender.stop.set()
                    for t in teyes:
                        t.stop()
                table.append((g, j, lat, n, size))
        fresh = cpu = rss = None
        if args.fresh_scrapes or args.cpu_seconds:
            teyes = [start_teye(k, tree, tmp, traces[8]) for k, tree in trees.items()]
            try:
                time.sleep(3.5)
                if args.fresh_scrapes:
                    fresh = rounds(teyes + [node], args.fresh_scrapes, spacing_s=1.1)
                if args.cpu_seconds:
                    every = teyes + [node]
                    cpu0 = {e.name: cpu_seconds(e.proc.pid) for e in every}
                    t0 = time.monotonic()
                    while time.monotonic() - t0 < args.cpu_seconds:
                        for e in every:
                            scrape(e.url)
                        time.sleep(min(15.0, max(0.0, args.cpu_seconds - (time.monotonic() - t0))))
                    elapsed = time.monotonic() - t0
                    cpu = {e.name: (cpu_seconds(e.proc.pid) - cpu0[e.name]) / elapsed for e in every}
                    rss = {e.name: peak_rss_mib(e.proc.pid) for e in every}
            finally:
                for t in teyes:
                    t.stop()
    finally:
        node.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    names = list(trees) + ["node_exporter"]
    print(f"back to back: {args.scrapes} rounds, one scrape of each exporter per round "
          f"({', '.join(names)}); p50 in ms, us/series = p50 / series")
    head = f"{'GPUs':>4} {'jobs':>4} {'series':>6} {'teye p50':>9} {'us/ser':>7}"
    if "before" in trees:
        head += f" {'before p50':>10} {'us/ser':>7} {'after/before':>12}"
    head += f" {'node series':>11} {'node p50':>9} {'teye/node':>9}"
    print(head)
    for g, j, lat, n, size in table:
        p = {k: statistics.median(v) * 1e3 for k, v in lat.items()}
        row = f"{g:>4} {j:>4} {n['teye']:>6} {p['teye']:>9.3f} {1e3 * p['teye'] / n['teye']:>7.2f}"
        if "before" in trees:
            row += f" {p['before']:>10.3f} {1e3 * p['before'] / n['before']:>7.2f} {p['teye'] / p['before']:>12.2f}"
        row += f" {n['node_exporter']:>11} {p['node_exporter']:>9.3f} {p['teye'] / p['node_exporter']:>9.2f}"
        print(row)
    rows = []
    if fresh:
        lat, n, size = fresh
        rows += [(f"fresh scrape p50 (ms), {args.fresh_scrapes} x 1.1 s apart",
                  {k: statistics.median(v) * 1e3 for k, v in lat.items()}),
                 ("fresh scrape p99 (ms)", {k: pct(v, 0.99) * 1e3 for k, v in lat.items()}),
                 ("series", {k: float(v) for k, v in n.items()}),
                 ("exposition size (KiB)", {k: v / 1024 for k, v in size.items()})]
    if cpu:
        rows += [(f"CPU, % of one core ({args.cpu_seconds:.0f} s)", {k: 100 * v for k, v in cpu.items()}),
                 ("peak RSS (MiB)", rss)]
    if rows:
        print()
        print("8 replayed GPUs, no jobs, defaults")
        print(f"{'':44s}" + "".join(f"{k:>14s}" for k in names) + "".join(f"{k + '/node':>14s}" for k in trees))
        for label, v in rows:
            print(f"{label:44s}" + "".join(f"{v[k]:14.3f}" for k in names)
                  + "".join(f"{v[k] / v['node_exporter'] if v['node_exporter'] else float('inf'):14.2f}"
                            for k in trees))
    return 0


if __name__ == "__main__":
    sys.exit(main())
