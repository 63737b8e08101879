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
    assert disabled == {"nfsd"} and "nfsd" not in up
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
