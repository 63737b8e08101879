"""The cost of merging a process's intervals of one phase (issue 39): JobTable.handle per step, in process.

    python benchmarks/overlap.py --baseline DIR [--rounds 5] [--steps 20000]

DIR is another checkout (e.g. ``git archive main | tar -x -C DIR``).  For each tree, in a fresh process that
imports that tree's agent, one sending process's version 1 datagrams of 10 steps each (2 ms steps of 3 phases:
compute, data_wait, compute, as benchmarks/_serve_cost.batched_datagram), times advancing, are handled by a
new JobTable: ``distinct`` sends each datagram once, ``each twice`` sends every datagram twice in a row (the
copies the covered set drops; the baseline counts them again); ``windows`` and ``windows twice`` the same with
version 2 datagrams of 10 windows of 10 fast steps (1 ms) each, merged with the process's earlier windows.
Prints µs per step handled (each copy's steps included; CPU time of the process, not wall time, on a shared
machine), medians of --rounds alternating rounds, side by side with the ratio.  (`benchmarks/phases.py
--step-rates` measures the live agent.)
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r'''
import json, sys, time
tree, case, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, tree)
from agent.config import defaults
from agent.context import AgentContext
from agent.phases.jobs import JobTable
MS = 1_000_000
t_end = time.monotonic_ns()
t0 = t_end - steps * 2 * MS
msgs = []
per_msg = 10
if case.startswith("windows"):   # version 2: 10 windows of 10 steps of 1 ms each a datagram, back to back
    per_msg = 100
    for d in range(steps // 100):
        sums = []
        for k in range(10):
            s = t0 + (10 * d + k) * 10 * MS
            sums.append([s, s + 10 * MS, 10, 640, 10 * MS, [["data_wait", 4 * MS, 4 * MS], ["compute", 6 * MS, 6 * MS]],
                         [10]])
        m = json.dumps({"v": 2, "job": "bench", "phases": [], "steps": [], "sums": sums},
                       separators=(",", ":")).encode()
        msgs += [m, m] if case == "windows twice" else [m]
for d in range(0 if per_msg == 100 else steps // 10):
    ph, st = [], []
    for k in range(10):
        s = t0 + (10 * d + k) * 2 * MS
        ph += [["compute", s, s + MS // 5], ["data_wait", s + MS // 5, s + MS], ["compute", s + MS, s + 2 * MS]]
        st.append([s, s + 2 * MS, 64])
    m = json.dumps({"v": 1, "job": "bench", "phases": ph, "steps": st}, separators=(",", ":")).encode()
    msgs += [m, m] if case == "each twice" else [m]
best = []
for _ in range(3):
    table = JobTable(defaults()["phases"], AgentContext())
    c = time.process_time()
    for m in msgs:
        table.handle(m, 4242, 0, t_end)
    best.append((time.process_time() - c) / (per_msg * len(msgs)) * 1e6)
    assert table.results["accepted"] == len(msgs), table.results
print(min(best))
'''


def one(tree: str, case: str, steps: int) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, tree, case, str(steps)], cwd=tree, capture_output=True,
                         text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{tree}: {out.stderr.strip()}")
    return float(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", metavar="DIR", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20000)
    args = ap.parse_args()
    trees = {"this tree": REPO, "baseline": os.path.abspath(args.baseline)}
    cases = ("distinct", "each twice", "windows", "windows twice")
    got = {t: {c: [] for c in cases} for t in trees}
    for _ in range(args.rounds):
        for c in cases:
            for name, tree in trees.items():
                got[name][c].append(one(tree, c, args.steps))
    print(f"JobTable.handle, CPU us per step handled (10 steps or 10 windows a datagram), medians of {args.rounds} "
          f"alternating rounds (each the best of 3 passes); baseline = {trees['baseline']}")
    print(f"{'datagrams':<14}{'this tree':>11}{'baseline':>11}{'ratio':>8}")
    for c in cases:
        a, b = statistics.median(got["this tree"][c]), statistics.median(got["baseline"][c])
        print(f"{c:<14}{a:11.3f}{b:11.3f}{a / b:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
