"""teye's host families and node_exporter's, in one map: the node_exporter mode (``host.node_exporter``).

Where a node keeps node_exporter (its other collectors, a site's habits), teye leaves the host to it and reads
its series: the collectors node_exporter's defaults cover are off (``COVERED``), those the communication cause
reads are sampled but not exported (``SAMPLED_NOT_EXPORTED``), and every PromQL expression teye ships that
reads a host family (the report's queries, the dashboards, the rules generated for this mode by
``deploy/prometheus/generate.py``) is rewritten through ``NODE_EXPORTER`` by :func:`to_node_exporter`.  One map,
so the report, the dashboards and the rules cannot disagree on a name.

Standard library only; pure functions (no room below or above is imported).
"""
from __future__ import annotations

import re
from typing import Dict

# Collectors whose families node_exporter's default collectors export (cpu/stat, meminfo, diskstats, pressure,
# loadavg, filesystem, textfile, hwmon/thermal_zone, edac, os/uname, timex, vmstat, netstat/sockstat/conntrack):
# off in the node_exporter mode unless the configuration turns one on explicitly.
COVERED = ("cpu", "memory", "disk", "pressure", "loadavg", "filesystem", "textfile", "hwmon", "edac", "os",
           "timex", "vmstat", "netstat")
# Covered too (netdev, netclass), but the communication cause of a job's verdict reads them: sampled, not exported.
SAMPLED_NOT_EXPORTED = ("network", "netclass")
# teye keeps these in the mode: infiniband and nfs (the report and the communication and input causes read
# teye's own; run node_exporter with --no-collector.infiniband --no-collector.nfs --no-collector.nfsd), qdisc
# (off by default in node_exporter), and everything node_exporter has not (GPUs, PMU, phases, jobs, allocation).

# teye family -> node_exporter's, same labels (a rename).  Every family a shipped dashboard, rule or report query
# reads from the collectors above is here or in DERIVED (tests/deploy/test_node_exporter_mode.py checks it).
RENAMES: Dict[str, str] = {
    "teye_cpu_seconds_total": "node_cpu_seconds_total",
    "teye_memory_total_bytes": "node_memory_MemTotal_bytes",
    "teye_memory_available_bytes": "node_memory_MemAvailable_bytes",
    "teye_memory_free_bytes": "node_memory_MemFree_bytes",
    "teye_memory_cached_bytes": "node_memory_Cached_bytes",
    "teye_memory_buffers_bytes": "node_memory_Buffers_bytes",
    "teye_disk_read_bytes_total": "node_disk_read_bytes_total",
    "teye_disk_written_bytes_total": "node_disk_written_bytes_total",
    "teye_disk_reads_completed_total": "node_disk_reads_completed_total",
    "teye_disk_writes_completed_total": "node_disk_writes_completed_total",
    "teye_network_receive_bytes_total": "node_network_receive_bytes_total",
    "teye_network_transmit_bytes_total": "node_network_transmit_bytes_total",
    "teye_network_receive_packets_total": "node_network_receive_packets_total",
    "teye_network_transmit_packets_total": "node_network_transmit_packets_total",
    "teye_network_up": "node_network_up",
    "teye_network_carrier": "node_network_carrier",
    "teye_network_speed_bytes": "node_network_speed_bytes",
    "teye_network_mtu_bytes": "node_network_mtu_bytes",
    "teye_filesystem_size_bytes": "node_filesystem_size_bytes",
    "teye_filesystem_free_bytes": "node_filesystem_free_bytes",
    "teye_filesystem_avail_bytes": "node_filesystem_avail_bytes",
    "teye_filesystem_files": "node_filesystem_files",
    "teye_filesystem_files_free": "node_filesystem_files_free",
    "teye_filesystem_readonly": "node_filesystem_readonly",
    "teye_filesystem_device_error": "node_filesystem_device_error",
    "teye_timex_sync_status": "node_timex_sync_status",
    "teye_timex_offset_seconds": "node_timex_offset_seconds",
    "teye_timex_maxerror_seconds": "node_timex_maxerror_seconds",
    "teye_vmstat_oom_kill_total": "node_vmstat_oom_kill",
    "teye_edac_correctable_errors_total": "node_edac_correctable_errors_total",
    "teye_edac_uncorrectable_errors_total": "node_edac_uncorrectable_errors_total",
    "teye_load1": "node_load1",
    "teye_load5": "node_load5",
    "teye_load15": "node_load15",
    # node-mixin's alerts (deploy/prometheus/rules/teye-host.yml, group teye-node-mixin)
    "teye_network_receive_errors_total": "node_network_receive_errs_total",
    "teye_network_transmit_errors_total": "node_network_transmit_errs_total",
    "teye_nf_conntrack_entries": "node_nf_conntrack_entries",
    "teye_nf_conntrack_entries_limit": "node_nf_conntrack_entries_limit",
    "teye_textfile_scrape_error": "node_textfile_scrape_error",
    "teye_disk_io_time_weighted_seconds_total": "node_disk_io_time_weighted_seconds_total",
    "teye_vmstat_pgmajfault_total": "node_vmstat_pgmajfault",
    "teye_filefd_allocated": "node_filefd_allocated",
    "teye_filefd_maximum": "node_filefd_maximum",
    "teye_md_disks": "node_md_disks",
    "teye_md_disks_required": "node_md_disks_required",
    "teye_md_state": "node_md_state",
    "teye_bonding_slaves": "node_bonding_slaves",
    "teye_bonding_active": "node_bonding_active",
    # node_exporter's systemd collector is off by default there too (--collector.systemd)
    "teye_systemd_unit_state": "node_systemd_unit_state",
}
# teye family -> a node_exporter expression, ``{m}`` where the selector's matchers go (with a leading comma when
# there are any: ``{mode="idle"{m}}``).  No teye family has an exact node_exporter name here.
DERIVED: Dict[str, str] = {
    # MemTotal - MemAvailable, as teye computes it
    "teye_memory_used_bytes": "(node_memory_MemTotal_bytes{{{m0}}} - node_memory_MemAvailable_bytes{{{m0}}})",
    # the CPUs listed in /proc/stat: node_exporter has one idle series per CPU
    "teye_cpus": 'count without (cpu, mode) (node_cpu_seconds_total{{mode="idle"{m}}})',
}

