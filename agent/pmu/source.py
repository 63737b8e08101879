"""The ``pmu`` collector: hardware counters through the kernel's perf events, system-wide.

What is counted (the *plan*, built from ``<sysfs>`` and ``<procfs>/cpuinfo``):

- ``core``: ``cpu/cpu-cycles/`` and ``cpu/instructions/`` per online CPU (one group);
- ``fp``: the floating-point classes of :mod:`agent.pmu.events` per online CPU, in groups
  of at most four events (one group per precision on Intel, one on AMD);
- ``memory``: per socket, on the CPU named by each memory controller PMU's ``cpumask``:
  ``uncore_imc_free_running_<n>/{read,write}`` where those exist (Ice Lake-SP and later),
  else ``uncore_imc_<n>/{cas_count_read,cas_count_write}``; bytes = count x scale x unit;
  on AMD Zen 4+ ``amd_umc_<n>`` with the table's CAS events (64 bytes each); on AMD Zen 2/3
  ``amd_df`` DRAM channel events, reads and writes together (``teye_memory_transferred_bytes_total``);
- ``pcie``: per socket and root bus, ``uncore_iio_free_running_<n>/bw_in_port*`` (bytes
  devices wrote into host memory) and ``bw_out_port*`` (bytes devices read), the root bus
  from ``uncore_iio_<n>/die<socket>``; where the kernel has no free-running IIO PMU, the
  programmed ``uncore_iio_<n>`` events of :data:`agent.pmu.events.UNCORE_PCIE` (Skylake-SP /
  Cascade Lake: per port group a read and a written event, 4 bytes per count).

File descriptors: one per event, so 2 (core) + 8 (Intel fp; 1 on AMD) per online CPU, plus per
socket 2 per memory controller and one per IIO port (free-running), or 8 per IIO stack
(programmed: 4 port groups x read, written).  The soft RLIMIT_NOFILE is raised
(up to the hard limit) when the plan needs more; an EMFILE leaves that group absent.

Values: each read gives (value, time enabled, time running) cumulative since the open; a
multiplexed count is scaled like perf does, value x enabled / running; running 0 means
"never counted" and the group is absent.  Totals are kept per (pmu, event, cpu) and only
grow: when a counter starts again from zero (CPU back online, counter reopened, replay
looping) the new counter's value is added to what was counted before.  A failing group
(open or read error, CPU offline, never running) is absent from the reading, logged once
per PMU and event (rate-limited), retried every ``pmu.reprobe_seconds``; nothing else changes.
A per-socket sum keeps the totals of a controller that stopped, so it never goes backwards.
When the CPU an uncore group is opened on goes offline, the PMU's ``cpumask`` is read again:
the kernel has moved the socket's uncore events to another of its CPUs, and the group is read
a last time, closed and reopened there (absent only while the socket has no online CPU).
"""
from __future__ import annotations

import logging
import os
import re
import resource
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from ..errors import ConfigError, HardwareAbsent, ParseError, SourceUnavailable
from ..logutil import RateLimitedLog
from ..metrics import COUNTER, GAUGE, Point, metric, point
from . import events as events_mod
from . import summary
from . import sysfs as sysfs_mod
from ..sources import _files
from .events import CPUINFO_HEAD_BYTES
from .perf import Counters, PerfError

log = logging.getLogger("teye.pmu")

CYCLES = metric("teye_cpu_cycles_total", COUNTER, "Core clock cycles per CPU (perf cpu/cpu-cycles/, system-wide, "
                "user and kernel; multiplexed counts scaled by time enabled / time running).", ["cpu"])
INSTRUCTIONS = metric("teye_cpu_instructions_total", COUNTER, "Instructions retired per CPU (perf "
                      "cpu/instructions/, system-wide, user and kernel; scaled like cycles).", ["cpu"])
FLOPS = metric("teye_cpu_floating_point_operations_total", COUNTER,
               "Floating-point operations retired per CPU, by precision (single, double) and vector width "
               "(scalar, 128, 256, 512 bits): operations, not instructions (a 256-bit packed double instruction "
               "is 4, an FMA counts as the vendor's event counts it: 2 per lane on Intel). AMD's event "
               "(PMCx003) splits neither precision nor width: there precision=\"all\" and width=\"all\".",
               ["cpu", "precision", "width"])
MEM_READ = metric("teye_memory_read_bytes_total", COUNTER, "Bytes read from DRAM by the memory controllers of "
                  "a socket (Intel uncore IMC CAS or free-running counters, bytes from the kernel's scale and "
                  "unit files; AMD Zen 4+ UMC CAS commands, 64 bytes each).", ["socket"])
