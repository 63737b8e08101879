"""NFS client source: per-mount mountstats and RPC totals equal node_exporter's; garbled input."""
from __future__ import annotations

import os
import shutil

import pytest
from prometheus_client import generate_latest

from agent.config import defaults
from agent.errors import ParseError
from agent.sampler import Sampler
from agent.sources import build
from agent.sources.cpu import CpuSource
from agent.sources.nfs import (EVENT_NAMES, NfsClientSource, parse_mountstats, parse_rpc_nfs, unescape,
                               visible_mounts)
from exporters.prometheus import make_registry
from tests.conftest import PROCFS, golden, parse_exposition, reading_series as series

MOUNTSTATS = os.path.join(PROCFS, "self", "mountstats")
RPC_NFS = os.path.join(PROCFS, "net", "rpc", "nfs")




@pytest.fixture(scope="module")
def reading():
    return NfsClientSource(PROCFS).collect()


# node_exporter keys mounts by (export, protocol, mountaddr) and keeps the first of each; teye keys them
# by mountpoint and keeps the last (visible) one. On this fixture both pick the same two mounts:
# /mnt/nfs/test is node_exporter's protocol="tcp" mount and /mnt/nfs/test-dupe (the NFSv3/udp mount
# stacked on top of an NFSv4 one) its protocol="udp" mount.
MOUNTPOINT_OF = {"tcp": "/mnt/nfs/test", "udp": "/mnt/nfs/test-dupe"}

PER_MOUNT = {
    "node_mountstats_nfs_total_read_bytes_total": "teye_nfs_client_read_bytes_total",
    "node_mountstats_nfs_total_write_bytes_total": "teye_nfs_client_write_bytes_total",
    "node_mountstats_nfs_read_bytes_total": "teye_nfs_client_normal_read_bytes_total",
    "node_mountstats_nfs_write_bytes_total": "teye_nfs_client_normal_write_bytes_total",
    "node_mountstats_nfs_direct_read_bytes_total": "teye_nfs_client_direct_read_bytes_total",
    "node_mountstats_nfs_direct_write_bytes_total": "teye_nfs_client_direct_write_bytes_total",
    "node_mountstats_nfs_read_pages_total": "teye_nfs_client_read_pages_total",
    "node_mountstats_nfs_write_pages_total": "teye_nfs_client_write_pages_total",
    "node_mountstats_nfs_age_seconds_total": "teye_nfs_client_mount_age_seconds",
}
PER_OP = {
    "node_mountstats_nfs_operations_requests_total": "teye_nfs_client_operations_total",
    "node_mountstats_nfs_operations_transmissions_total": "teye_nfs_client_operation_transmissions_total",
    "node_mountstats_nfs_operations_major_timeouts_total": "teye_nfs_client_operation_major_timeouts_total",
    "node_mountstats_nfs_operations_sent_bytes_total": "teye_nfs_client_operation_sent_bytes_total",
    "node_mountstats_nfs_operations_received_bytes_total": "teye_nfs_client_operation_received_bytes_total",
    "node_mountstats_nfs_operations_queue_time_seconds_total": "teye_nfs_client_operation_queue_seconds_total",
    "node_mountstats_nfs_operations_response_time_seconds_total": "teye_nfs_client_operation_rtt_seconds_total",
    "node_mountstats_nfs_operations_request_time_seconds_total": "teye_nfs_client_operation_execute_seconds_total",
}
PER_TRANSPORT = {
    "node_mountstats_nfs_transport_bind_total": "teye_nfs_client_transport_binds_total",
    "node_mountstats_nfs_transport_connect_total": "teye_nfs_client_transport_connects_total",
    "node_mountstats_nfs_transport_idle_time_seconds": "teye_nfs_client_transport_idle_seconds",
    "node_mountstats_nfs_transport_sends_total": "teye_nfs_client_transport_sends_total",
    "node_mountstats_nfs_transport_receives_total": "teye_nfs_client_transport_receives_total",
    "node_mountstats_nfs_transport_bad_transaction_ids_total": "teye_nfs_client_transport_bad_xids_total",
    "node_mountstats_nfs_transport_backlog_queue_total": "teye_nfs_client_transport_backlog_queue_total",
    "node_mountstats_nfs_transport_maximum_rpc_slots": "teye_nfs_client_transport_max_slots",
    "node_mountstats_nfs_transport_sending_queue_total": "teye_nfs_client_transport_sending_queue_total",
    "node_mountstats_nfs_transport_pending_queue_total": "teye_nfs_client_transport_pending_queue_total",
}
EVENT_OF = {"dnode_revalidate": "dentry_revalidate", "vfs_file_release": "vfs_release"}

