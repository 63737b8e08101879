"""teye's host families and node_exporter's, in one map: the node_exporter mode (``host.node_exporter``).

Where a node keeps node_exporter (its other collectors, a site's habits), teye leaves the host to it and reads
its series: the collectors node_exporter's defaults cover are off (``COVERED``), those the communication cause
reads are sampled but not exported (``SAMPLED_NOT_EXPORTED``), and every PromQL expression teye ships that
reads a host family (the report's queries, the dashboards, the rules generated for this mode by
``deploy/prometheus/generate.py``) is rewritten through ``NODE_EXPORTER`` by :func:`to_node_exporter`.  One map,
so the report, the dashboards and the rules cannot disagree on a name.

``EQUIVALENTS`` and ``NOT_EXPORTED`` account for the rest of node_exporter's families: an equivalent that is not
a plain rename, or the reason teye has none (docs/metrics.md prints both; tests/e2e/test_node_exporter_parity.py
fails on a family node_exporter exports that none of the three maps names).

Standard library only; pure functions (no room below or above is imported).
"""
from __future__ import annotations

import re
from typing import Dict, Tuple

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
    # issue 49: the rest of node_exporter's default families on a Linux GPU node, same values and labels
    "teye_memory_active_bytes": "node_memory_Active_bytes",
    "teye_memory_inactive_bytes": "node_memory_Inactive_bytes",
    "teye_memory_active_anon_bytes": "node_memory_Active_anon_bytes",
    "teye_memory_inactive_anon_bytes": "node_memory_Inactive_anon_bytes",
    "teye_memory_active_file_bytes": "node_memory_Active_file_bytes",
    "teye_memory_inactive_file_bytes": "node_memory_Inactive_file_bytes",
    "teye_memory_unevictable_bytes": "node_memory_Unevictable_bytes",
    "teye_memory_mlocked_bytes": "node_memory_Mlocked_bytes",
    "teye_memory_anon_pages_bytes": "node_memory_AnonPages_bytes",
    "teye_memory_mapped_bytes": "node_memory_Mapped_bytes",
    "teye_memory_slab_bytes": "node_memory_Slab_bytes",
    "teye_memory_slab_unreclaimable_bytes": "node_memory_SUnreclaim_bytes",
    "teye_memory_kernel_stack_bytes": "node_memory_KernelStack_bytes",
    "teye_memory_page_tables_bytes": "node_memory_PageTables_bytes",
    "teye_memory_commit_limit_bytes": "node_memory_CommitLimit_bytes",
    "teye_memory_committed_as_bytes": "node_memory_Committed_AS_bytes",
    "teye_memory_vmalloc_total_bytes": "node_memory_VmallocTotal_bytes",
    "teye_memory_vmalloc_used_bytes": "node_memory_VmallocUsed_bytes",
    "teye_memory_hardware_corrupted_bytes": "node_memory_HardwareCorrupted_bytes",
    "teye_memory_anon_huge_pages_bytes": "node_memory_AnonHugePages_bytes",
    "teye_memory_shmem_huge_pages_bytes": "node_memory_ShmemHugePages_bytes",
    "teye_memory_hugetlb_bytes": "node_memory_Hugetlb_bytes",
    "teye_memory_huge_page_size_bytes": "node_memory_Hugepagesize_bytes",
    "teye_memory_nfs_unstable_bytes": "node_memory_NFS_Unstable_bytes",
    "teye_memory_bounce_bytes": "node_memory_Bounce_bytes",
    "teye_memory_writeback_tmp_bytes": "node_memory_WritebackTmp_bytes",
    "teye_memory_percpu_bytes": "node_memory_Percpu_bytes",
    "teye_memory_direct_map_4k_bytes": "node_memory_DirectMap4k_bytes",
    "teye_memory_direct_map_2m_bytes": "node_memory_DirectMap2M_bytes",
    "teye_memory_direct_map_1g_bytes": "node_memory_DirectMap1G_bytes",
    "teye_memory_kernel_reclaimable_bytes": "node_memory_KReclaimable_bytes",
    "teye_memory_zswap_bytes": "node_memory_Zswap_bytes",
    "teye_memory_zswapped_bytes": "node_memory_Zswapped_bytes",
    "teye_memory_balloon_bytes": "node_memory_Balloon_bytes",
    "teye_memory_file_huge_pages_bytes": "node_memory_FileHugePages_bytes",
    "teye_memory_file_pmd_mapped_bytes": "node_memory_FilePmdMapped_bytes",
    "teye_memory_shmem_pmd_mapped_bytes": "node_memory_ShmemPmdMapped_bytes",
    "teye_memory_secondary_page_tables_bytes": "node_memory_SecPageTables_bytes",
    "teye_memory_vmalloc_chunk_bytes": "node_memory_VmallocChunk_bytes",
    "teye_memory_shmem_bytes": "node_memory_Shmem_bytes",
    "teye_memory_slab_reclaimable_bytes": "node_memory_SReclaimable_bytes",
    "teye_memory_dirty_bytes": "node_memory_Dirty_bytes",
    "teye_memory_writeback_bytes": "node_memory_Writeback_bytes",
    "teye_memory_swap_total_bytes": "node_memory_SwapTotal_bytes",
    "teye_memory_swap_free_bytes": "node_memory_SwapFree_bytes",
    "teye_memory_swap_cached_bytes": "node_memory_SwapCached_bytes",
    "teye_netstat_Ip_Forwarding": "node_netstat_Ip_Forwarding",
    "teye_netstat_Icmp_InErrors_total": "node_netstat_Icmp_InErrors",
    "teye_netstat_Icmp_InMsgs_total": "node_netstat_Icmp_InMsgs",
    "teye_netstat_Icmp_OutMsgs_total": "node_netstat_Icmp_OutMsgs",
    "teye_netstat_Tcp_ActiveOpens_total": "node_netstat_Tcp_ActiveOpens",
    "teye_netstat_Tcp_PassiveOpens_total": "node_netstat_Tcp_PassiveOpens",
    "teye_netstat_Tcp_CurrEstab": "node_netstat_Tcp_CurrEstab",
    "teye_netstat_Tcp_InErrs_total": "node_netstat_Tcp_InErrs",
    "teye_netstat_Tcp_InSegs_total": "node_netstat_Tcp_InSegs",
    "teye_netstat_Tcp_OutSegs_total": "node_netstat_Tcp_OutSegs",
    "teye_netstat_Tcp_OutRsts_total": "node_netstat_Tcp_OutRsts",
    "teye_netstat_Tcp_RetransSegs_total": "node_netstat_Tcp_RetransSegs",
    "teye_netstat_Udp_InDatagrams_total": "node_netstat_Udp_InDatagrams",
    "teye_netstat_Udp_OutDatagrams_total": "node_netstat_Udp_OutDatagrams",
    "teye_netstat_Udp_InErrors_total": "node_netstat_Udp_InErrors",
    "teye_netstat_Udp_NoPorts_total": "node_netstat_Udp_NoPorts",
    "teye_netstat_Udp_RcvbufErrors_total": "node_netstat_Udp_RcvbufErrors",
    "teye_netstat_Udp_SndbufErrors_total": "node_netstat_Udp_SndbufErrors",
    "teye_netstat_IpExt_InOctets_total": "node_netstat_IpExt_InOctets",
    "teye_netstat_IpExt_OutOctets_total": "node_netstat_IpExt_OutOctets",
    "teye_netstat_TcpExt_ListenDrops_total": "node_netstat_TcpExt_ListenDrops",
    "teye_netstat_TcpExt_ListenOverflows_total": "node_netstat_TcpExt_ListenOverflows",
    "teye_netstat_TcpExt_SyncookiesFailed_total": "node_netstat_TcpExt_SyncookiesFailed",
    "teye_netstat_TcpExt_SyncookiesRecv_total": "node_netstat_TcpExt_SyncookiesRecv",
    "teye_netstat_TcpExt_SyncookiesSent_total": "node_netstat_TcpExt_SyncookiesSent",
    "teye_netstat_TcpExt_TCPSynRetrans_total": "node_netstat_TcpExt_TCPSynRetrans",
    "teye_netstat_TcpExt_TCPTimeouts_total": "node_netstat_TcpExt_TCPTimeouts",
    "teye_netstat_TcpExt_TCPOFOQueue_total": "node_netstat_TcpExt_TCPOFOQueue",
    "teye_netstat_UdpLite_InErrors_total": "node_netstat_UdpLite_InErrors",
    "teye_netstat_Ip6_InOctets_total": "node_netstat_Ip6_InOctets",
    "teye_netstat_Ip6_OutOctets_total": "node_netstat_Ip6_OutOctets",
    "teye_netstat_Icmp6_InErrors_total": "node_netstat_Icmp6_InErrors",
    "teye_netstat_Icmp6_InMsgs_total": "node_netstat_Icmp6_InMsgs",
    "teye_netstat_Icmp6_OutMsgs_total": "node_netstat_Icmp6_OutMsgs",
    "teye_netstat_Udp6_InDatagrams_total": "node_netstat_Udp6_InDatagrams",
    "teye_netstat_Udp6_OutDatagrams_total": "node_netstat_Udp6_OutDatagrams",
    "teye_netstat_Udp6_InErrors_total": "node_netstat_Udp6_InErrors",
    "teye_netstat_Udp6_NoPorts_total": "node_netstat_Udp6_NoPorts",
    "teye_netstat_Udp6_RcvbufErrors_total": "node_netstat_Udp6_RcvbufErrors",
    "teye_netstat_Udp6_SndbufErrors_total": "node_netstat_Udp6_SndbufErrors",
    "teye_netstat_UdpLite6_InErrors_total": "node_netstat_UdpLite6_InErrors",
    "teye_sockstat_sockets_used": "node_sockstat_sockets_used",
    "teye_sockstat_TCP_inuse": "node_sockstat_TCP_inuse",
    "teye_sockstat_TCP_orphan": "node_sockstat_TCP_orphan",
    "teye_sockstat_TCP_tw": "node_sockstat_TCP_tw",
    "teye_sockstat_TCP_alloc": "node_sockstat_TCP_alloc",
    "teye_sockstat_TCP_mem": "node_sockstat_TCP_mem",
    "teye_sockstat_UDP_inuse": "node_sockstat_UDP_inuse",
    "teye_sockstat_UDP_mem": "node_sockstat_UDP_mem",
    "teye_sockstat_UDPLITE_inuse": "node_sockstat_UDPLITE_inuse",
    "teye_sockstat_RAW_inuse": "node_sockstat_RAW_inuse",
    "teye_sockstat_FRAG_inuse": "node_sockstat_FRAG_inuse",
    "teye_sockstat_FRAG_memory": "node_sockstat_FRAG_memory",
    "teye_sockstat_TCP6_inuse": "node_sockstat_TCP6_inuse",
    "teye_sockstat_UDP6_inuse": "node_sockstat_UDP6_inuse",
    "teye_sockstat_UDPLITE6_inuse": "node_sockstat_UDPLITE6_inuse",
    "teye_sockstat_RAW6_inuse": "node_sockstat_RAW6_inuse",
    "teye_sockstat_FRAG6_inuse": "node_sockstat_FRAG6_inuse",
    "teye_sockstat_FRAG6_memory": "node_sockstat_FRAG6_memory",
    "teye_sockstat_TCP_mem_bytes": "node_sockstat_TCP_mem_bytes",
    "teye_sockstat_UDP_mem_bytes": "node_sockstat_UDP_mem_bytes",
    "teye_nf_conntrack_entries": "node_nf_conntrack_entries",
    "teye_nf_conntrack_entries_limit": "node_nf_conntrack_entries_limit",
    "teye_nf_conntrack_stat_found_total": "node_nf_conntrack_stat_found",
    "teye_nf_conntrack_stat_invalid_total": "node_nf_conntrack_stat_invalid",
    "teye_nf_conntrack_stat_ignore_total": "node_nf_conntrack_stat_ignore",
    "teye_nf_conntrack_stat_insert_total": "node_nf_conntrack_stat_insert",
    "teye_nf_conntrack_stat_insert_failed_total": "node_nf_conntrack_stat_insert_failed",
    "teye_nf_conntrack_stat_drop_total": "node_nf_conntrack_stat_drop",
    "teye_nf_conntrack_stat_early_drop_total": "node_nf_conntrack_stat_early_drop",
    "teye_nf_conntrack_stat_search_restart_total": "node_nf_conntrack_stat_search_restart",
    "teye_udp_queues_bytes": "node_udp_queues",
    "teye_softnet_processed_total": "node_softnet_processed_total",
    "teye_softnet_dropped_total": "node_softnet_dropped_total",
    "teye_softnet_times_squeezed_total": "node_softnet_times_squeezed_total",
    "teye_network_receive_errors_total": "node_network_receive_errs_total",
    "teye_network_receive_drops_total": "node_network_receive_drop_total",
    "teye_network_receive_fifo_errors_total": "node_network_receive_fifo_total",
    "teye_network_receive_frame_errors_total": "node_network_receive_frame_total",
    "teye_network_receive_compressed_total": "node_network_receive_compressed_total",
    "teye_network_receive_multicast_total": "node_network_receive_multicast_total",
    "teye_network_transmit_errors_total": "node_network_transmit_errs_total",
    "teye_network_transmit_drops_total": "node_network_transmit_drop_total",
    "teye_network_transmit_fifo_errors_total": "node_network_transmit_fifo_total",
    "teye_network_transmit_collisions_total": "node_network_transmit_colls_total",
    "teye_network_transmit_carrier_errors_total": "node_network_transmit_carrier_total",
    "teye_network_transmit_compressed_total": "node_network_transmit_compressed_total",
    "teye_network_receive_nohandler_total": "node_network_receive_nohandler_total",
    "teye_network_address_assign_type": "node_network_address_assign_type",
    "teye_network_device_id": "node_network_device_id",
    "teye_network_dormant": "node_network_dormant",
    "teye_network_flags": "node_network_flags",
    "teye_network_iface_id": "node_network_iface_id",
    "teye_network_iface_link": "node_network_iface_link",
    "teye_network_iface_link_mode": "node_network_iface_link_mode",
    "teye_network_name_assign_type": "node_network_name_assign_type",
    "teye_network_net_dev_group": "node_network_net_dev_group",
    "teye_network_protocol_type": "node_network_protocol_type",
    "teye_network_transmit_queue_length": "node_network_transmit_queue_length",
    "teye_network_carrier_changes_total": "node_network_carrier_changes_total",
    "teye_network_carrier_up_changes_total": "node_network_carrier_up_changes_total",
    "teye_network_carrier_down_changes_total": "node_network_carrier_down_changes_total",
    "teye_arp_entries": "node_arp_entries",
    "teye_bonding_slaves": "node_bonding_slaves",
    "teye_bonding_active": "node_bonding_active",
    "teye_disk_reads_merged_total": "node_disk_reads_merged_total",
    "teye_disk_writes_merged_total": "node_disk_writes_merged_total",
    "teye_disk_read_time_seconds_total": "node_disk_read_time_seconds_total",
    "teye_disk_write_time_seconds_total": "node_disk_write_time_seconds_total",
    "teye_disk_io_time_seconds_total": "node_disk_io_time_seconds_total",
    "teye_disk_io_time_weighted_seconds_total": "node_disk_io_time_weighted_seconds_total",
    "teye_disk_io_in_progress": "node_disk_io_now",
    "teye_disk_discards_completed_total": "node_disk_discards_completed_total",
    "teye_disk_discards_merged_total": "node_disk_discards_merged_total",
    "teye_disk_discard_time_seconds_total": "node_disk_discard_time_seconds_total",
    "teye_disk_flush_requests_total": "node_disk_flush_requests_total",
    "teye_disk_flush_time_seconds_total": "node_disk_flush_requests_time_seconds_total",
    "teye_disk_info": "node_disk_info",
    "teye_md_state": "node_md_state",
    "teye_md_disks": "node_md_disks",
    "teye_md_disks_required": "node_md_disks_required",
    # node_exporter's systemd collector is off by default there too (--collector.systemd); node-mixin's
    # TeyeSystemdServiceFailed reads it in both modes
    "teye_systemd_unit_state": "node_systemd_unit_state",
    "teye_timex_estimated_error_seconds": "node_timex_estimated_error_seconds",
    "teye_timex_tai_offset_seconds": "node_timex_tai_offset_seconds",
    "teye_timex_loop_time_constant": "node_timex_loop_time_constant",
    "teye_timex_tick_seconds": "node_timex_tick_seconds",
    "teye_timex_pps_frequency_hertz": "node_timex_pps_frequency_hertz",
    "teye_timex_pps_jitter_seconds": "node_timex_pps_jitter_seconds",
    "teye_timex_pps_shift_seconds": "node_timex_pps_shift_seconds",
    "teye_timex_pps_stability_hertz": "node_timex_pps_stability_hertz",
    "teye_timex_pps_jitter_total": "node_timex_pps_jitter_total",
    "teye_timex_pps_calibration_total": "node_timex_pps_calibration_total",
    "teye_timex_pps_error_total": "node_timex_pps_error_total",
    "teye_timex_pps_stability_exceeded_total": "node_timex_pps_stability_exceeded_total",
    "teye_timex_status": "node_timex_status",
    "teye_time_clocksource_available_info": "node_time_clocksource_available_info",
    "teye_time_clocksource_current_info": "node_time_clocksource_current_info",
    "teye_time_zone_offset_seconds": "node_time_zone_offset_seconds",
    "teye_time_seconds": "node_time_seconds",
    "teye_os_info": "node_os_info",
    "teye_os_version": "node_os_version",
    "teye_uname_info": "node_uname_info",
    "teye_selinux_enabled": "node_selinux_enabled",
    "teye_selinux_config_mode": "node_selinux_config_mode",
    "teye_selinux_current_mode": "node_selinux_current_mode",
    "teye_filefd_allocated": "node_filefd_allocated",
    "teye_filefd_maximum": "node_filefd_maximum",
    "teye_entropy_available_bits": "node_entropy_available_bits",
    "teye_entropy_pool_size_bits": "node_entropy_pool_size_bits",
    "teye_boot_time_seconds": "node_boot_time_seconds",
    "teye_context_switches_total": "node_context_switches_total",
    "teye_forks_total": "node_forks_total",
    "teye_interrupts_total": "node_intr_total",
    "teye_procs_running": "node_procs_running",
    "teye_procs_blocked": "node_procs_blocked",
    "teye_vmstat_pgfault_total": "node_vmstat_pgfault",
    "teye_vmstat_pgmajfault_total": "node_vmstat_pgmajfault",
    "teye_vmstat_pgpgin_total": "node_vmstat_pgpgin",
    "teye_vmstat_pgpgout_total": "node_vmstat_pgpgout",
    "teye_vmstat_pswpin_total": "node_vmstat_pswpin",
    "teye_vmstat_pswpout_total": "node_vmstat_pswpout",
    "teye_textfile_scrape_error": "node_textfile_scrape_error",
    "teye_textfile_mtime_seconds": "node_textfile_mtime_seconds",
}
# teye family -> a node_exporter expression, ``{m}`` where the selector's matchers go (with a leading comma when
# there are any: ``{mode="idle"{m}}``).  No teye family has an exact node_exporter name here.
DERIVED: Dict[str, str] = {
    # MemTotal - MemAvailable, as teye computes it
    "teye_memory_used_bytes": "(node_memory_MemTotal_bytes{{{m0}}} - node_memory_MemAvailable_bytes{{{m0}}})",
    # the CPUs listed in /proc/stat: node_exporter has one idle series per CPU
    "teye_cpus": 'count without (cpu, mode) (node_cpu_seconds_total{{mode="idle"{m}}})',
    # sectors and 1 KiB blocks as bytes; node_exporter's frequency ratio is 1 + teye's (the multiplier)
    "teye_disk_discarded_bytes_total": "(node_disk_discarded_sectors_total{{{m0}}} * 512)",
    "teye_md_size_bytes": "(node_md_blocks{{{m0}}} * 1024)",
    "teye_md_synced_bytes": "(node_md_blocks_synced{{{m0}}} * 1024)",
    "teye_timex_frequency_adjustment_ratio": "(node_timex_frequency_adjustment_ratio{{{m0}}} - 1)",
}

