"""The ``gpu`` collector: NVIDIA GPUs through NVML (live, recorded, or replayed).

Per poll and per GPU: the utilization ring is integrated (:mod:`agent.gpu.ring`) and every
integrated sample is published to the shared timeline (``ctx.timeline``, CLOCK_MONOTONIC ns);
then utilization, memory (used, free, reserved), power, energy, temperature (core and memory),
clocks, PCIe (throughput, replays), encoder/decoder utilization, clock-event reasons, ECC /
retired pages / remapped rows, GPM metrics (two GPM samples >= 100 ms apart) and the processes
holding the GPU are read.  The source paces itself (:meth:`GpuSource.next_interval_s`, asked by
the sampler): every ``collectors.gpu.interval_seconds`` (5 s), every
``gpu.waiting_interval_seconds`` (1 s) while phase intervals wait for its samples or a GPU has
integrated none yet, and at most every half the ring depth the driver has shown.
XID errors are counted by their own thread (:mod:`agent.gpu.events`).

A GPU that fails with GpuIsLost/Unknown/... shows ``teye_gpu_up{gpu}`` 0 (its counters and
info stay) and is probed again every ``gpu.reprobe_seconds``; the other GPUs keep working.
When NVML itself is unusable (no library, driver not loaded), ``collect()`` raises
SourceUnavailable and ``teye_collector_up{collector="gpu"}`` is 0 with the reason; NVML is
tried again every ``gpu.reprobe_seconds``.  XID events are registered for the GPUs that answer
when the source starts (a GPU lost at start is watched again only after NVML is re-initialized).
"""
from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ..errors import ConfigError, HardwareAbsent, ParseError, SourceUnavailable
from ..logutil import RateLimitedLog
from ..metrics import COUNTER, GAUGE, HISTOGRAM, HistogramValue, Point, metric, point
from . import procinfo
from .events import XidWatcher
from .nvml import GpuLost, NvmlBackend, load_pynvml
from .ring import DEFAULT_GAP_BUCKETS, UtilRing

log = logging.getLogger("teye.gpu")

GPM_MIN_INTERVAL_NS = 100_000_000  # NVML: two GPM samples must be at least 100 ms apart
# ECC, retired-page and remapped-row counters change on hardware faults, not from one poll to the
# next: read them every 10 s (and at every (re)attach) instead of every poll (a quarter of the calls).
HEALTH_EVERY_NS = 10 * 10**9
# The ring is read at most every collectors.gpu.interval_seconds, and at least twice per the depth it has shown
# (the span of the largest read: a lower bound of what it holds), but never more often than this because of it
# (a driver loaded a moment ago shows a short backlog): a poll delayed by a busy host still finds every sample.
RING_SHARE = 0.5
MIN_RING_INTERVAL_S = 1.0

_G = ["gpu"]
GPU_INFO = metric("teye_gpu_info", GAUGE, "Always 1 per GPU (NVML index, or 'index/instance' for a MIG instance); "
                  "the labels carry its identity.", ["gpu", "uuid", "name", "pci_bus_id", "driver_version"])
GPU_UP = metric("teye_gpu_up", GAUGE, "1 while NVML answers for this GPU, 0 after GpuIsLost/Unknown-class errors "
                "(it is probed again periodically).", _G)
UTILIZATION = metric("teye_gpu_utilization_ratio", GAUGE, "NVML's current GPU utilization: fraction of the last "
                     "sample period in which a kernel ran (see teye_gpu_busy_seconds_total for exact busy time).", _G)
MEMORY_UTILIZATION = metric("teye_gpu_memory_utilization_ratio", GAUGE,
                            "NVML's current memory utilization: fraction of the last sample period in which "
                            "device memory was read or written.", _G)
BUSY = metric("teye_gpu_busy_seconds_total", COUNTER,
              "Seconds a kernel was running, integrated from every driver utilization sample (period x busy "
              "fraction), none lost or counted twice. Sampled in the background: sub-second idle gaps count.", _G)
SAMPLED = metric("teye_gpu_sampled_seconds_total", COUNTER,
                 "Seconds covered by the driver utilization samples integrated into teye_gpu_busy_seconds_total.", _G)
LOST = metric("teye_gpu_samples_lost_total", COUNTER,
              "Driver utilization samples that left the ring before teye read them (detected overruns).", _G)
IDLE_GAPS = metric("teye_gpu_idle_gap_seconds", HISTOGRAM,
                   "Lengths of idle stretches: consecutive driver samples at or below gpu.busy_threshold, "
                   "observed when the stretch ends. A stretch shorter than one driver sample (1/6 s; 0.2 s on "
                   "an H100) is not seen, though teye_gpu_busy_seconds_total still accounts for it exactly.", _G,
                   buckets=DEFAULT_GAP_BUCKETS)
MEMORY_USED = metric("teye_gpu_memory_used_bytes", GAUGE, "Device memory in use (NVML memory info v2 where the "
                     "driver has it: excludes driver-reserved memory, as nvidia-smi).", _G)
