"""A fake pynvml module for tests: same function names, argument orders, return types and
error classes as nvidia-ml-py 13.x, driven by scripted per-GPU state instead of a driver.

Faithful to real NVML where teye depends on it:
- returns pynvml's own ctypes structs (c_nvmlUtilization_t, c_nvmlMemory_v2_t, nvmlPciInfo_t,
  c_nvmlSample_t, c_nvmlProcessUtilizationSample_t, c_nvmlEventData_t, c_nvmlGpmSupport_t,
  friendly objects for process lists) and device handles that are real ``c_nvmlDevice_t``
  pointers (never dereferenced);
- raises pynvml's own ``NVMLError_*`` classes (``pynvml.NVMLError(code)``);
- ``nvmlDeviceGetSamples`` keeps a ring of the newest ``ring_capacity`` samples, returns
  only samples newer than lastSeenTimeStamp (all of them for 0) and NotFound when there is
  none; timestamps are CPU wall-clock µs; values are unsigned-int percents;
- ``nvmlDeviceGetProcessUtilization`` raises NotFound when no process had a sample;
- a function listed in ``missing`` raises FunctionNotFound (a driver without the symbol);
- every call before ``nvmlInit`` raises Uninitialized; a lost GPU raises GpuIsLost.

Scripting: ``fake.script(fn, answer, ..., gpu=i)`` queues answers (values, or ``Err(code)``)
that the next calls of fn (on GPU i, or any GPU) return before the normal behaviour.
"""
from __future__ import annotations

import bisect
import ctypes
import queue
from collections import Counter, defaultdict, deque
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import pynvml as _nv

GiB = 1024 ** 3
XID = _nv.nvmlEventTypeXidCriticalError


class Err:
    """A scripted NVML error answer."""

    def __init__(self, code: int):
        self.code = code


class Timeline:
    """Ground truth: sorted, disjoint busy intervals [(start_us, end_us)] on the CPU wall clock."""

    def __init__(self, busy: Sequence[Tuple[int, int]]):
        self.busy = sorted((int(a), int(b)) for a, b in busy if b > a)
        self._starts = [a for a, _ in self.busy]

    def busy_us(self, a: int, b: int) -> int:
        """Busy µs within [a, b)."""
        if b <= a:
            return 0
        total = 0
        i = max(0, bisect.bisect_right(self._starts, a) - 1)
        while i < len(self.busy) and self.busy[i][0] < b:
            s, e = self.busy[i]
            total += max(0, min(e, b) - max(s, a))
            i += 1
        return total

    def gaps(self, a: int, b: int) -> List[Tuple[int, int]]:
        """Idle intervals strictly inside [a, b) (bounded by busy time on both sides)."""
        out = []
        for (s0, e0), (s1, e1) in zip(self.busy, self.busy[1:]):
            if e0 >= a and s1 <= b and s1 > e0:
                out.append((e0, s1))
        return out


class FakeMig:
    def __init__(self, parent: "FakeGpu", slot: int, gpu_instance_id: int):
        self.parent = parent
        self.slot = slot
        self.gpu_instance_id = gpu_instance_id
        self.uuid = f"MIG-{parent.index:02d}{gpu_instance_id:02d}0000-1111-2222-3333-444444444444"
        self.name = parent.name + " MIG 1g.10gb"
        self.memory_total = 10 * GiB
        self.memory_used = 1 * GiB
        self.processes: List[Tuple[int, Optional[int]]] = []
        self.lost = False
        self.handle = ctypes.cast(ctypes.c_void_p(0x100000 + parent.index * 0x100 + 1 + slot), _nv.c_nvmlDevice_t)
        self.gpm_values: Dict[int, float] = {}


