"""Arbitrary YAML configs: a valid config, or a ConfigError with a one-line message (exit 2, no traceback,
no port bound).  Wrong types, unknown keys, alias bombs, huge numbers, negative intervals."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from agent import config
from agent.errors import ConfigError
from tests.procs import REPO, free_port


def leaves(schema, prefix=()):
    for k, v in schema.items():
        if isinstance(v, dict):
            yield from leaves(v, prefix + (k,))
        else:
            yield prefix + (k,), v


LEAVES = dict(leaves(config.SCHEMA))
SECTIONS = sorted({p[:i] for p in LEAVES for i in range(1, len(p))})

scalars = (st.none() | st.booleans() | st.integers(min_value=-10**30, max_value=10**30)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
values = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                      max_leaves=8)
paths = st.sampled_from(sorted(LEAVES) + SECTIONS) | st.lists(st.text(min_size=1, max_size=6), min_size=1,
                                                              max_size=3).map(tuple)


def nest(items):
    doc = {}
    for path, value in items:
        node = doc
        for p in path[:-1]:
            nxt = node.get(p)
            if not isinstance(nxt, dict):
                nxt = node[p] = {}
            node = nxt
        node[path[-1]] = value
    return doc


def check_loaded(cfg):
    for path, f in LEAVES.items():
        v = config.get(cfg, ".".join(path))
        assert (v is None and f.nullable) or isinstance(v, f.type), (path, v)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            assert abs(v) <= f.max
        if path[-1] == "interval_seconds":
            assert v > 0


def load_text(tmp_path, text):
    p = tmp_path / "teye.yml"
    p.write_text(text)
    try:
        check_loaded(config.load(str(p)))
        return None
    except ConfigError as e:
        msg = str(e)
        assert "\n" not in msg and 0 < len(msg) < 1000
        return msg


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(paths, values), max_size=5))
def test_arbitrary_documents_load_or_name_the_problem(tmp_path, items):
    load_text(tmp_path, yaml.safe_dump(nest(items)))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300))
def test_arbitrary_bytes_load_or_name_the_problem(tmp_path, data):
    p = tmp_path / "teye.yml"
    p.write_bytes(data)
    try:
        check_loaded(config.load(str(p)))
    except ConfigError as e:
        assert "\n" not in str(e)


def bomb(key: str, indent: str = "") -> str:
    """key: a list whose last item expands to 9**9 strings through aliases (a billion laughs)."""
    items = [f"{indent}  - &a [x, x, x, x, x, x, x, x, x]\n"] + [
        f"{indent}  - &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi")]
    return f"{indent}{key}:\n" + "".join(items)


@pytest.mark.parametrize("text, named", [
    ("collectors:\n  cpu:\n    interval_seconds: -1\n", "collectors.cpu.interval_seconds': must be > 0"),
    ("collectors:\n  cpu:\n    interval_seconds: .inf\n", "must be a finite number"),
    ("collectors:\n  cpu:\n    interval_seconds: .nan\n", "interval_seconds'"),
    ("phases:\n  max_jobs: 1" + "0" * 40 + "\n", "phases.max_jobs': must be a finite number"),
    ("phases:\n  max_jobs: 1" + "0" * 5000 + "\n", "unreadable YAML"),
    ("web:\n  max_connections: yes\n", "web.max_connections': expected integer, got bool"),
    ("listen: [1, 2]\n", "listen': expected string"),
    ("colectors: {}\n", "colectors': unknown key"),
    (bomb("listen"), "listen': expected string, got list"),
    ("gpu:\n" + bomb("idle_gap_buckets", "  "), "idle_gap_buckets"),
    ("phases:\n" + bomb("trusted_uids", "  "), "trusted_uids"),
    (bomb("collectors"), "section 'collectors': expected a mapping"),
    ("[" * 5000 + "]" * 5000 + "\n", "config file"),
])
def test_named_bad_configs(tmp_path, text, named):
    assert named in (load_text(tmp_path, text) or "")


@pytest.mark.parametrize("text", [
    bomb("listen"),
    "collectors:\n  gpu:\n    interval_seconds: -0.5\n",
    "phases:\n  max_jobs: 1" + "0" * 5000 + "\n",
    "web:\n  config_file: 7\n",
])
def test_agent_exits_2_with_one_line_and_binds_nothing(tmp_path, text):
    cfg = tmp_path / "teye.yml"
    cfg.write_text(text)
    port = free_port()
    res = subprocess.run([sys.executable, "-m", "agent", "agent", "--config", str(cfg), "--listen",
                          f"127.0.0.1:{port}", "--phase-socket", str(tmp_path / "p.sock")],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("teye: config") and "Traceback" not in res.stderr
    assert res.stdout == ""
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert not (tmp_path / "p.sock").exists()


WEB_PATHS = st.sampled_from([
    ("tls_server_config",), ("tls_server_config", "cert_file"), ("tls_server_config", "key_file"),
    ("tls_server_config", "client_auth_type"), ("tls_server_config", "cipher_suites"),
    ("tls_server_config", "min_version"), ("http_server_config", "headers"), ("http_server_config", "http2"),
    ("http_server_config", "headers", "X-Frame-Options"), ("basic_auth_users",), ("basic_auth_users", "u"),
    ("rate_limit", "interval"), ("rate_limit", "burst"), ("unknown",)])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(WEB_PATHS, values), max_size=4))
def test_arbitrary_web_configs_load_or_name_the_problem(items):
    from exporters import webconfig
    try:
        settings_, _ = webconfig.parse(nest(items), "/nonexistent")
    except ConfigError as e:
        assert "\n" not in str(e) and len(str(e)) < 1000
    else:
        assert isinstance(settings_, webconfig.Settings)
