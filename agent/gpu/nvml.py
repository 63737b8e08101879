"""The NVML backend: the only module of teye that imports pynvml.

``NvmlBackend`` takes a pynvml-like module as its constructor argument: the real
``pynvml`` (nvidia-ml-py), a recorder wrapping it (``agent.gpu.record``), a replay of a
recorded trace (``agent.gpu.replay``) or the tests' fake.  Every call goes through
:meth:`NvmlBackend.call`, which maps each NVML error class to one of three behaviours:

========================  =====================================================================
behaviour                 NVML errors
========================  =====================================================================
value absent (``None``)   NotSupported, NoPermission, FunctionNotFound, NotFound, InvalidArgument,
                          CorruptedInforom, ArgumentVersionMismatch, Deprecated, NoData, ...
                          (the metric is simply not emitted; never NaN)
GPU down (``GpuLost``)    GpuIsLost, Unknown, ResetRequired, Timeout, IrqIssue, NotReady,
                          GpuNotFound, Memory, OperatingSystem, ... and any code not listed here
                          (that GPU's ``teye_gpu_up`` goes 0; it is probed again later)
source down               Uninitialized, LibraryNotFound, DriverNotLoaded, LibRmVersionMismatch
(``SourceUnavailable``)   (``teye_collector_up{collector="gpu"}`` = 0 with the reason)
========================  =====================================================================

Functions that exist in several versions (``..._v3``/``_v2``/plain, ClocksEventReasons vs the
deprecated ClocksThrottleReasons, ``nvmlDeviceGetTemperatureV`` vs ``nvmlDeviceGetTemperature``,
memory info v2 vs v1) are probed once, newest first: a FunctionNotFound or
ArgumentVersionMismatch moves on to the next variant and the choice is cached for the process.
Units are converted here: bytes, seconds, hertz, watts, joules, ratios 0-1.
"""
from __future__ import annotations

import ctypes
import logging
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import HardwareAbsent, SourceUnavailable

log = logging.getLogger("teye.gpu.nvml")

ABSENT = "absent"
GPU_DOWN = "gpu_down"
SOURCE_DOWN = "source_down"

# NVML_ERROR_<name> -> behaviour (anything not listed: GPU_DOWN)
_ABSENT_ERRORS = ("NOT_SUPPORTED", "NO_PERMISSION", "FUNCTION_NOT_FOUND", "NOT_FOUND", "INVALID_ARGUMENT",
                  "CORRUPTED_INFOROM", "ARGUMENT_VERSION_MISMATCH", "DEPRECATED", "NO_DATA",
                  "INSUFFICIENT_SIZE", "VGPU_ECC_NOT_SUPPORTED", "FREQ_NOT_SUPPORTED",
                  "RESET_TYPE_NOT_SUPPORTED", "ALREADY_INITIALIZED")
_SOURCE_ERRORS = ("UNINITIALIZED", "LIBRARY_NOT_FOUND", "DRIVER_NOT_LOADED", "LIB_RM_VERSION_MISMATCH")
# A versioned function that fails with one of these is missing here: try the next variant.
_VERSION_ERRORS = ("FUNCTION_NOT_FOUND", "ARGUMENT_VERSION_MISMATCH")

# nvmlValueType_t -> member of the nvmlValue_t union
VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}

# Clock event (formerly "throttle") reason bits -> label value of teye_gpu_clock_event_active
CLOCK_EVENT_REASONS = (
    (0x0000000000000001, "gpu_idle"),
    (0x0000000000000002, "applications_clocks_setting"),
    (0x0000000000000004, "power_cap"),
    (0x0000000000000008, "hw_slowdown"),
    (0x0000000000000010, "sync_boost"),
    (0x0000000000000020, "sw_thermal"),
    (0x0000000000000040, "hw_thermal"),
    (0x0000000000000080, "hw_power_brake"),
    (0x0000000000000100, "display_clock_setting"),
)