# node_exporter families (1.5, the default collectors and mdadm, bonding, systemd) whose teye equivalent is not a
# plain rename (a key ending in "_" is a prefix: every family under it): node_exporter family -> teye's, in words (docs/metrics.md prints this map;
# tests/e2e/test_node_exporter_parity.py compares the values)
EQUIVALENTS: Dict[str, str] = {
    "node_memory_HugePages_Total": 'teye_memory_huge_pages{state="total"}',
    "node_memory_HugePages_Free": 'teye_memory_huge_pages{state="free"}',
    "node_memory_HugePages_Rsvd": 'teye_memory_huge_pages{state="reserved"}',
    "node_memory_HugePages_Surp": 'teye_memory_huge_pages{state="surplus"}',
    "node_cpu_guest_seconds_total": 'teye_cpu_guest_seconds_total{cpu,mode}: mode "guest" is node_exporter\'s "user", '
                                    '"guest_nice" its "nice"',
    "node_pressure_cpu_waiting_seconds_total": 'teye_pressure_stalled_seconds_total{resource="cpu",kind="some"}',
    "node_pressure_memory_waiting_seconds_total":
        'teye_pressure_stalled_seconds_total{resource="memory",kind="some"}',
    "node_pressure_memory_stalled_seconds_total":
        'teye_pressure_stalled_seconds_total{resource="memory",kind="full"}',
    "node_pressure_io_waiting_seconds_total": 'teye_pressure_stalled_seconds_total{resource="io",kind="some"}',
    "node_pressure_io_stalled_seconds_total": 'teye_pressure_stalled_seconds_total{resource="io",kind="full"}',
    "node_pressure_irq_stalled_seconds_total": 'teye_pressure_stalled_seconds_total{resource="irq",kind="full"}',
    "node_disk_discarded_sectors_total": "teye_disk_discarded_bytes_total / 512",
    "node_md_blocks": "teye_md_size_bytes / 1024",
    "node_md_blocks_synced": "teye_md_synced_bytes / 1024",
    "node_timex_frequency_adjustment_ratio": "1 + teye_timex_frequency_adjustment_ratio",
    "node_network_info": "teye_network_info{device,operstate,duplex,address} (ifalias and broadcast left out)",
    "node_scrape_collector_success": "teye_collector_up{collector}",
    "node_scrape_collector_duration_seconds": "teye_collector_duration_seconds{collector} (the last background "
                                              "read, not the scrape)",
    "node_exporter_build_info": "teye_build_info{version}",
    "node_hwmon_power_average_watt": "teye_hwmon_power_watts{chip,sensor}",
    "node_hwmon_chip_names": "teye_hwmon_chip_info{chip,chip_name}",
    "node_thermal_zone_temp": "teye_thermal_zone_temp_celsius{zone,type}",
    "node_infiniband_": "teye_infiniband_* (docs/metrics.md): per port, labels device and port, data counters "
                        "in bytes",
    "node_nfs_": "teye_nfs_* (the NFS client: /proc/net/rpc/nfs and per mount from mountstats)",
    "node_nfsd_": "teye_nfsd_* (the NFS server)",
    "node_edac_": "teye_edac_*, the same names and labels",
    "node_hwmon_": "teye_hwmon_{temp_celsius,temp_crit_celsius,temp_max_celsius,fan_rpm,in_volts}{chip,sensor}",
    "process_cpu_seconds_total": "process_cpu_seconds_total (teye's own process)",
    "process_max_fds": "process_max_fds", "process_open_fds": "process_open_fds",
    "process_resident_memory_bytes": "process_resident_memory_bytes",
    "process_start_time_seconds": "process_start_time_seconds",
    "process_virtual_memory_bytes": "process_virtual_memory_bytes",
}