MEMORY_TOTAL = metric("teye_gpu_memory_total_bytes", GAUGE, "Device memory size.", _G)
MEMORY_FREE = metric("teye_gpu_memory_free_bytes", GAUGE, "Device memory free (dcgm-exporter's "
                     "DCGM_FI_DEV_FB_FREE): total less used and driver-reserved memory.", _G)
MEMORY_RESERVED = metric("teye_gpu_memory_reserved_bytes", GAUGE, "Device memory the driver reserves for itself "
                         "(DCGM_FI_DEV_FB_RESERVED; NVML memory info v2 only: absent on older drivers).", _G)
MEMORY_TEMPERATURE = metric("teye_gpu_memory_temperature_celsius", GAUGE, "Device memory (HBM) temperature "
                            "(DCGM_FI_DEV_MEMORY_TEMP; absent on boards without a memory sensor).", _G)
PCIE_REPLAYS = metric("teye_gpu_pcie_replays_total", COUNTER, "PCIe replays (link-level retransmissions after a "
                      "bad or lost packet) since the driver was loaded (DCGM_FI_DEV_PCIE_REPLAY_COUNTER); a "
                      "rising rate points at a bad riser, slot or cable.", _G)
ENCODER = metric("teye_gpu_encoder_utilization_ratio", GAUGE, "Video encoder (NVENC) utilization over NVML's "
                 "sampling period (DCGM_FI_DEV_ENC_UTIL).", _G)
DECODER = metric("teye_gpu_decoder_utilization_ratio", GAUGE, "Video decoder (NVDEC) utilization over NVML's "
                 "sampling period (DCGM_FI_DEV_DEC_UTIL).", _G)
POWER = metric("teye_gpu_power_watts", GAUGE, "Power draw of the GPU board.", _G)
ENERGY = metric("teye_gpu_energy_joules_total", COUNTER, "Energy consumed since the driver was loaded (Volta+).", _G)
TEMPERATURE = metric("teye_gpu_temperature_celsius", GAUGE, "GPU core temperature.", _G)
SM_CLOCK = metric("teye_gpu_sm_clock_hertz", GAUGE, "Current SM clock.", _G)
MEMORY_CLOCK = metric("teye_gpu_memory_clock_hertz", GAUGE, "Current memory clock.", _G)
PCIE_TX = metric("teye_gpu_pcie_transmit_bytes_per_second", GAUGE,
                 "PCIe bytes/s sent by the GPU (NVML's 20 ms throughput window at poll time).", _G)
PCIE_RX = metric("teye_gpu_pcie_receive_bytes_per_second", GAUGE,
                 "PCIe bytes/s received by the GPU (NVML's 20 ms throughput window at poll time).", _G)
PCIE_MAX = metric("teye_gpu_pcie_link_max_bytes_per_second", GAUGE,
                  "Payload bytes/s per direction of the PCIe link at its current generation and width "
                  "(after 8b/10b, 128b/130b or FLIT encoding); idle GPUs drop to a lower generation.", _G)
CLOCK_EVENT = metric("teye_gpu_clock_event_active", GAUGE,
                     "1 while this clock event reason (formerly 'throttle reason') holds the clocks down, else 0; "
                     "only reasons the GPU supports.", ["gpu", "reason"])
XID = metric("teye_gpu_xid_errors_total", COUNTER, "XID critical errors reported by NVML's event set, by XID code.",
             ["gpu", "xid"])
ECC = metric("teye_gpu_ecc_errors_total", COUNTER, "ECC memory errors since the driver was loaded (volatile), "
             "by type (corrected, uncorrected).", ["gpu", "type"])
RETIRED_PAGES = metric("teye_gpu_retired_pages_total", COUNTER, "Device memory pages retired (pre-Ampere page "
                       "retirement), by cause.", ["gpu", "cause"])
RETIRED_PENDING = metric("teye_gpu_retired_pages_pending", GAUGE,
                         "1 when a page retirement waits for the next driver reload.", _G)
REMAPPED_ROWS = metric("teye_gpu_remapped_rows_total", COUNTER, "Memory rows remapped (Ampere and newer), by the "
                       "error type that caused it (correctable, uncorrectable).", ["gpu", "type"])
REMAP_PENDING = metric("teye_gpu_row_remap_pending", GAUGE, "1 when a row remapping waits for a GPU reset.", _G)
REMAP_FAILED = metric("teye_gpu_row_remap_failed", GAUGE, "1 when a row remapping failed (the GPU needs service).", _G)
PROCESS_INFO = metric("teye_gpu_process_info", GAUGE, "Always 1 per process holding the GPU (one series per live "
                      "process; the series disappears when the process exits).",
                      ["gpu", "pid", "user", "slurm_job", "pod_uid"])
PROCESS_SM = metric("teye_gpu_process_sm_utilization_ratio", GAUGE,
                    "The process's SM utilization, mean of NVML's per-process samples since the previous poll "
                    "(0 when NVML listed none for it).", ["gpu", "pid"])
