"""`teye agent` start-up: the port before anything else, and a start-up line that says which collectors run,
which are down and why, which are disabled."""
from __future__ import annotations

import re
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import PROCFS, SYSFS, parse_exposition
from tests.procs import REPO, Agent

pytestmark = pytest.mark.e2e


def test_port_in_use_stops_before_the_phase_socket_is_bound(tmp_path):
    sock_path = tmp_path / "phases.sock"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = subprocess.run([sys.executable, "-m", "agent", "agent", "--listen", f"127.0.0.1:{port}",
                            "--procfs", PROCFS, "--sysfs", SYSFS, "--phase-socket", str(sock_path)],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in p.stderr
    assert not sock_path.exists()                       # never bound
    assert str(sock_path) not in p.stderr + p.stdout     # and never logged as if it were
    assert p.stderr.strip().count("\n") == 0, p.stderr   # one line: the error alone


def test_start_up_line_names_running_down_and_disabled_collectors(tmp_path):
    cfg = tmp_path / "teye.yml"
    cfg.write_text("collectors:\n  nfsd:\n    enabled: false\n")
    log = tmp_path / "agent.log"
    a = Agent(["--config", str(cfg), "--procfs", PROCFS, "--sysfs", SYSFS], log_path=str(log))
    try:
        deadline = time.monotonic() + 20
        while True:   # every collector has been read once
            v = parse_exposition(a.metrics())
            up = {dict(k[1])["collector"]: val for k, val in v.items() if k[0] == "teye_collector_up"}
            ages = [k for k in v if k[0] == "teye_collector_last_read_age_seconds"]
            if len(ages) == len(up) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        a.stop()
    (line,) = [l for l in log.read_text().splitlines() if "teye agent listening on" in l]
    m = re.search(r"collectors running: ([^;]*)(?:; absent \((\d+), no such hardware here; not an alert\): (.*?))?"
                  r"(?:; down \((\d+)\): (.*?))?(?:; disabled in the configuration: (.*))?$", line)
    assert m, line

    def named(count, text):
        items = re.split(r"; (?=\w+ \()", text) if text else []
        out = dict(re.fullmatch(r"(\w+) \((.*)\)", item).groups() for item in items)
        assert len(out) == int(count or 0), line     # the count agrees with the names
        return out

    running = set(m.group(1).split(", "))
    absent, down = named(m.group(2), m.group(3)), named(m.group(4), m.group(5))
    disabled = set((m.group(6) or "").split(", ")) - {""}
    gone = {dict(k[1])["collector"]: val for k, val in v.items() if k[0] == "teye_collector_absent"}
    # the line agrees with what the collectors report on /metrics
    assert running == {c for c, val in up.items() if val == 1}
    assert set(absent) == {c for c, val in gone.items() if val == 1}
    assert set(down) == {c for c, val in up.items() if val == 0} - set(absent)
    assert disabled == {"nfsd", "systemd"} and "nfsd" not in up   # systemd: off by default (issue 49)
    # no NVIDIA driver here (the machine's own answer, not teye's): absent, with the reason; the fixture
    # tree has no net/dev: the network collector is down (a file it needs is missing: not absent hardware)
    try:
        __import__("ctypes").CDLL("libnvidia-ml.so.1")
    except OSError:
        assert "gpu" in absent and absent["gpu"] and "gpu" not in down
    assert "network" in down and "network" not in absent
    assert {"cpu", "memory"} <= running


def test_missing_procfs_and_sysfs_roots_are_named_and_the_agent_stays_up(tmp_path):
    """An image started without the host's /proc and /sys mounted: one warning per root, collectors down."""
    log = tmp_path / "agent.log"
    a = Agent(["--procfs", str(tmp_path / "host" / "proc"), "--sysfs", str(tmp_path / "host" / "sys")],
              log_path=str(log))
    try:
        time.sleep(1.0)
        v = parse_exposition(a.metrics())
        assert a.proc.poll() is None
    finally:
        a.stop()
    text = log.read_text()
    assert f"--procfs {tmp_path}/host/proc does not exist: is the host's /proc mounted there?" in text
    assert f"--sysfs {tmp_path}/host/sys does not exist: is the host's /sys mounted there?" in text
    assert v[("teye_collector_up", (("collector", "cpu"),))] == 0
    assert v[("teye_collector_up", (("collector", "memory"),))] == 0


# What an idle agent never needs: prometheus_client's package (it imports http.server, wsgiref, email and
# urllib.request: about 3 MiB of RSS); teye formats /metrics and reads its own process_* series itself.
NEVER_IDLE = ("prometheus_client", "http.server", "http.client", "wsgiref", "email", "urllib.request",
              # nor `teye trace`'s request side and summary (teye_client, secrets, tempfile, statistics: 3 MiB)
              "agent.trace.request", "agent.trace.summary", "teye_client", "secrets", "statistics")

_IDLE_CHILD = r"""
import os, socket, sys, threading, time
port, sock, trace = int(sys.argv[1]), sys.argv[2], sys.argv[3]
from agent import cli
threading.Thread(target=cli.main, daemon=True, args=(["agent", "--listen", f"127.0.0.1:{port}",
    "--gpu-replay", trace, "--phase-socket", sock, "--log-level", "warning"],)).start()
ACCEPTS = ("", "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
           "text/plain;version=1.0.0;escaping=allow-utf-8", "text/plain;version=1.0.0;escaping=dots")


def get(accept):   # raw HTTP: http.client would import email itself
    with socket.create_connection(("127.0.0.1", port), 2) as s:
        s.sendall(f"GET /metrics HTTP/1.0\r\nAccept: {accept}\r\n\r\n".encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return data
            data += chunk


bodies = []
deadline = time.monotonic() + 30
while len(bodies) < 3 and time.monotonic() < deadline:
    try:
        data = get(ACCEPTS[len(bodies)])
        if data.split(b" ", 2)[1:2] == [b"200"]:
            bodies.append(data)
    except OSError:
        time.sleep(0.2)
print(len(bodies))
print(" ".join(sorted(sys.modules)))
import ctypes
ctypes.CDLL(None).malloc_stats()   # glibc's account of its arenas, on stderr (agent/heap.py)
# a name escaping teye does not write itself: prometheus_client's encoder, made on this first need
data = get(ACCEPTS[3])
print(data.split(b" ", 2)[1].decode(), b"\nteye__collector__up{" in data, "prometheus_client" in sys.modules)
import gc
deadline = time.monotonic() + 5       # start-up's objects frozen once the first reads are in (agent/heap.py)
while gc.get_freeze_count() == 0 and time.monotonic() < deadline:
    time.sleep(0.1)
print(gc.get_freeze_count() > 1000)
sys.stdout.flush()
os._exit(0)
"""


def test_the_idle_agent_never_imports_prometheus_clients_http_stack(tmp_path, monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    from tests.gpu.conftest import TRACE_8GPU
    from tests.procs import free_port
    p = subprocess.run([sys.executable, "-c", _IDLE_CHILD, str(free_port()), str(tmp_path / "p.sock"), TRACE_8GPU],
                       cwd=REPO, capture_output=True, text=True, timeout=90)
    lines = p.stdout.splitlines()
    assert p.returncode == 0 and lines[0] == "3", p.stderr[-2000:]
    mods = set(lines[1].split())
    assert "agent.gpu.replay" in mods and "exporters.render" in mods   # it did run the agent and serve scrapes
    assert sorted(m for m in mods if any(m == n or m.startswith(n + ".") for n in NEVER_IDLE)) == []
    assert 1 <= sum(1 for line in p.stderr.splitlines() if line.startswith("Arena ")) <= 2   # heap.limit_arenas
    assert lines[2] == "200 True True"   # the scrape that needs prometheus_client still gets its answer
    assert lines[3] == "True"            # heap.freeze: start-up's objects out of the full collections' way