# node_exporter families (or family prefixes, ending in "_") teye does not export, with the reason: one line each.
NOT_EXPORTED: Dict[str, str] = {
    "go_": "the Go runtime of node_exporter's own process; teye is Python (its process_* families describe it)",
    "promhttp_": "node_exporter's HTTP handler counters; teye's are teye_web_requests_total{path,code} and "
                 "teye_web_* (docs/operations.md)",
    "process_virtual_memory_max_bytes": "client_python's process collector, whose families teye's process_* "
                                        "follow, has none (RLIMIT_AS is unlimited on nodes)",
    "node_softnet_backlog_len": "a newer node_exporter's (not 1.5's): one more series a CPU for a gauge "
                                "that is 0 but for a moment",
    "node_softnet_cpu_collision_total": "a newer node_exporter's (not 1.5's): transmit lock collisions, a "
                                        "counter that stays 0 on current kernels (lockless queues)",
    "node_softnet_received_rps_total": "a newer node_exporter's (not 1.5's): RPS is off on GPU nodes' NICs "
                                       "by default",
    "node_softnet_flow_limit_count_total": "a newer node_exporter's (not 1.5's): flow limits are off by default",
    "node_md_degraded": "a newer node_exporter's sysfs reading; teye_md_disks_required - "
                        "teye_md_disks{state=\"active\"} says the same from /proc/mdstat",
    "node_md_raid_disks": "a newer node_exporter's sysfs reading; teye_md_disks_required is the same count",
    "node_disk_ata_": "udev's ATA properties (rotation rate, write cache): not on NVMe-only GPU nodes; "
                      "teye_disk_info carries the model to look them up",
    "node_disk_device_mapper_info": "udev's device-mapper names: teye_disk_info's device is the dm-N name",
    "node_disk_filesystem_info": "udev's filesystem properties: teye_filesystem_* carries fstype per mount",
    "node_schedstat_": "per-CPU scheduler run and wait times: teye_job_input_wait_cpu_ratio and "
                       "teye_pressure_stalled_seconds_total{resource=\"cpu\"} answer the question teye asks "
                       "(is the host CPU starved); keep node_exporter where you chart it per CPU",
    "node_cpu_frequency_": "cpufreq per CPU (3 series a CPU); not read: GPU jobs' CPU side is judged by "
                           "pressure and run-queue wait, not clocks",
    "node_cpu_scaling_": "cpufreq per CPU, as node_cpu_frequency_",
    "node_rapl_": "CPU package energy (RAPL): root-only on current kernels (CVE-2020-8694), and the GPU "
                  "energy teye_gpu_energy_joules_total is what a GPU node's power is spent on",
    "node_power_supply_": "power_supply class: batteries and AC adapters, none on servers",
    "node_xfs_": "XFS internals (per-device allocation and inode operations): keep node_exporter where "
                 "you chart them; teye_disk_* and teye_filesystem_* cover capacity and I/O",
    "node_zfs_": "ZFS kstats: keep node_exporter where you run ZFS",
    "node_btrfs_": "btrfs internals: keep node_exporter where you run btrfs",
    "node_bcache_": "bcache internals: not on GPU nodes",
    "node_fibrechannel_": "Fibre Channel HBAs: not on GPU nodes (teye_infiniband_* for the fabric they have)",
    "node_nvme_": "NVMe controller info (node_exporter 1.5 reads only model and state); teye_disk_info "
                  "carries model, serial and firmware revision",
    "node_tape_": "tape drives: not on GPU nodes",
    "node_cooling_device_": "thermal cooling devices' state: a fan curve, not a failure; teye_hwmon_fan_rpm",
    "node_watchdog_": "a newer node_exporter's",
    "node_dmi_info": "a newer node_exporter's (1.6+)",
    "node_ipvs_": "IPVS load balancers: not on GPU nodes",
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


def node_family_account(name: str) -> Tuple[str, str]:
    """Where a node_exporter family stands: ("rename", teye family), ("equivalent", words), ("not_exported", reason)
    or ("unmapped", "")."""
    inverse = {v: k for k, v in RENAMES.items()}
    if name in inverse:
        return "rename", inverse[name]
    for table, kind in ((EQUIVALENTS, "equivalent"), (NOT_EXPORTED, "not_exported")):
        if name in table:
            return kind, table[name]
        for key, text in table.items():
            if key.endswith("_") and name.startswith(key):
                return kind, text
    for teye_name, expr in DERIVED.items():
        if re.search(rf"(?<![A-Za-z0-9_:]){re.escape(name)}(?![A-Za-z0-9_:])", expr):
            return "equivalent", teye_name
    return "unmapped", ""


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