PROCESS_MEMORY = metric("teye_gpu_process_memory_used_bytes", GAUGE, "Device memory the process uses.",
                        ["gpu", "pid"])

# GPM (Hopper and newer): short name from agent.gpu.nvml.GPM_METRICS -> spec
GPM_SPECS = {
    "sm_active": metric("teye_gpu_sm_active_ratio", GAUGE, "GPM: fraction of SMs busy (mean over the poll).", _G),
    "sm_occupancy": metric("teye_gpu_sm_occupancy_ratio", GAUGE,
                           "GPM: resident warps relative to the theoretical maximum.", _G),
    "tensor_active": metric("teye_gpu_tensor_active_ratio", GAUGE,
                            "GPM: fraction of time the SMs ran any tensor-core instruction.", _G),
    "dram_active": metric("teye_gpu_dram_active_ratio", GAUGE,
                          "GPM: DRAM bandwidth used relative to the theoretical maximum.", _G),
    "fp16_active": metric("teye_gpu_fp16_pipe_active_ratio", GAUGE,
                          "GPM: fraction of time the SMs ran non-tensor FP16 math.", _G),
    "fp32_active": metric("teye_gpu_fp32_pipe_active_ratio", GAUGE,
                          "GPM: fraction of time the SMs ran non-tensor FP32 math.", _G),
    "fp64_active": metric("teye_gpu_fp64_pipe_active_ratio", GAUGE,
                          "GPM: fraction of time the SMs ran non-tensor FP64 math.", _G),
    "nvlink_rx": metric("teye_gpu_nvlink_receive_bytes_per_second", GAUGE, "GPM: NVLink bytes/s received, all links.",
                        _G),
    "nvlink_tx": metric("teye_gpu_nvlink_transmit_bytes_per_second", GAUGE, "GPM: NVLink bytes/s sent, all links.",
                        _G),
    "graphics_active": metric("teye_gpu_graphics_engine_active_ratio", GAUGE,
                              "GPM: fraction of time the graphics/compute engine was active "
                              "(DCGM_FI_PROF_GR_ENGINE_ACTIVE).", _G),
}

# dcgm-exporter's default counters (etc/default-counters.csv) and its profiling fields -> teye's family and the
# difference to know (docs/metrics.md renders this table).  Those teye lacks are listed with "" as the family.
DCGM_FIELDS = (
    ("DCGM_FI_DEV_SM_CLOCK", "teye_gpu_sm_clock_hertz", "MHz there, Hz here"),
    ("DCGM_FI_DEV_MEM_CLOCK", "teye_gpu_memory_clock_hertz", "MHz there, Hz here"),
    ("DCGM_FI_DEV_GPU_TEMP", "teye_gpu_temperature_celsius", ""),
    ("DCGM_FI_DEV_MEMORY_TEMP", "teye_gpu_memory_temperature_celsius", "NVML field NVML_FI_DEV_MEMORY_TEMP; absent "
     "on boards without a memory sensor"),
    ("DCGM_FI_DEV_POWER_USAGE", "teye_gpu_power_watts", ""),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "teye_gpu_energy_joules_total", "mJ there, J here"),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "teye_gpu_pcie_replays_total", ""),
    ("DCGM_FI_DEV_GPU_UTIL", "teye_gpu_utilization_ratio", "percent there, ratio here; "
     "teye_gpu_busy_seconds_total integrates every driver sample"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "teye_gpu_memory_utilization_ratio", "percent there, ratio here"),
    ("DCGM_FI_DEV_ENC_UTIL", "teye_gpu_encoder_utilization_ratio", "percent there, ratio here"),
    ("DCGM_FI_DEV_DEC_UTIL", "teye_gpu_decoder_utilization_ratio", "percent there, ratio here"),
    ("DCGM_FI_DEV_XID_ERRORS", "teye_gpu_xid_errors_total", "there the last XID's code as a gauge, here a counter "
     "per code"),
    ("DCGM_FI_DEV_FB_FREE", "teye_gpu_memory_free_bytes", "MiB there, bytes here"),
    ("DCGM_FI_DEV_FB_USED", "teye_gpu_memory_used_bytes", "MiB there, bytes here"),
    ("DCGM_FI_DEV_FB_RESERVED", "teye_gpu_memory_reserved_bytes", "MiB there, bytes here; NVML memory info v2 only"),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "teye_gpu_ecc_errors_total",
     "type=\"corrected\", \"uncorrected\""),
    ("DCGM_FI_DEV_RETIRED_SBE, DCGM_FI_DEV_RETIRED_DBE", "teye_gpu_retired_pages_total", "by cause"),
    ("DCGM_FI_DEV_RETIRED_PENDING", "teye_gpu_retired_pages_pending", ""),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS, DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "teye_gpu_remapped_rows_total",
     "by type"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "teye_gpu_row_remap_failed", ""),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "teye_gpu_clock_event_active", "a bit mask there, one 0/1 series per "
     "reason here"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "teye_gpu_graphics_engine_active_ratio", "GPM: Hopper and newer"),
    ("DCGM_FI_PROF_SM_ACTIVE", "teye_gpu_sm_active_ratio", "GPM: Hopper and newer"),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "teye_gpu_sm_occupancy_ratio", "GPM: Hopper and newer"),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "teye_gpu_tensor_active_ratio", "GPM: Hopper and newer"),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "teye_gpu_dram_active_ratio", "GPM: Hopper and newer"),
    ("DCGM_FI_PROF_PIPE_FP16_ACTIVE, _FP32_, _FP64_",
     "teye_gpu_fp16_pipe_active_ratio, teye_gpu_fp32_pipe_active_ratio, teye_gpu_fp64_pipe_active_ratio",
     "GPM: Hopper and newer"),
    ("DCGM_FI_PROF_PCIE_TX_BYTES, DCGM_FI_PROF_PCIE_RX_BYTES", "teye_gpu_pcie_transmit_bytes_per_second, "
     "teye_gpu_pcie_receive_bytes_per_second", "NVML's 20 ms throughput window, bytes/s"),
    ("DCGM_FI_PROF_NVLINK_TX_BYTES, DCGM_FI_PROF_NVLINK_RX_BYTES", "teye_gpu_nvlink_transmit_bytes_per_second, "
     "teye_gpu_nvlink_receive_bytes_per_second", "GPM: Hopper and newer"),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "", "not read (the GPM NVLink rates above instead)"),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "", "not read (vGPU guests)"),
)
# Before Hopper NVML has no way to the profiling fields (DCGM_FI_PROF_*) but the PCIe rates: DCGM's profiling
# module reads the SM's hardware counters itself.  `teye doctor` says so per GPU (agent.doctor.NO_GPM).