MEM_WRITTEN = metric("teye_memory_written_bytes_total", COUNTER, "Bytes written to DRAM by the memory "
                     "controllers of a socket (as teye_memory_read_bytes_total).", ["socket"])
MEM_TRANSFERRED = metric("teye_memory_transferred_bytes_total", COUNTER, "Bytes moved between DRAM and the "
                         "memory controllers of a socket, reads and writes together, where the hardware does not "
                         "split them (AMD Zen 2/Zen 3 data fabric dram_channel_data_controller_0-7 events, 64 bytes "
                         "per request). There teye_memory_read_bytes_total and teye_memory_written_bytes_total are "
                         "absent; elsewhere this family is absent (sum those two).", ["socket"])
PCIE_READ = metric("teye_pcie_read_bytes_total", COUNTER, "Bytes PCIe devices behind this root bus read from "
                   "host memory (host to device; Intel IIO free-running bw_out ports, or on Skylake-SP/Cascade "
                   "Lake without them the uncore_iio UNC_IIO_DATA_REQ_OF_CPU.MEM_READ events, 4 bytes each). "
                   "Absent where the hardware counts only the other direction (Ice Lake-SP).", ["socket", "root_bus"])
PCIE_WRITTEN = metric("teye_pcie_written_bytes_total", COUNTER, "Bytes PCIe devices behind this root bus wrote "
                      "to host memory (device to host; Intel IIO free-running bw_in ports, or the uncore_iio "
                      "UNC_IIO_DATA_REQ_OF_CPU.MEM_WRITE events, 4 bytes each).",
                      ["socket", "root_bus"])
GPU_ROOT_BUS = metric("teye_gpu_pcie_root_bus_info", GAUGE, "Always 1 per NVIDIA GPU found under "
                      "<sysfs>/bus/pci/devices: the PCIe root bus it sits behind (the root_bus of "
                      "teye_pcie_*_bytes_total), by the GPU's PCI address as in teye_gpu_info.",
                      ["pci_bus_id", "root_bus"])
RUNNING = metric("teye_pmu_counter_running_ratio", GAUGE, "Share of the time enabled that this PMU's counters "
                 "were actually counting over the last poll (below 1: multiplexed, values are scaled "
                 "estimates).", ["pmu"])

GROUPS = ("core", "fp", "memory", "pcie")
UNCORE_GROUPS = ("memory", "pcie")   # opened on the CPU named by the PMU's cpumask, one per socket
GROUP_TITLES = {"core": "core cycles/instructions", "fp": "floating point", "memory": "memory bandwidth",
                "pcie": "PCIe bandwidth"}
NO_PMU = ("no hardware PMU: {dir} has no 'cpu' PMU (a virtual machine without a virtual PMU, or perf events "
          "not built into the kernel)")
PCIE_GROUP_MAX = 8  # free-running IIO ports per group (ICX: 8 bw_in counters per stack)


@dataclass(frozen=True)
class Ev:
    pmu: str
    event: str
    type: int
    config: Tuple[int, int, int]
    kind: str                 # cycles, instructions, flops, mem_read, mem_written, mem_transferred, pcie_read, pcie_written
    factor: float = 1.0       # bytes or operations per count
    labels: Tuple[str, ...] = ()


@dataclass(frozen=True)
class GroupPlan:
    group: str                # core, fp, memory, pcie
    pmu: str
    tag: str                  # distinguishes several groups of one PMU on one CPU
    cpu: int
    socket: int
    events: Tuple[Ev, ...]

    @property
    def key(self) -> Tuple[str, str, int]:
        return self.pmu, self.tag, self.cpu

    @property
    def what(self) -> str:
        w = self.__dict__.get("_what")
        if w is None:  # cached: named in every read's error message
            w = f"{self.pmu}/{','.join(e.event for e in self.events)}/"
            object.__setattr__(self, "_what", w)
        return w


@dataclass
class Plan:
    groups: List[GroupPlan] = field(default_factory=list)
    problems: Dict[str, str] = field(default_factory=dict)   # group -> why it is not planned
    cpu_model: Optional[events_mod.CpuModel] = None
    gpu_root_buses: Tuple[Tuple[str, str], ...] = ()          # (pci_bus_id, root_bus)


def _problem(plan: Plan, group: str, why: str) -> None:
    plan.problems.setdefault(group, why)


