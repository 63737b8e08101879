"""How far node_exporter's and teye's values of one family may differ on this machine, and why: shared by
tests/e2e/test_node_exporter_parity.py and tests/e2e/test_node_exporter_mode.py (issue 49)."""
from __future__ import annotations

import re
import time

# Gauges that move between node_exporter's read and teye's (teye samples every second here, node_exporter at the
# scrape): family -> absolute tolerance.  Every other gauge must be equal.
MOVING = {
    "teye_load1": 0.5, "teye_load5": 0.5, "teye_load15": 0.5,
    "teye_filefd_allocated": 500, "teye_entropy_available_bits": 256,
    # the run queue moves by tens within a second on this shared machine (13 and 22 a second apart at load 17)
    "teye_procs_running": 64, "teye_procs_blocked": 16,
    "teye_udp_queues_bytes": 1 << 20, "teye_time_seconds": 5.0,
    "teye_timex_maxerror_seconds": 0.01, "teye_timex_estimated_error_seconds": 0.01,
    "teye_nf_conntrack_entries": 200, "teye_disk_io_in_progress": 8,
    "teye_sockstat_sockets_used": 200, "teye_sockstat_TCP_inuse": 200, "teye_sockstat_TCP_tw": 200,
    "teye_sockstat_TCP_alloc": 200, "teye_sockstat_TCP_orphan": 50, "teye_sockstat_TCP_mem": 1000,
    "teye_sockstat_TCP_mem_bytes": 4096 * 1000, "teye_sockstat_UDP_inuse": 50, "teye_sockstat_UDP_mem": 1000,
    "teye_sockstat_UDP_mem_bytes": 4096 * 1000, "teye_sockstat_TCP6_inuse": 50, "teye_sockstat_UDP6_inuse": 50,
    "teye_sockstat_RAW_inuse": 10, "teye_sockstat_RAW6_inuse": 10, "teye_netstat_Tcp_CurrEstab": 200,
    "teye_filesystem_avail_bytes": 1 << 30, "teye_filesystem_free_bytes": 1 << 30,
    "teye_filesystem_files_free": 100000, "teye_textfile_mtime_seconds": 0,
}
# memory moves by tens of MiB a second on this shared machine; sizes that are fixed stay exact
MEMORY_FIXED = {"teye_memory_total_bytes", "teye_memory_swap_total_bytes", "teye_memory_vmalloc_total_bytes",
                "teye_memory_huge_page_size_bytes", "teye_memory_commit_limit_bytes", "teye_memory_hugetlb_bytes",
                "teye_memory_direct_map_1g_bytes", "teye_memory_hardware_corrupted_bytes",
                "teye_memory_balloon_bytes", "teye_memory_bounce_bytes", "teye_memory_nfs_unstable_bytes",
                "teye_memory_vmalloc_chunk_bytes", "teye_memory_secondary_page_tables_bytes"}
MEMORY_TOLERANCE = 256 << 20
# Committed_AS jumps by hundreds of MiB when any process starts (its address-space reservations): seen 320 MiB
# between two reads a second apart while another test started Prometheus and two agents
MOVING["teye_memory_committed_as_bytes"] = 1 << 30
# series one exporter has and the other leaves out on purpose: (teye family, label, value) -> why
LEFT_OUT = {
    "lo": "Debian's node_exporter leaves loopback out of some netclass families; teye exports every interface",
    "zram": "teye's disk.exclude leaves zram devices (compressed RAM, not a disk) out; node_exporter 1.5 keeps them",
}


def left_out(lbl):
    return any(k == "device" and (v == "lo" or re.fullmatch(r"z?ram\d+", v)) for k, v in lbl)


def tolerance(name):
    if name in MOVING:
        return MOVING[name]
    if name.startswith("teye_memory_") and name not in MEMORY_FIXED:
        return MEMORY_TOLERANCE
    return 0.0


# families teye exports where this node_exporter (1.5, Debian) has no such series: a newer node_exporter's field, or
# one its netlink path leaves out
ABSENT_HERE_IN_NODE_EXPORTER = {
    "teye_textfile_mtime_seconds",             # compared in test_textfile_families_equal (the file's own path)
    "teye_netstat_TcpExt_TCPOFOQueue_total",   # not among node_exporter's default netstat fields (--collector.netstat.fields)
}


# teye samples every second here and serves its last sample; node_exporter reads at the scrape.  So node_exporter
# is read again and again over the second before teye's answer and once after it: teye's sample was taken inside
# that span, and each value's lowest and highest reading over it bound what teye may have seen (a value that
# moved 326 MiB in the second before one teye read while the parallel pass's other worker trained, stop 60:
# two reads around teye's answer did not bracket its sample, taken up to a second before them)
SAMPLE_SPAN_S = 1.2


def bracket(read_ne, read_teye, parse, span_s: float = SAMPLE_SPAN_S):
    """(lowest, teye's, highest): node_exporter's series, each at its lowest and its highest over the span of
    teye's sample, and teye's series (all parsed with ``parse``)."""
    reads = [parse(read_ne())]
    end = time.monotonic() + span_s
    while time.monotonic() < end:
        reads.append(parse(read_ne()))
    t = parse(read_teye())
    reads.append(parse(read_ne()))
    lo, hi = {}, {}
    for r in reads:
        for k, v in r.items():
            lo[k] = min(lo.get(k, v), v)
            hi[k] = max(hi.get(k, v), v)
    return lo, t, hi
