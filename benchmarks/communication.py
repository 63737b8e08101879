"""Communication seen (issue 37): teye's exposed-exchange share and verdict against each rank's own clock,
and what timing the exchange costs the job.

    python benchmarks/communication.py matrix [--rates 20,100,1000,0] [--steps 12]
    python benchmarks/communication.py ranks [--steps 30]
    python benchmarks/communication.py cost [--rounds 5] [--steps 200]

matrix: two network namespaces joined by a veth pair shaped with tc tbf at each rate (0: unshaped), an
        agent in each, and the 2 x 2-rank DDP job of tests/e2e/test_communication_netns.py (gloo, 1.1 MB of
        gradients a step) under `teye run` on both; per rate: teye's exposed-exchange share per rank against
        the rank's own clocks: 'exposed', from its last gradient bucket ready (the script's own communication
        hook) to the end of backward(); 'bwd-alone', its backward() and optimizer step less a copy's backward
        that exchanges nothing; and what the shaping added against the unshaped run, by teye and by the
        clock around backward() and the step; the verdict and cause of both nodes.  Needs root.
ranks:  one node, 4 ranks of DDP with rank 2 computing 60 ms more per step, and FSDP (fully_shard) on 2 ranks
        with rank 1 computing 40 ms more: teye's per-rank communication share against each rank's clock,
        the critical rank and the job's verdict.
cost:   the same 2-rank DDP job (tiny model: steps of a few ms, where a per-step cost shows most) without teye
        and under `teye run` beside a live agent, alternating --rounds times: each rank's mean step time, the
        median over rounds side by side, and the ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def matrix(rates, steps: int) -> int:
    from agent.config import COLLECTORS
    from tests import netns
    from tests.e2e import test_communication_netns as T
    from tests.phases.helpers import shared_tmpdir
    why = netns.available()
    if why:
        print(f"matrix: {why}")
        return 1
    T.STEPS = steps
    tmp, d = tempfile.mkdtemp(prefix="teye-comm-"), shared_tmpdir()
    conf = os.path.join(tmp, "teye.yaml")
    with open(conf, "w") as fh:
        fh.write("collectors:\n" + "".join(f"  {c}: {{enabled: {'true' if c in T.ON else 'false'}}}\n"
                                           for c in COLLECTORS))
    print(f"{'rate':>9} {'rank':>4} {'teye':>6} {'exposed':>7} {'bwd-alone':>9} {'added teye':>10} {'added clock':>11} "
          f"{'step ms':>7} verdict/cause (node a; node b)")
    agents = []
    try:
        with netns.veth_pair("bm", rate_mbit=None, subnet=223, mgmt=True) as pair:
            agents = [T.NsAgent(pair.ns[i], pair.mgmt[i], conf, os.path.join(d, f"{'ab'[i]}.sock"),
                                os.path.join(tmp, f"agent-{'ab'[i]}.log")) for i in range(2)]
            base = None
            for rate in sorted(rates, key=lambda r: (r != 0, r)):   # the unshaped run first: the baseline
                netns.shape(pair, rate or None)
                name = f"ddp-{rate or 'free'}"
                own = T.run_job(pair, agents, name)
                time.sleep(6)
                seen, verdicts = {}, []
                for ag in agents:
                    comm, kind, cause, _ = T.shares(ag, name)
                    seen.update(comm)
                    verdicts.append(f"{'/'.join(kind)}/{'/'.join(cause) or '-'}")
                if base is None:
                    base = (own, seen)
                for r in sorted(own):
                    o = own[r]
                    clock = max(0.0, o["bwd_s"] - o["alone_s"]) / o["step_s"]
                    bo, bs = base[0][r], base[1].get(r, 0.0)
                    added_clock = (o["bwd_s"] - bo["bwd_s"]) / o["step_s"]
                    added_teye = (seen.get(r, 0.0) * o["step_s"] - bs * bo["step_s"]) / o["step_s"]
                    label = f"{rate} Mbit" if rate else "none"
                    print(f"{label:>9} {r:>4} {seen.get(r, 0.0):6.3f} {o['exposed_s'] / o['step_s']:7.3f} {clock:9.3f} "
                          f"{added_teye:10.3f} "
                          f"{added_clock:11.3f} {1000 * o['step_s'] / o['steps']:7.0f} "
                          f"{'; '.join(verdicts) if r == 0 else ''}")
    finally:
        for a in agents:
            a.stop()
        shutil.rmtree(d, ignore_errors=True)
    return 0


def ranks(steps: int) -> int:
    from tests.client.test_ranks import run_ddp
    for title, args, slow in (("DDP, 4 ranks, rank 2 computes 60 ms more", (4, steps, 2, 60, "ddp_compute"), 2),
                              ("FSDP, 2 ranks, rank 1 computes 40 ms more", (2, max(10, steps // 2), 1, 40, "fsdp"),
                               1)):
        d = tempfile.mkdtemp(prefix="teye-comm-")
        try:
            j, own = run_ddp(d, *args)
        finally:
            shutil.rmtree(d, ignore_errors=True)
        print(f"{title}: verdict {j.verdict.kind}, critical rank {j.critical_rank} (the slow one: {slow}), "
              f"scaling efficiency {j.scaling_efficiency:.3f}")
        print(f"  {'rank':>4} {'teye comm':>9} {'clock':>6}")
        for r in j.ranks:
            o = own[r.rank]
            teye = dict(r.phase_seconds).get("communication", 0.0) / r.step_seconds
            clock = (o["comm_s"] if args[4] == "fsdp" else max(0.0, o["bwd_s"] - o["alone_s"])) / o["step_s"]
            print(f"  {r.rank:>4} {teye:9.3f} {clock:6.3f}")
        print(f"  evidence: {j.verdict.evidence[:200]}")
    return 0


def cost(rounds: int, steps: int) -> int:
    from tests.client.helpers import HERE, LiveAgent, base_env, plain_run, teye_run
    from tests.procs import free_port
    script = os.path.join(HERE, "torch_ddp_ranks.py")
    rows = {"without teye": [], "teye run": []}
    for _ in range(rounds):
        for label in rows:
            argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                    str(free_port()), script, str(steps), "-1", "0", "ddp"]
            env = base_env(OMP_NUM_THREADS="1")
            if label == "teye run":
                d = tempfile.mkdtemp(prefix="teye-comm-")
                agent = LiveAgent(d)
                try:
                    r = teye_run(argv, socket_path=agent.path, env=env, timeout=600)
                finally:
                    agent.close()
                    shutil.rmtree(d, ignore_errors=True)
            else:
                r = plain_run(argv, env=env, timeout=600)
            if r.returncode != 0:
                print(f"{label}: failed: {r.stderr[-400:]}")
                return 1
            own = [json.loads(line) for line in r.stdout.splitlines()]
            rows[label].append(statistics.mean(o["step_s"] / o["steps"] for o in own))
    a, b = (statistics.median(v) for v in rows.values())
    print(f"2-rank DDP (gloo, CPU), {steps} steps, median of {rounds} rounds, alternating:")
    for label, v in rows.items():
        print(f"  {label:>13}: mean step {1000 * statistics.median(v):.3f} ms  (rounds: "
              f"{', '.join(f'{1000 * x:.3f}' for x in v)})")
    print(f"  ratio teye/without: {b / a:.3f} ({1e6 * (b - a):+.0f} µs per step)")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("matrix")
    m.add_argument("--rates", default="20,100,1000,0", help="Mbit/s, comma-separated; 0: unshaped")
    m.add_argument("--steps", type=int, default=12)
    r = sub.add_parser("ranks")
    r.add_argument("--steps", type=int, default=30)
    c = sub.add_parser("cost")
    c.add_argument("--rounds", type=int, default=5)
    c.add_argument("--steps", type=int, default=200)
    a = ap.parse_args(argv)
    if a.cmd == "matrix":
        return matrix([float(x) if "." in x else int(x) for x in a.rates.split(",")], a.steps)
    if a.cmd == "ranks":
        return ranks(a.steps)
    return cost(a.rounds, a.steps)


if __name__ == "__main__":
    sys.exit(main())