# PCIe generation -> (transfer rate in GT/s, encoding efficiency); gen 6 runs FLIT mode
# (242 payload bytes of each 256-byte flit), earlier generations 8b/10b or 128b/130b.
PCIE_GENERATIONS = {1: (2.5, 8 / 10), 2: (5.0, 8 / 10), 3: (8.0, 128 / 130), 4: (16.0, 128 / 130),
                    5: (32.0, 128 / 130), 6: (64.0, 242 / 256)}

# GPM metric id constant name -> (short name, scale to base units)
GPM_METRICS = (
    ("NVML_GPM_METRIC_SM_UTIL", "sm_active", 0.01),
    ("NVML_GPM_METRIC_SM_OCCUPANCY", "sm_occupancy", 0.01),
    ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", "tensor_active", 0.01),
    ("NVML_GPM_METRIC_DRAM_BW_UTIL", "dram_active", 0.01),
    ("NVML_GPM_METRIC_FP16_UTIL", "fp16_active", 0.01),
    ("NVML_GPM_METRIC_FP32_UTIL", "fp32_active", 0.01),
    ("NVML_GPM_METRIC_FP64_UTIL", "fp64_active", 0.01),
    ("NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", "nvlink_rx", 1024.0 * 1024.0),  # MiB/s -> bytes/s
    ("NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", "nvlink_tx", 1024.0 * 1024.0),
    ("NVML_GPM_METRIC_GRAPHICS_UTIL", "graphics_active", 0.01),
)

# NVML field values read with nvmlDeviceGetFieldValues: constant name -> short name (base units as NVML gives
# them: memory temperature in °C).  A field this GPU does not report answers NotSupported in its own slot.
FIELD_VALUES = (
    ("NVML_FI_DEV_MEMORY_TEMP", "memory_temperature"),
)

XID_EVENT = 0x0000000000000008  # nvmlEventTypeXidCriticalError


NVML_LIBRARY = "libnvidia-ml.so.1"      # the name nvidia-ml-py loads on Linux (and CUDA's own tools)


