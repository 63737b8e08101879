"""`teye agent` as a process: embedded defaults, signals, exit codes, endpoints."""
import re
import signal
import socket
import subprocess
import sys

import pytest

from tests.conftest import PROCFS, SYSFS, golden, parse_exposition
from tests.procs import REPO, Agent, free_port, http_get


def run_cli(*args, timeout=30):
    return subprocess.run([sys.executable, "-m", "agent", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def agent():
    a = Agent(["--procfs", PROCFS, "--sysfs", SYSFS])
    yield a
    a.stop()


def test_serves_fixture_values_with_no_config_file(agent, node_exporter_golden):
    v = parse_exposition(agent.metrics())
    ours = v[("teye_cpu_seconds_total", (("cpu", "3"), ("mode", "system")))]
    assert ours == golden(node_exporter_golden, "node_cpu_seconds_total", cpu="3", mode="system")
    assert v[("teye_collector_up", (("collector", "cpu"),))] == 1
    assert ("teye_build_info", (("version", "0.1.0"),)) in v


def test_landing_page_and_health(agent):
    assert 'href="metrics"' in http_get(agent.url + "/")
    assert http_get(agent.url + "/healthz") == "ok\n"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_stop_cleanly_with_status_0(sig):
    a = Agent(["--procfs", PROCFS, "--sysfs", SYSFS])
    a.proc.send_signal(sig)
    assert a.proc.wait(10) == 0


def test_port_in_use_exits_2_with_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = run_cli("agent", "--listen", f"127.0.0.1:{port}", "--procfs", PROCFS, "--sysfs", SYSFS)
    assert p.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in p.stderr and "in use" in p.stderr


def test_bad_config_exits_2_before_binding_the_port(tmp_path):
    cfg = tmp_path / "bad.yml"
    cfg.write_text("collectors:\n  cpu:\n    interval_seconds: often\n")
    with socket.socket() as s:  # the port is taken: had the agent tried to bind, it would say so instead
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = run_cli("agent", "--config", str(cfg), "--listen", f"127.0.0.1:{port}")
    assert p.returncode == 2
    err = p.stderr.strip()
    assert err == "teye: config key 'collectors.cpu.interval_seconds': expected number, got str 'often'"


def test_bad_yaml_exits_2(tmp_path):
    cfg = tmp_path / "bad.yml"
    cfg.write_text("collectors: {cpu: [\n")
    p = run_cli("agent", "--config", str(cfg), "--listen", f"127.0.0.1:{free_port()}")
    assert p.returncode == 2 and "invalid YAML" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_full_exposition_passes_promtool(agent):
    import shutil
    assert shutil.which("promtool"), "promtool missing: install Debian's prometheus package (.ci/run does)"
    p = subprocess.run(["promtool", "check", "metrics"], input=agent.metrics(), capture_output=True, text=True)
    lines = (p.stdout + p.stderr).strip().splitlines()
    # lint findings that are deliberate: node_exporter's own spellings, kept so its users find them
    # (docs/operations.md): netstat's Proto_Field names and entropy counted in bits, as node_exporter has them
    deliberate = re.compile(r"^teye_netstat_[A-Za-z0-9]+_[A-Za-z0-9]+(_total)? metric names should be written in "
                            r"'snake_case' not 'camelCase'$|^teye_entropy_(available|pool_size)_bits use base unit "
                            r'"bytes" instead of "bits"$')
    rest = [line for line in lines if not deliberate.match(line)]
    assert rest == [], "\n".join(rest)
    assert p.returncode in (0, 3 if lines else 0), p.stdout + p.stderr   # promtool: 3 = lint findings only
