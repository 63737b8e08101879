"""node_exporter's flag conventions beside teye's own spellings, each subcommand's own usage on a bad flag,
IPv6 listen addresses in brackets, structured logs and journald (issue 40)."""
from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import shlex
import subprocess
import sys

import pytest

from agent import cli, config as config_mod
from agent.logutil import StructuredFormatter, setup_logging, under_journald
from tests.conftest import PROCFS, SYSFS
from tests.procs import REPO, free_port


def cfg_of(argv):
    explicit: set = set()
    args = cli.parse(argv)
    return cli.load_config(args, explicit), explicit


# -- spellings -------------------------------------------------------------------------------------
@pytest.mark.parametrize("ours,theirs", [
    (["--listen", "127.0.0.1:9"], ["--web.listen-address", "127.0.0.1:9"]),
    (["--procfs", PROCFS], ["--path.procfs", PROCFS]),
    (["--sysfs", SYSFS], ["--path.sysfs", SYSFS]),
    (["--rootfs", "/host/root"], ["--path.rootfs", "/host/root"]),
    (["--log-level", "debug"], ["--log.level", "debug"]),
])
def test_node_exporter_spelling_gives_the_same_configuration(ours, theirs):
    base, _ = cfg_of(["agent"])
    a, _ = cfg_of(["agent"] + ours)
    b, _ = cfg_of(["agent"] + theirs)
    assert a == b and a != base       # the same key, and the flag did change it


@pytest.mark.parametrize("cmd", ["doctor", "record --output x", "profile"])
def test_path_flags_on_every_command_that_reads_the_node(cmd):
    a, _ = cfg_of(shlex.split(cmd) + ["--path.procfs", "/p", "--path.sysfs", "/s", "--path.rootfs", "/r",
                                      "--cgroupfs", "/c"])
    assert (a["procfs"], a["sysfs"], a["rootfs"], a["cgroupfs"]) == ("/p", "/s", "/r", "/c")


@pytest.mark.parametrize("name", sorted(config_mod.COLLECTORS))
def test_collector_flags_for_every_collector(name):
    default = config_mod.defaults()["collectors"][name]["enabled"]
    on, explicit_on = cfg_of(["agent", f"--collector.{name}"])
    off, explicit_off = cfg_of(["agent", f"--no-collector.{name}"])
    assert on["collectors"][name]["enabled"] is True and explicit_on == {name}
    assert off["collectors"][name]["enabled"] is False and explicit_off == set()
    plain, explicit = cfg_of(["agent"])
    assert plain["collectors"][name]["enabled"] is default and explicit == set()
    # only that collector moved
    for other in config_mod.COLLECTORS:
        if other != name:
            assert on["collectors"][other] == off["collectors"][other] == plain["collectors"][other]


def test_a_flag_overrides_the_file(tmp_path):
    f = tmp_path / "t.yml"
    f.write_text("collectors:\n  nfsd:\n    enabled: true\n  gpu:\n    enabled: false\n")
    cfg, explicit = cfg_of(["agent", "--config", str(f), "--no-collector.nfsd", "--collector.gpu"])
    assert (cfg["collectors"]["nfsd"]["enabled"], cfg["collectors"]["gpu"]["enabled"]) == (False, True)
    assert explicit == {"gpu"}


# -- each subcommand's own usage -------------------------------------------------------------------------
def commands(parser, path=()):
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield path + (name,), sub
                yield from commands(sub, path + (name,))


LEAF_ARGS = {("record",): ["--output", "x"], ("dashboards", "push"): ["--url", "http://g"],
             ("trace", "summarize"): ["x.json"]}


def test_a_bad_flag_prints_the_subcommands_own_usage(capsys):
    seen = 0
    for path, sub in commands(cli.build_parser()):
        if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
            continue      # a group (dashboards): its leaves are checked
        argv = list(path) + LEAF_ARGS.get(path, []) + ["--no-such-flag"]
        if any(a.nargs == argparse.REMAINDER for a in sub._actions):
            # what follows is the command's own (teye run -- CMD, teye workloads TOOL ARGS): the bad flag before it
            argv = list(path) + ["--no-such-flag"] + (["train"] if path == ("workloads",) else ["--", "true"])
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2, argv
        assert err.startswith(f"usage: teye {' '.join(path)} "), (argv, err[:200])
        assert err.rstrip().endswith(f"teye {' '.join(path)}: error: unrecognized arguments: --no-such-flag"), err
        seen += 1
    assert seen >= 9     # agent, doctor, record, profile, run, dashboards push, report, catalog, workloads