def build_plan(sysfs: str, procfs: str) -> Plan:
    """What to count on this machine: each group (core, fp, memory, pcie) planned from the PMUs that
    exist, or absent with its reason in ``plan.problems``.  The core and floating-point groups need
    the ``cpu`` PMU; memory and PCIe bandwidth need only their uncore PMUs.  SourceUnavailable when
    there is no ``cpu`` PMU and nothing else could be planned either (no hardware PMU at all)."""
    devices = sysfs_mod.devices_dir(sysfs)
    names = sysfs_mod.list_pmus(sysfs)
    plan = Plan(cpu_model=events_mod.read_cpuinfo(procfs))
    no_cpu = None
    if "cpu" not in names:
        no_cpu = (f"hybrid CPU (cpu_core/cpu_atom PMUs under {devices}): not supported by teye yet"
                  if "cpu_core" in names else NO_PMU.format(dir=devices))
    else:
        try:
            cpu = sysfs_mod.load_pmu(sysfs, "cpu")
        except (OSError, ParseError) as e:
            no_cpu = f"cpu PMU description unusable: {e}"
    if no_cpu is None:
        online = sysfs_mod.online_cpus(sysfs) or (0,)
        packages = {c: sysfs_mod.package_of(sysfs, c) for c in online}
        _plan_core(plan, cpu, online, packages)
        _plan_fp(plan, cpu, online, packages)
    else:
        _problem(plan, "core", no_cpu)
        _problem(plan, "fp", no_cpu)
    _plan_memory(plan, sysfs, names)
    _plan_pcie(plan, sysfs, names)
    if no_cpu is not None and not plan.groups:
        # no cpu PMU directory at all (a VM without a virtual PMU) is absent hardware; a hybrid CPU or an
        # unusable description is a PMU teye fails to use
        raise (HardwareAbsent if "cpu" not in names and "cpu_core" not in names else SourceUnavailable)(no_cpu)
    plan.gpu_root_buses = tuple(sorted(sysfs_mod.gpu_root_buses(sysfs).items()))
    return plan


def _plan_core(plan: Plan, cpu: sysfs_mod.Pmu, online, packages) -> None:
    evs = []
    for name, kind in (("cpu-cycles", "cycles"), ("instructions", "instructions")):
        try:
            a = cpu.alias(name)
            evs.append(Ev("cpu", name, cpu.type, cpu.encode(a.terms, os.path.join(cpu.path, "events", name)), kind))
        except (OSError, ParseError) as e:
            _problem(plan, "core", f"cpu/{name}/: {e}")
            return
    for c in online:
        plan.groups.append(GroupPlan("core", "cpu", "core", c, packages[c], tuple(evs)))


def _plan_fp(plan: Plan, cpu: sysfs_mod.Pmu, online, packages) -> None:
    table, why = events_mod.fp_events(plan.cpu_model)
    if not table:
        _problem(plan, "fp", why)
        return
    by_group: Dict[str, List[Ev]] = defaultdict(list)
    for fe in table:
        try:
            cfg = cpu.encode(sysfs_mod.parse_terms(fe.terms, fe.name), f"table event {fe.name}")
        except ParseError as e:
            _problem(plan, "fp", f"cpu/{fe.name}/: {e}")
            return
        by_group[fe.group].append(Ev("cpu", fe.name, cpu.type, cfg, "flops", fe.flops_per_count,
                                     (fe.precision, fe.width)))
    for c in online:
        for tag, evs in by_group.items():
            plan.groups.append(GroupPlan("fp", "cpu", tag, c, packages[c], tuple(evs)))


def _uncore_groups(plan: Plan, sysfs: str, group: str, pmu_name: str, wanted, tag: str = "") -> List[GroupPlan]:
    """Groups of ``wanted`` [(event, kind, labels)] on each cpumask CPU of one uncore PMU (problems noted).

    An event is a sysfs alias, or an :class:`agent.pmu.events.UncoreEvent` of teye's table."""
    try:
        pmu = sysfs_mod.load_pmu(sysfs, pmu_name)
    except (OSError, ParseError) as e:
        _problem(plan, group, f"{pmu_name}: {e}")
        return []
    evs = []
    for event, kind, labels in wanted:
        if isinstance(event, events_mod.UncoreEvent):
            try:
                cfg = pmu.encode(sysfs_mod.parse_terms(event.terms, event.name), f"table event {event.name}")
            except ParseError as e:
                _problem(plan, group, f"{pmu_name}/{event.name}/: {e}")
                return []
            evs.append(Ev(pmu_name, event.name, pmu.type, cfg, kind, event.bytes_per_count, labels))
            continue
        path = os.path.join(pmu.path, "events", event)
        try:
            a = pmu.alias(event)
            evs.append(Ev(pmu_name, event, pmu.type, pmu.encode(a.terms, path), kind,
                          sysfs_mod.bytes_per_count(a, path), labels))
        except (OSError, ParseError) as e:
            _problem(plan, group, f"{pmu_name}/{event}/: {e}")
            return []
    out = []
    for c in pmu.cpumask or (0,):
        socket = sysfs_mod.package_of(sysfs, c)
        out.append(GroupPlan(group, pmu_name, tag or group, c, socket, tuple(evs)))
    return out


