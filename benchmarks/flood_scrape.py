"""The scrape and a legitimate job under the worst datagram flood (issue 48), beside the same without it.

    python benchmarks/flood_scrape.py [--seconds 6] [--rounds 3] [--baseline DIR]

A real `teye agent` (defaults, its phase socket in a directory every uid may reach).  In each round, two
periods of --seconds each, in alternating order: "quiet", --jobs legitimate jobs (default 2: teye_client.Reporter,
20 ms flushes, 5 ms steps, as root); "flood", the same jobs beside three flooders, each its own uid (setpriv:
daemon, sys, nobody), sending the most expensive datagram shape found (benchmarks/datagram_cost.py: 64 KiB of
small sum windows) as fast as a non-blocking socket takes it (tests/phases/test_cost_budget.py's flooder).
Through each period a scraper asks for /metrics every 100 ms on one keep-alive connection, as Prometheus does,
and times each answer (perf_counter around the request and the whole body).  Prints per period, medians over
the rounds: the scrape's p50 and p99 and slowest, the jobs' steps lost (their own counts against the agent's
teye_job_steps_total for each, as a share of their steps) and their dropped datagrams, and the agent's CPU seconds per second.
With --baseline the same agent from another checkout, run after this one's (needs root and setpriv).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from tests.procs import REPO, free_port, wait_http  # noqa: E402
from tests.phases.test_cost_budget import FLOODER, FLOODERS, VICTIM  # noqa: E402
from benchmarks._proc import cpu_seconds  # noqa: E402


def _pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


class Scraper(threading.Thread):
    def __init__(self, port):
        super().__init__(daemon=True)
        self.port, self.times, self.failed = port, [], 0
        self.stop = threading.Event()

    def run(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                conn.request("GET", "/metrics")
                r = conn.getresponse()
                r.read()
                if r.status != 200:
                    self.failed += 1
                else:
                    self.times.append(time.perf_counter() - t0)
            except (OSError, http.client.HTTPException):
                self.failed += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            self.stop.wait(max(0.0, 0.1 - (time.perf_counter() - t0)))
        conn.close()


def _steps(port, job):
    body = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    body.request("GET", "/metrics")
    text = body.getresponse().read().decode()
    body.close()
    m = re.search(r'^teye_job_steps_total\{[^}]*train_job="%s"[^}]*\} (\S+)$' % re.escape(job), text, re.M)
    return float(m.group(1)) if m else 0.0


def period(agent, port, sock, seconds, flood, name, jobs):
    py = shutil.which("python3", path="/usr/bin:/bin")
    scraper = Scraper(port)
    cpu0, t0 = cpu_seconds(agent.pid), time.monotonic()
    scraper.start()
    floods = []
    if flood:
        for uid, _ in FLOODERS.items():
            floods.append(subprocess.Popen(
                ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", py, "-c", FLOODER, sock,
                 str(seconds), "flood"], stdout=subprocess.PIPE, text=True, cwd="/", env={"PATH": "/usr/bin:/bin"}))
        for p in floods:
            p.stdout.readline()
    steps = int(seconds / 0.0055)
    names = [f"{name}-{k}" for k in range(jobs)]
    victims = [subprocess.Popen([sys.executable, "-c", VICTIM.replace('"victim"', repr(n)), sock, str(steps)],
                                stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": REPO})
               for n in names]
    outs = [json.loads(v.communicate(timeout=120)[0].strip().splitlines()[-1]) for v in victims]
    for p in floods:
        p.communicate(timeout=60)
    time.sleep(1.5)   # the agent reads its job table every second: the last flush counted
    scraper.stop.set()
    scraper.join(15)
    cpu = (cpu_seconds(agent.pid) - cpu0) / (time.monotonic() - t0)
    lost = sum(v["steps"] - _steps(port, n) for v, n in zip(outs, names))
    return {"p50": _pct(scraper.times, 0.5), "p99": _pct(scraper.times, 0.99), "max": max(scraper.times),
            "scrapes": len(scraper.times), "failed": scraper.failed, "lost": lost,
            "lost_share": lost / sum(v["steps"] for v in outs),
            "dropped": sum(v["dropped_messages"] for v in outs), "cpu": cpu}


def run_tree(tree, args):
    tmp = tempfile.mkdtemp(prefix="teye-fs")
    os.chmod(tmp, 0o755)
    sock = os.path.join(tmp, "phases.sock")
    port = free_port()
    agent = subprocess.Popen([sys.executable, "-m", "agent", "agent", "--listen", f"127.0.0.1:{port}",
                              "--phase-socket", sock], cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env={**os.environ, "PYTHONPATH": tree})
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc=agent)
        while not os.path.exists(sock):
            time.sleep(0.05)
        os.chmod(sock, 0o777)
        time.sleep(3)
        rows = {"quiet": [], "flood": []}
        for r in range(args.rounds):
            order = ("quiet", "flood") if r % 2 == 0 else ("flood", "quiet")
            for what in order:
                rows[what].append(period(agent, port, sock, args.seconds, what == "flood", f"victim-{what}-{r}",
                                        args.jobs))
        return rows
    finally:
        agent.terminate()
        agent.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2, help="legitimate jobs at once (default 2)")
    ap.add_argument("--baseline", help="another teye checkout, run after this one")
    args = ap.parse_args()
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        sys.exit("flood_scrape.py needs root and setpriv (the flooders are three other uids)")
    trees = [("teye", REPO)] + ([("teye-base", os.path.abspath(args.baseline))] if args.baseline else [])
    print(f"{os.cpu_count()} CPUs; {args.rounds} rounds of {args.seconds:g} s per period; medians over rounds")
    print(f"{'agent':10} {'period':6} {'scrape p50 ms':>13} {'p99 ms':>8} {'max ms':>8} {'scrapes':>8} "
          f"{'failed':>6} {'jobs lost':>9} {'dropped':>7} {'agent CPU s/s':>13}")
    for label, tree in trees:
        rows = run_tree(tree, args)
        for what in ("quiet", "flood"):
            rs = rows[what]
            med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            print(f"{label:10} {what:6} {med['p50'] * 1e3:13.1f} {med['p99'] * 1e3:8.1f} {med['max'] * 1e3:8.1f} "
                  f"{med['scrapes']:8.0f} {med['failed']:6.0f} {100 * med['lost_share']:8.1f}% {med['dropped']:7.0f} "
                  f"{med['cpu']:13.2f}   (steps lost per round: {[r['lost'] for r in rs]})")


if __name__ == "__main__":
    main()