@dataclass(frozen=True)
class GpuStats:
    """One GPU (or MIG instance) at one poll, in base units; None = not supported here (not exported)."""

    gpu: str
    uuid: str = ""
    name: str = ""
    pci_bus_id: str = ""
    driver_version: str = ""
    up: bool = True
    utilization: Optional[float] = None
    memory_utilization: Optional[float] = None
    busy_seconds: Optional[float] = None
    sampled_seconds: Optional[float] = None
    samples_lost: Optional[float] = None
    idle_gaps: Optional[HistogramValue] = None
    memory_used: Optional[float] = None
    memory_total: Optional[float] = None
    memory_free: Optional[float] = None
    memory_reserved: Optional[float] = None
    memory_temperature_celsius: Optional[float] = None
    pcie_replays: Optional[float] = None
    encoder_utilization: Optional[float] = None
    decoder_utilization: Optional[float] = None
    power_watts: Optional[float] = None
    energy_joules: Optional[float] = None
    temperature_celsius: Optional[float] = None
    sm_clock_hz: Optional[float] = None
    memory_clock_hz: Optional[float] = None
    pcie_tx: Optional[float] = None
    pcie_rx: Optional[float] = None
    pcie_max: Optional[float] = None
    gpm: Tuple[Tuple[str, float], ...] = ()
    clock_events: Tuple[Tuple[str, bool], ...] = ()
    xid: Tuple[Tuple[int, int], ...] = ()
    ecc: Tuple[Tuple[str, float], ...] = ()
    retired_pages: Tuple[Tuple[str, float], ...] = ()
    retired_pending: Optional[float] = None
    remapped_rows: Optional[Tuple[float, float, float, float]] = None


@dataclass(frozen=True)
class GpuProcess:
    gpu: str
    pid: int
    user: str = ""
    slurm_job: str = ""
    pod_uid: str = ""
    sm_utilization: Optional[float] = None
    memory_used: Optional[float] = None