def _numbered(names, prefix: str) -> List[str]:
    rx = re.compile(rf"^{re.escape(prefix)}(\d+)$")
    return sorted((n for n in names if rx.match(n)), key=lambda n: int(rx.match(n).group(1)))


def _plan_memory(plan: Plan, sysfs: str, names) -> None:
    devices = sysfs_mod.devices_dir(sysfs)
    free = [p for p in _numbered(names, "uncore_imc_free_running_")
            if os.path.isfile(os.path.join(devices, p, "events", "read"))]  # else the CAS counters
    if free:
        pmus, read, write = free, "read", "write"
    else:
        pmus, read, write = _numbered(names, "uncore_imc_"), "cas_count_read", "cas_count_write"
    vendor = plan.cpu_model.vendor if plan.cpu_model else ""
    for (v, prefix), (rd, wr, _source) in events_mod.UNCORE_MEMORY.items():
        if not pmus and v == vendor:
            pmus, read, write = _numbered(names, prefix), rd, wr
    if not pmus and "amd_df" in names:
        df = events_mod.df_memory_events(plan.cpu_model)
        if df:
            for i in range(0, len(df), events_mod.DF_GROUP_MAX):
                chunk = df[i:i + events_mod.DF_GROUP_MAX]
                plan.groups.extend(_uncore_groups(plan, sysfs, "memory", "amd_df",
                                                  [(e, "mem_transferred", ()) for e in chunk], f"dram{i}"))
            return
    if not pmus:
        _problem(plan, "memory", f"no memory-controller PMU under {devices} (uncore_imc_* on Intel servers with "
                                 f"the intel_uncore driver, amd_umc_* on AMD Zen 4 and later with Linux >= 6.8, "
                                 f"amd_df on AMD Zen 2/Zen 3)")
        return
    for p in pmus:
        plan.groups.extend(_uncore_groups(plan, sysfs, "memory", p, ((read, "mem_read", ()),
                                                                      (write, "mem_written", ()))))


def _with_bus(groups: List[GroupPlan], buses: Dict[int, str]) -> List[GroupPlan]:
    """The groups with each event labelled by the root bus of its socket's die (``unknown`` if unnamed)."""
    out = []
    for g in groups:
        bus = buses.get(g.socket, "unknown")
        out.append(GroupPlan(g.group, g.pmu, g.tag, g.cpu, g.socket,
                             tuple(Ev(e.pmu, e.event, e.type, e.config, e.kind, e.factor, (bus,)) for e in g.events)))
    return out


def _plan_pcie(plan: Plan, sysfs: str, names) -> None:
    devices = sysfs_mod.devices_dir(sysfs)
    pmus = _numbered(names, "uncore_iio_free_running_")
    if not pmus:
        _plan_pcie_programmed(plan, sysfs, names)
        return
    for p in pmus:
        stack = p.rsplit("_", 1)[1]
        buses = sysfs_mod.root_buses(os.path.join(devices, f"uncore_iio_{stack}"))
        try:
            pmu = sysfs_mod.load_pmu(sysfs, p)
        except (OSError, ParseError) as e:
            _problem(plan, "pcie", f"{p}: {e}")
            continue
        for direction, kind in (("in", "pcie_written"), ("out", "pcie_read")):
            ports = _numbered(pmu.event_names(), f"bw_{direction}_port")
            for i in range(0, len(ports), PCIE_GROUP_MAX):
                chunk = ports[i:i + PCIE_GROUP_MAX]
                plan.groups.extend(_with_bus(_uncore_groups(plan, sysfs, "pcie", p, [(e, kind, ()) for e in chunk],
                                                            f"bw_{direction}{i}"), buses))


