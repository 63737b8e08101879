"""What issue 49's families cost each host collector's pass: the CPU time of one ``collect()`` of the collectors that
read them (netstat, network, netclass, loadavg, memory, timex, os, disk), in this tree and in a peer tree (another
checkout, e.g. main before the change), side by side in one run, on this machine's /proc and /sys.

    python benchmarks/node_families.py --peer /work/main [--passes 400]

Prints, per collector, the median CPU milliseconds of a pass in each tree, their ratio, and the share of one core
each costs at its default interval (agent/config.py): what the agent's idle cost gains or loses per collector.
Each tree is measured in a child process of its own (its own imports), alternating, three rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

COLLECTORS = ("netstat", "network", "netclass", "loadavg", "memory", "timex", "os", "disk")

CHILD = r"""
import json, statistics, sys, time
from agent import config as config_mod
from agent.context import AgentContext
from agent.sources import build
cfg = config_mod.load(None)
out = {}
for name in sys.argv[2].split(","):
    src = build(name, cfg, AgentContext())
    src.collect()   # the first pass fills caches (interface attributes, udev) as the agent's first does
    samples = []
    for _ in range(int(sys.argv[1])):
        t = time.process_time()
        src.collect()
        samples.append(time.process_time() - t)
    out[name] = (statistics.median(samples), cfg["collectors"][name]["interval_seconds"])
print(json.dumps(out))
"""


def measure(tree: str, passes: int) -> dict:
    env = {**os.environ, "PYTHONPATH": tree}
    res = subprocess.run([sys.executable, "-c", CHILD, str(passes), ",".join(COLLECTORS)], cwd=tree, env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(res.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", required=True, help="another checkout of teye (e.g. /work/main)")
    ap.add_argument("--passes", type=int, default=400)
    args = ap.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rounds = {"this": [], "peer": []}
    for _ in range(3):
        rounds["this"].append(measure(here, args.passes))
        rounds["peer"].append(measure(args.peer, args.passes))
    print(f"{'collector':10} {'peer ms/pass':>13} {'this ms/pass':>13} {'ratio':>6} {'peer %core':>10} {'this %core':>10}")
    tot = {"this": 0.0, "peer": 0.0}
    for name in COLLECTORS:
        row = {}
        for k in ("this", "peer"):
            row[k] = statistics.median(r[name][0] for r in rounds[k])
            interval = rounds[k][0][name][1]
            tot[k] += row[k] / interval
        print(f"{name:10} {row['peer'] * 1e3:13.3f} {row['this'] * 1e3:13.3f} {row['this'] / row['peer']:6.2f} "
              f"{row['peer'] / interval * 100:10.4f} {row['this'] / interval * 100:10.4f}")
    print(f"{'all':10} {'':13} {'':13} {tot['this'] / tot['peer']:6.2f} {tot['peer'] * 100:10.4f} "
          f"{tot['this'] * 100:10.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