@dataclass(frozen=True)
class GpuReading:
    gpus: Tuple[GpuStats, ...]
    processes: Tuple[GpuProcess, ...] = ()

    def gpu(self, label: str) -> GpuStats:
        for g in self.gpus:
            if g.gpu == label:
                return g
        raise KeyError(label)

    def points(self) -> Iterator[Point]:
        for g in self.gpus:
            yield point(GPU_INFO, 1.0, g.gpu, g.uuid, g.name, g.pci_bus_id, g.driver_version)
            yield point(GPU_UP, 1.0 if g.up else 0.0, g.gpu)
            for spec, v in ((BUSY, g.busy_seconds), (SAMPLED, g.sampled_seconds), (LOST, g.samples_lost),
                            (IDLE_GAPS, g.idle_gaps), (ENERGY, g.energy_joules), (PCIE_REPLAYS, g.pcie_replays)):
                if v is not None:
                    yield point(spec, v, g.gpu)
            for xid, n in g.xid:
                yield point(XID, float(n), g.gpu, xid)
            for kind, n in g.ecc:
                yield point(ECC, n, g.gpu, kind)
            for cause, n in g.retired_pages:
                yield point(RETIRED_PAGES, n, g.gpu, cause)
            if g.remapped_rows is not None:
                corr, unc, pending, failed = g.remapped_rows
                yield point(REMAPPED_ROWS, corr, g.gpu, "correctable")
                yield point(REMAPPED_ROWS, unc, g.gpu, "uncorrectable")
            if not g.up:
                continue  # gauges of a GPU that does not answer are absent, not stale
            if g.remapped_rows is not None:
                yield point(REMAP_PENDING, g.remapped_rows[2], g.gpu)
                yield point(REMAP_FAILED, g.remapped_rows[3], g.gpu)
            for spec, v in ((UTILIZATION, g.utilization), (MEMORY_UTILIZATION, g.memory_utilization),
                            (MEMORY_USED, g.memory_used), (MEMORY_TOTAL, g.memory_total), (POWER, g.power_watts),
                            (TEMPERATURE, g.temperature_celsius), (SM_CLOCK, g.sm_clock_hz),
                            (MEMORY_CLOCK, g.memory_clock_hz), (PCIE_TX, g.pcie_tx), (PCIE_RX, g.pcie_rx),
                            (PCIE_MAX, g.pcie_max), (RETIRED_PENDING, g.retired_pending),
                            (MEMORY_FREE, g.memory_free), (MEMORY_RESERVED, g.memory_reserved),
                            (MEMORY_TEMPERATURE, g.memory_temperature_celsius),
                            (ENCODER, g.encoder_utilization), (DECODER, g.decoder_utilization)):
                if v is not None:
                    yield point(spec, v, g.gpu)
            for short, v in g.gpm:
                yield point(GPM_SPECS[short], v, g.gpu)
            for reason, active in g.clock_events:
                yield point(CLOCK_EVENT, 1.0 if active else 0.0, g.gpu, reason)
        for p in self.processes:
            yield point(PROCESS_INFO, 1.0, p.gpu, p.pid, p.user, p.slurm_job, p.pod_uid)
            if p.sm_utilization is not None:
                yield point(PROCESS_SM, p.sm_utilization, p.gpu, p.pid)
            if p.memory_used is not None:
                yield point(PROCESS_MEMORY, p.memory_used, p.gpu, p.pid)


class _Device:
    """Mutable per-GPU state kept by the source between polls."""

    def __init__(self, label: str, index: int, handle, ring: UtilRing, parent: "Optional[_Device]" = None,
                 instance_id: Optional[str] = None):
        self.label = label
        self.index = index
        self.handle = handle
        self.parent = parent
        self.instance_id = instance_id
        self.ring = ring
        self.has_ring = True
        self.uuid = self.name = self.pci_bus_id = ""
        self.up = True
        self.reason: Optional[str] = None
        self.down_since_ns = 0
        self.gpm_supported: Optional[bool] = None
        self.gpm_samples: List = []
        self.gpm_prev: Optional[Tuple[object, int]] = None
        self.gpm_values: Dict[str, float] = {}
        self.proc_last_seen = 0
        self.children: List["_Device"] = []
        self.ring_span_s = 0.0                # the longest span of samples one read of the ring returned
        self.health: Optional[tuple] = None   # (ecc, retired, retired_pending, remapped), read at health_ns
        self.health_ns = 0
        self.gauges: Optional[dict] = None    # utilization, memory, power, clocks ... read at gauges_ns
        self.gauges_ns = 0

    @property
    def is_mig(self) -> bool:
        return self.parent is not None


