"""node_exporter's other default families (issue 49) read from node_exporter's own fixture trees and compared with
its golden e2e-output.txt, series by series and both ways; then the bad input the issue lists: a host without IPv6,
an SELinux-less host, an interface renamed while read, garbled files."""
from __future__ import annotations

import os
import shutil
import threading

import pytest
from prometheus_client import generate_latest

from agent.hostseries import RENAMES
from agent.sampler import Sampler
from agent.sources import netclass as netclass_mod
from agent.sources.disk import DiskSource
from agent.sources.loadavg import LoadavgSource
from agent.sources.memory import MemorySource
from agent.sources.netclass import NetclassSource
from agent.sources.netstat import NetstatSource
from agent.sources.network import NetworkSource
from agent.sources.osinfo import OsInfoSource
from agent.sources.timex import TimexSource
from exporters.prometheus import make_registry
from tests.conftest import NODE_EXPORTER, PROCFS, SYSFS, parse_exposition

UDEV = os.path.join(NODE_EXPORTER, "udev", "data")
SELINUX = os.path.join(os.path.dirname(NODE_EXPORTER), "selinux")
# node_exporter's e2e run ignores these in netclass and arp (--collector.netclass.ignored-devices=(dmz|int),
# --collector.arp.device-exclude=nope): teye's network.exclude does both
EXCLUDE = r"^(dmz|int|nope)$"
NE_DISK_EXCLUDE = r"^(z?ram|loop|fd|(h|s|v|xv)d[a-z]|nvme\d+n\d+p)\d+$"   # node_exporter's default device-exclude


def _exposition(sources):
    s = Sampler({src.name: (src, 5.0) for src in sources})
    for src in sources:
        st = s.read_once(src.name)
        assert st.up, (src.name, st.error)
    return parse_exposition(generate_latest(make_registry(lambda: s.snapshot)).decode())


def _fixture_sources(tmp_path):
    # node_exporter ships no /proc/net/dev fixture: this project's own beside its softnet_stat
    (tmp_path / "net").mkdir()
    shutil.copy(os.path.join(PROCFS.replace("node_exporter", "net_dev"), "net", "dev"), tmp_path / "net" / "dev")
    shutil.copy(os.path.join(PROCFS, "net", "softnet_stat"), tmp_path / "net" / "softnet_stat")
    return [NetstatSource(PROCFS, page_size=4096), NetworkSource(str(tmp_path)),
            NetclassSource(SYSFS, EXCLUDE, procfs=PROCFS), MemorySource(PROCFS), LoadavgSource(PROCFS),
            DiskSource(PROCFS, NE_DISK_EXCLUDE, UDEV), OsInfoSource(PROCFS, rootfs=NODE_EXPORTER, sysfs=SYSFS),
            TimexSource(adjtimex=lambda: (0, {"offset": 0, "freq": 0, "maxerror": 0, "esterror": 0, "status": 0,
                                             "tai": 0}), sysfs=SYSFS)]


# node_exporter families new in issue 49 whose fixture files node_exporter ships (the golden file has every series)
GOLDEN_FAMILIES = (
    ["node_arp_entries", "node_entropy_available_bits", "node_entropy_pool_size_bits", "node_filefd_allocated",
     "node_filefd_maximum", "node_udp_queues", "node_memory_VmallocChunk_bytes", "node_os_version",
     "node_bonding_slaves", "node_bonding_active", "node_disk_info", "node_md_state", "node_md_disks",
     "node_md_disks_required", "node_time_clocksource_available_info", "node_time_clocksource_current_info"]
    + [f"node_softnet_{f}_total" for f in ("processed", "dropped", "times_squeezed")]
    + [f"node_nf_conntrack_stat_{f}" for f in ("found", "invalid", "ignore", "insert", "insert_failed", "drop",
                                                "early_drop", "search_restart")]
    + [f"node_netstat_{f}" for f in ("Ip6_InOctets", "Ip6_OutOctets", "Icmp6_InErrors", "Icmp6_InMsgs",
                                     "Icmp6_OutMsgs", "Udp6_InDatagrams", "Udp6_OutDatagrams", "Udp6_InErrors",
                                     "Udp6_NoPorts", "Udp6_RcvbufErrors", "Udp6_SndbufErrors", "UdpLite6_InErrors",
                                     "UdpLite_InErrors")]
    + [f"node_sockstat_{f}" for f in ("TCP6_inuse", "UDP6_inuse", "UDPLITE6_inuse", "RAW6_inuse", "FRAG6_inuse",
                                      "FRAG6_memory")]
    + [f"node_network_{f}" for f in ("address_assign_type", "device_id", "dormant", "flags", "iface_id",
                                     "iface_link", "iface_link_mode", "name_assign_type", "net_dev_group",
                                     "protocol_type", "transmit_queue_length")]
)
# teye family -> (node_exporter family, scale): byte families from node_exporter's blocks
SCALED = {"teye_md_size_bytes": ("node_md_blocks", 1024), "teye_md_synced_bytes": ("node_md_blocks_synced", 1024)}
# labels node_exporter's newer golden file has that node_exporter 1.5 (the one teye follows) has not
NEWER_LABELS = {"node_disk_info": ("rotational",)}


