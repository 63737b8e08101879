"""NFS server source: every value equals node_exporter's node_nfsd_*; garbled input; nfsd not loaded."""
from __future__ import annotations

import os
import shutil

import pytest
from prometheus_client import generate_latest

from agent.config import defaults
from agent.errors import ParseError, SourceUnavailable
from agent.sampler import Sampler
from agent.sources import build
from agent.sources.cpu import CpuSource
from agent.sources.nfsd import NfsdSource, parse_nfsd
from exporters.prometheus import make_registry
from tests.conftest import PROCFS, golden, parse_exposition, reading_series as series

NFSD = os.path.join(PROCFS, "net", "rpc", "nfsd")




@pytest.fixture(scope="module")
def mine():
    return series(NfsdSource(PROCFS).collect())


SCALARS = {
    "teye_nfsd_read_bytes_total": "node_nfsd_disk_bytes_read_total",
    "teye_nfsd_write_bytes_total": "node_nfsd_disk_bytes_written_total",
    "teye_nfsd_reply_cache_hits_total": "node_nfsd_reply_cache_hits_total",
    "teye_nfsd_reply_cache_misses_total": "node_nfsd_reply_cache_misses_total",
    "teye_nfsd_reply_cache_nocache_total": "node_nfsd_reply_cache_nocache_total",
    "teye_nfsd_file_handles_stale_total": "node_nfsd_file_handles_stale_total",
    "teye_nfsd_threads": "node_nfsd_server_threads",
    "teye_nfsd_connections_total": "node_nfsd_connections_total",
    "teye_nfsd_rpc_calls_total": "node_nfsd_server_rpcs_total",
}


@pytest.mark.parametrize("ours, theirs", sorted(SCALARS.items()))
def test_scalars_equal_node_exporter(mine, node_exporter_golden, ours, theirs):
    assert mine[(ours, ())] == golden(node_exporter_golden, theirs)


def test_contract_bytes_from_the_io_line(mine):
    assert mine[("teye_nfsd_read_bytes_total", ())] == 157286400  # io 157286400 72864
    assert mine[("teye_nfsd_write_bytes_total", ())] == 72864


def test_packets_and_rpc_errors_equal_node_exporter(mine, node_exporter_golden):
    g = node_exporter_golden
    for proto in ("udp", "tcp"):
        assert mine[("teye_nfsd_packets_total", (("protocol", proto),))] == \
            golden(g, "node_nfsd_packets_total", proto=proto)
    for ours, theirs in (("format", "fmt"), ("auth", "auth"), ("client", "cInt")):
        assert mine[("teye_nfsd_rpc_errors_total", (("error", ours),))] == \
            golden(g, "node_nfsd_rpc_errors_total", error=theirs)
    # not in node_exporter: bad calls = the sum of the three reasons (rpc 18628 3 1 2 0)
    assert mine[("teye_nfsd_rpc_bad_calls_total", ())] == 3 == 1 + 2 + 0


def _norm(name):
    return name.replace("_", "").upper()


# node_exporter method (proto 4: proc4ops) -> kernel/RFC name where they differ beyond '_' and case.
RENAMED = {("2", "FSSTAT"): "STATFS", ("4", "LOOKUPROOT"): "LOOKUPP", ("4", "OPENDGRD"): "OPENDOWNGRADE",
           ("4", "RELLOCKOWNER"): "RELEASELOCKOWNER"}


def test_every_request_count_equals_node_exporter(mine, node_exporter_golden):
    procs = {}
    for (name, labels), v in mine.items():
        lab = dict(labels)
        if name == "teye_nfsd_procedure_calls_total" and lab["version"] in ("2", "3"):
            procs[(lab["version"], _norm(lab["procedure"]))] = v
        elif name == "teye_nfsd_v4_operations_total":
            procs[("4", _norm(lab["operation"]))] = v
    checked = set()
    for (name, labels), value in node_exporter_golden.items():
        if name != "node_nfsd_requests_total":
            continue
        lab = dict(labels)
        if lab["method"] == "WdelegGetattr":
            assert mine[("teye_nfsd_write_delegation_getattrs_total", ())] == value == 15
            continue
        key = (lab["proto"], RENAMED.get((lab["proto"], _norm(lab["method"])), _norm(lab["method"])))
        assert procs[key] == value, key
        checked.add(key)
    # what node_exporter leaves out, against the file itself: NULL per version, ops 23, 24 and 40..71
    rest = {k: v for k, v in procs.items() if k not in checked}
    assert rest.pop(("2", "NULL")) == 2 and rest.pop(("3", "NULL")) == 2
    assert rest.pop(("4", "PUTPUBFH")) == 0 and rest.pop(("4", "PUTROOTFH")) == 2
    assert len(rest) == 71 - 39 and set(rest.values()) == {0}  # proc4ops 72: indices 40..71 are all 0
    assert ("4", "BACKCHANNELCTL") in rest and ("4", "CLONE") in rest
    assert mine[("teye_nfsd_procedure_calls_total", (("procedure", "NULL"), ("version", "4")))] == 2
    assert mine[("teye_nfsd_procedure_calls_total", (("procedure", "COMPOUND"), ("version", "4")))] == 10853


