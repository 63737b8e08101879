"""Node: the host (CPU, memory, disk, network, InfiniBand, NFS) and each of its GPUs."""
from __future__ import annotations

from agent.hostseries import either

from .common import (NODE, NODE_GPU, cluster_variable, dashboard, datasource_variable, gpu_variable, node_variable,
                     row, table, target, timeseries)

UID = "teye-node"
TITLE = "teye / Node"

RATE = "[$__rate_interval]"


def _rate(metric: str, sel: str = NODE) -> str:
    return f"rate({metric}{{{sel}}}{RATE})"


def _hardware_counters(d):
    """Host hardware counters (pmu collector, recording rules in deploy/prometheus/rules/teye-pmu.yml)."""
    d = d.with_row(row("Host hardware counters"))
    d = d.with_panel(timeseries(
        "Cycles per instruction", "CPI of the whole node and of its busiest CPUs over 5 minutes (perf cycles / "
        "instructions, system-wide). Around 0.3-1 is compute-bound code; several cycles per instruction mean "
        "the CPUs wait on memory. Empty on VMs without a virtual PMU: see `teye doctor`.",
        "none",
        [target(f"teye:node_cpi:ratio5m{{{NODE}}}", "node"),
         target(f"topk(8, teye:cpu_cpi:ratio5m{{{NODE}}})", "cpu {{cpu}}")],
        min=0))
    d = d.with_panel(timeseries(
        "Floating point by class", "Floating-point operations per second by precision and vector width (FMA "
        "counted as the vendor's event counts it). AMD's counter splits neither: one 'all/all' series.",
        "flops",
        [target(f"teye:node_floating_point_operations:rate5m{{{NODE}}}", "{{precision}} {{width}}")],
        stack=True, min=0))
    d = d.with_panel(timeseries(
        "Vectorization ratio", "Packed (128/256/512-bit) floating-point operations / all floating-point "
        "operations over 5 minutes. Low while a job decodes or augments on the CPU: the host code is scalar.",
        "percentunit",
        [target(f"teye:node_vectorization:ratio5m{{{NODE}}}", "packed share")],
        min=0, max=1))
    d = d.with_panel(timeseries(
        "Memory bandwidth", "DRAM bytes per second read and written per socket (memory-controller counters; "
        "AMD Zen 2/3 count both together: read+written). "
        "Near the platform's peak while GPUs idle in data_wait: the host, not storage, is the bottleneck.",
        "Bps",
        [target(f"teye:socket_memory_read_bytes:rate5m{{{NODE}}}", "socket {{socket}} read"),
         target(f"teye:socket_memory_written_bytes:rate5m{{{NODE}}}", "socket {{socket}} written"),
         target(f"teye:socket_memory_transferred_bytes:rate5m{{{NODE}}}", "socket {{socket}} read+written")],
        min=0))
    d = d.with_panel(timeseries(
        "PCIe bandwidth per root bus", "Bytes per second PCIe devices behind each root bus read from host "
        "memory (host to device) and wrote to it (device to host), from the IIO counters. The table next to "
        "it names the GPUs behind each root bus.",
        "Bps",
        [target(f"teye:root_bus_pcie_read_bytes:rate5m{{{NODE}}}", "{{root_bus}} read (host to device)"),
         target(f"teye:root_bus_pcie_written_bytes:rate5m{{{NODE}}}", "{{root_bus}} written (device to host)")],
        min=0))
    d = d.with_panel(table(
        "GPUs behind each root bus", "Each GPU's PCI address and the PCIe root bus it sits behind (the agent's "
        "PCI topology joined with teye_gpu_info), to read the PCIe panel per GPU.",
        "none",
        [target(f"teye:gpu_pcie_root_bus:info{{{NODE}}}", instant=True, fmt="table")],
        hide=("Time", "__name__", "job", "instance", "Value")))
    return d