ACCESS_QUEUE_MS = 18446743919241604546  # the fixture's (wrapped) ACCESS queue time on the udp mount


def test_every_mountstats_value_equals_node_exporter(reading, node_exporter_golden):
    mine = series(reading)
    checked = 0
    for (name, labels), value in node_exporter_golden.items():
        if not name.startswith("node_mountstats_nfs_") or name == "node_mountstats_nfs_mountpoint_info":
            continue
        lab = dict(labels)
        mp = MOUNTPOINT_OF[lab["protocol"]]
        if name in PER_MOUNT:
            key = (PER_MOUNT[name], (("mountpoint", mp),))
        elif name in PER_OP:
            key = (PER_OP[name], (("mountpoint", mp), ("operation", lab["operation"])))
        elif name in PER_TRANSPORT:
            key = (PER_TRANSPORT[name], (("mountpoint", mp), ("transport", lab["transport"])))
        elif name.startswith("node_mountstats_nfs_event_"):
            event = name[len("node_mountstats_nfs_event_"):-len("_total")]
            key = ("teye_nfs_client_events_total", (("event", EVENT_OF.get(event, event)), ("mountpoint", mp)))
        else:
            raise AssertionError(f"golden metric {name} not mapped")
        if lab["protocol"] == "udp" and name in ("node_mountstats_nfs_transport_connect_total",
                                                 "node_mountstats_nfs_transport_idle_time_seconds"):
            assert value == 0 and key not in mine  # udp xprt lines have no such field: absent, not 0
            continue
        if name == "node_mountstats_nfs_operations_queue_time_seconds_total" and lab["operation"] == "ACCESS":
            # node_exporter loses the high bits of this wrapped 64-bit value (ms -> Duration overflow);
            # teye exports the kernel's number / 1000.
            assert value * 1000 == ACCESS_QUEUE_MS % 2 ** 53
            assert mine[key] == ACCESS_QUEUE_MS / 1000
            continue
        assert mine[key] == value, (name, labels)
        checked += 1
    assert checked == 149 - 3 - 2 - 1  # all golden series but the 3 info, 2 udp-only-zero, 1 wrapped


def test_contract_bytes_are_server_bytes(reading, node_exporter_golden):
    m = reading.mount("/mnt/nfs/test")
    assert m.server_read_bytes == 1210214218 == golden(
        node_exporter_golden, "node_mountstats_nfs_total_read_bytes_total",
        export="192.168.1.1:/srv/test", mountaddr="192.168.1.1", protocol="tcp")
    assert m.server_write_bytes == 0
    assert m.normal_read_bytes == 1207640230
    op = m.operation("READ")
    assert (op.ops, op.rtt_seconds, op.execute_seconds, op.queue_seconds) == (1298, 79.386, 79.407, 0.006)


def test_duplicate_mountpoint_reports_the_visible_mount_once(reading):
    assert [m.mountpoint for m in reading.mounts] == ["/mnt/nfs/test", "/mnt/nfs/test-dupe"]
    dupe = reading.mount("/mnt/nfs/test-dupe")
    assert (dupe.fstype, dupe.version, dupe.protocol) == ("nfs", "3", "udp")  # the last, stacked on top
    assert dupe.operation("ACCESS").ops == 2927395007
    info = {labels: v for (n, labels), v in series(reading).items() if n == "teye_nfs_client_mount_info"}
    assert info == {
        (("export", "192.168.1.1:/srv/test"), ("mountpoint", "/mnt/nfs/test"), ("protocol", "tcp"),
         ("version", "4.0")): 1,
        (("export", "192.168.1.1:/srv/test"), ("mountpoint", "/mnt/nfs/test-dupe"), ("protocol", "udp"),
         ("version", "3")): 1,
    }
    # all three NFS mounts parse; only the visible ones are kept
    assert len(parse_mountstats(open(MOUNTSTATS).read(), MOUNTSTATS)) == 3


def _norm(name):
    return name.replace("_", "").upper()


