"""Memory creep on a real Prometheus (issue 45): a real agent reads the resident memory of two training
processes (a loop that keeps 1 MB a step, one whose memory saws up and back every second) and a real Prometheus
evaluates TeyeJobMemoryCreep over it.  The rule is the deployed one with its windows scaled 60 times down (30 m
-> 30 s, 10 m -> 10 s, for 15 m -> 15 s) and its threshold 4 times down (64 MiB), so that it can be seen in a
minute; the expression is otherwise as deployed (deploy/prometheus/tests/teye-job-memory.test.yml tests it at
full scale in promtool)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.procs import REPO, Agent, Prometheus, prometheus_binary

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not prometheus_binary(), reason="prometheus not installed")]

LOOP = r"""
import sys, time
from teye_client import Reporter
mode, sock = sys.argv[1], sys.argv[2]
rep = Reporter(train_job="creep-" + mode, socket_path=sock, flush_ms=100)
kept = []
print("ready", flush=True)
while True:
    t0 = time.monotonic_ns()
    kept.append(b"\x01" * 1_000_000)        # written, so resident
    if mode == "saw" and len(kept) == 10:
        kept.clear()                       # a sawtooth that returns: freed every 10 steps
    time.sleep(0.1)
    rep.record_phase("compute", t0, time.monotonic_ns())
    rep.step(samples=1)
"""


def _scaled(src: str, dst: str) -> str:
    text = open(os.path.join(REPO, "deploy", "prometheus", "rules", src)).read()
    for a, b in (("offset 30m", "offset 30s"), ("[30m]", "[30s]"), ("[10m]", "[10s]"), ("offset 10m", "offset 10s"),
                 ("offset 20m", "offset 20s"), ("for: 15m", "for: 15s"), ("vector(268435456)", "vector(67108864)")):
        text = text.replace(a, b)
    with open(dst, "w") as fh:
        fh.write(text)
    return dst


def test_a_leak_fires_on_a_real_prometheus_and_a_sawtooth_does_not(tmp_path):
    d = str(tmp_path)
    rules = [_scaled("teye-thresholds.yml", os.path.join(d, "thresholds.yml")),
             _scaled("teye-jobs-memory.yml", os.path.join(d, "memory.yml"))]
    sock = os.path.join(d, "phases.sock")
    agent = Agent(["--phase-socket", sock])
    loops = []
    prom = None
    try:
        env = {**os.environ, "PYTHONPATH": REPO}
        for mode in ("leak", "saw"):
            p = subprocess.Popen([sys.executable, "-c", LOOP, mode, sock], env=env, stdout=subprocess.PIPE, text=True)
            assert p.stdout.readline().strip() == "ready"
            loops.append(p)
        started = time.monotonic()
        prom = Prometheus(d, [f"127.0.0.1:{agent.port}"], rule_files=rules)
        fired = prom.wait_for('ALERTS{alertname="TeyeJobMemoryCreep",alertstate="firing"}', timeout=150)
        took = time.monotonic() - started
        assert [a["metric"]["train_job"] for a in fired] == ["creep-leak"], fired
        assert fired[0]["metric"]["kind"] == "host_resident"
        # the series grew by the leak's 1 MB a step (10 a second): within 10 % over the last 30 s
        (g,) = prom.query('teye:job_memory_growth:bytes30m{train_job="creep-leak",kind="host_resident"}')
        assert float(g["value"][1]) == pytest.approx(300e6, rel=0.1)
        assert not prom.query('ALERTS{alertname="TeyeJobMemoryCreep",train_job="creep-saw"}')
        print(f"TeyeJobMemoryCreep fired {took:.0f} s after the leak began (scaled: 30 s window, 15 s for)")
    finally:
        for p in loops:
            p.kill()
            p.wait()
        if prom is not None:
            prom.stop()
        agent.stop()