def build():
    d = (dashboard(UID, TITLE, "One node as the teye agent sees it: host CPU, memory, disk, network, "
                   "InfiniBand and NFS, then every GPU's utilization, SM activity, memory, power, temperature, "
                   "clock-event reasons and PCIe traffic against the link maximum.")
         .with_variable(datasource_variable())
         .with_variable(cluster_variable())
         .with_variable(node_variable(multi=False))
         .with_variable(gpu_variable()))

    d = d.with_row(row("Host"))
    d = d.with_panel(timeseries(
        "CPU by mode", "Share of all CPUs' time in each mode (/proc/stat), stacked to 100 %. High iowait "
        "while a job is input-bound points at storage; high system or softirq at the network stack.",
        "percentunit",
        [target(either(f"sum by (mode) ({_rate('teye_cpu_seconds_total')})"
                       f" / on () group_left () count(count by (cpu) (teye_cpu_seconds_total{{{NODE}}}))", "cluster, mode"),
                "{{mode}}")],
        stack=True, min=0, max=1))
    d = d.with_panel(timeseries(
        "Memory", "Memory in use (total - available), page cache, buffers and what is still available "
        "(/proc/meminfo), against the total.",
        "bytes",
        [target(either(f"teye_memory_{m}_bytes{{{NODE}}}", "cluster, instance"), m)
         for m in ("used", "cached", "buffers", "available", "total")],
        min=0))
    d = d.with_panel(timeseries(
        "Disk throughput", "Bytes read from and written to each block device per second (/proc/diskstats, "
        "partitions excluded).",
        "Bps",
        [target(either(_rate("teye_disk_read_bytes_total"), "cluster, instance, device"), "{{device}} read"),
         target(either(_rate("teye_disk_written_bytes_total"), "cluster, instance, device"), "{{device}} written")],
        min=0))
    d = d.with_panel(timeseries(
        "Disk request size", "Mean bytes per completed read and write request of each block device over 5 "
        "minutes (recording rules in teye-recording.yml). Tens of KiB or less at a modest throughput: many "
        "small files or random reads; hundreds of KiB: streaming. Empty while a device is idle.",
        "bytes",
        [target(f"teye:disk_read_request_size_bytes:mean5m{{{NODE}}}", "{{device}} read"),
         target(f"teye:disk_write_request_size_bytes:mean5m{{{NODE}}}", "{{device}} write")],
        min=0))
    d = d.with_panel(timeseries(
        "Network throughput", "Bits received and transmitted per second on each interface except loopback "
        "(/proc/net/dev bytes x 8: links are rated in bits per second).",
        "bps",
        [target(either(_rate("teye_network_receive_bytes_total", NODE + ', device!="lo"'),
                       "cluster, instance, device") + " * 8", "{{device}} receive"),
         target(either(_rate("teye_network_transmit_bytes_total", NODE + ', device!="lo"'),
                       "cluster, instance, device") + " * 8", "{{device}} transmit")],
        min=0))
    d = d.with_panel(timeseries(
        "Network packet size", "Mean bytes per packet received and transmitted on each interface except "
        "loopback over 5 minutes (recording rules in teye-recording.yml). Near the MTU: bulk transfers; "
        "small packets at a high packet rate: small messages or many small files over the network. Empty "
        "while an interface is idle.",
        "bytes",
        [target(f'teye:network_receive_packet_size_bytes:mean5m{{{NODE}, device!="lo"}}', "{{device}} receive"),
         target(f'teye:network_transmit_packet_size_bytes:mean5m{{{NODE}, device!="lo"}}', "{{device}} transmit")],
        min=0))
    d = d.with_panel(timeseries(
        "InfiniBand throughput", "Data bits received and transmitted per second on each InfiniBand port "
        "(port_*_data counters are 4-byte words, already multiplied; x 8 to bits, as links are rated), with "
        "the port's link rate as the limit.",
        "bps",
        [target(_rate("teye_infiniband_receive_bytes_total") + " * 8", "{{device}}/{{port}} receive"),
         target(_rate("teye_infiniband_transmit_bytes_total") + " * 8", "{{device}}/{{port}} transmit"),
         target(f"teye_infiniband_link_rate_bytes_per_second{{{NODE}}} * 8", "{{device}}/{{port}} link rate")],
        min=0))
    d = d.with_panel(timeseries(
        "InfiniBand packet size", "Mean data bytes per packet received and transmitted on each InfiniBand port "
        "over 5 minutes (recording rules in teye-recording.yml). Near the path MTU (4 KiB): large messages; "
        "far below it: small messages, whose per-message latency rather than bandwidth limits collective "
        "communication. Empty while a port is idle.",
        "bytes",
        [target(f"teye:infiniband_receive_packet_size_bytes:mean5m{{{NODE}}}", "{{device}}/{{port}} receive"),
         target(f"teye:infiniband_transmit_packet_size_bytes:mean5m{{{NODE}}}", "{{device}}/{{port}} transmit")],
        min=0))
    d = d.with_panel(timeseries(
        "NFS throughput", "Bytes the NFS client read from and wrote to the server per mount "
        "(mountstats serverreadbytes / serverwritebytes), and what this node's NFS server read and wrote "
        "on its disks (nfsd io).",
        "Bps",
        [target(_rate("teye_nfs_client_read_bytes_total"), "{{mountpoint}} client read"),
         target(_rate("teye_nfs_client_write_bytes_total"), "{{mountpoint}} client write"),
         target(_rate("teye_nfsd_read_bytes_total"), "server read"),
         target(_rate("teye_nfsd_write_bytes_total"), "server write")],
        min=0))
    d = d.with_panel(timeseries(
        "NFS round trip per operation", "Mean RPC round-trip time of each NFS operation per mount over the "
        "rate interval (mountstats per-op rtt / ops). The TeyeNFSSlowOperations alert watches this.",
        "s",
        [target(f"sum by (mountpoint, operation) ({_rate('teye_nfs_client_operation_rtt_seconds_total')})"
                f" / sum by (mountpoint, operation) ({_rate('teye_nfs_client_operations_total')})",
                "{{mountpoint}} {{operation}}")],
        min=0))
    d = d.with_panel(table(
        "Collectors", "Each collector of the agent: up (1) or failing (0), and how long its last read took. "
        "`teye doctor` on the node explains a failing one.",
        "s",
        [target(f"teye_collector_up{{{NODE}}}", instant=True, fmt="table"),
         target(f"teye_collector_duration_seconds{{{NODE}}}", instant=True, fmt="table")],
        hide=("Time", "__name__", "job", "instance"),
        rename={"Value #A": "up", "Value #B": "last read"}))

    d = _hardware_counters(d)

    d = d.with_row(row("GPUs"))
    d = d.with_panel(timeseries(
        "GPU utilization", "Busy share of each GPU over the rate interval, integrated by the agent from every "
        "NVML utilization sample (no sub-second idle gap is lost between scrapes); NVML's current value where "
        "the busy counters are absent.",
        "percentunit",
        [target(f"({_rate('teye_gpu_busy_seconds_total', NODE_GPU)}"
                f" / {_rate('teye_gpu_sampled_seconds_total', NODE_GPU)})"
                f" or teye_gpu_utilization_ratio{{{NODE_GPU}}}", "GPU {{gpu}}")],
        min=0, max=1))
    d = d.with_panel(timeseries(
        "SM activity", "Share of time the streaming multiprocessors, tensor cores and DRAM were active (NVML "
        "GPM, Hopper and newer; absent elsewhere). Busy but low SM activity means small or few kernels.",
        "percentunit",
        [target(f"teye_gpu_sm_active_ratio{{{NODE_GPU}}}", "GPU {{gpu}} SM active"),
         target(f"teye_gpu_tensor_active_ratio{{{NODE_GPU}}}", "GPU {{gpu}} tensor active"),
         target(f"teye_gpu_dram_active_ratio{{{NODE_GPU}}}", "GPU {{gpu}} DRAM active")],
        min=0, max=1))
    d = d.with_panel(timeseries(
        "GPU memory", "Device memory used by each GPU, and its total.",
        "bytes",
        [target(f"teye_gpu_memory_used_bytes{{{NODE_GPU}}}", "GPU {{gpu}} used"),
         target(f"teye_gpu_memory_total_bytes{{{NODE_GPU}}}", "GPU {{gpu}} total")],
        min=0))
    d = d.with_panel(timeseries(
        "Power", "Power draw of each GPU (NVML).",
        "watt", [target(f"teye_gpu_power_watts{{{NODE_GPU}}}", "GPU {{gpu}}")], min=0))
    d = d.with_panel(timeseries(
        "Temperature", "GPU core temperature (NVML).",
        "celsius", [target(f"teye_gpu_temperature_celsius{{{NODE_GPU}}}", "GPU {{gpu}}")]))
    d = d.with_panel(timeseries(
        "Clocks", "SM and memory clocks of each GPU; they drop when a clock-event reason is active.",
        "hertz",
        [target(f"teye_gpu_sm_clock_hertz{{{NODE_GPU}}}", "GPU {{gpu}} SM"),
         target(f"teye_gpu_memory_clock_hertz{{{NODE_GPU}}}", "GPU {{gpu}} memory")],
        min=0))
    d = d.with_panel(timeseries(
        "Clock-event reasons", "How many of the selected GPUs have each clock-event (throttle) reason active "
        "(NVML ClocksEventReasons): sw_thermal, hw_thermal and hw_slowdown mean heat, power_cap and "
        "hw_power_brake mean power limits, gpu_idle is harmless.",
        "short",
        [target(f"sum by (reason) (teye_gpu_clock_event_active{{{NODE_GPU}}})", "{{reason}}")],
        min=0, bars=False))
    d = d.with_panel(timeseries(
        "PCIe traffic against the link maximum", "PCIe bytes received and transmitted per second by each GPU "
        "as a share of its link's maximum (current generation x width). Near 100 % the host-device copies "
        "are the bottleneck.",
        "percentunit",
        [target(f"teye_gpu_pcie_receive_bytes_per_second{{{NODE_GPU}}}"
                f" / teye_gpu_pcie_link_max_bytes_per_second{{{NODE_GPU}}}", "GPU {{gpu}} receive"),
         target(f"teye_gpu_pcie_transmit_bytes_per_second{{{NODE_GPU}}}"
                f" / teye_gpu_pcie_link_max_bytes_per_second{{{NODE_GPU}}}", "GPU {{gpu}} transmit")],
        min=0, max=1))
    d = d.with_panel(timeseries(
        "PCIe throughput", "PCIe bytes per second to (receive) and from (transmit) each GPU, and the link "
        "maximum.",
        "Bps",
        [target(f"teye_gpu_pcie_receive_bytes_per_second{{{NODE_GPU}}}", "GPU {{gpu}} receive"),
         target(f"teye_gpu_pcie_transmit_bytes_per_second{{{NODE_GPU}}}", "GPU {{gpu}} transmit"),
         target(f"teye_gpu_pcie_link_max_bytes_per_second{{{NODE_GPU}}}", "GPU {{gpu}} link maximum")],
        min=0))
    d = d.with_panel(table(
        "GPU health", "Per GPU: reachable through NVML (1) or lost (0), uncorrected ECC errors since the "
        "driver loaded, and XID errors over the dashboard's time range.",
        "short",
        [target(f"teye_gpu_up{{{NODE_GPU}}}", instant=True, fmt="table"),
         target(f'sum by (instance, gpu) (teye_gpu_ecc_errors_total{{{NODE_GPU}, type="uncorrected"}})',
                instant=True, fmt="table"),
         target(f"sum by (instance, gpu) (increase(teye_gpu_xid_errors_total{{{NODE_GPU}}}[$__range]))",
                instant=True, fmt="table")],
        hide=("Time", "__name__", "job", "instance"),
        rename={"Value #A": "up", "Value #B": "uncorrected ECC", "Value #C": "XID errors (range)"}))
    return d