def _plan_pcie_programmed(plan: Plan, sysfs: str, names) -> None:
    """No free-running IIO counters: the table's programmed events on each ``uncore_iio_<n>``."""
    devices = sysfs_mod.devices_dir(sysfs)
    pmus = _numbered(names, "uncore_iio_")
    if not pmus:
        _problem(plan, "pcie", f"no uncore_iio_free_running or uncore_iio PMU under {devices} (not an Intel "
                               f"server CPU, or intel_uncore not loaded)")
        return
    parts, why = events_mod.pcie_events(plan.cpu_model)
    if not parts:
        _problem(plan, "pcie", f"{_family(pmus[0])} has no free-running bandwidth counters here and {why}")
        return
    for p in pmus:
        buses = sysfs_mod.root_buses(os.path.join(devices, p))
        for i, (rd, wr) in enumerate(parts):
            plan.groups.extend(_with_bus(_uncore_groups(plan, sysfs, "pcie", p, ((rd, "pcie_read", ()),
                                                                              (wr, "pcie_written", ())),
                                                        f"part{i}"), buses))


# ---------------------------------------------------------------------------------------------- readers
class LiveReader:
    """Opens and reads plan groups through the perf door (:class:`agent.pmu.perf.Counters`)."""

    def __init__(self, counters: Optional[Counters] = None):
        self.counters = counters if counters is not None else Counters()

    def open(self, g: GroupPlan):
        return self.counters.open_group(g.cpu, [(e.type,) + e.config for e in g.events], g.what)

    def read(self, g: GroupPlan, handle) -> Tuple[int, int, Tuple[int, ...]]:
        return self.counters.read_group(handle, g.what)

    def close(self, handle) -> None:
        self.counters.close_group(handle)

    @property
    def open_fds(self) -> int:
        return self.counters.open_fds


# ---------------------------------------------------------------------------------------------- reading
@dataclass(frozen=True)
class PmuReading:
    """Cumulative totals in base units (cycles, instructions, operations, bytes); absent = not counted now."""

    cycles: Tuple[Tuple[str, float], ...] = ()
    instructions: Tuple[Tuple[str, float], ...] = ()
    flops: Tuple[Tuple[str, str, str, float], ...] = ()          # cpu, precision, width, operations
    memory_read: Tuple[Tuple[str, float], ...] = ()              # socket, bytes
    memory_written: Tuple[Tuple[str, float], ...] = ()
    memory_transferred: Tuple[Tuple[str, float], ...] = ()       # socket, bytes (read + written, unsplit)
    pcie_read: Tuple[Tuple[str, str, float], ...] = ()           # socket, root_bus, bytes
    pcie_written: Tuple[Tuple[str, str, float], ...] = ()
    running: Tuple[Tuple[str, float], ...] = ()                  # pmu, ratio
    gpu_root_buses: Tuple[Tuple[str, str], ...] = ()             # pci_bus_id, root_bus
    groups: Tuple[Tuple[str, str], ...] = ()                     # group, "ok" or why not
    open_fds: int = 0

    def points(self) -> Iterator[Point]:
        for spec, rows in ((CYCLES, self.cycles), (INSTRUCTIONS, self.instructions), (FLOPS, self.flops),
                           (MEM_READ, self.memory_read), (MEM_WRITTEN, self.memory_written),
                           (MEM_TRANSFERRED, self.memory_transferred),
                           (PCIE_READ, self.pcie_read), (PCIE_WRITTEN, self.pcie_written), (RUNNING, self.running)):
            for row in rows:
                yield point(spec, row[-1], *row[:-1])
        for bus_id, root in self.gpu_root_buses:
            yield point(GPU_ROOT_BUS, 1.0, bus_id, root)

    def total(self, name: str) -> Optional[float]:
        """Sum of one family over all its series (None when absent): for `teye profile` deltas."""
        rows = getattr(self, name)
        return sum(r[-1] for r in rows) if rows else None


class _Counter:
    __slots__ = ("total", "last_scaled", "last_value", "last_enabled")

    def __init__(self):
        self.total = 0.0
        self.last_scaled: Optional[float] = None
        self.last_value = 0
        self.last_enabled = 0

    def update(self, value: int, enabled: int, running: int) -> None:
        scaled = value * enabled / running if running != enabled else float(value)
        if self.last_scaled is None or value < self.last_value or enabled < self.last_enabled:
            self.total += scaled              # a counter that (re)started from zero
        elif scaled > self.last_scaled:
            self.total += scaled - self.last_scaled
        self.last_scaled, self.last_value, self.last_enabled = scaled, value, enabled


class _GroupState:
    __slots__ = ("handle", "retry_at", "live", "times", "delta", "failed", "counters")

    def __init__(self, n: int):
        self.handle = None
        self.retry_at = 0
        self.live = False
        self.times: Optional[Tuple[int, int]] = None
        self.delta: Optional[Tuple[int, int]] = None
        self.failed: Optional[str] = None
        self.counters: List[_Counter] = [_Counter() for _ in range(n)]  # one per event, kept across reopens