def load_pynvml():
    """The real pynvml module (nvidia-ml-py) where NVIDIA's library loads; HardwareAbsent where it cannot (no
    driver: pynvml is not imported then, 2 MiB of the daemon's memory on a node without GPUs, as its nvmlInit
    would fail the same way), SourceUnavailable where pynvml is not installed."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(NVML_LIBRARY)     # (where it loads, pynvml's own load finds it loaded)
        except OSError as e:
            raise HardwareAbsent(f"NVML init failed: {NVML_LIBRARY} cannot be loaded ({e}): no NVIDIA driver on "
                                 f"this machine") from None
    return import_pynvml()


def import_pynvml():
    """The pynvml module, its library not loaded (a replay takes NVML's constants and error classes from it),
    or SourceUnavailable when it is not installed."""
    try:
        import pynvml  # noqa: WPS433 (the one import of pynvml in teye)
    except ImportError as e:
        raise SourceUnavailable(f"nvidia-ml-py (pynvml) is not installed: {e}") from None
    return pynvml


class GpuLost(Exception):
    """One GPU stopped answering (GpuIsLost, Unknown, ...); the others keep working."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def handle_key(handle) -> Any:
    """A hashable identity for a device handle (ctypes pointers compare by address)."""
    if isinstance(handle, ctypes._Pointer):  # noqa: SLF001 (the base class of every ctypes pointer)
        return ("ptr", ctypes.cast(handle, ctypes.c_void_p).value)
    return handle


def pcie_link_max_bytes_per_second(generation: int, width: int) -> Optional[float]:
    """Payload bytes/s per direction of a PCIe link: generation x width x per-lane rate after encoding."""
    spec = PCIE_GENERATIONS.get(int(generation))
    if spec is None or width <= 0:
        return None
    gts, efficiency = spec
    return gts * 1e9 * efficiency / 8.0 * int(width)


class NvmlBackend:
    """All NVML access for one agent.  Methods return base units, or None when absent."""

    def __init__(self, nv):
        self.nv = nv
        self._behaviour: Dict[int, str] = {}
        for names, what in ((_ABSENT_ERRORS, ABSENT), (_SOURCE_ERRORS, SOURCE_DOWN)):
            for n in names:
                code = getattr(nv, "NVML_ERROR_" + n, None)
                if code is not None:
                    self._behaviour[code] = what
        self._version_codes = {getattr(nv, "NVML_ERROR_" + n) for n in _VERSION_ERRORS
                               if hasattr(nv, "NVML_ERROR_" + n)}
        self._not_found = getattr(nv, "NVML_ERROR_NOT_FOUND", 6)
        self._timeout = getattr(nv, "NVML_ERROR_TIMEOUT", 10)
        self._success = getattr(nv, "NVML_SUCCESS", 0)
        mem_v2 = getattr(nv, "nvmlMemory_v2", None)
        temp_gpu = getattr(nv, "NVML_TEMPERATURE_GPU", 0)
        # capability -> variants, newest first: (function name, extra positional args, keyword args)
        self._variants: Dict[str, Sequence[Tuple[str, tuple, dict]]] = {
            "processes": (("nvmlDeviceGetComputeRunningProcesses_v3", (), {}),
                          ("nvmlDeviceGetComputeRunningProcesses_v2", (), {}),
                          ("nvmlDeviceGetComputeRunningProcesses", (), {})),
            "clock_events": (("nvmlDeviceGetCurrentClocksEventReasons", (), {}),
                             ("nvmlDeviceGetCurrentClocksThrottleReasons", (), {})),
            "clock_events_supported": (("nvmlDeviceGetSupportedClocksEventReasons", (), {}),
                                       ("nvmlDeviceGetSupportedClocksThrottleReasons", (), {})),
            "temperature": (("nvmlDeviceGetTemperatureV", (temp_gpu,), {}),
                            ("nvmlDeviceGetTemperature", (temp_gpu,), {})),
            "pci_info": (("nvmlDeviceGetPciInfo_v3", (), {}), ("nvmlDeviceGetPciInfo", (), {})),
            "memory": ((("nvmlDeviceGetMemoryInfo", (), {"version": mem_v2}),) if mem_v2 else ())
                      + (("nvmlDeviceGetMemoryInfo", (), {}),),
            "process_utilization": (("nvmlDeviceGetProcessesUtilizationInfo", (), {}),
                                    ("nvmlDeviceGetProcessUtilization", (), {})),
            "event_wait": (("nvmlEventSetWait_v2", (), {}), ("nvmlEventSetWait", (), {})),
        }
        self._chosen: Dict[str, int] = {}  # capability -> index of the first variant not known missing
        self._consts: Dict[str, Any] = {}
        self._gpm_request = None
        self._gpm_wanted = [(getattr(nv, const), short, scale) for const, short, scale in GPM_METRICS
                            if hasattr(nv, const)]

    def k(self, name: str, default=None):
        """An NVML constant of the module (cached: fakes and replays resolve attributes slowly)."""
        try:
            return self._consts[name]
        except KeyError:
            v = self._consts[name] = getattr(self.nv, name, default)
            return v

    # ------------------------------------------------------------------ error mapping
    def behaviour(self, code: int) -> str:
        return self._behaviour.get(code, GPU_DOWN)

    def _missing(self) -> Exception:
        return self.nv.NVMLError(self.k("NVML_ERROR_FUNCTION_NOT_FOUND", 13))

    def _raw(self, name: str, *args, **kw):
        fn = getattr(self.nv, name, None)
        if fn is None:  # an older nvidia-ml-py without this binding: same as a driver without the symbol
            raise self._missing()
        return fn(*args, **kw)

    def _fail(self, name: str, err) -> None:
        """Translate one NVML error: returns (absent) or raises GpuLost / SourceUnavailable."""
        what = self.behaviour(err.value)
        if what == ABSENT:
            return None
        if what == SOURCE_DOWN:
            raise SourceUnavailable(f"NVML {name}: {err}") from None
        raise GpuLost(f"{name}: {err}") from None

    def call(self, name: str, *args, **kw):
        """pynvml.<name>(*args): its value, None when absent, else GpuLost / SourceUnavailable."""
        try:
            return self._raw(name, *args, **kw)
        except self.nv.NVMLError as e:
            return self._fail(name, e)

    def call_versioned(self, capability: str, *args):
        """Call the newest variant of a versioned function this driver has (probed once, cached)."""
        variants = self._variants[capability]
        i = self._chosen.get(capability, 0)
        while i < len(variants):
            name, extra, kw = variants[i]
            try:
                value = self._raw(name, *args, *extra, **kw)
            except self.nv.NVMLError as e:
                if e.value in self._version_codes:
                    i += 1
                    self._chosen[capability] = i
                    continue
                return self._fail(name, e)
            self._chosen[capability] = i
            return value
        return None

    def chosen_variant(self, capability: str) -> Optional[str]:
        """Which function a versioned capability resolved to (None before the first call or when none exists)."""
        i = self._chosen.get(capability)
        variants = self._variants[capability]
        return variants[i][0] if i is not None and i < len(variants) else None

    # ------------------------------------------------------------------ system
    def init(self) -> None:
        """nvmlInit, or SourceUnavailable saying why NVML cannot be used here."""
        try:
            self.nv.nvmlInit()
        except self.nv.NVMLError as e:
            if self.behaviour(e.value) == ABSENT:  # AlreadyInitialized
                return
            hint, cls = "", SourceUnavailable
            if e.value == self.k("NVML_ERROR_LIBRARY_NOT_FOUND", 12):
                hint, cls = " (libnvidia-ml.so.1 not found: no NVIDIA driver on this machine)", HardwareAbsent
            elif e.value == self.k("NVML_ERROR_DRIVER_NOT_LOADED", 9):
                hint, cls = " (the NVIDIA kernel driver is not loaded)", HardwareAbsent
            raise cls(f"NVML init failed: {e}{hint}") from None

    def shutdown(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except self.nv.NVMLError as e:
            log.debug("nvmlShutdown: %s", e)

    def driver_version(self) -> Optional[str]:
        return self._text(self.call("nvmlSystemGetDriverVersion"))

    def nvml_version(self) -> Optional[str]:
        return self._text(self.call("nvmlSystemGetNVMLVersion"))

    def cuda_driver_version(self) -> Optional[str]:
        v = self.call("nvmlSystemGetCudaDriverVersion")
        return None if v is None else f"{int(v) // 1000}.{int(v) % 1000 // 10}"

    def device_count(self) -> int:
        try:
            return int(self._raw("nvmlDeviceGetCount"))
        except self.nv.NVMLError as e:
            if self.behaviour(e.value) == SOURCE_DOWN:
                raise SourceUnavailable(f"NVML nvmlDeviceGetCount: {e}") from None
            raise SourceUnavailable(f"NVML cannot count GPUs: {e}") from None

    def handle_by_index(self, index: int):
        h = self.call("nvmlDeviceGetHandleByIndex", index)
        if h is None:
            raise GpuLost(f"nvmlDeviceGetHandleByIndex({index}) not available")
        return h

    @staticmethod
    def _text(v) -> Optional[str]:
        if v is None:
            return None
        return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)

    # ------------------------------------------------------------------ identity
    def uuid(self, h) -> Optional[str]:
        return self._text(self.call("nvmlDeviceGetUUID", h))

    def name(self, h) -> Optional[str]:
        return self._text(self.call("nvmlDeviceGetName", h))

    def pci_bus_id(self, h) -> Optional[str]:
        info = self.call_versioned("pci_info", h)
        return None if info is None else self._text(info.busId)

    def mig_devices(self, h) -> List[Tuple[str, Any]]:
        """MIG instances of a physical GPU in MIG mode: [(instance id, handle)]; [] when MIG is off."""
        mode = self.call("nvmlDeviceGetMigMode", h)
        if not mode or int(mode[0]) != self.k("NVML_DEVICE_MIG_ENABLE", 1):
            return []
        count = self.call("nvmlDeviceGetMaxMigDeviceCount", h) or 0
        out = []
        for i in range(int(count)):
            mh = self.call("nvmlDeviceGetMigDeviceHandleByIndex", h, i)
            if mh is None:  # NotFound: no instance in this slot
                continue
            gi = self.call("nvmlDeviceGetGpuInstanceId", mh)
            out.append((str(gi if gi is not None else i), mh))
        return out

    # ------------------------------------------------------------------ readings
    def utilization(self, h) -> Tuple[Optional[float], Optional[float]]:
        """NVML's current (gpu, memory) utilization as ratios."""
        u = self.call("nvmlDeviceGetUtilizationRates", h)
        if u is None:
            return None, None
        return u.gpu / 100.0, u.memory / 100.0

    def memory(self, h) -> Tuple[Optional[float], Optional[float], Optional[float], Optional[float]]:
        """(used, total, free, reserved) bytes; v2 when the driver has it (used excludes driver-reserved memory,
        as nvidia-smi); reserved None under v1, which has no such field (its used includes it)."""
        m = self.call_versioned("memory", h)
        if m is None:
            return None, None, None, None
        reserved = getattr(m, "reserved", None)
        return float(m.used), float(m.total), float(m.free), None if reserved is None else float(reserved)

    def field_values(self, h) -> Dict[str, float]:
        """FIELD_VALUES this GPU reports, by short name (one nvmlDeviceGetFieldValues call); {} when none."""
        wanted = [(self.k(const), short) for const, short in FIELD_VALUES if self.k(const) is not None]
        if not wanted:
            return {}
        got = self.call("nvmlDeviceGetFieldValues", h, [fid for fid, _ in wanted])
        if got is None:
            return {}
        out = {}
        for (fid, short), fv in zip(wanted, got):
            if int(fv.nvmlReturn) != self._success or int(fv.fieldId) != fid:
                continue  # NotSupported (e.g. GDDR boards have no memory sensor), or a slot not ours
            field = VALUE_FIELDS.get(int(fv.valueType))
            if field is not None:
                out[short] = float(getattr(fv.value, field))
        return out

    def pcie_replays(self, h) -> Optional[float]:
        """PCIe replays (link-level retransmissions) since the driver was loaded."""
        n = self.call("nvmlDeviceGetPcieReplayCounter", h)
        return None if n is None else float(n)

    def codec_utilization(self, h, which: str) -> Optional[float]:
        """Encoder ('encoder') or decoder ('decoder') utilization as a ratio over NVML's sampling period."""
        fn = {"encoder": "nvmlDeviceGetEncoderUtilization", "decoder": "nvmlDeviceGetDecoderUtilization"}[which]
        r = self.call(fn, h)
        return None if r is None else r[0] / 100.0

    def power_watts(self, h) -> Optional[float]:
        mw = self.call("nvmlDeviceGetPowerUsage", h)
        return None if mw is None else mw / 1000.0

    def energy_joules(self, h) -> Optional[float]:
        mj = self.call("nvmlDeviceGetTotalEnergyConsumption", h)
        return None if mj is None else mj / 1000.0

    def temperature_celsius(self, h) -> Optional[float]:
        t = self.call_versioned("temperature", h)
        return None if t is None else float(t)

    def clock_hz(self, h, which: str) -> Optional[float]:
        clock = {"sm": "NVML_CLOCK_SM", "memory": "NVML_CLOCK_MEM"}[which]
        mhz = self.call("nvmlDeviceGetClockInfo", h, self.k(clock))
        return None if mhz is None else mhz * 1e6

    def pcie_throughput(self, h) -> Tuple[Optional[float], Optional[float]]:
        """(transmit, receive) bytes/s; NVML reports KB/s (1024 bytes) over a 20 ms window."""
        tx = self.call("nvmlDeviceGetPcieThroughput", h, self.k("NVML_PCIE_UTIL_TX_BYTES", 0))
        rx = self.call("nvmlDeviceGetPcieThroughput", h, self.k("NVML_PCIE_UTIL_RX_BYTES", 1))
        return (None if tx is None else tx * 1024.0), (None if rx is None else rx * 1024.0)

    def pcie_link_max(self, h) -> Optional[float]:
        gen = self.call("nvmlDeviceGetCurrPcieLinkGeneration", h)
        width = self.call("nvmlDeviceGetCurrPcieLinkWidth", h)
        if gen is None or width is None:
            return None
        return pcie_link_max_bytes_per_second(gen, width)

    def clock_events(self, h) -> Optional[Tuple[Tuple[str, bool], ...]]:
        """((reason, active), ...) for the reasons this GPU supports; None when unsupported."""
        current = self.call_versioned("clock_events", h)
        if current is None:
            return None
        supported = self.call_versioned("clock_events_supported", h)
        return tuple((name, bool(current & bit)) for bit, name in CLOCK_EVENT_REASONS
                     if supported is None or supported & bit)

    def ecc_volatile(self, h) -> Tuple[Tuple[str, float], ...]:
        """Volatile (since driver load) ECC error totals: (("corrected", n), ("uncorrected", n)) where supported."""
        out = []
        volatile = self.k("NVML_VOLATILE_ECC", 0)
        for kind, const in (("corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
                            ("uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED")):
            n = self.call("nvmlDeviceGetTotalEccErrors", h, self.k(const), volatile)
            if n is not None:
                out.append((kind, float(n)))
        return tuple(out)

    def retired_pages(self, h) -> Tuple[Tuple[Tuple[str, float], ...], Optional[float]]:
        """Retired pages by cause (pre-Ampere page retirement) and whether a retirement is pending."""
        out = []
        for cause, const in (("multiple_single_bit_ecc", "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS"),
                             ("double_bit_ecc", "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR")):
            pages = self.call("nvmlDeviceGetRetiredPages", h, self.k(const))
            if pages is not None:
                out.append((cause, float(len(pages))))
        pending = self.call("nvmlDeviceGetRetiredPagesPendingStatus", h) if out else None
        return tuple(out), (None if pending is None else float(bool(pending)))

    def remapped_rows(self, h) -> Optional[Tuple[float, float, float, float]]:
        """Row remapping (Ampere and newer): (correctable, uncorrectable, pending, failed)."""
        r = self.call("nvmlDeviceGetRemappedRows", h)
        if r is None:
            return None
        corr, unc, pending, failed = r
        return float(corr), float(unc), float(bool(pending)), float(bool(failed))

    def samples(self, h, last_seen_us: int) -> Optional[List[Tuple[int, float]]]:
        """Utilization samples newer than last_seen_us from the driver's ring: [(timestamp µs, percent)].

        NVML answers NotFound when no sample is newer than last_seen_us: that is an empty list.
        None: the GPU has no utilization ring (NotSupported, e.g. MIG instances)."""
        kind = self.k("NVML_GPU_UTILIZATION_SAMPLES", 1)
        try:
            vtype, raw = self._raw("nvmlDeviceGetSamples", h, kind, int(last_seen_us))
        except self.nv.NVMLError as e:
            if e.value == self._not_found:
                return []
            return self._fail("nvmlDeviceGetSamples", e)
        field = VALUE_FIELDS.get(int(vtype), "uiVal")
        return [(int(s.timeStamp), float(getattr(s.sampleValue, field))) for s in raw]

    def processes(self, h) -> Optional[List[Tuple[int, Optional[float]]]]:
        """Compute processes on the GPU: [(pid, used GPU memory bytes or None)]."""
        procs = self.call_versioned("processes", h)
        if procs is None:
            return None
        out = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            out.append((int(p.pid), None if used is None else float(used)))
        return out

    def process_utilization(self, h, last_seen_us: int) -> Optional[List[Tuple[int, int, float]]]:
        """Per-process SM utilization samples newer than last_seen_us: [(pid, timestamp µs, percent)].

        NVML lists only processes with non-zero utilization in the window; NotFound means none."""
        variants = self._variants["process_utilization"]
        i = self._chosen.get("process_utilization", 0)
        while i < len(variants):
            name = variants[i][0]
            try:
                raw = self._raw(name, h, int(last_seen_us))
            except self.nv.NVMLError as e:
                if e.value in self._version_codes:
                    i += 1
                    self._chosen["process_utilization"] = i
                    continue
                if e.value == self._not_found:
                    self._chosen["process_utilization"] = i
                    return []
                return self._fail(name, e)
            self._chosen["process_utilization"] = i
            return [(int(s.pid), int(s.timeStamp), float(s.smUtil)) for s in raw]
        return None

    # ------------------------------------------------------------------ GPM (Hopper and newer)
    def gpm_supported(self, h) -> Optional[bool]:
        """True/False from nvmlGpmQueryDeviceSupport; None when the driver has no GPM at all."""
        s = self.call("nvmlGpmQueryDeviceSupport", h)
        return None if s is None else bool(s.isSupportedDevice)

    def gpm_alloc(self):
        return self.call("nvmlGpmSampleAlloc")

    def gpm_free(self, sample) -> None:
        self.call("nvmlGpmSampleFree", sample)

    def gpm_sample(self, h, sample, parent=None, instance_id: Optional[int] = None) -> bool:
        """Take a GPM sample (of a MIG instance when parent/instance_id are given); False when absent."""
        if parent is not None and instance_id is not None:
            r = self.call("nvmlGpmMigSampleGet", parent, int(instance_id), sample)
        else:
            r = self.call("nvmlGpmSampleGet", h, sample)
        return r is not None

    def gpm_metrics(self, sample1, sample2) -> Dict[str, float]:
        """GPM metrics between two samples (>= 100 ms apart), in base units; metrics NVML cannot give are absent."""
        wanted = self._gpm_wanted
        mg = self._gpm_request
        if mg is None:  # one request struct, reused (it is large): metric ids are set once
            mg = self._gpm_request = self.nv.c_nvmlGpmMetricsGet_t()
            mg.version = self.k("NVML_GPM_METRICS_GET_VERSION", 1)
            mg.numMetrics = len(wanted)
            for i, (mid, _, _) in enumerate(wanted):
                mg.metrics[i].metricId = mid
        mg.sample1 = sample1
        mg.sample2 = sample2
        if self.call("nvmlGpmMetricsGet", mg) is None:
            return {}
        out = {}
        for i, (mid, short, scale) in enumerate(wanted):
            m = mg.metrics[i]
            if m.nvmlReturn == self._success:
                out[short] = float(m.value) * scale
        return out

    # ------------------------------------------------------------------ events
    def event_set_create(self):
        return self.call("nvmlEventSetCreate")

    def event_set_free(self, event_set) -> None:
        self.call("nvmlEventSetFree", event_set)

    def register_xid(self, h, event_set) -> bool:
        """Register the GPU's XID critical-error events on event_set; False when it cannot deliver them."""
        supported = self.call("nvmlDeviceGetSupportedEventTypes", h)
        if supported is None or not supported & XID_EVENT:
            return False
        try:
            self._raw("nvmlDeviceRegisterEvents", h, XID_EVENT, event_set)  # returns None on success
        except self.nv.NVMLError as e:
            self._fail("nvmlDeviceRegisterEvents", e)
            return False
        return True

    def event_wait(self, event_set, timeout_ms: int):
        """The next event, or None after timeout_ms without one."""
        variants = self._variants["event_wait"]
        i = self._chosen.get("event_wait", 0)
        while i < len(variants):
            name = variants[i][0]
            try:
                data = self._raw(name, event_set, int(timeout_ms))
            except self.nv.NVMLError as e:
                if e.value in self._version_codes:
                    i += 1
                    self._chosen["event_wait"] = i
                    continue
                if e.value == self._timeout:
                    return None
                return self._fail(name, e)
            self._chosen["event_wait"] = i
            return data
        raise SourceUnavailable("NVML has no nvmlEventSetWait")