class GpuSource:
    name = "gpu"

    def __init__(self, loader: Callable[[], object], procfs: str = "/proc", ctx=None, busy_threshold: float = 0.0,
                 idle_gap_buckets: Sequence[float] = DEFAULT_GAP_BUCKETS, events: bool = True, gpm: bool = True,
                 processes: bool = True, max_processes: int = 32, reprobe_seconds: float = 10.0,
                 wall_ns: Callable[[], int] = time.time_ns, event_timeout_ms: int = 1000,
                 gauge_seconds: float = 0.0, waiting_interval_seconds: float = 1.0):
        """``loader`` returns the pynvml-like module (real pynvml, a recorder, a replay, or a fake)."""
        from ..context import AgentContext
        self._loader = loader
        self.procfs = procfs
        self.ctx = ctx if ctx is not None else AgentContext()
        self._clock = self.ctx.clock
        self._wall_ns = wall_ns
        self.busy_threshold = busy_threshold
        self.buckets = tuple(idle_gap_buckets)
        self.events = events
        self.gpm = gpm
        self.want_processes = processes
        self.max_processes = max_processes
        self.reprobe_ns = int(reprobe_seconds * 1e9)
        # utilization, memory, PCIe, power, energy, temperature, clocks and clock events are read at
        # most this often (0: every poll); the utilization samples, processes and GPM at every poll
        self.gauge_ns = int(gauge_seconds * 1e9)
        self.event_timeout_ms = event_timeout_ms
        # while the phase path waits for samples covering a job's intervals (AgentContext.timeline.waits moves),
        # the ring is read at least this often
        self.waiting_interval_s = float(waiting_interval_seconds)
        self._waits_seen = self.ctx.timeline.waits
        self.backend: Optional[NvmlBackend] = None
        self.devices: List[_Device] = []
        self.driver_version = ""
        self.xid: Optional[XidWatcher] = None
        self._retry_at_ns = 0
        self._last_unavailable: Optional[SourceUnavailable] = None
        self._owners: Dict[int, procinfo.ProcOwner] = {}
        self._rlog = RateLimitedLog(log)

    # ------------------------------------------------------------------ lifecycle
    def _new_ring(self) -> UtilRing:
        return UtilRing(self.busy_threshold, self.buckets)

    def _start(self) -> None:
        now = self._clock()
        if self._last_unavailable is not None and now < self._retry_at_ns:
            raise self._last_unavailable
        try:
            backend = NvmlBackend(self._loader())
            backend.init()
            try:
                self.driver_version = backend.driver_version() or ""
                count = backend.device_count()
                if count == 0:
                    raise HardwareAbsent("NVML found no GPUs")
                devices = []
                for i in range(count):
                    d = _Device(str(i), i, None, self._new_ring())
                    devices.append(d)
                    self._attach(backend, d, now)
            except SourceUnavailable:
                backend.shutdown()
                raise
        except SourceUnavailable as e:
            self._last_unavailable = e
            self._retry_at_ns = now + self.reprobe_ns
            raise
        self._last_unavailable = None
        self.backend = backend
        self.devices = devices
        if self.events:
            self.xid = XidWatcher(backend, [(d.label, d.handle) for d in devices if d.up], self.event_timeout_ms)
            self.xid.start()

    def _attach(self, b: NvmlBackend, d: _Device, now: int) -> None:
        """(Re)open a physical GPU: handle, identity, MIG instances.  Marks it down on GpuLost."""
        try:
            h = b.handle_by_index(d.index)
            uuid = b.uuid(h) or ""
            if d.uuid and uuid != d.uuid:  # a different board answers at this index: start afresh
                d.ring = self._new_ring()
                for s in d.gpm_samples:
                    b.gpm_free(s)
                d.gpm_samples, d.gpm_supported, d.gpm_prev, d.gpm_values = [], None, None, {}
            d.handle, d.uuid = h, uuid
            d.health = d.gauges = None
            d.name = b.name(h) or ""
            d.pci_bus_id = b.pci_bus_id(h) or ""
            old = {c.label: c for c in d.children}
            children = []
            for instance_id, mh in b.mig_devices(h):
                label = f"{d.label}/{instance_id}"
                c = old.get(label) or _Device(label, d.index, mh, self._new_ring(), d, instance_id)
                c.handle, c.up, c.reason, c.health, c.gauges = mh, True, None, None, None
                c.uuid = b.uuid(mh) or ""
                c.name = b.name(mh) or d.name
                c.pci_bus_id = d.pci_bus_id
                children.append(c)
            d.children = children
            d.up, d.reason = True, None
        except GpuLost as e:
            self._down(d, e.reason, now)

    def _down(self, d: _Device, reason: str, now: int) -> None:
        if d.up:
            self._rlog.warning(f"lost:{d.label}", "gpu %s down: %s", d.label, reason)
        d.up, d.reason, d.down_since_ns = False, reason, now
        d.gpm_prev = None
        for c in d.children:
            c.up, c.reason, c.down_since_ns = False, reason, now
            c.gpm_prev = None

    def _teardown(self) -> None:
        if self.xid is not None:
            self.xid.stop()
            self.xid = None
        b, self.backend = self.backend, None
        if b is None:
            return
        for d in self._all_devices():
            for s in d.gpm_samples:
                try:
                    b.gpm_free(s)
                except (GpuLost, SourceUnavailable) as e:
                    log.debug("freeing a GPM sample: %s", e)
            d.gpm_samples, d.gpm_prev = [], None
        b.shutdown()

    def close(self) -> None:
        self._teardown()

    def _all_devices(self) -> Iterator[_Device]:
        for d in self.devices:
            yield d
            yield from d.children

    # ------------------------------------------------------------------ polling
    def collect(self) -> GpuReading:
        if self.backend is None:
            self._start()
        b = self.backend
        now = self._clock()
        offset_ns = self._wall_ns() - now  # CPU wall clock -> CLOCK_MONOTONIC
        xids = self.xid.counts() if self.xid is not None else {}
        stats: List[GpuStats] = []
        procs: List[GpuProcess] = []
        try:
            for d in self.devices:
                if self._reprobe_due(d, now) or (d.up and any(self._reprobe_due(c, now) for c in d.children)):
                    self._attach(b, d, now)
                for dev in [d] + d.children:
                    if dev.up:
                        try:
                            stats.append(self._poll(b, dev, now, offset_ns, xids, procs))
                            continue
                        except GpuLost as e:
                            self._down(dev, e.reason, now)  # a physical GPU takes its MIG instances along
                    stats.append(self._down_stats(dev, xids))
        except SourceUnavailable:
            self._teardown()
            self._retry_at_ns = now + self.reprobe_ns
            raise
        self._publish_pids(procs)
        # every GPU and MIG instance by UUID -> its label: the allocation source names the kubelet's devices
        self.ctx.gpu_labels = {dev.uuid: dev.label for d in self.devices for dev in [d] + d.children if dev.uuid}
        self.ctx.gpu_notes = gpu_notes(stats)
        return GpuReading(tuple(stats), tuple(procs))

    def next_interval_s(self, configured: float) -> float:
        """Seconds until the next poll (the sampler asks after each): ``configured``, shortened to
        ``waiting_interval_seconds`` while phase intervals wait for GPU samples or a GPU has integrated none
        yet, and to half the ring depth the driver has shown (never below MIN_RING_INTERVAL_S for that reason)."""
        interval = configured
        waits = self.ctx.timeline.waits
        if waits != self._waits_seen:
            self._waits_seen = waits
            interval = min(interval, self.waiting_interval_s)
        if any(d.up and d.has_ring and not d.ring.samples for d in self._all_devices()):
            # the first read is only a baseline: until a GPU's samples reach the timeline the phase path does
            # not know it is sampled (a job's intervals on it would be credited to no GPU), so read again soon
            interval = min(interval, self.waiting_interval_s)
        spans = [d.ring_span_s for d in self._all_devices() if d.up and d.has_ring and d.ring_span_s > 0]
        if spans:
            interval = min(interval, max(MIN_RING_INTERVAL_S, RING_SHARE * min(spans)))
        return interval

    def _reprobe_due(self, d: _Device, now: int) -> bool:
        return not d.up and now - d.down_since_ns >= self.reprobe_ns

    def _counters(self, d: _Device, xids) -> dict:
        ring = d.ring
        has = d.has_ring and ring.last_ts is not None
        return dict(
            busy_seconds=ring.busy_s if has else None,
            sampled_seconds=ring.sampled_s if has else None,
            samples_lost=float(ring.lost) if has else None,
            idle_gaps=ring.gaps.value() if has else None,
            xid=tuple(sorted((x, n) for (label, x), n in xids.items() if label == d.label)),
        )

    def _down_stats(self, d: _Device, xids) -> GpuStats:
        return GpuStats(d.label, d.uuid, d.name, d.pci_bus_id, self.driver_version, up=False, **self._counters(d, xids))

    def _poll(self, b: NvmlBackend, d: _Device, now: int, offset_ns: int, xids, procs: List[GpuProcess]) -> GpuStats:
        h = d.handle
        if d.has_ring:
            samples = b.samples(h, d.ring.last_seen)
            if samples is None:
                d.has_ring = False
            else:
                if len(samples) > 1:
                    d.ring_span_s = max(d.ring_span_s, (samples[-1][0] - samples[0][0]) / 1e6)
                self.ctx.timeline.add_many(d.label, [(start_us * 1000 - offset_ns, end_us * 1000 - offset_ns, ratio)
                                                     for start_us, end_us, ratio in d.ring.feed(samples)])
        if d.gauges is None or now - d.gauges_ns >= self.gauge_ns:
            util, mem_util = b.utilization(h)
            used, total, free, reserved = b.memory(h)
            tx, rx = b.pcie_throughput(h)
            fields = b.field_values(h)
            d.gauges = dict(utilization=util, memory_utilization=mem_util, memory_used=used, memory_total=total,
                            memory_free=free, memory_reserved=reserved,
                            memory_temperature_celsius=fields.get("memory_temperature"),
                            pcie_replays=b.pcie_replays(h), encoder_utilization=b.codec_utilization(h, "encoder"),
                            decoder_utilization=b.codec_utilization(h, "decoder"),
                            power_watts=b.power_watts(h), energy_joules=b.energy_joules(h),
                            temperature_celsius=b.temperature_celsius(h),
                            sm_clock_hz=b.clock_hz(h, "sm"), memory_clock_hz=b.clock_hz(h, "memory"),
                            pcie_tx=tx, pcie_rx=rx, pcie_max=b.pcie_link_max(h),
                            clock_events=b.clock_events(h) or ())
            d.gauges_ns = now
        fresh = d.health is None or now - d.health_ns >= HEALTH_EVERY_NS
        if fresh:
            retired, retired_pending = b.retired_pages(h)
        else:
            _, retired, retired_pending, _ = d.health
        if self.gpm:
            self._gpm(b, d, now)
        if self.want_processes and not d.children:
            procs.extend(self._processes(b, d))
        stats = GpuStats(
            d.label, d.uuid, d.name, d.pci_bus_id, self.driver_version, True, **d.gauges,
            gpm=tuple(sorted(d.gpm_values.items())),
            ecc=b.ecc_volatile(h) if fresh else d.health[0], retired_pages=retired, retired_pending=retired_pending,
            remapped_rows=b.remapped_rows(h) if fresh else d.health[3],
            **self._counters(d, xids))
        if fresh:
            d.health, d.health_ns = (stats.ecc, retired, retired_pending, stats.remapped_rows), now
        return stats

    def _gpm(self, b: NvmlBackend, d: _Device, now: int) -> None:
        if d.gpm_supported is None:
            physical = d.parent.handle if d.is_mig else d.handle
            d.gpm_supported = bool(b.gpm_supported(physical))
            if d.gpm_supported:
                d.gpm_samples = [s for s in (b.gpm_alloc(), b.gpm_alloc()) if s is not None]
                if len(d.gpm_samples) < 2:
                    d.gpm_supported = False
        if not d.gpm_supported:
            return
        if d.gpm_prev is not None and now - d.gpm_prev[1] < GPM_MIN_INTERVAL_NS:
            return  # too soon after the previous sample: keep the last values
        prev = d.gpm_prev[0] if d.gpm_prev is not None else None
        cur = d.gpm_samples[1] if prev is d.gpm_samples[0] else d.gpm_samples[0]
        parent = d.parent.handle if d.is_mig else None
        ok = b.gpm_sample(d.handle, cur, parent, int(d.instance_id) if d.is_mig else None)
        if not ok:
            d.gpm_prev, d.gpm_values = None, {}
            return
        if prev is not None:
            d.gpm_values = b.gpm_metrics(prev, cur)
        d.gpm_prev = (cur, now)

    def _processes(self, b: NvmlBackend, d: _Device) -> List[GpuProcess]:
        listed = b.processes(d.handle)
        if not listed:
            return []
        listed = sorted(listed)[:self.max_processes]
        util = b.process_utilization(d.handle, d.proc_last_seen)
        sm: Dict[int, List[float]] = defaultdict(list)
        if util:
            for pid, ts, pct in util:
                if ts > d.proc_last_seen:
                    sm[pid].append(pct)
            d.proc_last_seen = max(d.proc_last_seen, max(ts for _, ts, _ in util))
        out = []
        for pid, used in listed:
            who = self._owners.get(pid)
            if who is None:
                who = self._owners[pid] = procinfo.owner(self.procfs, pid)
            if util is None:
                ratio = None
            else:
                vals = sm.get(pid)
                ratio = sum(vals) / len(vals) / 100.0 if vals else 0.0
            out.append(GpuProcess(d.label, pid, who.user, who.slurm_job, who.pod_uid, ratio, used))
        return out

    def _publish_pids(self, procs: List[GpuProcess]) -> None:
        held: Dict[int, set] = defaultdict(set)
        for p in procs:
            held[p.pid].add(p.gpu)
        for pid in list(self._owners):
            if pid not in held:
                del self._owners[pid]  # exited (or no longer on a GPU): forget; a reused pid is looked up again
        self.ctx.gpu_pids = {pid: frozenset(gpus) for pid, gpus in held.items()}


