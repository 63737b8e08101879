"""deploy/systemd/teye-agent.service: `systemd-analyze verify` silent, `security --offline` <= 3.0.

systemd-analyze runs here without systemd as PID 1 (it loads the unit in test mode).
`verify` checks that ExecStart's binary exists, so the unit is checked as shipped
(failing only on the missing /opt/teye binary) and with ExecStart pointing at an
executable that exists; test_install.py verifies the unit install.sh writes, whose
ExecStart is the real installed `teye`.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys


from tests.procs import REPO

UNIT = os.path.join(REPO, "deploy", "systemd", "teye-agent.service")


def analyze(*args):
    exe = shutil.which("systemd-analyze")
    assert exe, "systemd-analyze missing (Debian package systemd)"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)


def unit_with_execstart(tmp_path, binary):
    text = open(UNIT, encoding="utf-8").read()
    text = re.sub(r"(?m)^ExecStart=\S+", f"ExecStart={binary}", text)
    path = tmp_path / "teye-agent.service"
    path.write_text(text)
    return str(path)


def unit_settings():
    """[Service] settings as {key: [values]} (repeated keys kept in order)."""
    out = {}
    section = None
    for line in open(UNIT, encoding="utf-8"):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]":
            k, _, v = line.partition("=")
            out.setdefault(k, []).append(v)
    return out


def test_verify_reports_nothing_once_the_binary_exists(tmp_path):
    res = analyze("verify", unit_with_execstart(tmp_path, os.path.realpath(sys.executable)))
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == "" and res.stderr.strip() == ""


def test_verify_as_shipped_only_misses_the_installed_binary():
    res = analyze("verify", UNIT)
    msgs = [l for l in (res.stdout + res.stderr).splitlines() if l.strip()]
    assert msgs == ["teye-agent.service: Command /opt/teye/venv/bin/teye is not executable: "
                    "No such file or directory"]


def test_verify_catches_a_broken_unit(tmp_path):
    """The check is real: a misspelled directive is reported."""
    path = unit_with_execstart(tmp_path, os.path.realpath(sys.executable))
    with open(path) as fh:
        text = fh.read()
    with open(path, "w") as fh:
        fh.write(text.replace("ProtectSystem=strict", "ProtectSystme=strict"))
    res = analyze("verify", path)
    assert "Unknown key 'ProtectSystme' in section [Service]" in res.stdout + res.stderr


def test_security_exposure_is_at_most_3(tmp_path):
    res = analyze("security", "--offline=yes", unit_with_execstart(tmp_path, os.path.realpath(sys.executable)))
    assert res.returncode == 0, res.stdout + res.stderr
    m = re.search(r"Overall exposure level for teye-agent\.service: (\d+\.\d+)", res.stdout)
    assert m, res.stdout[-2000:]
    assert float(m.group(1)) <= 3.0
    # and the hardening we rely on is recognised as such
    for ok in ("NoNewPrivileges=", "ProtectHome=", "PrivateTmp=", "ProtectSystem=", "SystemCallFilter=~@privileged",
               "CapabilityBoundingSet=~CAP_SYS_ADMIN", "RestrictAddressFamilies=~AF_PACKET", "User=/DynamicUser="):
        line = [l for l in res.stdout.splitlines() if ok in l]
        assert line and line[0].lstrip().startswith("✓"), (ok, line)


def test_unit_grants_only_what_the_agent_needs():
    s = unit_settings()
    assert s["User"] == ["teye"] and s["Group"] == ["teye"]
    assert s["ExecStart"] == ["/opt/teye/venv/bin/teye agent --config /etc/teye/teye.yml"]
    assert s["Restart"] == ["on-failure"]
    assert s["RuntimeDirectory"] == ["teye"] and s["RuntimeDirectoryMode"] == ["0755"]
    assert s["DevicePolicy"] == ["closed"]
    assert s["DeviceAllow"] == ["char-nvidia-frontend rw", "char-nvidia rw", "char-nvidia-caps r"]
    assert s["ProtectSystem"] == ["strict"] and s["ProtectHome"] == ["yes"] and s["PrivateTmp"] == ["yes"]
    assert s["NoNewPrivileges"] == ["yes"]
    # one capability: system-wide hardware counters (pmu collector), and the one syscall it needs from @debug
    assert s["CapabilityBoundingSet"] == ["CAP_PERFMON"] and s["AmbientCapabilities"] == ["CAP_PERFMON"]
    assert s["SystemCallFilter"][1:] == ["~@privileged @resources @mount @swap @reboot @raw-io @module @obsolete "
                                         "@cpu-emulation @debug", "perf_event_open"]
    assert s["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6 AF_NETLINK"]
    assert s["SystemCallFilter"][0] == "@system-service"
    # /proc stays fully visible (GPU process -> cgroup -> job) and uids stay real (SO_PASSCRED)
    assert "ProtectProc" not in s and "ProcSubset" not in s and "PrivateUsers" not in s
    # the configured phase socket lives in the runtime directory the unit creates
    from agent.config import load
    cfg = load(os.path.join(REPO, "deploy", "teye.example.yml"))
    assert cfg["phases"]["socket"] == "/run/teye/phases.sock"


def test_agent_command_line_in_the_unit_parses():
    from agent.cli import build_parser
    argv = unit_settings()["ExecStart"][0].split()[1:]
    args = build_parser().parse_args(argv)
    assert args.command == "agent" and args.config == "/etc/teye/teye.yml"
