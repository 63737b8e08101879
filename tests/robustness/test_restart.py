"""kill -9 in the middle of load, start again: the stale phase socket is reclaimed, the port serves
again and the counters start over.  (How fast: benchmarks/web.py reports the restart time.)"""
from __future__ import annotations

import os
import signal
import socket
import threading
import time

import pytest

from agent.phases import protocol
from tests.conftest import parse_exposition
from tests.web.agentproc import WebAgent

pytestmark = pytest.mark.e2e


def accepted(agent) -> float:
    series = parse_exposition(agent.get().decode())
    return series.get(("teye_phase_messages_total", (("result", "accepted"),)), 0.0)


def send(path: str, n: int) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        for _ in range(n):
            t = time.monotonic_ns()
            s.sendto(protocol.encode("restart-test", phases=[("compute", t - 1000, t)]), path)


def wait_accepted(agent, at_least: float, timeout: float = 20.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = accepted(agent)
        if n >= at_least:
            return n
        time.sleep(0.1)
    raise TimeoutError(f"accepted stayed below {at_least}")


def test_kill_9_under_load_then_restart(tmp_path):
    agent = WebAgent(str(tmp_path))
    stop = threading.Event()

    def load():  # phase datagrams and scrapes until told to stop or the agent dies
        while not stop.is_set():
            try:
                send(agent.sock_path, 20)
                agent.get(timeout=2)
            except OSError:
                time.sleep(0.01)

    threads = [threading.Thread(target=load, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        wait_accepted(agent, 100)
        agent.proc.send_signal(signal.SIGKILL)
        agent.proc.wait(10)
        assert agent.proc.returncode == -signal.SIGKILL
        assert os.path.exists(agent.sock_path)  # SIGKILL leaves the socket file behind
        stop.set()
        for t in threads:
            t.join(10)
        agent.stop()

        again = WebAgent(str(tmp_path), port=agent.port)  # same port (SO_REUSEADDR), same socket path
        try:
            assert "replacing stale phase socket" in again.log()
            assert accepted(again) == 0  # counters start over
            send(again.sock_path, 7)
            assert wait_accepted(again, 7) == 7
        finally:
            again.stop()
        assert not os.path.exists(again.sock_path)  # a clean stop removes it
    finally:
        stop.set()
        agent.stop()