def test_exposition_through_sampler_and_exporter(node_exporter_golden):
    cfg = defaults()
    cfg["procfs"] = PROCFS
    s = Sampler({"nfsd": (build("nfsd", cfg), 5.0)})
    assert s.read_once("nfsd").up
    out = parse_exposition(generate_latest(make_registry(lambda: s.snapshot)).decode())
    g = node_exporter_golden
    assert out[("teye_nfsd_read_bytes_total", ())] == golden(g, "node_nfsd_disk_bytes_read_total")
    assert out[("teye_nfsd_write_bytes_total", ())] == golden(g, "node_nfsd_disk_bytes_written_total")
    assert out[("teye_nfsd_v4_operations_total", (("operation", "PUTFH"),))] == \
        golden(g, "node_nfsd_requests_total", method="PutFH", proto="4")


# --- other kernels, garbled input -----------------------------------------------------------------

MODERN = """rc 0 1 2
fh 3 0 0 0 0
io 4096 8192
th 16 0 0.000 0.000 0.000 0.000 0.000 0.000 0.000 0.000 0.000 0.000
ra 0 0 0 0 0 0 0 0 0 0 0 0
net 10 0 10 2
rpc 10 0 0 0 0
proc3 22 """ + " ".join(str(i) for i in range(22)) + """
proc4 2 1 9
proc4ops 76 """ + " ".join(str(i) for i in range(76)) + """
wdeleg_getattr 0
"""


def test_modern_kernel_without_nfsv2_and_with_xattr_ops():
    s = series(parse_nfsd(MODERN, "nfsd"))
    ops = {dict(k)["operation"]: v for (n, k), v in s.items() if n == "teye_nfsd_v4_operations_total"}
    assert ops["ACCESS"] == 3 and ops["READ_PLUS"] == 68 and ops["REMOVEXATTR"] == 75
    assert "OP0" not in ops and len(ops) == 76 - 3  # indices 0-2 are unassigned
    assert s[("teye_nfsd_procedure_calls_total", (("procedure", "COMMIT"), ("version", "3")))] == 21
    assert not any(dict(k).get("version") == "2" for n, k in s if n == "teye_nfsd_procedure_calls_total")
    assert s[("teye_nfsd_threads", ())] == 16 and s[("teye_nfsd_file_handles_stale_total", ())] == 3
    assert s[("teye_nfsd_write_delegation_getattrs_total", ())] == 0


def test_unknown_ops_get_positional_names():
    r = parse_nfsd(MODERN.replace("proc4ops 76 ", "proc4ops 78 ").replace(" 75\n", " 75 76 77\n"), "nfsd")
    assert r.v4_operations[-2:] == (("OP76", 76), ("OP77", 77))


@pytest.mark.parametrize("text, why", [
    ("", "file is empty"),
    ("\n", "file is empty"),
    ("rc 0 6 18622\nfh 0 0 0 0 0\n", "no io, th, net, rpc lines"),
    (MODERN.replace("io 4096 8192", "io 4096"), "has 1 values, expected 2"),
    (MODERN.replace("io 4096 8192", "io 4096 lots"), "got 'lots'"),
    (MODERN.replace("rc 0 1 2", "rc 0 1"), "has 2 values, expected 3"),
    (MODERN.replace("th 16 0", "th x 0"), "got 'x'"),
    (MODERN.replace("rpc 10 0 0 0 0", "rpc 10 0 0"), "has 3 values, expected 5"),
    (MODERN.replace("proc3 22 ", "proc3 30 "), "says 30 procedures but has 22 values"),
    (MODERN.replace("proc4ops 76 0 1", "proc4ops 76 0 one"), "got 'one'"),
    (MODERN.replace("wdeleg_getattr 0", "wdeleg_getattr"), "has 0 values, expected 1"),
    (MODERN.replace("net 10 0 10 2\n", ""), "no net line"),
])
def test_parse_nfsd_garbled(text, why):
    with pytest.raises(ParseError) as e:
        parse_nfsd(text, "/proc/net/rpc/nfsd")
    assert e.value.path == "/proc/net/rpc/nfsd" and why in str(e.value)


def test_nfsd_not_loaded_is_unavailable(tmp_path):
    with pytest.raises(SourceUnavailable, match=r"net/rpc/nfsd does not exist \(NFS server module nfsd not loaded\)"):
        NfsdSource(str(tmp_path)).collect()


def test_garbled_tree_takes_collector_down_others_stay_up(tmp_path):
    procfs = tmp_path / "proc"
    shutil.copytree(PROCFS, procfs, symlinks=True)
    bad = procfs / "net" / "rpc" / "nfsd"
    bad.write_text(bad.read_text().replace("io 157286400 72864", "io 157286400"))
    s = Sampler({"nfsd": (NfsdSource(str(procfs)), 5.0), "cpu": (CpuSource(str(procfs)), 1.0)})
    nfsd, cpu = s.read_once("nfsd"), s.read_once("cpu")
    assert not nfsd.up and nfsd.reading is None
    assert nfsd.error.startswith(str(bad) + ": ") and "io: has 1 values" in nfsd.error
    assert cpu.up
    out = parse_exposition(generate_latest(make_registry(lambda: s.snapshot)).decode())
    assert out[("teye_collector_up", (("collector", "nfsd"),))] == 0
    assert out[("teye_collector_up", (("collector", "cpu"),))] == 1
    assert ("teye_nfsd_read_bytes_total", ()) not in out
    bad.unlink()  # module unloaded: still down, with the reason
    st = s.read_once("nfsd")
    assert not st.up and "nfsd not loaded" in st.error