class PmuSource:
    name = "pmu"

    def __init__(self, reader_factory: Callable[[], object], sysfs: str = "/sys", procfs: str = "/proc",
                 reprobe_seconds: float = 60.0, clock: Callable[[], int] = time.monotonic_ns, ctx=None):
        """``ctx`` (an AgentContext), when given, receives the counters of each poll interval as verdict
        evidence (``ctx.host_notes``), so the phase verdicts can cite them."""
        self._factory = reader_factory
        self._ctx = ctx
        self._last: Optional[Tuple["PmuReading", int]] = None
        self.sysfs, self.procfs = sysfs, procfs
        self.reprobe_ns = int(reprobe_seconds * 1e9)
        self._clock = clock
        self.reader = None
        self.plan: Optional[Plan] = None
        self._state: Dict[Tuple[str, str, int], _GroupState] = {}
        self._retry_start_at = 0
        self._unavailable: Optional[SourceUnavailable] = None
        self._rlog = RateLimitedLog(log)

    # ------------------------------------------------------------------ lifecycle
    def _start(self) -> None:
        now = self._clock()
        if self._unavailable is not None and now < self._retry_start_at:
            raise self._unavailable
        try:
            plan = build_plan(self.sysfs, self.procfs)
            if not plan.groups:
                raise SourceUnavailable("nothing to count: " + "; ".join(f"{GROUP_TITLES[g]}: {w}"
                                                                          for g, w in plan.problems.items()))
            for grp, why in plan.problems.items():
                log.warning("pmu %s not counted: %s", GROUP_TITLES[grp], why)
            reader = self._factory()
            _raise_fd_limit(sum(len(g.events) for g in plan.groups))
            self.reader, self.plan = reader, plan
            self._state = {g.key: _GroupState(len(g.events)) for g in plan.groups}
            errors = [self._open(g, self._state[g.key], now) for g in plan.groups]
            if not any(st.handle is not None for st in self._state.values()):
                first = next((e for e in errors if e), "no group could be opened")
                self.close()
                raise SourceUnavailable(f"no counter could be opened: {first}")
        except SourceUnavailable as e:
            self._unavailable = e
            self._retry_start_at = now + self.reprobe_ns
            raise
        self._unavailable = None

    def fds_wanted(self) -> int:
        """File descriptors the counters will hold once open (one per event), before any is opened;
        0 where nothing can be counted. Lets the HTTP server keep them out of its connection budget."""
        plan = self.plan
        if plan is None:
            try:
                plan = build_plan(self.sysfs, self.procfs)
            except (SourceUnavailable, ParseError, OSError):
                return 0
        return sum(len(g.events) for g in plan.groups)

    def close(self) -> None:
        """Close every counter (fds released); the next collect() starts afresh."""
        if self.reader is not None:
            for st in self._state.values():
                if st.handle is not None:
                    self.reader.close(st.handle)
                    st.handle = None
            closer = getattr(self.reader, "shutdown", None)
            if closer:
                closer()
        self.reader, self.plan = None, None

    def _open(self, g: GroupPlan, st: _GroupState, now: int) -> Optional[str]:
        try:
            st.handle = self.reader.open(g)
        except PerfError as e:
            self._fail(g, st, now, str(e))
            return str(e)
        st.failed, st.times = None, None
        for c in st.counters:  # a fresh counter starts from zero: its first value adds to the total
            c.last_scaled = None
        return None

    def _fail(self, g: GroupPlan, st: _GroupState, now: int, why: str) -> None:
        if st.handle is not None:
            self.reader.close(st.handle)
            st.handle = None
        st.live, st.times, st.delta, st.failed = False, None, None, why
        st.retry_at = now + self.reprobe_ns
        self._rlog.warning(f"{g.pmu}/{g.tag}", "pmu %s event %s on cpu %d not counted: %s",
                           g.pmu, ",".join(e.event for e in g.events), g.cpu, why)

    # ------------------------------------------------------------------ polling
    def collect(self) -> PmuReading:
        if self.plan is None:
            self._start()
        now = self._clock()
        online = sysfs_mod.online_cpus(self.sysfs)
        for i, g in enumerate(self.plan.groups):
            st = self._state[g.key]
            if online is not None and g.cpu not in online and g.group in UNCORE_GROUPS:
                moved = self._follow_cpumask(g, st, online, now)
                if moved is not None:
                    self.plan.groups[i] = g = moved
            if online is not None and g.cpu not in online:
                offline = f"cpu {g.cpu} is offline"
                if st.handle is not None or st.failed != offline:
                    self._fail(g, st, now, offline)
                st.retry_at = 0  # reopen as soon as it is back
                continue
            if st.handle is None:
                if now < st.retry_at or self._open(g, st, now) is not None:
                    continue
            try:
                enabled, running, values = self.reader.read(g, st.handle)
            except PerfError as e:
                self._fail(g, st, now, str(e))
                continue
            prev = st.times
            st.delta = (enabled - prev[0], running - prev[1]) if prev and enabled >= prev[0] else (enabled, running)
            st.times = (enabled, running)
            if running == 0:
                if st.live or st.failed is None:
                    self._rlog.warning(f"{g.pmu}/{g.tag}", "pmu %s event %s on cpu %d has not run yet "
                                       "(running time 0): absent", g.pmu, ",".join(e.event for e in g.events), g.cpu)
                st.live, st.failed = False, "counter never ran (time running 0)"
                continue
            st.live, st.failed = True, None
            for c, v in zip(st.counters, values):
                c.update(v, enabled, running)
        reading = self._reading()
        if self._ctx is not None:
            self._publish(reading, now)
        return reading

    def _follow_cpumask(self, g: GroupPlan, st: _GroupState, online, now: int) -> Optional[GroupPlan]:
        """The group moved to the CPU the kernel now names for its socket in the PMU's ``cpumask``
        (None when it names none: the group stays absent until one comes back).

        When an uncore PMU's CPU goes offline the kernel migrates its events to another online CPU
        of the die (perf_pmu_migrate_context in arch/x86/events/intel/uncore.c, amd/uncore.c) and
        updates ``cpumask``.  The open group still counts there, so it is read one last time (no
        count lost since the previous poll), closed, and reopened on the new CPU, whose counters
        start from zero and add to the totals."""
        path = os.path.join(sysfs_mod.devices_dir(self.sysfs), g.pmu, "cpumask")
        try:
            mask = sysfs_mod.parse_cpulist(sysfs_mod.read_text(path), path)
        except (OSError, ParseError):
            return None
        cpu = next((c for c in mask if c in online and sysfs_mod.package_of(self.sysfs, c) == g.socket), None)
        if cpu is None:
            return None
        moved = GroupPlan(g.group, g.pmu, g.tag, cpu, g.socket, g.events)
        if moved.key in self._state:
            return None
        if st.handle is not None:
            try:
                enabled, running, values = self.reader.read(g, st.handle)
                if running:
                    for c, v in zip(st.counters, values):
                        c.update(v, enabled, running)
            except PerfError:
                pass  # the migrated events could not be read: only the counts since the last poll are lost
            self.reader.close(st.handle)
            st.handle = None
        st.retry_at, st.times = 0, None
        del self._state[g.key]
        self._state[moved.key] = st
        self._rlog.warning(f"{g.pmu}/moved", "pmu %s: cpu %d went offline, the kernel moved the socket's "
                           "counters to cpu %d (cpumask): reopened there", g.pmu, g.cpu, cpu)
        return moved

    def _publish(self, reading: "PmuReading", now: int) -> None:
        """The figures between the previous poll and this one, as one note for the verdicts' evidence."""
        last, self._last = self._last, (reading, now)
        if last is None or now <= last[1]:
            return
        seconds = (now - last[1]) / 1e9
        figures = summary.render(summary.summarize(last[0], reading, seconds))
        self._ctx.host_notes = () if figures == summary.NO_FIGURES else \
            (("host", f"host counters over the last {seconds:.0f} s: {figures}"),)

    def _reading(self) -> PmuReading:
        per_cpu: Dict[str, List] = defaultdict(list)
        sums: Dict[Tuple[str, tuple], List] = {}   # (kind, labels) -> [total, any live]
        run: Dict[str, List[int]] = defaultdict(lambda: [0, 0, 0, 0])
        status: Dict[str, str] = {}
        for g in self.plan.groups:
            st = self._state[g.key]
            if st.live:
                r = run[g.pmu]   # [delta enabled, delta running, cumulative enabled, cumulative running]
                r[0] += st.delta[0]
                r[1] += st.delta[1]
                r[2] += st.times[0]
                r[3] += st.times[1]
            if st.live:
                status[g.group] = "ok"
            elif st.failed:
                status.setdefault(g.group, st.failed)
            if g.group in ("core", "fp"):   # per CPU: present while its group counts
                if st.live:
                    cpu = str(g.cpu)
                    for e, c in zip(g.events, st.counters):
                        per_cpu[e.kind].append((cpu,) + e.labels + (c.total * e.factor,))
                continue
            socket = str(g.socket)           # per socket / root bus: sums keep what stopped counting
            for e, c in zip(g.events, st.counters):
                acc = sums.setdefault((e.kind, (socket,) + e.labels), [0.0, False])
                acc[0] += c.total * e.factor
                acc[1] = acc[1] or st.live
        for grp, why in self.plan.problems.items():
            status.setdefault(grp, why)
        out: Dict[str, List] = defaultdict(list)
        for (kind, labels), (total, live) in sums.items():
            if live:
                out[kind].append(labels + (total,))
        return PmuReading(
            cycles=tuple(per_cpu["cycles"]), instructions=tuple(per_cpu["instructions"]),
            flops=tuple(per_cpu["flops"]),
            memory_read=tuple(out["mem_read"]), memory_written=tuple(out["mem_written"]),
            memory_transferred=tuple(out["mem_transferred"]),
            pcie_read=tuple(out["pcie_read"]), pcie_written=tuple(out["pcie_written"]),
            running=tuple((p, r[1] / r[0] if r[0] > 0 else r[3] / r[2]) for p, r in sorted(run.items()) if r[2] > 0),
            groups=tuple((g, status.get(g, "not planned")) for g in GROUPS),
            gpu_root_buses=self.plan.gpu_root_buses,
            open_fds=getattr(self.reader, "open_fds", 0))


