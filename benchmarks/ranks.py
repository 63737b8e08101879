"""Data-parallel jobs (issue 30): teye against each rank's own clock, and what ranks cost the agent.

    python benchmarks/ranks.py matrix [--ranks 2,4,8] [--steps 60] [--slow-ms 20]
    python benchmarks/ranks.py cost [--ranks 8] [--rounds 15]
    python benchmarks/ranks.py live [--ranks 8] [--seconds 8] [--rounds 3]

matrix: a real DDP job (gloo, CPU; tests/client/torch_ddp_ranks.py) under `torchrun` and `teye run`
        for each rank count, with the last rank's Dataset sleeping --slow-ms per batch, and with no slow
        rank; the agent's phase path (receiver + job table) runs in this process.  Prints teye's job
        input-bound share, verdict and critical rank next to the slow rank's own wall-clock wait share
        (time in next() of its DataLoader over its step time, as the script measures it), and the largest
        difference between teye's per-rank share and each rank's own.
cost:   the job table's CPU per step for one job whose R processes send zero-code batches (10 steps a
        datagram: 30 phase records), side by side: processes that said their rank (every datagram on the
        Python path, per-rank sums) against the same processes without a rank (the compiled helpers);
        then the cost of one collection (views(): per-rank evidence and the critical rank) with and
        without ranks.  The receive itself (recvmmsg) is the same for both and not counted.
live:   a real `teye agent` and R processes reporting 10 ms steps through teye_client.Reporter, with and
        without ranks, alternating --rounds times: the agent's CPU (utime + stime from /proc, the whole
        agent: receive, table, collection, its other threads) per step sent.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def matrix(ranks_list, steps: int, slow_ms: float) -> int:
    from tests.client.helpers import HERE, LiveAgent, base_env, teye_run
    from tests.procs import free_port
    script = os.path.join(HERE, "torch_ddp_ranks.py")
    print(f"{'ranks':>5} {'slow':>5} {'own share':>9} {'teye job':>8} {'verdict':>8} {'critical':>8} "
          f"{'max rank err':>12} {'steps':>5} {'wall s':>6}")
    for n in ranks_list:
        for slow in (n - 1, -1):
            d = tempfile.mkdtemp(prefix="teye-ranks-")
            agent = LiveAgent(d)
            t0 = time.monotonic()
            try:
                r = teye_run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n),
                              "--master_port", str(free_port()), script, str(steps), str(slow), str(slow_ms), "ddp"],
                             socket_path=agent.path, env=base_env(OMP_NUM_THREADS="1"), timeout=600)
                wall = time.monotonic() - t0
                if r.returncode != 0:
                    print(f"{n:>5} {slow:>5} failed: {r.stderr[-400:]}")
                    continue
                own = {o["rank"]: o for o in map(json.loads, r.stdout.splitlines())}
                (j,) = agent.jobs().values()
            finally:
                agent.close()
            share = {k: o["wait_s"] / o["step_s"] for k, o in own.items()}
            truth = share[slow] if slow >= 0 else max(share.values())
            err = max(abs(rv.input_bound_ratio - share[rv.rank]) for rv in j.ranks)
            print(f"{n:>5} {slow if slow >= 0 else 'none':>5} {truth:>9.3f} {j.input_bound_ratio:>8.3f} "
                  f"{j.verdict.kind:>8} {j.critical_rank!s:>8} {err:>12.3f} {j.steps:>5} {wall:>6.1f}")
    return 0


def cost(ranks: int, rounds: int) -> int:
    from agent.config import defaults
    from agent.context import AgentContext
    from agent.phases.jobs import JobTable
    from agent.phases.protocol import encode

    print("phase path: Python (the only one since issue 38)")
    per_dgram = 10

    def datagram(t_ns: int, rank=None, world=None) -> bytes:
        ph, st = [], []
        for k in range(per_dgram):
            e = t_ns - (per_dgram - 1 - k) * 10_000_000
            s = e - 10_000_000
            ph += [("compute", s, s + 1_000_000), ("data_wait", s + 1_000_000, s + 4_000_000),
                   ("compute", s + 4_000_000, e)]
            st.append((s, e, 64))
        return encode("ddp", ph, st, rank=rank, world=world)

    def run(with_rank: bool):
        cfg = copy.deepcopy(defaults()["phases"])
        table = JobTable(cfg, AgentContext(clock=time.monotonic_ns))
        pids = [10_000 + r for r in range(ranks)]
        t = time.monotonic_ns()
        table.handle_batch([(datagram(t, r if with_rank else None, ranks if with_rank else None), pid, 0)
                            for r, pid in enumerate(pids)])
        out, views = [], []
        for _ in range(rounds):
            cpu, n = 0.0, 0
            for _ in range(50):
                t = time.monotonic_ns()
                batch = [(datagram(t), pid, 0) for pid in pids]
                c0 = time.thread_time()
                table.handle_batch(batch)
                cpu += time.thread_time() - c0
                n += len(batch) * per_dgram
            out.append(cpu / n * 1e6)
            c0 = time.thread_time()
            (view,), *_ = table.views(time.monotonic_ns())
            views.append((time.thread_time() - c0) * 1e6)
        assert table.results["accepted"] == ranks * (1 + 50 * rounds), table.results
        # global steps with ranks; every process's steps without (the agent cannot tell they are the same)
        assert (view.critical_rank is not None) == with_rank
        assert view.steps == per_dgram * (1 + 50 * rounds) * (1 if with_rank else ranks), view.steps
        return statistics.median(out), statistics.median(views)

    runs = {False: [], True: []}
    for _ in range(3):   # alternate, so that the host's load falls on both alike
        for with_rank in (False, True):
            runs[with_rank].append(run(with_rank))
    plain = statistics.median(x[0] for x in runs[False])
    ranked = statistics.median(x[0] for x in runs[True])
    v_plain = statistics.median(x[1] for x in runs[False])
    v_ranked = statistics.median(x[1] for x in runs[True])
    print(f"{ranks} processes, {per_dgram} steps per datagram, median of 3 x {rounds} rounds")
    print(f"  CPU per step:        without ranks {plain:7.2f} us   with ranks {ranked:7.2f} us   ratio {ranked / plain:.1f}x")
    print(f"  CPU per collection:  without ranks {v_plain:7.0f} us   with ranks {v_ranked:7.0f} us   ratio "
          f"{v_ranked / v_plain:.1f}x")
    for step_ms in (100, 10):
        per_s = ranks * 1000 / step_ms
        print(f"  at {step_ms} ms steps on every rank ({per_s:.0f} steps/s on the node): "
              f"{per_s * plain / 1e4:.3f} % of a core without ranks, {per_s * ranked / 1e4:.3f} % with ranks "
              f"(+ one collection a second: {v_ranked / 1e4:.3f} %)")
    return 0


SENDER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from teye_client import Reporter
rank = int(sys.argv[2])
rep = Reporter(train_job="ddp", rank=rank if rank >= 0 else None, world_size=int(sys.argv[3]) if rank >= 0 else None)
deadline = time.monotonic() + float(sys.argv[4])
n = 0
while time.monotonic() < deadline:
    with rep.phase("data_wait"):
        time.sleep(0.002)
    with rep.phase("compute"):
        time.sleep(0.008)
    rep.step(samples=32)
    n += 1
rep.close()
print(n)
"""


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        f = fh.read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def live(ranks: int, seconds: float, rounds: int) -> int:
    """A real `teye agent` and R sender processes (teye_client.Reporter, 10 ms steps, its usual 100 ms
    batching), with and without ranks, alternating: the agent's CPU (utime+stime) per step sent."""
    import subprocess
    from tests.procs import REPO, Agent
    tmp = tempfile.mkdtemp(prefix="teye-ranks-live-")
    conf = os.path.join(tmp, "teye.yaml")
    with open(conf, "w") as fh:
        fh.write("collectors:\n" + "".join(f"  {c}: {{enabled: false}}\n" for c in
                                            ("gpu", "disk", "network", "infiniband", "nfs", "nfsd", "pressure", "pmu")))
    res = {False: [], True: []}
    for _ in range(rounds):
        for with_rank in (False, True):
            sock = os.path.join(tmp, "p.sock")
            ag = Agent(["--config", conf, "--phase-socket", sock])
            try:
                time.sleep(1.0)
                c0 = _cpu_s(ag.proc.pid)
                env = {**os.environ, "TEYE_PHASE_SOCKET": sock}
                ps = [subprocess.Popen([sys.executable, "-c", SENDER, REPO, str(r if with_rank else -1), str(ranks),
                                        str(seconds)], env=env, stdout=subprocess.PIPE, text=True)
                      for r in range(ranks)]
                steps = sum(int(p.communicate(timeout=seconds + 60)[0]) for p in ps)
                time.sleep(0.5)   # the last flushes
                cpu = _cpu_s(ag.proc.pid) - c0
                body = ag.metrics()
            finally:
                ag.stop()
            ranked = body.count("teye_job_rank_steps_total{")
            assert ranked == (ranks if with_rank else 0), ranked
            res[with_rank].append((cpu, steps))
    for with_rank in (False, True):
        per = statistics.median(c / n * 1e6 for c, n in res[with_rank])
        share = statistics.median(c / (seconds + 1.5) for c, _ in res[with_rank])
        print(f"  {'with' if with_rank else 'without'} ranks: agent CPU {per:6.1f} us per step sent "
              f"({statistics.median(n for _, n in res[with_rank]) / seconds:.0f} steps/s from {ranks} processes; "
              f"{100 * share:.1f} % of a core, idle collectors included)")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    m = sub.add_parser("matrix")
    m.add_argument("--ranks", default="2,4,8")
    m.add_argument("--steps", type=int, default=60)
    m.add_argument("--slow-ms", type=float, default=20.0)
    c = sub.add_parser("cost")
    c.add_argument("--ranks", type=int, default=8)
    c.add_argument("--rounds", type=int, default=15)
    lv = sub.add_parser("live")
    lv.add_argument("--ranks", type=int, default=8)
    lv.add_argument("--seconds", type=float, default=8.0)
    lv.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    if args.what == "live":
        return live(args.ranks, args.seconds, args.rounds)
    if args.what == "matrix":
        return matrix([int(x) for x in args.ranks.split(",")], args.steps, args.slow_ms)
    return cost(args.ranks, args.rounds)


if __name__ == "__main__":
    sys.exit(main())
