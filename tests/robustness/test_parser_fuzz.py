"""Property tests: every /proc, /sys and phase-protocol parser, fed arbitrary input, returns a reading
or raises the project's parse error (ParseError; Rejected for the phase protocol), never anything else.

Two kinds of input: arbitrary bytes (decoded as the sources decode files: UTF-8 with replacement),
and the real fixture files mutated (a token replaced, a line dropped or duplicated, the text cut)
so that the parsers' deeper paths are reached too.
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings, strategies as st

from agent.errors import ParseError
from agent.gpu import procinfo
from agent.phases import protocol
from agent.sources import cpu, disk, infiniband, memory, network, nfs, nfsd, pressure
from tests.conftest import PROCFS, SYSFS

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def fixture(*parts: str) -> str:
    with open(os.path.join(*parts), encoding="utf-8", errors="replace") as fh:
        return fh.read()


TOKENS = st.sampled_from(["", "-1", "0", "18446744073709551616", "1e309", "nan", "N/A", "x", ":", " ", "\n",
                          "\t", "\x00", "é", "99999999999999999999999999999999", "4:", "ACTIVE", "=", "(", "[]"])


@st.composite
def mutated(draw, text: str) -> str:
    """The fixture text with a few random edits."""
    lines = text.split("\n")
    for _ in range(draw(st.integers(1, 4))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["token", "drop", "dup", "cut"]))
        words = lines[i].split(" ")
        if op == "token" and words:
            j = draw(st.integers(0, len(words) - 1))
            words[j] = draw(st.one_of(TOKENS, st.text(max_size=8)))
            lines[i] = " ".join(words)
        elif op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        else:
            lines[i] = lines[i][:draw(st.integers(0, len(lines[i])))]
            lines = lines[:i + 1]
    return "\n".join(lines)


def text_for(name: str):
    return st.one_of(st.binary(max_size=512).map(lambda b: b.decode("utf-8", "replace")),
                     st.text(max_size=256), mutated(fixture(PROCFS, name)))


def parses_or_parse_error(fn, text):
    try:
        return fn(text)
    except ParseError:
        return None


@FUZZ
@given(text_for("stat"))
def test_cpu_stat(text):
    r = parses_or_parse_error(lambda t: cpu.parse_stat(t, "stat"), text)
    assert r is None or isinstance(r, cpu.CpuReading)


@FUZZ
@given(text_for("diskstats"))
def test_diskstats(text):
    r = parses_or_parse_error(lambda t: disk.parse_diskstats(t, "diskstats", exclude=r"^loop"), text)
    assert r is None or isinstance(r, disk.DiskReading)


@FUZZ
@given(text_for("meminfo"))
def test_meminfo(text):
    r = parses_or_parse_error(lambda t: memory.parse_meminfo(t, "meminfo"), text)
    assert r is None or isinstance(r, memory.MemoryReading)


NET_DEV = fixture(os.path.dirname(os.path.dirname(PROCFS)), "net_dev", "proc", "net", "dev")


@FUZZ
@given(st.one_of(st.binary(max_size=512).map(lambda b: b.decode("utf-8", "replace")), mutated(NET_DEV)))
def test_net_dev(text):
    r = parses_or_parse_error(lambda t: network.parse_net_dev(t, "net/dev"), text)
    assert r is None or isinstance(r, network.NetworkReading)


@FUZZ
@given(text_for("self/mountstats"))
def test_mountstats(text):
    r = parses_or_parse_error(lambda t: nfs.parse_mountstats(t, "mountstats"), text)
    assert r is None or all(isinstance(m, nfs.NfsMount) for m in r)


@FUZZ
@given(text_for("net/rpc/nfs"))
def test_rpc_nfs(text):
    r = parses_or_parse_error(lambda t: nfs.parse_rpc_nfs(t, "net/rpc/nfs"), text)
    assert r is None or isinstance(r, nfs.NfsRpcStats)


@FUZZ
@given(text_for("net/rpc/nfsd"))
def test_nfsd(text):
    r = parses_or_parse_error(lambda t: nfsd.parse_nfsd(t, "net/rpc/nfsd"), text)
    assert r is None or isinstance(r, nfsd.NfsdReading)


@FUZZ
@given(st.sampled_from(["cpu", "io", "memory", "irq"]).flatmap(lambda n: text_for(f"pressure/{n}")))
def test_pressure(text):
    r = parses_or_parse_error(lambda t: pressure.parse_psi(t, "pressure/io"), text)
    assert r is None or all(isinstance(v, pressure.PsiLine) for v in r.values())


PORT = os.path.join(SYSFS, "class", "infiniband", "mlx4_0", "ports", "1")
PORT_FILES = {os.path.relpath(os.path.join(d, f), PORT): fixture(d, f)
              for d, _, fs in os.walk(PORT) for f in fs}


@FUZZ
@given(st.dictionaries(st.sampled_from(sorted(PORT_FILES)),
                       st.one_of(st.none(), TOKENS, st.text(max_size=16),
                                 st.binary(max_size=32).map(lambda b: b.decode("utf-8", "replace")))))
def test_infiniband_port(edits):
    files = {**PORT_FILES, **edits}
    r = parses_or_parse_error(lambda f: infiniband.parse_port("mlx4_0", "1", f, PORT), files)
    assert r is None or isinstance(r, infiniband.IbPort)


@FUZZ
@given(st.one_of(st.binary(max_size=256).map(lambda b: b.decode("utf-8", "replace")), st.text(max_size=64)))
def test_proc_pid_files(text):
    job, pod = procinfo.parse_cgroup(text)
    assert isinstance(job, str) and isinstance(pod, str)
    uid = parses_or_parse_error(lambda t: procinfo.parse_status_uid(t, "status"), text)
    assert uid is None or isinstance(uid, int)


VALID = protocol.encode("job-1", phases=[("data_wait", 10**12, 10**12 + 5)], steps=[(10**12, 10**12 + 9, 4)])


@st.composite
def datagrams(draw) -> bytes:
    kind = draw(st.integers(0, 2))
    if kind == 0:
        return draw(st.binary(max_size=1024))
    if kind == 1:  # valid JSON of arbitrary shape
        value = draw(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                                  lambda c: st.lists(c, max_size=4) | st.dictionaries(
                                      st.sampled_from(["v", "job", "phases", "steps", "cvd", "dropped", "x"]),
                                      c, max_size=6), max_leaves=20))
        import json
        return json.dumps(value).encode()
    data = bytearray(VALID)  # the valid message with a few bytes changed
    for _ in range(draw(st.integers(1, 4))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


@settings(max_examples=400, deadline=None)
@given(datagrams())
def test_phase_protocol(data):
    try:
        msg = protocol.decode(data, now_ns=10**12 + 10)
    except protocol.Rejected as e:
        assert e.reason in protocol.REASONS
        return
    assert isinstance(msg, protocol.Message)