class FakeGpu:
    def __init__(self, index: int, name: str = "NVIDIA H100 80GB HBM3", timeline: Optional[Timeline] = None,
                 period_us: int = 166_667, ring_start_us: int = 0):
        self.index = index
        self.name = name
        self.uuid = f"GPU-{index:08x}-aaaa-bbbb-cccc-{index:012x}"
        self.bus_id = f"00000000:{0x18 + index:02X}:00.0"
        self.handle = ctypes.cast(ctypes.c_void_p(0x100000 + index * 0x100), _nv.c_nvmlDevice_t)
        self.lost = False
        self.not_supported: set = set()
        self.util_gpu, self.util_mem = 87, 35
        self.memory_total, self.memory_used, self.memory_reserved = 80 * GiB, 20 * GiB, 512 * 1024 ** 2
        self.power_mw = 312_500
        self.energy_mj = 123_456_789
        self.temperature = 61
        self.memory_temperature: Optional[int] = 71   # HBM sensor (field NVML_FI_DEV_MEMORY_TEMP); None: no sensor
        self.pcie_replays = 4
        self.encoder_util, self.decoder_util = 12, 30  # percent over the sampling period
        self.sm_mhz, self.mem_mhz = 1980, 2619
        self.pcie_tx_kb, self.pcie_rx_kb = 1_000_000, 250_000
        self.pcie_gen, self.pcie_width = 5, 16
        self.clock_events = 0x4  # SW power cap
        self.clock_events_supported = 0x1FF
        self.ecc: Optional[Tuple[int, int]] = (3, 0)
        self.retired: Optional[Dict[int, List[int]]] = None  # cause -> page addresses (pre-Ampere)
        self.retired_pending = 0
        self.remapped: Optional[Tuple[int, int, int, int]] = (2, 1, 0, 0)
        self.processes: List[Tuple[int, Optional[int]]] = []
        self.process_util: List[Tuple[int, int, int]] = []  # (pid, timeStamp µs, smUtil %)
        self.gpm = True
        self.gpm_values: Dict[int, float] = {_nv.NVML_GPM_METRIC_SM_UTIL: 71.0,
                                             _nv.NVML_GPM_METRIC_SM_OCCUPANCY: 42.0,
                                             _nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 55.5,
                                             _nv.NVML_GPM_METRIC_DRAM_BW_UTIL: 30.0,
                                             _nv.NVML_GPM_METRIC_FP16_UTIL: 12.0,
                                             _nv.NVML_GPM_METRIC_FP32_UTIL: 8.0,
                                             _nv.NVML_GPM_METRIC_FP64_UTIL: 0.5,
                                             _nv.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: 1000.0,
                                             _nv.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: 2000.0,
                                             _nv.NVML_GPM_METRIC_GRAPHICS_UTIL: 80.0}
        self.event_types = XID | _nv.nvmlEventTypeSingleBitEccError | _nv.nvmlEventTypeDoubleBitEccError
        self.mig: List[FakeMig] = []
        # utilization ring: a sample every period_us from ring_start_us; value = busy % of its period
        self.timeline = timeline if timeline is not None else Timeline([])
        self.period_us = period_us
        self.ring_start_us = ring_start_us
        self.sample_value: Optional[Callable[[int, int], int]] = None  # override (start, end) -> percent

    def enable_mig(self, instance_ids: Sequence[int]) -> None:
        self.mig = [FakeMig(self, slot, gi) for slot, gi in enumerate(instance_ids)]

    def ring_value(self, start: int, end: int) -> int:
        if self.sample_value is not None:
            return int(self.sample_value(start, end))
        return int(round(100.0 * self.timeline.busy_us(start, end) / (end - start)))


def _checked(fn):
    """Common NVML behaviour in front of every fake function."""
    name = fn.__name__

    def call(self, *args, **kw):
        self.calls[name] += 1
        if name not in ("nvmlInit", "nvmlInitWithFlags") and not self.initialized:
            raise _nv.NVMLError(_nv.NVML_ERROR_UNINITIALIZED)
        dev = self._device(args[0]) if args and isinstance(args[0], ctypes._Pointer) else None
        gpu_index = None if dev is None else (dev.index if isinstance(dev, FakeGpu) else dev.parent.index)
        for key in ((name, gpu_index), (name, None)):
            q = self._scripted.get(key)
            if q:
                answer = q.popleft()
                if isinstance(answer, Err):
                    raise _nv.NVMLError(answer.code)
                return answer
        if name in self.missing:
            raise _nv.NVMLError(_nv.NVML_ERROR_FUNCTION_NOT_FOUND)
        if dev is not None:
            if dev.lost or (isinstance(dev, FakeMig) and dev.parent.lost):
                raise _nv.NVMLError(_nv.NVML_ERROR_GPU_IS_LOST)
            if isinstance(dev, FakeGpu) and name in dev.not_supported:
                raise _nv.NVMLError(_nv.NVML_ERROR_NOT_SUPPORTED)
        return fn(self, *args, **kw)

    call.__name__ = name
    return call


