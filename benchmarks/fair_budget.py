"""Fair budget (issue 29, item 6): what a flood costs the agent and the job beside it.

    python benchmarks/fair_budget.py [SECONDS [RATE]]

One agent phase path (PhaseSource on a private socket, in this process, the compiled helpers where
built), budget RATE datagrams a second (default 20,000: the default ``phases.max_messages_per_second``).
A victim job (teye_client.Reporter, 20 ms flushes, 5 ms steps) runs alone, then beside a flooder (one
process sending valid one-step datagrams non-blocking as fast as it can), each for SECONDS (default 3).
Side by side in one run: the receiver as it is (sheds a flooder's excess, keeps the queue drained) and
the peer, the receiver before it (paused when the budget was spent: ``_shed_until`` replaced by a
sleep). Prints per configuration: the agent's CPU seconds per second (process CPU of this process,
which is the agent: the clients are subprocesses) and per victim step, the victim's steps the agent
counted against the steps it took, its dropped datagrams, and the flood's datagrams handled and shed.
"""
from __future__ import annotations

import json
import os
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
        cpu0, t0 = time.process_time(), time.monotonic()
        f = subprocess.Popen([sys.executable, "-c", FLOODER, path, str(seconds + 0.5)], stdout=subprocess.PIPE,
                             text=True, env=env) if flood else None
        v = subprocess.run([sys.executable, "-c", VICTIM, path, str(seconds)], capture_output=True, text=True,
                           env=env, check=True)
        sent = int(f.communicate()[0]) if f else 0
        time.sleep(0.3)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
        own = json.loads(v.stdout)
        jobs = {j.train_job: j for j in src.collect(force=True).jobs}
        vj, fj = jobs.get("victim"), jobs.get("flood")
        return {"cpu_per_s": cpu / wall, "cpu_us_per_victim_step": 1e6 * cpu / max(1, own["steps"]),
                "victim_steps": own["steps"], "agent_counted": vj.steps if vj else 0,
                "victim_dropped_datagrams": own["dropped_messages"], "flood_sent": sent,
                "flood_handled": fj.steps if fj else 0, "flood_shed": fj.shed if fj else 0}
    finally:
        src.close()
        _receiver.Receiver._shed_until = saved


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    rate = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
    print(f"budget {rate} datagrams/s, {seconds:g} s per configuration, "
          f"net.unix.max_dgram_qlen {_receiver.queue_length()}")
    print(f"{'receiver':10} {'flood':6} {'agent CPU s/s':>13} {'us/victim step':>15} {'victim steps':>13} "
          f"{'counted':>8} {'v dropped':>10} {'flood sent':>11} {'handled':>8} {'shed':>9}")
    for peer in (False, True):
        for flood in (False, True):
            r = run(seconds, rate, flood, peer)
            print(f"{'pause' if peer else 'shed':10} {'yes' if flood else 'no':6} {r['cpu_per_s']:13.3f} "
                  f"{r['cpu_us_per_victim_step']:15.0f} {r['victim_steps']:13d} {r['agent_counted']:8d} "
                  f"{r['victim_dropped_datagrams']:10d} {r['flood_sent']:11d} {r['flood_handled']:8d} "
                  f"{r['flood_shed']:9d}")


if __name__ == "__main__":
    main()