# Clock events that slow a busy GPU (the others: idle, a setting, or a boost group's sync)
SLOWING_EVENTS = ("power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")


def gpu_notes(stats) -> Dict[str, str]:
    """GPU label -> what slows it now, in words, for the GPUs where something does (AgentContext.gpu_notes)."""
    out = {}
    for g in stats:
        bits = []
        if not g.up:
            bits.append("not answering (lost)")
        held = [r for r, active in g.clock_events if active and r in SLOWING_EVENTS]
        if held:
            clock = f", SM clock {g.sm_clock_hz / 1e6:.0f} MHz" if g.sm_clock_hz else ""
            bits.append(f"clocks held down by {', '.join(held)}{clock}")
        if g.xid:
            bits.append("XID " + ", ".join(f"{x} ({n}x)" for x, n in g.xid) + " since the agent started")
        if bits:
            out[g.gpu] = "; ".join(bits)
    return out


def from_config(cfg, ctx=None) -> GpuSource:
    g = cfg["gpu"]
    if g["replay"]:
        from .replay import Replay
        try:
            replay = Replay.load(g["replay"])
        except (OSError, ParseError) as e:
            raise ConfigError(f"config key 'gpu.replay': cannot replay {g['replay']}: {e}") from None
        loader = lambda: replay  # noqa: E731
    else:
        loader = load_pynvml
    return GpuSource(loader, procfs=cfg["procfs"], ctx=ctx, busy_threshold=g["busy_threshold"],
                     idle_gap_buckets=g["idle_gap_buckets"], events=g["events"], gpm=g["gpm"],
                     processes=g["processes"], max_processes=g["max_processes"],
                     reprobe_seconds=g["reprobe_seconds"], gauge_seconds=g["gauge_interval_seconds"],
                     waiting_interval_seconds=g["waiting_interval_seconds"])
