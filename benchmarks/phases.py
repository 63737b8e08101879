"""Phase protocol costs and accuracy: agent CPU under load, client overhead, input-bound accuracy.

    python benchmarks/phases.py [--rate 10000] [--seconds 5] [--steps 60]
    python benchmarks/phases.py --baseline DIR [--rounds 3]   # before/after, in one run
    python benchmarks/phases.py --step-rates --baseline DIR [--rounds 3] [--seconds 4]

With ``--baseline DIR`` (another checkout, e.g. ``git archive main | tar -x -C DIR``; where it has the
phase path's C helpers, ``setup.py build_ext --inplace`` is run there first if they are not built), 1 and
2 run for both trees, alternating, --rounds times (each agent from its own tree, each client from its own
workloads/phases.py), and the medians are printed side by side with their ratio.

``--step-rates`` (issue 38): agent CPU per received step for a process stepping 1,000, 10,000 and 100,000
times a second (3 phases a step, sent by its tree's own teye_client ``record_step``, the zero-code path) and
for 8 ranks (RANK/WORLD_SIZE) stepping 1,000 times a second each; each tree's agent with its own client,
alternating, the agent's CPU above its idle baseline divided by the steps it counted.

1. Agent CPU at --rate phase messages/s: a real `teye agent` (phases + cpu collectors) on a
   private socket; a sender paces typical per-step datagrams (2 phases + 1 step record) at
   the rate for --seconds.  Reports the agent's CPU (utime+stime from /proc) as a share of
   one core, minus its idle baseline measured just before, and peak RSS.
2. Client overhead: `with rep.phase(...)` and `rep.step()` timed one by one (median, p99),
   against an empty context manager, while the agent receives.
3. Where the agent's time per message goes, in this process: JSON parsing alone, the whole
   validation (protocol.decode), and validation plus the job-table update (JobTable.handle),
   each the median of --repeat timings of 20,000 typical datagrams; and the receive thread's
   CPU per datagram for bursts of 16 queued on a socket (benchmarks/_serve_cost.py: receive,
   decode and apply, in a fresh process, without a live agent's wake-ups and cold caches: a
   lower bound of 1, and much less noisy).  With --baseline or --pure-python it runs for both
   sides.
4. Input-bound accuracy: training loops with injected data_wait sleeps (ground truth measured
   around the sleeps) report to the agent; the agent's teye_job_input_bound_ratio is compared.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.conftest import PROCFS, parse_exposition  # noqa: E402
from tests.procs import REPO, free_port, http_get, wait_http  # noqa: E402
from benchmarks._proc import cpu_seconds, peak_rss_mib  # noqa: E402
from benchmarks._serve_cost import typical_datagram  # noqa: E402
from workloads.phases import Reporter  # noqa: E402




def start_agent(tmp: str, tree: str = REPO, env=None):
    sock = os.path.join(tmp, "phases.sock")
    conf = os.path.join(tmp, "teye.yaml")
    with open(conf, "w") as fh:
        fh.write("collectors:\n" + "".join(f"  {c}: {{enabled: false}}\n" for c in
                                           ("memory", "disk", "network", "infiniband", "nfs", "nfsd", "pressure",
                                            "gpu")))
        fh.write("phases:\n  max_messages_per_second: 50000\n")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "agent", "agent", "--config", conf, "--procfs", PROCFS,
                             "--listen", f"127.0.0.1:{port}", "--phase-socket", sock, "--log-level", "error"],
                            cwd=tree, env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/healthz", proc=proc)
    return proc, url, sock


def metrics(url: str):
    return parse_exposition(http_get(url + "/metrics"))


def agent_cpu(proc, sock: str, rate: int, seconds: float):
    time.sleep(1.0)
    c0, t0 = cpu_seconds(proc.pid), time.monotonic()
    time.sleep(3.0)
    idle = (cpu_seconds(proc.pid) - c0) / (time.monotonic() - t0)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.settimeout(1.0)
    batch = max(1, rate // 100)  # 100 bursts a second
    sent = blocked = 0
    c0, t0 = cpu_seconds(proc.pid), time.monotonic()
    nxt = t0
    while time.monotonic() - t0 < seconds:
        t = time.monotonic_ns()
        for i in range(batch):
            try:
                s.sendto(typical_datagram(i, t), sock)
                sent += 1
            except OSError:
                blocked += 1
        nxt += 0.01
        delay = nxt - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    wall = time.monotonic() - t0
    time.sleep(0.5)
    busy = (cpu_seconds(proc.pid) - c0) / (wall + 0.5)
    return {"idle_cpu": idle, "loaded_cpu": busy, "achieved_rate": sent / wall, "send_failures": blocked,
            "peak_rss_mib": peak_rss_mib(proc.pid)}


def client_overhead(sock: str, n: int = 20000, reporter=Reporter):
    rep = reporter(train_job="overhead", socket_path=sock)
    clock = time.perf_counter_ns
    empty, phase, step = [], [], []
    null = contextlib.nullcontext()
    for i in range(n):
        a = clock()
        with null:
            pass
        b = clock()
        with rep.phase("compute"):
            pass
        c = clock()
        if i % 3 == 2:
            rep.step(samples=32)  # flushes: one datagram per 3 phases
            step.append(clock() - c)
        empty.append(b - a)
        phase.append(c - b)
    rep.close()

    def q(xs, p):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(p * len(xs)))] / 1000

    return {"empty_us": statistics.median(empty) / 1000, "phase_us": statistics.median(phase) / 1000,
            "phase_p99_us": q(phase, 0.99), "step_send_us": statistics.median(step) / 1000,
            "step_send_p99_us": q(step, 0.99),
            "per_phase_amortized_us": (statistics.median(phase) - statistics.median(empty)) / 1000
            + statistics.median(step) / 1000 / 3, "dropped": rep.dropped}


def breakdown(repeat: int = 5, n: int = 20000):
    """Median µs per typical datagram: JSON parse, protocol.decode, JobTable.handle (in this process)."""
    from agent.context import AgentContext
    from agent.config import defaults
    from agent.phases.jobs import JobTable
    from agent.phases.protocol import _DECODER, decode, decode_python
    t = time.monotonic_ns()
    msgs = [typical_datagram(i, t) for i in range(n)]
    table = JobTable(defaults()["phases"], AgentContext())
    now = time.monotonic_ns()
    parts = {"json": lambda m: _DECODER.decode(m.decode("utf-8")), "decode": lambda m: decode(m, now),
             "decode_python": lambda m: decode_python(m, now), "handle": lambda m: table.handle(m, 4242, 0, now)}
    out = {k: [] for k in parts}
    for _ in range(repeat):
        for k, fn in parts.items():
            t0 = time.perf_counter()
            for m in msgs:
                fn(m)
            out[k].append((time.perf_counter() - t0) / n * 1e6)
    return {k: statistics.median(v) for k, v in out.items()}


def serve_cost(tree: str = REPO, env=None) -> float:
    """µs of the receive thread's CPU per datagram in a fresh process (benchmarks/_serve_cost.py) for tree."""
    out = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "_serve_cost.py"),
                          tree], env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"_serve_cost.py {tree} failed: {out.stderr.strip()}")
    return float(out.stdout)


