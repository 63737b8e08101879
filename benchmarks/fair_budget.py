"""Fair budget (issue 29, item 6): what a flood costs the agent and the job beside it.

    python benchmarks/fair_budget.py [SECONDS [RATE]] [--rounds N]

One agent phase path (PhaseSource on a private socket, in this process, the compiled helpers where
built), budget RATE datagrams a second (default 20,000: the default ``phases.max_messages_per_second``).
A victim job (teye_client.Reporter, 20 ms flushes, 5 ms steps) runs alone, then beside a flooder (one
process sending valid one-step datagrams non-blocking as fast as it can), each for SECONDS (default 3).
Side by side in one run: the receiver as it is (sheds a flooder's excess, keeps the queue drained) and
the peer, the receiver before it (paused when the budget was spent: ``_shed_until`` replaced by a
sleep). Prints per configuration, medians of N rounds (default 3; the configurations alternate in each
round): the agent's CPU seconds per second (process CPU of this process, which is the agent: the clients
are subprocesses), the receive thread's CPU (every datagram's work is done there, none of the launching
of the clients is) per victim step and per datagram it received (kept as records or shed unread), the
victim's steps the agent counted against the steps it took, its dropped datagrams, and the flood's
datagrams sent, counted as steps and shed; then, per receiver, the receive thread's CPU per victim step
and per datagram with the flood against without it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

from agent.context import AgentContext  # noqa: E402
from agent.config import defaults  # noqa: E402
from agent.phases import receiver as _receiver  # noqa: E402
from agent.phases.source import PhaseSource  # noqa: E402

FLOODER = textwrap.dedent("""
    import socket, sys, time
    path, seconds = sys.argv[1], float(sys.argv[2])
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.connect(path)
    s.setblocking(False)
    t = time.monotonic_ns()
    end = time.monotonic() + seconds
    sent = 0
    while time.monotonic() < end:
        for _ in range(200):
            t += 1000
            try:
                s.send(b'{"v":1,"job":"flood","steps":[[%d,%d,1]]}' % (t, t + 500))
                sent += 1
            except BlockingIOError:
                pass
    print(sent)
""")

VICTIM = textwrap.dedent("""
    import json, sys, time
    from teye_client import Reporter
    path, seconds = sys.argv[1], float(sys.argv[2])
    rep = Reporter("victim", socket_path=path, flush_ms=20)
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with rep.phase("data_wait"):
            time.sleep(0.002)
        with rep.phase("compute"):
            time.sleep(0.003)
        rep.step(samples=8)
        n += 1
    rep.close()
    print(json.dumps({"steps": n, "dropped_messages": rep.dropped_messages}))
""")


def _pause(self, end, receive):
    """The peer: the receiver before the fair budget paused until the slice ended."""
    self._stop.wait(max(0.0, end - time.monotonic()))


def run(seconds: float, rate: int, flood: bool, peer: bool) -> dict:
    cfg = defaults()["phases"]
    cfg["max_messages_per_second"] = rate
    saved = _receiver.Receiver._shed_until
    if peer:
        _receiver.Receiver._shed_until = _pause
    d = tempfile.mkdtemp(prefix="teye-fair-")
    path = os.path.join(d, "p.sock")
    src = PhaseSource(cfg, AgentContext(), socket_path=path)
    env = {**os.environ, "PYTHONPATH": REPO}
    try:
        clock = time.pthread_getcpuclockid(src.receiver._thread.ident)   # the receive thread's CPU clock
        cpu0, t0, rcpu0 = time.process_time(), time.monotonic(), time.clock_gettime(clock)
        f = subprocess.Popen([sys.executable, "-c", FLOODER, path, str(seconds + 0.5)], stdout=subprocess.PIPE,
                             text=True, env=env) if flood else None
        v = subprocess.run([sys.executable, "-c", VICTIM, path, str(seconds)], capture_output=True, text=True,
                           env=env, check=True)
        sent = int(f.communicate()[0]) if f else 0
        time.sleep(0.3)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
        rcpu = time.clock_gettime(clock) - rcpu0
        own = json.loads(v.stdout)
        jobs = {j.train_job: j for j in src.collect(force=True).jobs}
        vj, fj = jobs.get("victim"), jobs.get("flood")
        received = src.receiver.received
        return {"cpu_per_s": cpu / wall, "cpu_us_per_victim_step": 1e6 * rcpu / max(1, own["steps"]),
                "datagrams": received, "cpu_us_per_datagram": 1e6 * rcpu / max(1, received),
                "victim_steps": own["steps"], "agent_counted": vj.steps if vj else 0,
                "victim_dropped_datagrams": own["dropped_messages"], "flood_sent": sent,
                "flood_handled": fj.steps if fj else 0, "flood_shed": fj.shed if fj else 0}
    finally:
        src.close()
        _receiver.Receiver._shed_until = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("seconds", nargs="?", type=float, default=3.0, help="seconds per configuration (3)")
    ap.add_argument("rate", nargs="?", type=int, default=20000, help="the budget, datagrams a second (20,000)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; each row is the median (3)")
    args = ap.parse_args()
    seconds, rate = args.seconds, args.rate
    print(f"budget {rate} datagrams/s, {seconds:g} s per configuration, {args.rounds} rounds (medians), "
          f"net.unix.max_dgram_qlen {_receiver.queue_length()}")
    configs = [(peer, flood) for peer in (False, True) for flood in (False, True)]
    runs = {c: [] for c in configs}
    for _ in range(args.rounds):
        for peer, flood in configs:
            runs[(peer, flood)].append(run(seconds, rate, flood, peer))
    med = {c: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for c, rs in runs.items()}
    print(f"{'':10} {'':6} {'process':>13} {'receive thread CPU':^28}")
    print(f"{'receiver':10} {'flood':6} {'agent CPU s/s':>13} {'us/victim step':>15} {'datagrams':>10} "
          f"{'us/datagram':>12} {'victim steps':>13} {'counted':>8} {'v dropped':>10} {'flood sent':>11} "
          f"{'f counted':>9} {'shed':>9}")
    for peer, flood in configs:
        r = med[(peer, flood)]
        print(f"{'pause' if peer else 'shed':10} {'yes' if flood else 'no':6} {r['cpu_per_s']:13.3f} "
              f"{r['cpu_us_per_victim_step']:15.1f} {r['datagrams']:10.0f} {r['cpu_us_per_datagram']:12.2f} "
              f"{r['victim_steps']:13.0f} {r['agent_counted']:8.0f} {r['victim_dropped_datagrams']:10.0f} "
              f"{r['flood_sent']:11.0f} {r['flood_handled']:9.0f} {r['flood_shed']:9.0f}")
    for peer in (False, True):
        off, on = med[(peer, False)], med[(peer, True)]
        print(f"{'pause' if peer else 'shed'} receiver, receive thread CPU without the flood / with it: "
              f"{off['cpu_us_per_victim_step']:.1f} / {on['cpu_us_per_victim_step']:.0f} us per victim step "
              f"(x{on['cpu_us_per_victim_step'] / max(1e-9, off['cpu_us_per_victim_step']):.1f}), "
              f"{off['cpu_us_per_datagram']:.2f} / {on['cpu_us_per_datagram']:.2f} us per datagram received "
              f"(kept or shed)")


if __name__ == "__main__":
    main()
