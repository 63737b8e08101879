"""Scrape latency, CPU and memory of `teye agent` side by side with Debian's prometheus-node-exporter.

    python benchmarks/scrape.py [--scrapes 200] [--cpu-seconds 60]

Both exporters run on this host with default settings (teye: all collectors, sampling in the
background; node_exporter: its default collectors, collecting at scrape time).  Scrapes alternate
between the two so machine noise hits both alike.  Then both are left running for --cpu-seconds
while each is scraped every 15 s (a common Prometheus interval), and their CPU time (utime+stime
from /proc/<pid>/stat) and peak RSS (VmHWM) are read.  Prints medians/percentiles and ratios.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.procs import REPO, free_port, wait_http  # noqa: E402
from benchmarks._proc import cpu_seconds, peak_rss_mib  # noqa: E402

NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")




def scrape(url: str) -> tuple:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as r:
        body = r.read()
    return time.perf_counter() - t0, len(body)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--cpu-seconds", type=float, default=60.0)
    args = ap.parse_args()
    if not NODE_EXPORTER:
        print("prometheus-node-exporter not found: apt-get install prometheus-node-exporter", file=sys.stderr)
        return 2
    tp, np_ = free_port(), free_port()
    teye = subprocess.Popen([sys.executable, "-m", "agent", "agent", "--listen", f"127.0.0.1:{tp}",
                             "--log-level", "warning"], cwd=REPO)
    node = subprocess.Popen([NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{np_}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    urls = {"teye": f"http://127.0.0.1:{tp}/metrics", "node_exporter": f"http://127.0.0.1:{np_}/metrics"}
    pids = {"teye": teye.pid, "node_exporter": node.pid}
    try:
        for u in urls.values():
            wait_http(u)
        time.sleep(3)  # let every teye collector complete a read
        lat = {k: [] for k in urls}
        size = {}
        for _ in range(args.scrapes):
            for k, u in urls.items():
                dt, n = scrape(u)
                lat[k].append(dt)
                size[k] = n
        cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.cpu_seconds:
            for u in urls.values():
                scrape(u)
            time.sleep(min(15.0, max(0.0, args.cpu_seconds - (time.monotonic() - t0))))
        elapsed = time.monotonic() - t0
        cpu = {k: (cpu_seconds(p) - cpu0[k]) * 60.0 / elapsed for k, p in pids.items()}
        rss = {k: peak_rss_mib(p) for k, p in pids.items()}
    finally:
        for p in (teye, node):
            p.terminate()
            p.wait(10)

    rows = [
        ("scrape latency p50 (ms)", {k: statistics.median(v) * 1e3 for k, v in lat.items()}),
        ("scrape latency p99 (ms)", {k: pct(v, 0.99) * 1e3 for k, v in lat.items()}),
        ("exposition size (KiB)", {k: v / 1024 for k, v in size.items()}),
        ("CPU seconds per minute", cpu),
        ("peak RSS (MiB)", rss),
    ]
    print(f"{args.scrapes} scrapes each, alternating; CPU over {elapsed:.0f} s with a scrape every 15 s")
    print(f"{'':28s}{'teye':>12s}{'node_exporter':>16s}{'teye/node':>12s}")
    for label, v in rows:
        ratio = v["teye"] / v["node_exporter"] if v["node_exporter"] else float("inf")
        print(f"{label:28s}{v['teye']:12.3f}{v['node_exporter']:16.3f}{ratio:12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