def test_every_new_family_equals_node_exporters_golden_output(node_exporter_golden, tmp_path):
    out = _exposition(_fixture_sources(tmp_path))
    inverse = {v: k for k, v in RENAMES.items()}
    checked = 0
    for fam in GOLDEN_FAMILIES + [ne for ne, _ in SCALED.values()]:
        gold = {}
        for (n, lbl), v in node_exporter_golden.items():
            if n == fam:
                gold[tuple(x for x in lbl if x[0] not in NEWER_LABELS.get(fam, ()))] = v
        assert gold, f"{fam}: not in the golden file"
        teye_fam, scale = next(((t, s) for t, (n, s) in SCALED.items() if n == fam), (inverse.get(fam), 1))
        assert teye_fam, f"{fam}: no teye family maps to it"
        mine = {lbl: v / scale for (n, lbl), v in out.items() if n == teye_fam}
        assert mine == gold, (fam, {k: (gold.get(k), mine.get(k)) for k in set(gold) | set(mine)
                                    if gold.get(k) != mine.get(k)})
        checked += len(gold)
    assert checked >= 280, checked   # 283 series of node_exporter's golden output


def test_md_arrays_by_hand():
    """Three arrays of the fixture read by hand: a degraded raid1 recovering, a raid0 (every member needed) and an
    inactive container of spares."""
    arrays = {a.device: a for a in DiskSource(PROCFS).collect().md.arrays}
    md6, md10, md219 = arrays["md6"], arrays["md10"], arrays["md219"]
    assert (md6.state, md6.required, md6.active, md6.failed, md6.spare, md6.synced) == \
        ("recovering", 2, 1, 1, 1, 16775552)
    assert (md10.state, md10.required, md10.active, md10.synced) == ("active", 2, 2, 314159265)
    assert (md219.state, md219.required, md219.active, md219.spare) == ("inactive", 0, 0, 3)


def test_no_mdstat_and_no_udev_database_leave_those_families_out(tmp_path):
    (tmp_path / "diskstats").write_text(" 259 0 nvme0n1 1 0 8 1 2 0 16 2 0 3 3\n")
    out = _exposition([DiskSource(str(tmp_path), None, str(tmp_path / "no-udev"))])
    assert not [n for n, _ in out if n.startswith("teye_md_")]
    assert {dict(lbl)["device"]: dict(lbl) for (n, lbl), _ in out.items() if n == "teye_disk_info"} == {
        "nvme0n1": {"device": "nvme0n1", "major": "259", "minor": "0", "path": "", "wwn": "", "model": "",
                    "serial": "", "revision": ""}}


# ---------------------------------------------------------------------------------------------------------------
# bad input

def _tree(tmp_path, *names):
    """A copy of the fixture /proc files ``names`` (relative paths)."""
    for n in names:
        dst = tmp_path / n
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.join(PROCFS, n), dst)
    return str(tmp_path)


NETSTAT_FILES = ("net/snmp", "net/netstat", "net/sockstat", "net/snmp6", "net/sockstat6", "net/stat/nf_conntrack",
                 "net/udp")


def test_a_host_without_ipv6_says_so_and_exports_the_rest(tmp_path):
    proc = _tree(tmp_path, "net/snmp", "net/netstat", "net/sockstat", "net/udp")
    out = _exposition([NetstatSource(proc, page_size=4096)])
    names = {n for n, _ in out}
    assert out[("teye_netstat_ipv6", ())] == 0
    assert not {n for n in names if "6_" in n or n.endswith("6_inuse") or "6_memory" in n}, names
    assert {dict(lbl)["ip"] for (n, lbl), _ in out.items() if n == "teye_udp_queues_bytes"} == {"v4"}
    assert out[("teye_netstat_Tcp_InSegs_total", ())] == 57252008          # the rest, exact
    assert ("teye_netstat_files_unreadable_total", (("file", "snmp6"),)) not in out   # absent is not garbled