# node_exporter method -> kernel procedure name where they differ after dropping '_' and case.
# LayoutGet/GetDeviceInfo: the kernel lists NFSPROC4_CLNT_LAYOUTGET before NFSPROC4_CLNT_GETDEVICEINFO
# (include/linux/nfs4.h), but prometheus/procfs maps them the other way round (GetDeviceInfo: v[45],
# LayoutGet: v[46]), so node_exporter swaps the two; teye follows the kernel.
RENAMED = {("2", "FSSTAT"): "STATFS", ("4", "GETDEVICEINFO"): "LAYOUTGET", ("4", "LAYOUTGET"): "GETDEVICEINFO"}


def test_rpc_totals_equal_node_exporter(reading, node_exporter_golden):
    g = node_exporter_golden
    mine = series(reading)
    assert mine[("teye_nfs_client_rpc_calls_total", ())] == golden(g, "node_nfs_rpcs_total")
    assert mine[("teye_nfs_client_rpc_retransmissions_total", ())] == golden(g, "node_nfs_rpc_retransmissions_total")
    assert mine[("teye_nfs_client_rpc_auth_refreshes_total", ())] == \
        golden(g, "node_nfs_rpc_authentication_refreshes_total")
    assert mine[("teye_nfs_client_connections_total", ())] == golden(g, "node_nfs_connections_total")
    for proto in ("tcp", "udp"):
        assert mine[("teye_nfs_client_packets_total", (("protocol", proto),))] == \
            golden(g, "node_nfs_packets_total", protocol=proto)
    procs = {(dict(k)["version"], _norm(dict(k)["procedure"])): v for (n, k), v in mine.items()
             if n == "teye_nfs_client_procedure_calls_total"}
    checked = 0
    for (name, labels), value in g.items():
        if name != "node_nfs_requests_total":
            continue
        lab = dict(labels)
        key = (lab["proto"], RENAMED.get((lab["proto"], _norm(lab["method"])), _norm(lab["method"])))
        if key in procs:
            assert procs[key] == value, key
            checked += 1
        else:  # node_exporter pads procedures a kernel does not list with 0; teye leaves them absent
            assert lab["proto"] == "4" and value == 0, key
    assert checked == 18 + 22 + 48
    assert len(procs) == checked  # nothing beyond what the file lists


def test_exposition_through_sampler_and_exporter(node_exporter_golden):
    cfg = defaults()
    cfg["procfs"] = PROCFS
    s = Sampler({"nfs": (build("nfs", cfg), 5.0)})
    assert s.read_once("nfs").up
    out = parse_exposition(generate_latest(make_registry(lambda: s.snapshot)).decode())
    assert out[("teye_nfs_client_read_bytes_total", (("mountpoint", "/mnt/nfs/test"),))] == 1210214218
    assert out[("teye_nfs_client_write_bytes_total", (("mountpoint", "/mnt/nfs/test-dupe"),))] == 0
    assert out[("teye_nfs_client_operation_rtt_seconds_total",
                (("mountpoint", "/mnt/nfs/test-dupe"), ("operation", "ACCESS")))] == 1667369.447
    assert out[("teye_nfs_client_rpc_calls_total", ())] == golden(node_exporter_golden, "node_nfs_rpcs_total")


# --- constructed input ----------------------------------------------------------------------------

EVENTS = " ".join(str(i) for i in range(1, 28))


def nfs_block(device="srv:/export", mountpoint="/mnt/a", fstype="nfs4", read=100, write=200,
              ops=("READ: 3 3 0 300 40000 1 2500 2600 1", "WRITE: 2 2 0 50000 200 0 1200 1300 0"),
              xprt=("tcp 0 1 1 0 5 10 10 0 10 0 2 0 0",), opts="rw,vers=4.2,proto=tcp", statvers="1.1"):
    lines = [f"device {device} mounted on {mountpoint} with fstype {fstype}" + (f" statvers={statvers}" if statvers
                                                                                else ""),
             f"\topts:\t{opts}", "\tage:\t60", f"\tevents:\t{EVENTS}",
             f"\tbytes:\t{read} {write} 0 0 {read + 1} {write + 1} 7 8",
             "\tRPC iostats version: 1.1  p/v: 100003/4 (nfs)"]
    lines += [f"\txprt:\t{x}" for x in xprt]
    lines += ["\tper-op statistics"] + [f"\t{op:>14}" for op in ops]
    return "\n".join(lines) + "\n\n"