# a selector: a teye family name, its optional {matchers} (no braces inside quotes in what teye ships) and its
# optional [range] or [range:step] (the latter a subquery already)
_SELECTOR = re.compile(r"(?<![A-Za-z0-9_:])(teye_[A-Za-z0-9_]+)(\{[^{}]*\})?(\[[^\]]*\])?")


def _matchers(braces: str) -> str:
    inner = (braces or "{}")[1:-1].strip().rstrip(",").strip()
    return inner


def to_node_exporter(expr: str) -> str:
    """``expr`` with every teye host family in ``RENAMES``/``DERIVED`` replaced by node_exporter's; other
    families (GPU, phases, recording rules' teye:... names) are left alone.  A derived family under a range
    selector becomes a subquery (``[5m]`` -> ``[5m:]``)."""
    def sub(m: "re.Match") -> str:
        name, braces, rng = m.group(1), m.group(2) or "", m.group(3) or ""
        if name in RENAMES:
            return RENAMES[name] + braces + rng
        if name in DERIVED:
            inner = _matchers(braces)
            body = DERIVED[name].format(m0=inner, m=("," + inner) if inner else "")
            if rng and ":" not in rng:
                rng = rng[:-1] + ":]"
            return body + rng
        return m.group(0)
    return _SELECTOR.sub(sub, expr)


def families_read(expr: str) -> set:
    """The teye families an expression reads (selector names; recording-rule names ``teye:...`` excluded)."""
    return {m.group(1) for m in _SELECTOR.finditer(expr)}


def either(expr: str, on: str = "instance") -> str:
    """``expr`` or, where teye exports no such host series (the node_exporter mode), node_exporter's:
    ``(expr) or on (<on>) (to_node_exporter(expr))``.  ``expr`` must aggregate to the ``on`` labels (a node
    with both exporters then counts once, teye's).  Unchanged when it reads no mapped family."""
    ne = to_node_exporter(expr)
    if ne == expr:
        return expr
    return f"({expr}) or on ({on}) ({ne})"