class FakeNvml:
    """Stands in for the ``pynvml`` module."""

    def __init__(self, gpus: Sequence[FakeGpu] = (), now_us: int = 1_700_000_000_000_000, ring_capacity: int = 100,
                 driver_version: str = "550.54.15"):
        self.gpus = list(gpus)
        self.now_us = now_us
        self.ring_capacity = ring_capacity
        self.driver_version = driver_version
        self.initialized = False
        self.init_error: Optional[int] = None
        self.missing: set = {"nvmlDeviceGetProcessesUtilizationInfo"}  # R535-style driver by default
        self.samples_inclusive = False  # True: also return the sample AT lastSeenTimeStamp (tests dedup)
        self.calls: Counter = Counter()
        self._scripted: Dict[tuple, deque] = defaultdict(deque)
        self._gpm_samples: Dict[int, Tuple[object, int]] = {}
        self._next_ptr = 0x900000
        self._events: "queue.Queue" = queue.Queue()
        self._registered: Dict[int, int] = {}
        self._by_address: Dict[int, object] = {}

    # ------------------------------------------------------------------ scripting helpers
    def script(self, fn: str, *answers, gpu: Optional[int] = None) -> None:
        self._scripted[(fn, gpu)].extend(answers)

    def advance(self, seconds: float) -> None:
        self.now_us += int(round(seconds * 1e6))

    def emit_xid(self, gpu: int, xid: int) -> None:
        ev = _nv.c_nvmlEventData_t()
        ev.device = self.gpus[gpu].handle
        ev.eventType = XID
        ev.eventData = xid
        ev.gpuInstanceId = 0xFFFFFFFF
        ev.computeInstanceId = 0xFFFFFFFF
        self._events.put(ev)

    def __getattr__(self, name: str):
        attr = getattr(_nv, name)  # constants, structs, error classes
        if name.startswith("nvml") and callable(attr) and not isinstance(attr, type):
            def missing(*args, **kw):  # a binding this fake driver does not implement
                self.calls[name] += 1
                raise _nv.NVMLError(_nv.NVML_ERROR_FUNCTION_NOT_FOUND)
            return missing
        return attr

    def _device(self, handle):
        addr = ctypes.cast(handle, ctypes.c_void_p).value
        dev = self._by_address.get(addr)
        if dev is None:  # rebuild: GPUs or MIG instances were added since
            self._by_address = {ctypes.cast(d.handle, ctypes.c_void_p).value: d
                                for g in self.gpus for d in [g] + list(g.mig)}
            dev = self._by_address.get(addr)
        return dev

    def _ptr(self, kind):
        self._next_ptr += 16
        return ctypes.cast(ctypes.c_void_p(self._next_ptr), kind)

    # ------------------------------------------------------------------ system
    @_checked
    def nvmlInit(self):
        if self.init_error is not None:
            raise _nv.NVMLError(self.init_error)
        self.initialized = True

    @_checked
    def nvmlShutdown(self):
        self.initialized = False

    @_checked
    def nvmlSystemGetDriverVersion(self):
        return self.driver_version

    @_checked
    def nvmlSystemGetNVMLVersion(self):
        return "12." + self.driver_version

    @_checked
    def nvmlSystemGetCudaDriverVersion(self):
        return 12040

    @_checked
    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    @_checked
    def nvmlDeviceGetHandleByIndex(self, index):
        if not 0 <= index < len(self.gpus):
            raise _nv.NVMLError(_nv.NVML_ERROR_INVALID_ARGUMENT)
        g = self.gpus[index]
        if g.lost:
            raise _nv.NVMLError(_nv.NVML_ERROR_GPU_IS_LOST)
        return g.handle

    # ------------------------------------------------------------------ identity
    @_checked
    def nvmlDeviceGetUUID(self, h):
        return self._device(h).uuid

    @_checked
    def nvmlDeviceGetName(self, h):
        return self._device(h).name

    @_checked
    def nvmlDeviceGetPciInfo_v3(self, h):
        return self._pci_info(h)

    @_checked
    def nvmlDeviceGetPciInfo(self, h):
        return self._pci_info(h)

    def _pci_info(self, h):
        info = _nv.nvmlPciInfo_t()
        g = self._device(h)
        g = g.parent if isinstance(g, FakeMig) else g
        info.busId = g.bus_id.encode()
        info.busIdLegacy = g.bus_id[4:].encode()
        info.domain, info.bus, info.device = 0, 0x18 + g.index, 0
        return info

    @_checked
    def nvmlDeviceGetMigMode(self, h):
        g = self._device(h)
        if isinstance(g, FakeMig):
            raise _nv.NVMLError(_nv.NVML_ERROR_NOT_SUPPORTED)
        on = _nv.NVML_DEVICE_MIG_ENABLE if g.mig else _nv.NVML_DEVICE_MIG_DISABLE
        return [on, on]

    @_checked
    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7

    @_checked
    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, index):
        g = self._device(h)
        for m in g.mig:
            if m.slot == index:
                return m.handle
        raise _nv.NVMLError(_nv.NVML_ERROR_NOT_FOUND)

    @_checked
    def nvmlDeviceGetGpuInstanceId(self, h):
        d = self._device(h)
        if not isinstance(d, FakeMig):
            raise _nv.NVMLError(_nv.NVML_ERROR_INVALID_ARGUMENT)
        return d.gpu_instance_id

    # ------------------------------------------------------------------ readings
    @_checked
    def nvmlDeviceGetUtilizationRates(self, h):
        g = self._device(h)
        if isinstance(g, FakeMig):
            raise _nv.NVMLError(_nv.NVML_ERROR_NOT_SUPPORTED)
        u = _nv.c_nvmlUtilization_t()
        u.gpu, u.memory = g.util_gpu, g.util_mem
        return u

    @_checked
    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        d = self._device(h)
        if version:
            if "nvmlDeviceGetMemoryInfo_v2" in self.missing:
                raise _nv.NVMLError(_nv.NVML_ERROR_FUNCTION_NOT_FOUND)
            m = _nv.c_nvmlMemory_v2_t()
            m.version = version
            reserved = getattr(d, "memory_reserved", 0)
            m.total, m.reserved, m.used = d.memory_total, reserved, d.memory_used
            m.free = d.memory_total - reserved - d.memory_used
            return m
        m = _nv.c_nvmlMemory_t()
        reserved = getattr(d, "memory_reserved", 0)
        m.total, m.used, m.free = d.memory_total, d.memory_used + reserved, d.memory_total - d.memory_used - reserved
        return m

    def _physical(self, h) -> FakeGpu:
        d = self._device(h)
        if isinstance(d, FakeMig):
            raise _nv.NVMLError(_nv.NVML_ERROR_NOT_SUPPORTED)
        return d

    @_checked
    def nvmlDeviceGetPowerUsage(self, h):
        return self._physical(h).power_mw

    @_checked
    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return self._physical(h).energy_mj

    @_checked
    def nvmlDeviceGetTemperatureV(self, h, sensor, version=_nv.nvmlTemperature_v1):
        return self._physical(h).temperature

    @_checked
    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._physical(h).temperature

    @_checked
    def nvmlDeviceGetFieldValues(self, h, field_ids):
        """As NVML: one status per requested field; unknown or unsupported fields answer NotSupported in their slot."""
        g = self._physical(h)
        values = (_nv.c_nvmlFieldValue_t * len(field_ids))()
        for i, fid in enumerate(field_ids):
            values[i].fieldId = fid
            values[i].timestamp = self.now_us
            if fid == _nv.NVML_FI_DEV_MEMORY_TEMP and g.memory_temperature is not None:
                values[i].nvmlReturn, values[i].valueType = _nv.NVML_SUCCESS, _nv.NVML_VALUE_TYPE_UNSIGNED_INT
                values[i].value.uiVal = g.memory_temperature
            else:
                values[i].nvmlReturn = _nv.NVML_ERROR_NOT_SUPPORTED
        return values

    @_checked
    def nvmlDeviceGetPcieReplayCounter(self, h):
        return self._physical(h).pcie_replays

    @_checked
    def nvmlDeviceGetEncoderUtilization(self, h):
        return [self._physical(h).encoder_util, 167_000]

    @_checked
    def nvmlDeviceGetDecoderUtilization(self, h):
        return [self._physical(h).decoder_util, 167_000]

    @_checked
    def nvmlDeviceGetClockInfo(self, h, clock_type):
        g = self._physical(h)
        if clock_type == _nv.NVML_CLOCK_SM:
            return g.sm_mhz
        if clock_type == _nv.NVML_CLOCK_MEM:
            return g.mem_mhz
        raise _nv.NVMLError(_nv.NVML_ERROR_INVALID_ARGUMENT)

    @_checked
    def nvmlDeviceGetPcieThroughput(self, h, counter):
        g = self._physical(h)
        return g.pcie_tx_kb if counter == _nv.NVML_PCIE_UTIL_TX_BYTES else g.pcie_rx_kb

    @_checked
    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self._physical(h).pcie_gen

    @_checked
    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self._physical(h).pcie_width

    @_checked
    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._physical(h).clock_events

    @_checked
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return self._physical(h).clock_events

    @_checked
    def nvmlDeviceGetSupportedClocksEventReasons(self, h):
        return self._physical(h).clock_events_supported

    @_checked
    def nvmlDeviceGetSupportedClocksThrottleReasons(self, h):
        return self._physical(h).clock_events_supported

    @_checked
    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type):
        g = self._physical(h)
        if g.ecc is None:
            raise _nv.NVMLError(_nv.NVML_ERROR_NOT_SUPPORTED)
        return g.ecc[0] if error_type == _nv.NVML_MEMORY_ERROR_TYPE_CORRECTED else g.ecc[1]

    @_checked
    def nvmlDeviceGetRetiredPages(self, h, cause):
        g = self._physical(h)
        if g.retired is None:
            raise _nv.NVMLError(_nv.NVML_ERROR_NOT_SUPPORTED)
        return list(g.retired.get(cause, []))

    @_checked
    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        g = self._physical(h)
        if g.retired is None:
            raise _nv.NVMLError(_nv.NVML_ERROR_NOT_SUPPORTED)
        return g.retired_pending

    @_checked
    def nvmlDeviceGetRemappedRows(self, h):
        g = self._physical(h)
        if g.remapped is None:
            raise _nv.NVMLError(_nv.NVML_ERROR_NOT_SUPPORTED)
        return g.remapped

    # ------------------------------------------------------------------ the utilization ring
    def ring(self, g: FakeGpu, newer_than: int = 0) -> List[Tuple[int, int]]:
        """The samples the driver ring holds now (newest ring_capacity, timestamps <= now), newer than newer_than."""
        if self.now_us < g.ring_start_us:
            return []
        n_last = (self.now_us - g.ring_start_us) // g.period_us
        n_first = max(1, n_last - self.ring_capacity + 1)
        if newer_than > g.ring_start_us:
            n_first = max(n_first, (newer_than - g.ring_start_us) // g.period_us)
        out = []
        for i in range(n_first, n_last + 1):
            end = g.ring_start_us + i * g.period_us
            if end > newer_than:
                out.append((end, g.ring_value(end - g.period_us, end)))
        return out

    @_checked
    def nvmlDeviceGetSamples(self, h, sampling_type, last_seen):
        g = self._device(h)
        if isinstance(g, FakeMig) or sampling_type != _nv.NVML_GPU_UTILIZATION_SAMPLES:
            raise _nv.NVMLError(_nv.NVML_ERROR_NOT_SUPPORTED)
        since = last_seen - 1 if self.samples_inclusive and last_seen else last_seen
        picked = self.ring(g, since)
        if not picked:
            raise _nv.NVMLError(_nv.NVML_ERROR_NOT_FOUND)
        out = []
        for ts, v in picked:
            s = _nv.c_nvmlSample_t()
            s.timeStamp = ts
            s.sampleValue.uiVal = v
            out.append(s)
        return _nv.NVML_VALUE_TYPE_UNSIGNED_INT, out

    # ------------------------------------------------------------------ processes
    def _procs(self, h):
        d = self._device(h)
        holders = d.mig if isinstance(d, FakeGpu) and d.mig else [d]
        out = []
        for holder in holders:
            for pid, used in holder.processes:
                info = _nv.c_nvmlProcessInfo_v3_t()
                info.pid = pid
                info.usedGpuMemory = used if used is not None else _nv.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
                info.gpuInstanceId = holder.gpu_instance_id if isinstance(holder, FakeMig) else 0xFFFFFFFF
                info.computeInstanceId = 0 if isinstance(holder, FakeMig) else 0xFFFFFFFF
                obj = _nv.nvmlStructToFriendlyObject(info)
                if obj.usedGpuMemory == _nv.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
                    obj.usedGpuMemory = None  # as pynvml does (WDDM)
                out.append(obj)
        return out

    @_checked
    def nvmlDeviceGetComputeRunningProcesses_v3(self, h):
        return self._procs(h)

    @_checked
    def nvmlDeviceGetComputeRunningProcesses_v2(self, h):
        return self._procs(h)

    @_checked
    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return self._procs(h)

    @_checked
    def nvmlDeviceGetProcessUtilization(self, h, last_seen):
        d = self._physical(h)
        picked = [(pid, ts, sm) for pid, ts, sm in d.process_util if ts > last_seen and ts <= self.now_us]
        if not picked:
            raise _nv.NVMLError(_nv.NVML_ERROR_NOT_FOUND)
        out = []
        for pid, ts, sm in picked:
            s = _nv.c_nvmlProcessUtilizationSample_t()
            s.pid, s.timeStamp, s.smUtil, s.memUtil = pid, ts, sm, 0
            out.append(s)
        return out

    # ------------------------------------------------------------------ GPM
    @_checked
    def nvmlGpmQueryDeviceSupport(self, h):
        s = _nv.c_nvmlGpmSupport_t()
        s.version = _nv.NVML_GPM_SUPPORT_VERSION
        s.isSupportedDevice = 1 if self._physical(h).gpm else 0
        return s

    @_checked
    def nvmlGpmSampleAlloc(self):
        return self._ptr(_nv.c_nvmlGpmSample_t)

    @_checked
    def nvmlGpmSampleFree(self, sample):
        self._gpm_samples.pop(ctypes.cast(sample, ctypes.c_void_p).value, None)

    @_checked
    def nvmlGpmSampleGet(self, h, sample):
        g = self._physical(h)
        if not g.gpm:
            raise _nv.NVMLError(_nv.NVML_ERROR_NOT_SUPPORTED)
        self._gpm_samples[ctypes.cast(sample, ctypes.c_void_p).value] = (g, self.now_us)
        return sample

    @_checked
    def nvmlGpmMigSampleGet(self, h, gpu_instance_id, sample):
        g = self._physical(h)
        mig = next((m for m in g.mig if m.gpu_instance_id == gpu_instance_id), None)
        if not g.gpm or mig is None:
            raise _nv.NVMLError(_nv.NVML_ERROR_NOT_SUPPORTED)
        self._gpm_samples[ctypes.cast(sample, ctypes.c_void_p).value] = (mig, self.now_us)
        return sample

    @_checked
    def nvmlGpmMetricsGet(self, mg):
        a = self._gpm_samples.get(ctypes.cast(mg.sample1, ctypes.c_void_p).value)
        b = self._gpm_samples.get(ctypes.cast(mg.sample2, ctypes.c_void_p).value)
        if a is None or b is None or a[0] is not b[0] or b[1] <= a[1]:
            raise _nv.NVMLError(_nv.NVML_ERROR_INVALID_ARGUMENT)
        values = b[0].gpm_values
        for i in range(mg.numMetrics):
            m = mg.metrics[i]
            if m.metricId in values:
                m.value = values[m.metricId]
                m.nvmlReturn = _nv.NVML_SUCCESS
            else:
                m.nvmlReturn = _nv.NVML_ERROR_NOT_SUPPORTED
        return mg

    # ------------------------------------------------------------------ events
    @_checked
    def nvmlEventSetCreate(self):
        return self._ptr(_nv.c_nvmlEventSet_t)

    @_checked
    def nvmlDeviceGetSupportedEventTypes(self, h):
        return self._physical(h).event_types

    @_checked
    def nvmlDeviceRegisterEvents(self, h, event_types, event_set):
        g = self._physical(h)
        if event_types & ~g.event_types:
            raise _nv.NVMLError(_nv.NVML_ERROR_NOT_SUPPORTED)
        self._registered[g.index] = event_types
        return None

    @_checked
    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        try:
            return self._events.get(timeout=timeout_ms / 1000.0)
        except queue.Empty:
            raise _nv.NVMLError(_nv.NVML_ERROR_TIMEOUT) from None

    @_checked
    def nvmlEventSetWait(self, event_set, timeout_ms):
        return self.nvmlEventSetWait_v2(event_set, timeout_ms)

    @_checked
    def nvmlEventSetFree(self, event_set):
        return None
