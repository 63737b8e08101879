"""`teye report` on the simulated fleet: report time and PromQL queries for 1, 100 and 1,000 jobs.

    python benchmarks/report.py [--nodes 1000] [--seconds 150] [--repeats 3] [--naive 20]

1. benchmarks/fleet.py's capture: one real agent replays the synthetic 8-GPU trace with three training
   jobs; its /metrics is the template of every node.
2. N synthetic nodes (fleet.py's Node: every 4th idle, i % 10 == 1 vanishes and restarts, i % 10 == 3
   loses its GPUs) are scraped every 15 s by one real Prometheus (no rules here).  Each node's GPU
   processes are given Slurm jobs: GPUs 0-3 job 10*i+1, GPUs 4-5 job 10*i+2, GPUs 6-7 job 10*i+3
   (3 jobs per node, 3,000 in all), user user<i % 50>.
3. After --seconds of history, `build()` (the code behind `teye report --format json`) runs for the first
   1, 100 and 1,000 jobs (--repeats times each; median), printing wall time, queries and jobs reported.
   Side by side, the peer: one report per job (what a per-job tool such as jobstats does), for
   --naive jobs, with its time per job and queries per job, extrapolated linearly to 100 and 1,000.
History is what the run scraped (about --seconds), not days: say so next to any figure.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import fleet  # noqa: E402
from agent.report.build import Request, build  # noqa: E402
from agent.report.prom import Prometheus  # noqa: E402

GROUP = {"0": 1, "1": 1, "2": 1, "3": 1, "4": 2, "5": 2, "6": 3, "7": 3}


class SlurmNode(fleet.Node):
    def __init__(self, i, *a):
        super().__init__(i, *a)
        out = []
        for prefix, *rest in self.lines:
            if prefix.startswith("teye_gpu_process_info"):
                gpu = re.search(r'gpu="([^"]*)"', prefix).group(1)
                prefix = re.sub(r'slurm_job="[^"]*"', f'slurm_job="{10 * i + GROUP[gpu]}"', prefix)
                prefix = re.sub(r'user="[^"]*"', f'user="user{i % 50}"', prefix)
            out.append((prefix, *rest))
        self.lines = out


def timed(url, jobs):
    prom = Prometheus(url, timeout=300)
    t = time.perf_counter()
    doc = build(prom, Request(slurm_jobs=jobs, since=time.time() - 3600))
    return time.perf_counter() - t, prom.queries, len(doc["jobs"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=150.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--naive", type=int, default=20, help="jobs reported one by one for the peer figure")
    ap.add_argument("--profile", action="store_true", help="print where the 1,000-job report spends its time")
    args = ap.parse_args(argv)
    fx = os.path.join(fleet.FIXTURES)
    first, second, dt = fleet.capture(os.path.join(fx, "proc"), os.path.join(fx, "sys"))
    headers, lines = fleet.template(first, second, dt)
    n = args.nodes
    tmp = tempfile.mkdtemp(prefix="teye-report-bench-")
    t0 = time.monotonic()
    nodes = [SlurmNode(i, headers, lines, t0, 30.0, args.seconds - 30.0) for i in range(n)]
    srv, port = fleet.serve(nodes)
    rules, fleet.RULES = fleet.RULES, []
    proc, url = fleet.start_prometheus(tmp, port, n)
    fleet.RULES = rules
    try:
        print(f"{n} nodes, {len(lines)} series each, scraped every {fleet.SCRAPE_S} s; waiting {args.seconds:.0f} s "
              f"for history", flush=True)
        time.sleep(args.seconds)
        all_jobs = [str(10 * i + g) for i in range(n) for g in (1, 2, 3)]
        print(f"\n{'jobs':>6} {'teye report (batched)':>24} {'queries':>8} {'reported':>9} "
              f"{'one report per job (peer)':>27} {'queries':>8}")
        naive = []
        for j in all_jobs[: args.naive]:
            naive.append(timed(url, [j]))
        per_job = statistics.median(t for t, _, _ in naive)
        q_per_job = statistics.median(q for _, q, _ in naive)
        for k in (1, 100, 1000):
            jobs = all_jobs[:k]
            runs = [timed(url, jobs) for _ in range(args.repeats)]
            med = statistics.median(t for t, _, _ in runs)
            q, got = runs[0][1], runs[0][2]
            peer = per_job * k
            print(f"{k:>6} {med:>22.2f} s {q:>8} {got:>9} {peer:>23.2f} s{'' if k <= args.naive else ' *'} "
                  f"{int(q_per_job * k):>8}   ratio {peer / med:.1f}x")
        if args.profile:
            import cProfile
            import pstats
            pr = cProfile.Profile()
            pr.enable()
            timed(url, all_jobs[:1000])
            pr.disable()
            pstats.Stats(pr).sort_stats("cumulative").print_stats(25)
        print(f"\n* extrapolated from {len(naive)} single-job reports (median {per_job:.3f} s, "
              f"{q_per_job:.0f} queries each); history: {args.seconds:.0f} s of scrapes")
    finally:
        proc.terminate()
        proc.wait(30)
        srv.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
