"""What one phase datagram costs the agent to decode and apply, by shape (issue 48).

    python benchmarks/datagram_cost.py [--repeat 7] [--tree DIR]

For each shape: its size, and the median over --repeat rounds of the time ``JobTable.handle`` takes per
datagram (decode + apply, the receive thread's work without the recvmsg), measured with the thread's CPU
clock over enough datagrams for 0.2 s a round; beside it ``protocol.decode`` alone; and the cost in the
receiver's units (``receiver.UNIT_NS``) and in bytes per unit.  The shapes: the benchmarks' typical
per-step datagram, teye_client's batches, and the most expensive ones found within the 64 KiB / 1,024
record bounds (many small windows, windows of 64 phase names, 1,024 intervals, 1,024 steps).  With --tree
the same for another checkout, side by side.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

CHILD = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
repeat = int(sys.argv[2])
from agent.config import defaults
from agent.context import AgentContext
from agent.phases.jobs import JobTable
from agent.phases.protocol import decode
import copy
sys.path.insert(0, sys.argv[3])
from datagram_cost import shapes

now = 10**15
out = {}
for name, make in shapes():
    results = []
    for mode in ("handle", "decode"):
        per = []
        for r in range(repeat):
            cfg = copy.deepcopy(defaults()["phases"])
            table = JobTable(cfg, AgentContext(clock=lambda: now), own_uid=0)
            n, t0, spent = 0, time.thread_time_ns(), 0
            while spent < 200_000_000:
                data = make(n, now - 1_000_000_000 + n * 20_000_000 % 10**9)
                a = time.thread_time_ns()
                if mode == "handle":
                    res = table.handle(data, 1000 + n % 8, 0, now)
                    got = res
                else:
                    decode(data, now)
                spent += time.thread_time_ns() - a
                n += 1
            per.append(spent / n)
        results.append(statistics.median(per))
    out[name] = (len(make(0, now - 10**9)), results[0], results[1], got)
print(json.dumps(out))
"""


def _win(s, span, steps, names):
    return [s, s + span, steps, 8 * steps, steps * 1000, [[n, 100, 50] for n in names], [steps]]


def shapes():
    """(name, make(i, t_ns) -> bytes) for each shape measured."""
    def enc(obj):
        return json.dumps(obj, separators=(",", ":")).encode()

    def typical(i, t):
        return enc({"v": 1, "job": f"bench{i % 8}", "phases": [["data_wait", t - 3_000_000, t - 2_000_000],
                                                                ["compute", t - 2_000_000, t]],
                    "steps": [[t - 3_000_000, t, 32]]})

    def batch(i, t):   # a 100 ms flush of 10 ms steps, 3 phases each (teye_client)
        ph, st = [], []
        for k in range(10):
            s = t - (10 - k) * 10_000_000
            ph += [["compute", s, s + 10**6], ["data_wait", s + 10**6, s + 4 * 10**6], ["compute", s + 4 * 10**6, s + 10**7]]
            st.append([s, s + 10**7, 64])
        return enc({"v": 1, "job": f"bench{i % 8}", "phases": ph, "steps": st})

    def client_windows(i, t):   # a 100 ms flush of fast steps: 10 windows of 2 phase names
        return enc({"v": 2, "job": f"bench{i % 8}",
                    "sums": [_win(t - (10 - k) * 10**7, 10**7 - 1, 100, ["data_wait", "compute"]) for k in range(10)]})

    def small_windows(i, t):   # as many one-name windows as fit in 64 KiB / 1,024 records
        ws, size = [], 40
        k = 0
        while True:
            w = _win(t - 10**9 + k * 10_000, 10_000, 2, ["compute"])
            size += len(json.dumps(w, separators=(",", ":"))) + 1
            if size > 65000 or k >= 1024:
                break
            ws.append(w)
            k += 1
        return enc({"v": 2, "job": f"bench{i % 8}", "sums": ws})

    def named_windows(i, t):   # windows of 64 distinct (unknown: "other") phase names, as many as fit
        ws, size, k = [], 40, 0
        names = [f"p{j:02d}" for j in range(64)]
        while True:
            w = _win(t - 10**9 + k * 10**7, 10**6, 2, names)
            size += len(json.dumps(w, separators=(",", ":"))) + 1
            if size > 65000:
                break
            ws.append(w)
            k += 1
        return enc({"v": 2, "job": f"bench{i % 8}", "sums": ws})

    def intervals(i, t):   # 1,024 phase intervals
        return enc({"v": 1, "job": f"bench{i % 8}",
                    "phases": [["compute", t - 10**9 + k * 10**5, t - 10**9 + k * 10**5 + 50_000] for k in range(1024)]})

    def steps(i, t):   # 1,024 steps
        return enc({"v": 1, "job": f"bench{i % 8}",
                    "steps": [[t - 10**9 + k * 10**5, t - 10**9 + k * 10**5 + 50_000, 8] for k in range(1024)]})

    return [("typical (2 phases + 1 step)", typical), ("client batch (10 steps, 30 phases)", batch),
            ("client windows (10 x 2 names)", client_windows), ("small windows (max count)", small_windows),
            ("windows of 64 names", named_windows), ("1,024 intervals", intervals), ("1,024 steps", steps)]


def measure(tree: str, repeat: int):
    r = subprocess.run([sys.executable, "-c", CHILD, tree, str(repeat), HERE], capture_output=True, text=True,
                       timeout=1200)
    if r.returncode:
        raise SystemExit(r.stderr)
    return json.loads(r.stdout)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--tree", help="another checkout, measured beside this one")
    args = ap.parse_args()
    sys.path.insert(0, REPO)
    from agent.phases.receiver import BYTES_PER_UNIT, UNIT_NS
    trees = [("this tree", REPO)] + ([("other", os.path.abspath(args.tree))] if args.tree else [])
    got = {label: measure(tree, args.repeat) for label, tree in trees}
    print(f"receiver units: {UNIT_NS / 1000:g} us of handling each, estimated before decoding as 1 per "
          f"{BYTES_PER_UNIT} bytes; medians of {args.repeat} rounds, thread CPU per datagram")
    head = f"{'shape':36} {'bytes':>6} {'handle us':>10} {'decode us':>10} {'units':>6} {'est':>5} {'result':>9}"
    for label, res in got.items():
        print(f"\n{label}\n{head}")
        for name, (size, handle, dec, result) in res.items():
            print(f"{name:36} {size:6d} {handle / 1000:10.1f} {dec / 1000:10.1f} {max(1, handle / UNIT_NS):6.0f} "
                  f"{max(1, size // BYTES_PER_UNIT):5d} {result:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