@pytest.mark.parametrize("name,garbage,gone", [
    ("net/snmp6", "Ip6InReceives 12\nIp6InOctets\n", "teye_netstat_Ip6_InOctets_total"),
    ("net/sockstat6", "TCP6: inuse\n", "teye_sockstat_TCP6_inuse"),
    ("net/stat/nf_conntrack", "entries found\n00000001 0000zz00\n", "teye_nf_conntrack_stat_found_total"),
    ("net/udp", "  sl  local_address rem_address   st tx_queue rx_queue\n 0: 0:0 0:0 0A 0000001G\n",
     "teye_udp_queues_bytes"),
])
def test_a_garbled_optional_netstat_file_loses_only_its_families(tmp_path, name, garbage, gone):
    proc = _tree(tmp_path, *NETSTAT_FILES)
    (tmp_path / name).write_text(garbage)
    src = NetstatSource(proc, page_size=4096)
    src.collect()
    out = _exposition([src])
    key = os.path.basename(name).replace("nf_conntrack", "nf_conntrack_stat")
    assert out[("teye_netstat_files_unreadable_total", (("file", key),))] == 2   # counted each pass
    assert gone not in {n for n, _ in out}
    assert out[("teye_netstat_Tcp_InSegs_total", ())] == 57252008
    assert out[("teye_netstat_ipv6", ())] == 1   # a garbled snmp6 is still a kernel with IPv6


def test_a_fifo_in_place_of_proc_net_udp_is_refused_without_waiting(tmp_path):
    proc = _tree(tmp_path, "net/snmp", "net/netstat", "net/sockstat")
    os.mkfifo(tmp_path / "net" / "udp")   # opened without O_NONBLOCK, this read would wait for a writer forever
    done = []
    t = threading.Thread(target=lambda: done.append(_exposition([NetstatSource(proc, page_size=4096)])), daemon=True)
    t.start()
    t.join(10)
    assert done, "the netstat pass waited on a FIFO"
    out = done[0]
    assert out[("teye_netstat_files_unreadable_total", (("file", "udp"),))] == 1
    assert out[("teye_netstat_Tcp_InSegs_total", ())] == 57252008


@pytest.mark.parametrize("name,garbage,family", [
    ("sys/fs/file-nr", "1024 0\n", "teye_filefd_allocated"),
    ("sys/kernel/random/entropy_avail", "lots\n", "teye_entropy_available_bits"),
])
def test_garbled_kernel_tables_lose_only_their_families(tmp_path, name, garbage, family):
    proc = _tree(tmp_path, "loadavg", "sys/fs/file-nr", "sys/kernel/random/entropy_avail",
                 "sys/kernel/random/poolsize")
    (tmp_path / name).write_text(garbage)
    out = _exposition([LoadavgSource(proc)])
    assert family not in {n for n, _ in out}
    assert out[("teye_kernel_tables_unreadable_total", (("file", os.path.basename(name)),))] == 1
    assert out[("teye_entropy_pool_size_bits", ())] == 4096 and ("teye_load1", ()) in out


def test_garbled_softnet_arp_and_mdstat_lose_only_their_families(tmp_path):
    proc = _tree(tmp_path, "diskstats", "mdstat", "net/arp", "net/softnet_stat")
    shutil.copy(os.path.join(PROCFS.replace("node_exporter", "net_dev"), "net", "dev"), tmp_path / "net" / "dev")
    (tmp_path / "net" / "softnet_stat").write_text("0004 zz 0001\n")
    (tmp_path / "net" / "arp").write_text("IP address HW type Flags HW address Mask Device\n10.0.0.1 0x1 0x2\n")
    (tmp_path / "mdstat").write_text("Personalities : [raid1]\nmd0 : rebuilding raid1 sda[0]\n      10 blocks\n")
    out = _exposition([NetworkSource(proc), NetclassSource(SYSFS, EXCLUDE, procfs=proc), DiskSource(proc)])
    names = {n for n, _ in out}
    assert out[("teye_softnet_unreadable_total", ())] == 1 and "teye_softnet_processed_total" not in names
    assert out[("teye_arp_unreadable_total", ())] == 1 and "teye_arp_entries" not in names
    assert out[("teye_md_unreadable_total", ())] == 1 and "teye_md_state" not in names
    assert "teye_network_receive_bytes_total" in names and "teye_disk_reads_completed_total" in names
    assert ("teye_network_iface_id", (("device", "eth0"),)) in out


def test_an_selinux_less_host_reads_not_enabled_and_an_selinux_host_its_modes(tmp_path):
    out = _exposition([OsInfoSource("/proc", rootfs=str(tmp_path), sysfs=str(tmp_path))])
    assert out[("teye_selinux_enabled", ())] == 0
    assert "teye_selinux_current_mode" not in {n for n, _ in out}
    out = _exposition([OsInfoSource("/proc", rootfs=SELINUX, sysfs=os.path.join(SELINUX, "sys"))])
    # config: SELINUX=permissive; enforce: 1 (an admin ran setenforce 1 since boot)
    assert (out[("teye_selinux_enabled", ())], out[("teye_selinux_config_mode", ())],
            out[("teye_selinux_current_mode", ())]) == (1, 0, 1)


