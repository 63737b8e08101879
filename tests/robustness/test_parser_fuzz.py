"""Property tests: every /proc, /sys and phase-protocol parser, fed arbitrary input, returns a reading
or raises the project's parse error (ParseError; Rejected for the phase protocol), never anything else.

Two kinds of input: arbitrary bytes (decoded as the sources decode files: UTF-8 with replacement),
and the real fixture files mutated (a token replaced, a line dropped or duplicated, the text cut)
so that the parsers' deeper paths are reached too.
"""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from agent.errors import ParseError
from agent.gpu import procinfo
from agent.phases import protocol
from agent.sources import cpu, disk, infiniband, kernel, md, memory, netclass, netstat, network, nfs, nfsd, osinfo, \
    pressure, softnet
from tests.conftest import PROCFS, SYSFS

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


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


def parses_or_parse_error(fn, text):
    try:
        return fn(text)
    except ParseError:
        return None


SELINUX_CONFIG = os.path.join(os.path.dirname(os.path.dirname(PROCFS)), "selinux", "etc", "selinux", "config")
NET_DEV = os.path.join(os.path.dirname(os.path.dirname(PROCFS)), "net_dev", "proc", "net", "dev")

# parser, the fixture file it reads (mutated by the fuzzer), and what a reading must be
TEXT_PARSERS = {
    "stat": (lambda t: cpu.parse_stat(t, "stat"), os.path.join(PROCFS, "stat"),
             lambda r: isinstance(r, cpu.CpuReading)),
    "diskstats": (lambda t: disk.parse_diskstats(t, "diskstats", exclude=r"^loop"), os.path.join(PROCFS, "diskstats"),
                  lambda r: isinstance(r, disk.DiskReading)),
    "meminfo": (lambda t: memory.parse_meminfo(t, "meminfo"), os.path.join(PROCFS, "meminfo"),
                lambda r: isinstance(r, memory.MemoryReading)),
    "net/dev": (lambda t: network.parse_net_dev(t, "net/dev"), NET_DEV,
                lambda r: isinstance(r, network.NetworkReading)),
    "mountstats": (lambda t: nfs.parse_mountstats(t, "mountstats"), os.path.join(PROCFS, "self", "mountstats"),
                   lambda r: all(isinstance(m, nfs.NfsMount) for m in r)),
    "net/rpc/nfs": (lambda t: nfs.parse_rpc_nfs(t, "net/rpc/nfs"), os.path.join(PROCFS, "net", "rpc", "nfs"),
                    lambda r: isinstance(r, nfs.NfsRpcStats)),
    "net/rpc/nfsd": (lambda t: nfsd.parse_nfsd(t, "net/rpc/nfsd"), os.path.join(PROCFS, "net", "rpc", "nfsd"),
                     lambda r: isinstance(r, nfsd.NfsdReading)),
    **{f"pressure/{n}": (lambda t: pressure.parse_psi(t, "pressure"), os.path.join(PROCFS, "pressure", n),
                         lambda r: all(isinstance(v, pressure.PsiLine) for v in r.values()))
       for n in ("cpu", "io", "memory", "irq")},
    # issue 49: node_exporter's other default families
    "net/snmp6": (lambda t: netstat.parse_snmp6(t, "snmp6"), os.path.join(PROCFS, "net", "snmp6"),
                  lambda r: all(isinstance(v, int) and "6_" in k for k, v in r.items())),
    "net/sockstat6": (lambda t: netstat.parse_sockstat(t, "sockstat6"), os.path.join(PROCFS, "net", "sockstat6"),
                      lambda r: all(isinstance(v, int) for v in r.values())),
    "net/stat/nf_conntrack": (lambda t: netstat.parse_conntrack_stat(t, "nf_conntrack"),
                              os.path.join(PROCFS, "net", "stat", "nf_conntrack"),
                              lambda r: all(isinstance(v, int) and v >= 0 for v in r.values())),
    "net/udp": (lambda t: netstat.parse_udp_queues(t, "udp"), os.path.join(PROCFS, "net", "udp"),
                lambda r: len(r) == 2 and all(isinstance(v, int) and v >= 0 for v in r)),
    "net/softnet_stat": (lambda t: softnet.parse_softnet(t, "softnet_stat"), os.path.join(PROCFS, "net", "softnet_stat"),
                         lambda r: len({c for c, *_ in r}) == len(r) and all(min(v) >= 0 for _, *v in r)),
    "net/arp": (lambda t: netclass.parse_arp(t, "arp"), os.path.join(PROCFS, "net", "arp"),
                lambda r: all(isinstance(v, int) and v > 0 for v in r.values())),
    "mdstat": (lambda t: md.parse_mdstat(t, "mdstat"), os.path.join(PROCFS, "mdstat"),
               lambda r: all(isinstance(a, md.MdArray) and a.state in md.STATES and 0 <= a.active <= a.required
                             and min(a.failed, a.spare, a.blocks, a.synced) >= 0 for a in r)),
    "sys/fs/file-nr": (lambda t: kernel.parse_file_nr(t, "file-nr"), os.path.join(PROCFS, "sys", "fs", "file-nr"),
                       lambda r: len(r) == 2 and min(r) >= 0),
    "sys/kernel/random/entropy_avail": (lambda t: kernel.parse_bits(t, "entropy_avail"),
                                        os.path.join(PROCFS, "sys", "kernel", "random", "entropy_avail"),
                                        lambda r: isinstance(r, int) and r >= 0),
    "etc/selinux/config": (lambda t: osinfo.parse_selinux_config(t, "config"), SELINUX_CONFIG, lambda r: r in (None, -1, 0, 1)),
}


@pytest.mark.parametrize("name", sorted(TEXT_PARSERS))
@FUZZ
@given(data=st.data())
def test_text_parsers(name, data):
    parse, path, is_reading = TEXT_PARSERS[name]
    text = data.draw(st.one_of(st.binary(max_size=512).map(lambda b: b.decode("utf-8", "replace")),
                               st.text(max_size=256), mutated(fixture(path))))
    r = parses_or_parse_error(parse, text)
    assert r is None or is_reading(r)


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


@settings(max_examples=300, deadline=None)
@given(datagrams())
def test_phase_protocol(data):
    try:
        msg = protocol.decode(data, now_ns=10**12 + 10)
    except protocol.Rejected as e:
        assert e.reason in protocol.REASONS
        return
    assert isinstance(msg, protocol.Message)