ROOT = "device /dev/sda1 mounted on / with fstype ext4\ndevice proc mounted on /proc with fstype proc\n"


def test_statvers_1_1_errors_events_and_nconnect_transports():
    text = ROOT + nfs_block(xprt=("tcp 0 1 1 0 5 10 10 0 10 0 2 0 0", "tcp 0 0 1 0 -1 4 4 0 4 0 1 0 0"))
    (m,) = parse_mountstats(text, "mountstats")
    assert m.events == dict(zip(EVENT_NAMES, range(1, 28)))
    assert m.events["jukebox_delay"] == 25 and m.events["vfs_release"] == 18
    read = m.operation("READ")
    assert (read.errors, read.rtt_seconds, read.execute_seconds, read.bytes_received) == (1, 2.5, 2.6, 40000)
    assert [(t.sends, t.idle_seconds, t.max_slots) for t in m.transports] == [(10, 5, 2), (4, -1, 1)]
    s = series(parse_and_wrap(text))
    assert s[("teye_nfs_client_operation_errors_total", (("mountpoint", "/mnt/a"), ("operation", "READ")))] == 1
    assert s[("teye_nfs_client_transport_sends_total", (("mountpoint", "/mnt/a"), ("transport", "1")))] == 4
    assert s[("teye_nfs_client_read_bytes_total", (("mountpoint", "/mnt/a"),))] == 101
    assert s[("teye_nfs_client_write_bytes_total", (("mountpoint", "/mnt/a"),))] == 201


def parse_and_wrap(text):
    from agent.sources.nfs import NfsClientReading
    return NfsClientReading(visible_mounts(parse_mountstats(text, "mountstats")))


def test_escaped_mountpoint_and_rdma_transport():
    text = nfs_block(mountpoint=r"/mnt/my\040data", xprt=("rdma 0 0 1 0 3 9 9 0 9 0 0 0 0 0 0 0 0 0 0",))
    (m,) = parse_mountstats(text, "mountstats")
    assert m.mountpoint == "/mnt/my data" == unescape(r"/mnt/my\040data")
    (x,) = m.transports
    assert (x.protocol, x.connect_count, x.idle_seconds, x.sends, x.max_slots) == ("rdma", 1, 3, 9, None)


def test_same_mountpoint_twice_keeps_the_last_without_duplicate_series():
    text = ROOT + nfs_block(read=1000) + nfs_block(mountpoint="/mnt/b", read=5) + nfs_block(read=2000)
    r = parse_and_wrap(text)
    assert [(m.mountpoint, m.normal_read_bytes) for m in r.mounts] == [("/mnt/b", 5), ("/mnt/a", 2000)]
    series(r)  # asserts there is no duplicate series


def test_no_nfs_mounts_is_an_empty_reading_and_up(tmp_path):
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "mountstats").write_text(ROOT)
    os.makedirs(tmp_path / "net" / "rpc")
    shutil.copy(RPC_NFS, tmp_path / "net" / "rpc" / "nfs")
    s = Sampler({"nfs": (NfsClientSource(str(tmp_path)), 5.0)})
    st = s.read_once("nfs")
    assert st.up and st.reading.mounts == ()
    assert st.reading.rpc.calls == 1218785755
    assert not any(n.startswith("teye_nfs_client_read") for n, _ in series(st.reading))


def test_missing_rpc_nfs_only_drops_the_rpc_totals(tmp_path):
    (tmp_path / "self").mkdir()
    shutil.copy(MOUNTSTATS, tmp_path / "self" / "mountstats")
    r = NfsClientSource(str(tmp_path)).collect()
    assert r.rpc is None
    assert [m.mountpoint for m in r.mounts] == ["/mnt/nfs/test", "/mnt/nfs/test-dupe"]
    assert not any(n.startswith("teye_nfs_client_rpc_") for n, _ in series(r))


def test_missing_mountstats_is_down_naming_the_file(tmp_path):
    s = Sampler({"nfs": (NfsClientSource(str(tmp_path)), 5.0)})
    st = s.read_once("nfs")
    assert not st.up and str(tmp_path / "self" / "mountstats") in st.error


# --- garbled input --------------------------------------------------------------------------------

GOOD = ROOT + nfs_block()