def accuracy(url: str, sock: str, steps: int):
    rows = []
    for k, (wait_ms, compute_ms) in enumerate(((2, 18), (6, 14), (10, 10), (16, 4), (30, 10))):
        job = f"acc{k}"
        rep = Reporter(train_job=job, socket_path=sock)
        waited = total = 0.0
        for _ in range(steps):
            t0 = time.monotonic()
            with rep.phase("data_wait"):
                time.sleep(wait_ms / 1000)
            t1 = time.monotonic()
            with rep.phase("compute"):
                time.sleep(compute_ms / 1000)
            rep.step(samples=32)
            waited += t1 - t0
            total += time.monotonic() - t0
        rep.close()
        time.sleep(1.5)  # the agent's phases collector runs once a second
        m = metrics(url)
        got = m[("teye_job_input_bound_ratio", (("train_job", job),))]
        kind = [dict(lab)["kind"] for (name, lab), v in m.items()
                if name == "teye_job_bottleneck" and dict(lab)["train_job"] == job and v == 1][0]
        rows.append((wait_ms, compute_ms, waited / total, got, kind))
    return rows


def per_message_us(cpu) -> float:
    return 1e6 * (cpu["loaded_cpu"] - cpu["idle_cpu"]) / max(1.0, cpu["achieved_rate"])