def test_a_garbled_selinux_config_loses_only_the_configured_mode(tmp_path):
    shutil.copytree(SELINUX, tmp_path, dirs_exist_ok=True)
    (tmp_path / "etc" / "selinux" / "config").write_text("SELINUX=sometimes\n")
    out = _exposition([OsInfoSource("/proc", rootfs=str(tmp_path), sysfs=str(tmp_path / "sys"))])
    assert out[("teye_selinux_enabled", ())] == 1 and out[("teye_selinux_current_mode", ())] == 1
    assert "teye_selinux_config_mode" not in {n for n, _ in out}


def _net_tree(tmp_path):
    net = tmp_path / "class" / "net"
    for dev in ("eth0", "bond0"):
        shutil.copytree(os.path.realpath(os.path.join(SYSFS, "class", "net", dev)), net / dev)
    return str(tmp_path)


def test_an_interface_renamed_while_read_is_left_out_once_then_read_whole_under_its_new_name(tmp_path, monkeypatch):
    sysfs = _net_tree(tmp_path)
    clock = [1000.0]
    src = NetclassSource(sysfs, clock=lambda: clock[0], procfs=str(tmp_path))
    src.collect()   # both read whole, attributes cached
    real = netclass_mod.read_text
    net = tmp_path / "class" / "net"

    def renaming(path, *a, **k):   # udev renames eth0 to ens3 right after its operstate was read
        text = real(path, *a, **k)
        if path == str(net / "eth0" / "operstate"):
            os.rename(net / "eth0", net / "ens3")
        return text
    monkeypatch.setattr(netclass_mod, "read_text", renaming)
    r = src.collect()
    assert [d for d, _ in r.links] == ["bond0"] and r.vanished_total == 1
    monkeypatch.setattr(netclass_mod, "read_text", real)
    (net / "ens3" / "tx_queue_len").write_text("4000\n")   # read fresh under the new name, not from eth0's cache
    clock[0] += 1
    out = _exposition([src])
    assert out[("teye_network_transmit_queue_length", (("device", "ens3"),))] == 4000
    assert out[("teye_network_iface_id", (("device", "ens3"),))] == 2
    assert ("teye_network_iface_id", (("device", "eth0"),)) not in out
    assert out[("teye_network_interfaces_vanished_total", ())] == 1


def test_static_attributes_are_read_once_a_minute_and_at_once_when_the_link_changes(tmp_path):
    sysfs = _net_tree(tmp_path)
    clock = [1000.0]
    src = NetclassSource(sysfs, clock=lambda: clock[0], procfs=str(tmp_path))
    eth0 = tmp_path / "class" / "net" / "eth0"

    def qlen():
        return dict((d, link.attrs[-1]) for d, link in src.collect().links)["eth0"]
    assert qlen() == 1000
    (eth0 / "tx_queue_len").write_text("2000\n")
    clock[0] += 59.0
    assert qlen() == 1000                        # within the minute: the cached value
    clock[0] += 1.0
    assert qlen() == 2000                        # a minute on: read again
    (eth0 / "tx_queue_len").write_text("3000\n")
    (eth0 / "operstate").write_text("down\n")    # the link changed: read again at once
    clock[0] += 1.0
    assert qlen() == 3000


def test_bonding_masters_beside_the_interfaces_is_not_an_interface():
    r = NetclassSource(SYSFS, procfs=PROCFS).collect()
    assert "bonding_masters" not in {d for d, _ in r.links} and r.unreadable_total == 0


def test_softnet_labels_the_kernels_cpu_number_where_it_prints_one(tmp_path):
    """Kernels from 5.10 print the CPU's number (13th column); an offline CPU has no line, so the line's index is
    not the CPU: CPU 1 offline here, lines for 0, 2 and 3."""
    (tmp_path / "net").mkdir()
    shutil.copy(os.path.join(PROCFS.replace("node_exporter", "net_dev"), "net", "dev"), tmp_path / "net" / "dev")
    rows = [(0x10, 0, 1, 0), (0x20, 5, 2, 2), (0x30, 0, 3, 3)]   # processed, dropped, squeezed, cpu
    (tmp_path / "net" / "softnet_stat").write_text("".join(
        f"{p:08x} {d:08x} {s:08x} " + "00000000 " * 9 + f"{c:08x}\n" for p, d, s, c in rows))
    out = _exposition([NetworkSource(str(tmp_path))])
    assert {dict(lbl)["cpu"]: v for (n, lbl), v in out.items() if n == "teye_softnet_processed_total"} == \
        {"0": 16, "2": 32, "3": 48}
    assert out[("teye_softnet_dropped_total", (("cpu", "2"),))] == 5