def test_bad_values_name_the_subcommand_too(capsys):
    for argv in (["agent", "--collector.bogus"], ["agent", "--log.format", "xml"], ["agent", "--log.level", "x"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        err = capsys.readouterr().err
        assert err.startswith("usage: teye agent ") and "teye agent: error: " in err, err


# -- listen addresses --------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["[::]:9835", "[::1]:80", "127.0.0.1:9835", "0.0.0.0:1", "[fe80::1]:65535"])
def test_hostport_round_trip(text):
    assert config_mod.join_hostport(*config_mod.split_hostport(text)) == text


def _ipv6_loopback() -> bool:
    import socket
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def _agent_lines(tmp_path, *flags, env=None):
    """Start the agent on the fixture trees with these flags, stop it after its start-up line; its stderr lines."""
    port = free_port()
    err = tmp_path / "agent.err"
    with open(err, "w") as fh:
        p = subprocess.Popen([sys.executable, "-m", "agent", "agent", "--path.procfs", PROCFS, "--path.sysfs", SYSFS,
                              "--phase-socket", str(tmp_path / "p.sock"), *[f.format(port=port) for f in flags]],
                             cwd=REPO, stdout=subprocess.DEVNULL, stderr=fh, env={**os.environ, **(env or {})})
        try:
            import time
            deadline = time.monotonic() + 60
            while "listening on" not in err.read_text() and time.monotonic() < deadline and p.poll() is None:
                time.sleep(0.1)
        finally:
            p.terminate()
            p.wait(10)
    return err.read_text().splitlines(), port


@pytest.mark.e2e
def test_ipv6_listen_is_logged_with_brackets(tmp_path):
    if not _ipv6_loopback():
        pytest.skip("no IPv6 loopback on this machine")
    lines, port = _agent_lines(tmp_path, "--web.listen-address", "[::1]:{port}")
    assert any(f"listening on http://[::1]:{port}/metrics " in x for x in lines), lines


# -- log formats and journald -----------------------------------------------------------------------------
def record(msg="a \"quoted\" = value\nsecond line", name="teye.test", level=logging.WARNING):
    r = logging.LogRecord(name, level, __file__, 1, msg, (), None)
    r.created, r.msecs = 1700000000.25, 250.0
    return r


def test_logfmt_and_json_lines():
    j = json.loads(StructuredFormatter("json").format(record()))
    assert j == {"ts": "2023-11-14T22:13:20.250Z", "level": "warning", "logger": "teye.test",
                 "msg": "a \"quoted\" = value\nsecond line"}
    line = StructuredFormatter("logfmt").format(record())
    assert line == 'ts=2023-11-14T22:13:20.250Z level=warning logger=teye.test ' \
                   'msg="a \\"quoted\\" = value\\nsecond line"'
    assert "\n" not in line
    assert StructuredFormatter("logfmt", timestamps=False).format(record("plain")) == \
        "level=warning logger=teye.test msg=plain"
    assert "ts" not in json.loads(StructuredFormatter("json", timestamps=False).format(record()))


def test_journald_is_detected_from_the_stream_itself(tmp_path):
    f = open(tmp_path / "err", "w")
    st = os.fstat(f.fileno())
    assert under_journald({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}, f)
    assert not under_journald({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino + 1}"}, f)   # inherited, elsewhere
    assert not under_journald({}, f) and not under_journald({"JOURNAL_STREAM": "garbage"}, f)
    f.close()


TS = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")


@pytest.mark.e2e
@pytest.mark.parametrize("fmt", ["text", "logfmt", "json"])
def test_the_agents_lines_carry_no_timestamp_under_journald_and_one_elsewhere(tmp_path, fmt):
    err = tmp_path / "agent.err"
    # a shell opens the agent's stderr and names it in JOURNAL_STREAM, as systemd does for a journal stream
    port = free_port()
    script = (f'exec 2>>{shlex.quote(str(err))}; JOURNAL_STREAM=$(stat -L -c "%d:%i" /dev/stderr) exec '
              f'{shlex.quote(sys.executable)} -m agent agent --listen 127.0.0.1:{port} --log.format {fmt} '
              f'--path.procfs {PROCFS} --path.sysfs {SYSFS} --phase-socket {tmp_path}/p.sock')
    p = subprocess.Popen(["bash", "-c", script], cwd=REPO)
    try:
        import time
        deadline = time.monotonic() + 60
        while (not err.exists() or "listening on" not in err.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        p.terminate()
        p.wait(10)
    journal = [x for x in err.read_text().splitlines() if x.strip()]
    plain, _ = _agent_lines(tmp_path, "--listen", "127.0.0.1:{port}", "--log.format", fmt)
    assert any("listening on" in x for x in journal) and any("listening on" in x for x in plain)
    if fmt == "text":
        assert not any(TS.match(x) for x in journal), journal[:3]
        assert all(TS.match(x) for x in plain if x.split(" ", 1)[0] != "Traceback"), plain[:3]
        assert any(x.startswith("INFO teye.agent: teye agent listening on") for x in journal)
    elif fmt == "logfmt":
        assert all(x.startswith("level=") for x in journal), journal[:3]
        assert all(x.startswith("ts=") for x in plain), plain[:3]
    else:
        assert all("ts" not in json.loads(x) for x in journal), journal[:3]
        assert all(json.loads(x)["ts"].endswith("Z") for x in plain), plain[:3]