def compare(baseline: str, rounds: int, rate: int, seconds: float) -> int:
    """Agent CPU per message and client overhead per phase, two sides alternating (baseline: another
    checkout's directory)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("baseline_phases",
                                                  os.path.join(baseline, "workloads", "phases.py"))
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    trees = {"this tree": (REPO, Reporter, {}), "baseline": (os.path.abspath(baseline), old.Reporter, {})}
    what = trees["baseline"][0]
    got = {k: {"agent": [], "phase": [], "step": [], "amortized": [], "serve": []} for k in trees}
    for _ in range(rounds):
        for name, (tree, reporter, env) in trees.items():
            tmp = tempfile.mkdtemp(prefix="teye-bench-")
            proc, url, sock = start_agent(tmp, tree, env)
            try:
                got[name]["agent"].append(per_message_us(agent_cpu(proc, sock, rate, seconds)))
                over = client_overhead(sock, reporter=reporter)
            finally:
                proc.terminate()
                proc.wait(10)
            got[name]["phase"].append(over["phase_us"] - over["empty_us"])
            got[name]["step"].append(over["step_send_us"])
            got[name]["amortized"].append(over["per_phase_amortized_us"])
            got[name]["serve"].append(serve_cost(tree, env))
    rows = (("agent CPU per message at %d msg/s (us)" % rate, "agent"),
            ("client: with rep.phase() above an empty `with` (us)", "phase"),
            ("client: rep.step() incl. encoding + send (us)", "step"),
            ("client: overhead per phase, 3 phases/step (us)", "amortized"),
            ("in process, bursts of 16: receive + handle (us)", "serve"))
    print(f"medians of {rounds} alternating rounds; baseline = {what}")
    print(f"{'':54}{'this tree':>11}{'baseline':>11}{'ratio':>8}")
    for label, key in rows:
        a, b = statistics.median(got["this tree"][key]), statistics.median(got["baseline"][key])
        print(f"{label:54}{a:11.2f}{b:11.2f}{a / b:8.2f}")
    return 0


def build_helpers(tree: str) -> None:
    """Build a checkout's phase-path C helpers in place where it has them (releases before issue 38)."""
    import glob
    if os.path.exists(os.path.join(tree, "agent", "phases", "_fast.c")) and not glob.glob(
            os.path.join(tree, "agent", "phases", "_fast*.so")):
        print(f"building the C helpers of {tree} ...", file=sys.stderr)
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree, check=True,
                       capture_output=True, timeout=600)


STEPPER = r"""
import os, sys, time
sys.path.insert(0, sys.argv[1])
from teye_client import Reporter
from teye_client.reporter import QUOTED
job, rate, seconds = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
rep = Reporter(train_job=job, socket_path=sys.argv[5])
C, W = QUOTED["compute"], QUOTED["data_wait"]
ns = time.monotonic_ns
period = 10**9 // rate
t0 = ns()
end = t0 + int(seconds * 1e9)
k = 0
while True:
    now = ns()
    if now >= end:
        break
    due = (now - t0) // period       # steps the loop's clock has reached: evenly spaced, whatever the client costs
    while k < due:
        a = t0 + k * period
        rep.record_step((W, a, a + period // 5, C, a + period // 5, a + period * 4 // 5, C, a + period * 4 // 5,
                         a + period), a, a + period, 8)
        k += 1
    time.sleep(0.0005)
rep.close()
print(k)
"""