def _raise_fd_limit(needed: int, margin: int = 256) -> None:
    """Raise the soft RLIMIT_NOFILE towards the hard limit when the plan needs more descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed + margin + len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else needed + margin
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        except (ValueError, OSError) as e:
            log.warning("cannot raise the open-files limit to %d: %s", new, e)


def from_config(cfg, ctx=None) -> PmuSource:
    p = cfg["pmu"]
    if p["replay"]:
        from .replay import ReplayReader
        try:
            replay = ReplayReader.load(p["replay"])
        except (OSError, ParseError) as e:
            raise ConfigError(f"config key 'pmu.replay': cannot replay {p['replay']}: {e}") from None
        factory = lambda: replay  # noqa: E731
    else:
        factory = LiveReader
    return PmuSource(factory, sysfs=cfg["sysfs"], procfs=cfg["procfs"], reprobe_seconds=p["reprobe_seconds"], ctx=ctx)


def _paranoid(procfs: str) -> Optional[int]:
    try:
        return int(_files.read_text(os.path.join(procfs, "sys", "kernel", "perf_event_paranoid")).strip())
    except (OSError, ValueError):
        return None


def _hypervisor(procfs: str) -> bool:
    try:
        head = _files.read_head(os.path.join(procfs, "cpuinfo"), CPUINFO_HEAD_BYTES)   # the first processor
        return any(line.startswith("flags") and " hypervisor" in line for line in head.splitlines())
    except OSError:
        return False


def _family(pmu: str) -> str:
    """'uncore_imc_3' -> 'uncore_imc_*' (one name for the numbered instances)."""
    return re.sub(r"_\d+$", "_*", pmu)


def probe(sysfs: str, procfs: str, reader=None) -> List[Tuple[str, bool, str]]:
    """(group, supported, detail) for each group: the plan, then one trial open per group (closed at once)."""
    vm = "; this is a virtual machine (cpuinfo flag 'hypervisor')" if _hypervisor(procfs) else ""
    try:
        plan = build_plan(sysfs, procfs)
    except SourceUnavailable as e:
        return [(g, False, str(e) + vm) for g in GROUPS]
    reader = reader if reader is not None else LiveReader()
    out = []
    for g in GROUPS:
        if g in plan.problems:
            why = plan.problems[g]
            out.append((g, False, why + vm if why.startswith("no hardware PMU") else why))
            continue
        mine = [p for p in plan.groups if p.group == g]
        try:
            handle = reader.open(mine[0])
        except PerfError as e:
            why = str(e)
            if e.kind == "denied":
                level = _paranoid(procfs)
                why = (f"not permitted: kernel.perf_event_paranoid={level if level is not None else '?'} and teye has "
                       f"neither CAP_PERFMON nor CAP_SYS_ADMIN (grant CAP_PERFMON, or set "
                       f"kernel.perf_event_paranoid=0 as the fallback)")
            out.append((g, False, why))
            continue
        reader.close(handle)
        events = sorted({f"{_family(e.pmu)}/{e.event}/" for p in mine for e in p.events})
        cpus = sorted({p.cpu for p in mine})
        shown = ", ".join(events[:4]) + (f" and {len(events) - 4} more" if len(events) > 4 else "")
        out.append((g, True, f"{len(mine)} group(s) on {len(cpus)} CPU(s): {shown}"))
    return out