@pytest.mark.parametrize("text, why", [
    ("", "file is empty"),
    ("\n\n", "file is empty"),
    (ROOT + "device srv:/export mounted on /mnt/a with fstype nfs4 statvers=1.1\n", "no age: line"),
    (GOOD.replace("\tbytes:\t100 200 0 0 101 201 7 8", "\tbytes:\t100 200 0 0"), "bytes line has 4 values"),
    (GOOD.replace("\tbytes:\t100 200", "\tbytes:\t1oo 200"), "expected a non-negative integer, got '1oo'"),
    (GOOD.replace(f"\tevents:\t{EVENTS}", "\tevents:\t1 2 3"), "events line has 3 values"),
    (GOOD.replace("READ: 3 3 0 300", "READ: 3 3 0 x"), "READ: expected a non-negative integer, got 'x'"),
    (GOOD.replace("READ: 3 3 0 300 40000 1 2500 2600 1", "READ: 3 3 0 300"), "READ has 4 values"),
    (GOOD.replace("tcp 0 1 1 0 5 10 10 0 10 0 2 0 0", "tcp 0 1 1"), "tcp xprt line has 3 values"),
    (GOOD.replace("tcp 0 1 1 0 5 10 10 0 10 0 2 0 0", "udp 0 x 1 1 1 1 1"), "got 'x'"),
    (GOOD.replace(" statvers=1.1", ""), "NFS mount without statvers"),
    (ROOT + "device srv:/export mounted on /mnt/a wi", "malformed device line"),
    (GOOD.replace("\tage:\t60", "\tage:\tsixty"), "got 'sixty'"),
])
def test_parse_mountstats_garbled(text, why):
    with pytest.raises(ParseError) as e:
        parse_mountstats(text, "/proc/self/mountstats")
    assert e.value.path == "/proc/self/mountstats"
    assert why in str(e.value)


RPC_GOOD = "net 0 0 0 0\nrpc 10 1 10\nproc3 22 " + " ".join(["1"] * 22) + "\n"


def test_parse_rpc_nfs_constructed():
    r = parse_rpc_nfs(RPC_GOOD + "proc4 3 5 6 7\nproc9 1 4\n", "nfs")
    assert (r.calls, r.retransmissions, r.auth_refreshes) == (10, 1, 10)
    assert r.procedures["4"] == (("NULL", 5), ("READ", 6), ("WRITE", 7))
    assert r.procedures["9"] == (("PROC0", 4),)  # unknown version: kept, with positional names
    assert dict(r.procedures["3"])["COMMIT"] == 1


@pytest.mark.parametrize("text, why", [
    ("", "file is empty"),
    ("net 0 0 0 0\n", "no rpc line"),
    ("rpc 10 1\n", "has 2 values, expected 3"),
    ("rpc 10 x 10\n", "got 'x'"),
    (RPC_GOOD.replace("proc3 22 ", "proc3 23 "), "says 23 procedures but has 22 values"),
    (RPC_GOOD.replace("proc3 22 1 ", "proc3 22 one "), "got 'one'"),
    ("net 1 2\nrpc 1 2 3\n", "has 2 values, expected 4"),
])
def test_parse_rpc_nfs_garbled(text, why):
    with pytest.raises(ParseError) as e:
        parse_rpc_nfs(text, "/proc/net/rpc/nfs")
    assert e.value.path == "/proc/net/rpc/nfs" and why in str(e.value)


def test_garbled_tree_takes_collector_down_others_stay_up(tmp_path):
    procfs = tmp_path / "proc"
    shutil.copytree(PROCFS, procfs, symlinks=True)  # keeps proc/self -> 10
    bad = procfs / "10" / "mountstats"
    bad.write_text(bad.read_text().replace("READ: 1298 1298 0 207680", "READ: 1298 1298 0 2O7680", 1))
    s = Sampler({"nfs": (NfsClientSource(str(procfs)), 5.0), "cpu": (CpuSource(str(procfs)), 1.0)})
    nfs, cpu = s.read_once("nfs"), s.read_once("cpu")
    assert not nfs.up and nfs.reading is None
    assert str(procfs / "self" / "mountstats") in nfs.error and "'2O7680'" in nfs.error
    assert cpu.up
    out = parse_exposition(generate_latest(make_registry(lambda: s.snapshot)).decode())
    assert out[("teye_collector_up", (("collector", "nfs"),))] == 0
    assert out[("teye_collector_up", (("collector", "cpu"),))] == 1
    assert not any(n.startswith("teye_nfs_client_") for n, _ in out)
