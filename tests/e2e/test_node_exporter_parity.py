"""node_exporter and teye side by side on this machine (issue 40): every family teye says it replaces
(docs/operations.md, "teye and node_exporter") has node_exporter's value, within the tolerance stated here
for values that move between the two reads.  Debian's prometheus-node-exporter is the oracle: it reads the
same kernel with its own code."""
from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from tests.conftest import parse_exposition
from tests.procs import Agent, free_port, http_get, wait_http

NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(NODE_EXPORTER is None, reason="Debian's prometheus-node-exporter (./dev.sh test "
                                                                "installs it)")]

TEXTFILE = """# HELP site_health_ok Site health check.
# TYPE site_health_ok gauge
site_health_ok{check="disk"} 1
site_health_ok{check="gpu"} 0
"""


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    d = tmp_path_factory.mktemp("textfile")
    (d / "site.prom").write_text(TEXTFILE)
    cfg = tmp_path_factory.mktemp("cfg") / "teye.yml"
    cfg.write_text(f"textfile:\n  directory: {d}\ncollectors:\n  filesystem:\n    interval_seconds: 1.0\n"
                   "  netstat:\n    interval_seconds: 1.0\n  vmstat:\n    interval_seconds: 1.0\n"
                   "  loadavg:\n    interval_seconds: 1.0\n  timex:\n    interval_seconds: 1.0\n")
    port = free_port()
    ne = subprocess.Popen([NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{port}",
                           f"--collector.textfile.directory={d}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    agent = Agent(["--config", str(cfg)])
    try:
        wait_http(f"http://127.0.0.1:{port}/metrics", proc=ne)
        time.sleep(2.5)  # every teye collector above has read at least twice

        def scrape():
            n1 = parse_exposition(http_get(f"http://127.0.0.1:{port}/metrics"))
            t = parse_exposition(agent.metrics())
            n2 = parse_exposition(http_get(f"http://127.0.0.1:{port}/metrics"))
            return n1, t, n2
        yield scrape
    finally:
        agent.stop()
        ne.terminate()
        ne.wait(10)


def _by(series, name, key=None):
    return {(dict(l).get(key) if key else None): v for (n, l), v in series.items() if n == name}


def test_exact_families(both):
    """Values that do not move while a test runs: equal."""
    n1, t, _ = both()
    pairs = [("node_memory_MemTotal_bytes", "teye_memory_total_bytes", None),
             ("node_memory_HugePages_Total", "teye_memory_huge_pages", None),
             ("node_memory_Hugepagesize_bytes", "teye_memory_huge_page_size_bytes", None),
             ("node_memory_CommitLimit_bytes", "teye_memory_commit_limit_bytes", None),
             ("node_vmstat_oom_kill", "teye_vmstat_oom_kill_total", None),
             ("node_vmstat_pswpin", "teye_vmstat_pswpin_total", None),
             ("node_network_mtu_bytes", "teye_network_mtu_bytes", "device"),
             ("node_network_up", "teye_network_up", "device"),
             ("node_network_carrier", "teye_network_carrier", "device"),
             ("node_network_speed_bytes", "teye_network_speed_bytes", "device"),
             ("node_network_carrier_changes_total", "teye_network_carrier_changes_total", "device"),
             ("node_filesystem_size_bytes", "teye_filesystem_size_bytes", "mountpoint"),
             ("node_filesystem_files", "teye_filesystem_files", "mountpoint"),
             ("node_filesystem_readonly", "teye_filesystem_readonly", "mountpoint"),
             ("node_timex_sync_status", "teye_timex_sync_status", None),
             ("node_timex_status", "teye_timex_status", None),
             ("node_timex_tai_offset_seconds", "teye_timex_tai_offset_seconds", None),
             ("node_nf_conntrack_entries_limit", "teye_nf_conntrack_entries_limit", None),
             ("node_netstat_Ip_Forwarding", "teye_netstat_Ip_Forwarding", None)]
    compared = 0
    for node, teye, key in pairs:
        a = _by(n1, node, key)
        if node == "node_network_speed_bytes":  # node_exporter says -125000 for "unknown" (-1 Mbit/s): absent here
            assert all(b_ not in _by(t, teye, key) for b_, v in a.items() if v < 0)
            a = {k: v for k, v in a.items() if v >= 0}
        b = _by(t, teye, key) if teye != "teye_memory_huge_pages" else {
            None: v for (n, l), v in t.items() if n == teye and dict(l)["state"] == "total"}
        if not a:
            continue  # node_exporter does not export it on this machine (e.g. no conntrack module)
        common = set(a) & set(b)
        assert common, (node, a, b)
        for k in common:
            assert b[k] == a[k], (node, k, a[k], b[k])
            compared += 1
    assert compared >= 15
    # the root filesystem is in both, with the same labels
    assert {dict(l)["mountpoint"] for (n, l) in n1 if n == "node_filesystem_size_bytes"} & \
        {dict(l)["mountpoint"] for (n, l) in t if n == "teye_filesystem_size_bytes"} >= {"/"}


def test_info_families_carry_the_same_labels(both):
    n1, t, _ = both()
    (ne_uname,) = [dict(l) for (n, l) in n1 if n == "node_uname_info"]
    (teye_uname,) = [dict(l) for (n, l) in t if n == "teye_uname_info"]
    assert teye_uname == ne_uname
    (ne_os,) = [dict(l) for (n, l) in n1 if n == "node_os_info"]
    (teye_os,) = [dict(l) for (n, l) in t if n == "teye_os_info"]
    assert {k: v for k, v in ne_os.items() if k in teye_os} == teye_os
    ne_info = {dict(l)["device"]: dict(l) for (n, l) in n1 if n == "node_network_info"}
    teye_info = {dict(l)["device"]: dict(l) for (n, l) in t if n == "teye_network_info"}
    assert set(ne_info) == set(teye_info)
    for dev, labels in teye_info.items():
        assert {k: ne_info[dev][k] for k in ("operstate", "duplex", "address")} == \
            {k: labels[k] for k in ("operstate", "duplex", "address")}, dev


def test_textfile_families_equal(both):
    n1, t, _ = both()
    a = {l: v for (n, l), v in n1.items() if n == "site_health_ok"}
    b = {l: v for (n, l), v in t.items() if n == "site_health_ok"}
    assert a == b and len(a) == 2
    assert _by(t, "teye_textfile_scrape_error")[None] == _by(n1, "node_textfile_scrape_error")[None] == 0
    assert _by(t, "teye_textfile_mtime_seconds", "file") == _by(n1, "node_textfile_mtime_seconds", "file")


# counters read by teye at most 1 s (its interval here) before node_exporter's first read or at most after its second
def test_moving_counters_lie_between_node_exporters_reads_within_a_second_of_traffic(both):
    n1, t, n2 = both()
    names = [("node_vmstat_pgfault", "teye_vmstat_pgfault_total"),
             ("node_vmstat_pgmajfault", "teye_vmstat_pgmajfault_total"),
             ("node_netstat_Tcp_InSegs", "teye_netstat_Tcp_InSegs_total"),
             ("node_netstat_Tcp_OutSegs", "teye_netstat_Tcp_OutSegs_total"),
             ("node_netstat_Tcp_ActiveOpens", "teye_netstat_Tcp_ActiveOpens_total"),
             ("node_netstat_TcpExt_ListenOverflows", "teye_netstat_TcpExt_ListenOverflows_total"),
             ("node_netstat_IpExt_InOctets", "teye_netstat_IpExt_InOctets_total")]
    for node, teye in names:
        lo, hi, v = _by(n1, node)[None], _by(n2, node)[None], _by(t, teye)[None]
        # teye's value is from its last read (at most ~1 s old): never above node_exporter's later read, and
        # below its earlier one by at most 5 % (a second of this machine's traffic)
        assert v <= hi and v >= lo - max(0.05 * lo, 1000), (node, lo, v, hi)


def test_moving_gauges_within_their_stated_tolerance(both):
    n1, t, n2 = both()
    # load averages move by at most a few hundredths a second on a quiet node; 0.5 on this shared 2-core VM
    for n in ("1", "5", "15"):
        assert abs(_by(t, f"teye_load{n}")[None] - _by(n1, f"node_load{n}")[None]) <= 0.5
    avail_ne = _by(n1, "node_filesystem_avail_bytes", "mountpoint")["/"]
    assert abs(_by(t, "teye_filesystem_avail_bytes", "mountpoint")["/"] - avail_ne) <= 1 << 30  # writes in flight
    assert abs(_by(t, "teye_memory_mlocked_bytes")[None] - _by(n1, "node_memory_Mlocked_bytes")[None]) <= 64 << 20
    assert abs(_by(t, "teye_timex_maxerror_seconds")[None] - _by(n1, "node_timex_maxerror_seconds")[None]) <= 0.01
    for f in ("TCP_inuse", "TCP_tw", "sockets_used"):
        assert abs(_by(t, f"teye_sockstat_{f}")[None] - _by(n1, f"node_sockstat_{f}")[None]) <= 200, f