def _stepping(tree: str, sock: str, job: str, rate: int, seconds: float, ranks: int) -> int:
    """Run ``ranks`` stepping processes of tree's client at ``rate`` steps/s each; the steps they sent."""
    procs = []
    for r in range(ranks):
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
        if ranks > 1:
            env.update(RANK=str(r), WORLD_SIZE=str(ranks))
        procs.append(subprocess.Popen([sys.executable, "-c", STEPPER, tree, job, str(rate), str(seconds), sock],
                                      cwd=tree, env=env, stdout=subprocess.PIPE, text=True))
    return sum(int(p.communicate(timeout=seconds + 60)[0]) for p in procs)


def task_cpu_seconds(pid: int) -> float:
    """CPU time of all of pid's threads in ns resolution (/proc/<pid>/task/*/schedstat), not the clock ticks of
    /proc/<pid>/stat: 4,000 steps at 2 us each are less than one 10 ms tick."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass   # a thread that just ended
    return total / 1e9


def step_rates(baseline: str, rounds: int, seconds: float) -> int:
    """Agent CPU per received step, this tree against baseline, for the cases of issue 38."""
    cases = [("1k", 1000, 1), ("10k", 10000, 1), ("100k", 100000, 1), ("8x1k", 1000, 8)]
    trees = {"this tree": REPO, "baseline": os.path.abspath(baseline)}
    got = {t: {c[0]: [] for c in cases} for t in trees}
    rates = {t: {c[0]: [] for c in cases} for t in trees}
    idles = {t: [] for t in trees}
    for rnd in range(rounds):
        for name, tree in trees.items():
            tmp = tempfile.mkdtemp(prefix="teye-bench-")
            proc, url, sock = start_agent(tmp, tree)
            try:
                time.sleep(1.0)
                c0, t0 = task_cpu_seconds(proc.pid), time.monotonic()
                time.sleep(3.0)
                idle = (task_cpu_seconds(proc.pid) - c0) / (time.monotonic() - t0)
                idles[name].append(idle)
                for label, rate, ranks in cases:
                    job = f"steps-{label}-{rnd}"
                    c0, t0 = task_cpu_seconds(proc.pid), time.monotonic()
                    sent = _stepping(tree, sock, job, rate, seconds, ranks)
                    time.sleep(1.5)   # the last flushes, and a collection
                    cpu = task_cpu_seconds(proc.pid) - c0 - idle * (time.monotonic() - t0)
                    m = metrics(url)
                    if ranks > 1:
                        counted = sum(v for (n, lab), v in m.items() if n == "teye_job_rank_steps_total"
                                      and dict(lab)["train_job"] == job)
                    else:
                        counted = m.get(("teye_job_steps_total", (("train_job", job),)), 0)
                    got[name][label].append(1e6 * cpu / max(1.0, counted))
                    rates[name][label].append(counted / max(1, sent))
            finally:
                proc.terminate()
                proc.wait(10)
    print(f"agent CPU per received step (us, above its idle baseline), medians of {rounds} alternating rounds of "
          f"{seconds:g} s; baseline = {trees['baseline']}")
    print(f"{'steps/s':<22}{'this tree':>11}{'baseline':>11}{'ratio':>8}{'counted/sent (this, base)':>28}")
    for label, rate, ranks in cases:
        a, b = statistics.median(got["this tree"][label]), statistics.median(got["baseline"][label])
        what = f"{rate:,} x {ranks} ranks" if ranks > 1 else f"{rate:,}"
        ra, rb = min(rates["this tree"][label]), min(rates["baseline"][label])
        print(f"{what:<22}{a:11.3f}{b:11.3f}{a / b:8.2f}{ra:>16.3f}{rb:>10.3f}")
        print(f"{'  rounds':<22}{' '.join(f'{x:.3f}' for x in got['this tree'][label]):>11}   "
              f"{' '.join(f'{x:.3f}' for x in got['baseline'][label])}")
    print(f"{'agent idle CPU (% of a core)':<22}{100 * statistics.median(idles['this tree']):11.3f}"
          f"{100 * statistics.median(idles['baseline']):11.3f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=10000)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--baseline", metavar="DIR", help="another checkout to compare with (agent and client)")
    ap.add_argument("--step-rates", action="store_true",
                    help="agent CPU per received step at 1k/10k/100k steps/s and 8 ranks, against --baseline")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.baseline:
        build_helpers(args.baseline)
    if args.step_rates:
        if not args.baseline:
            ap.error("--step-rates needs --baseline DIR")
        return step_rates(args.baseline, args.rounds, args.seconds if args.seconds != 5.0 else 4.0)
    if args.baseline:
        return compare(args.baseline, args.rounds, args.rate, args.seconds)
    tmp = tempfile.mkdtemp(prefix="teye-bench-")
    proc, url, sock = start_agent(tmp)
    try:
        cpu = agent_cpu(proc, sock, args.rate, args.seconds)
        over = client_overhead(sock)
        acc = accuracy(url, sock, args.steps)
        parts = breakdown(args.repeat)
        parts["serve"] = serve_cost()
        accepted = metrics(url)[("teye_phase_messages_total", (("result", "accepted"),))]
    finally:
        proc.terminate()
        proc.wait(10)
    print(f"{'measure':<52} {'value':>12}")
    print("-" * 65)
    print(f"{'agent CPU, idle baseline (share of one core)':<52} {100 * cpu['idle_cpu']:>11.1f}%")
    print(f"{'agent CPU at %d msg/s (achieved %.0f msg/s)' % (args.rate, cpu['achieved_rate']):<52} "
          f"{100 * cpu['loaded_cpu']:>11.1f}%")
    print(f"{'agent CPU per message (above baseline)':<52} {per_message_us(cpu):>10.1f}us")
    print(f"{'agent peak RSS':<52} {cpu['peak_rss_mib']:>9.1f}MiB")
    print(f"{'sender send failures (queue full)':<52} {cpu['send_failures']:>12d}")
    print(f"{'messages accepted by the agent':<52} {int(accepted):>12d}")
    print(f"{'client: empty context manager (median)':<52} {over['empty_us']:>10.2f}us")
    print(f"{'client: with rep.phase() (median / p99)':<52} {over['phase_us']:>6.2f}/{over['phase_p99_us']:.1f}us")
    print(f"{'client: rep.step() incl. JSON + send (median / p99)':<52} "
          f"{over['step_send_us']:>6.2f}/{over['step_send_p99_us']:.1f}us")
    print(f"{'client: overhead per phase, 3 phases/step, amortized':<52} {over['per_phase_amortized_us']:>10.2f}us")
    print(f"{'in process: JSON parse of a datagram':<52} {parts['json']:>10.2f}us")
    print(f"{'in process: protocol.decode (this path, see below)':<52} {parts['decode']:>10.2f}us")
    print(f"{'in process: protocol.decode_python (JSON + checks)':<52} {parts['decode_python']:>10.2f}us")
    print(f"{'in process: JobTable.handle (decode + table update)':<52} {parts['handle']:>10.2f}us")
    print(f"{'in process: receive + handle, bursts of 16 queued':<52} {parts['serve']:>10.2f}us")
    print()
    print(f"{'injected wait/compute ms':<26}{'truth':>8}{'agent':>8}{'error':>8}  verdict")
    for w, c, truth, got, kind in acc:
        print(f"{f'{w}/{c}':<26}{truth:>8.3f}{got:>8.3f}{got - truth:>+8.3f}  {kind}")
    errs = [abs(g - t) for _, _, t, g, _ in acc]
    print(f"{'max |error| of input-bound ratio':<42}{max(errs):>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
