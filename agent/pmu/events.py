"""Core floating-point events that have no sysfs alias, by CPU vendor/family/model.

The ``cpu`` PMU's sysfs ``events/`` directory names only generic events (cycles,
instructions, ...); the floating-point classes come from this small table.  Each entry
gives the event description in the PMU's own terms (encoded through its ``format/``
files like any sysfs alias), the precision and vector width it counts, and how many
floating-point operations one count stands for.  Every entry cites its public source.

Intel ``FP_ARITH_INST_RETIRED`` (event 0xC7) counts *instructions* by class; an FMA
instruction counts twice (SDM vol. 3B, "Performance Monitoring Events"; Intel perfmon
event lists at github.com/intel/perfmon: SKX/events/skylakex_core.json,
CLX/events/cascadelakex_core.json, ICX/events/icelakex_core.json,
SPR/events/sapphirerapids_core.json, EMR/events/emeraldrapids_core.json), so operations =
count x lanes: scalar 1, 128-bit 2 double / 4 single, 256-bit 4 / 8, 512-bit 8 / 16.

AMD ``Retired SSE/AVX FLOPs`` (PMCx003, umask 0xFF all of add/sub, multiply, multiply-add
(2 per FMA), divide/sqrt) counts *operations* already, of every precision and width
together (Processor Programming Reference for family 17h models 31h, 19h model 01h and
19h model 11h; linux tools/perf/pmu-events/arch/x86/amdzen{2,3,4}/floating-point.json
``fp_ret_sse_avx_ops.all``); teye exports it as precision="all", width="all".
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from ..sources._files import read_head

CPUINFO_HEAD_BYTES = 1 << 16   # the first processor's block (a few KiB); the whole file is ~1.5 KiB per CPU


@dataclass(frozen=True)
class CpuModel:
    vendor: str   # GenuineIntel, AuthenticAMD, ...
    family: int
    model: int
    name: str = ""

    def __str__(self) -> str:
        return f"{self.vendor} family {self.family:#x} model {self.model:#x}" + (f" ({self.name})" if self.name else "")


@dataclass(frozen=True)
class FpEvent:
    name: str          # the table's event name (also the name in recorded traces)
    terms: str         # description in the cpu PMU's format terms
    precision: str     # single, double, all
    width: str         # scalar, 128, 256, 512, all
    flops_per_count: float
    group: str         # events of one group are opened together (at most 4: fits any core's counters)


def read_cpuinfo(procfs: str) -> Optional[CpuModel]:
    """The first processor's vendor, family and model from <procfs>/cpuinfo (None when absent)."""
    path = os.path.join(procfs, "cpuinfo")
    try:
        text = read_head(path, CPUINFO_HEAD_BYTES)   # the first processor's block is all that is read
    except OSError:
        return None
    fields: Dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        k, sep, v = line.partition(":")
        if sep:
            fields.setdefault(k.strip(), v.strip())
    try:
        return CpuModel(fields["vendor_id"], int(fields["cpu family"]), int(fields["model"]),
                        fields.get("model name", ""))
    except (KeyError, ValueError):
        return None


def _intel_fp_arith() -> Tuple[FpEvent, ...]:
    out = []
    for umask, width, prec, lanes in ((0x01, "scalar", "double", 1), (0x02, "scalar", "single", 1),
                                      (0x04, "128", "double", 2), (0x08, "128", "single", 4),
                                      (0x10, "256", "double", 4), (0x20, "256", "single", 8),
                                      (0x40, "512", "double", 8), (0x80, "512", "single", 16)):
        suffix = "scalar" if width == "scalar" else f"{width}b_packed"
        out.append(FpEvent(f"fp_arith_inst_retired.{suffix}_{prec}", f"event=0xc7,umask={umask:#04x}",
                           prec, width, float(lanes), f"fp_{prec}"))
    return tuple(out)


_INTEL_SERVER = _intel_fp_arith()  # FP_ARITH_INST_RETIRED.* in the SKX/CLX/ICX/SPR/EMR core event lists
_AMD_FLOPS = (FpEvent("fp_ret_sse_avx_ops.all", "event=0x03,umask=0xff", "all", "all", 1.0, "fp_all"),)

# (vendor, family) -> {model: (events, source)}; model None matches any model of the family.
TABLE: Dict[Tuple[str, int], Dict[Optional[int], Tuple[Tuple[FpEvent, ...], str]]] = {
    ("GenuineIntel", 6): {
        0x55: (_INTEL_SERVER, "Skylake-SP / Cascade Lake / Cooper Lake: intel/perfmon SKX, CLX, CPX core json"),
        0x6a: (_INTEL_SERVER, "Ice Lake-SP: intel/perfmon ICX/events/icelakex_core.json"),
        0x6c: (_INTEL_SERVER, "Ice Lake-D: intel/perfmon ICX/events/icelakex_core.json"),
        0x8f: (_INTEL_SERVER, "Sapphire Rapids: intel/perfmon SPR/events/sapphirerapids_core.json"),
        0xcf: (_INTEL_SERVER, "Emerald Rapids: intel/perfmon EMR/events/emeraldrapids_core.json"),
    },
    ("AuthenticAMD", 0x17): {
        None: (_AMD_FLOPS, "Zen/Zen 2: AMD PPR family 17h, PMCx003; perf amdzen1/amdzen2 floating-point.json"),
    },
    ("AuthenticAMD", 0x19): {
        None: (_AMD_FLOPS, "Zen 3/Zen 4: AMD PPR family 19h, PMCx003; perf amdzen3/amdzen4 floating-point.json"),
    },
}


@dataclass(frozen=True)
class UncoreEvent:
    name: str          # the table's event name (also the name in recorded traces)
    terms: str         # description in the uncore PMU's format terms
    bytes_per_count: float


# Memory-controller events without a sysfs alias: (vendor, PMU name prefix) ->
# (read event, written event, source).  AMD Zen 4 and later: one amd_umc_<n> PMU per memory
# controller (arch/x86/events/amd/uncore.c: format event config:0-7, rdwrmask config:8-9);
# UMC CAS commands, one per 64-byte line (perf pmu-events amdzen4/amdzen5
# memory-controller.json: umc_cas_cmd.rd = EventCode 0x0a, RdWrMask 0x1; .wr = RdWrMask 0x2).
UNCORE_MEMORY = {
    ("AuthenticAMD", "amd_umc_"): (UncoreEvent("umc_cas_cmd.rd", "event=0x0a,rdwrmask=0x1", 64.0),
                                   UncoreEvent("umc_cas_cmd.wr", "event=0x0a,rdwrmask=0x2", 64.0),
                                   "AMD UMC CAS commands: perf amdzen4/amdzen5 memory-controller.json"),
}


def fp_events(cpu: Optional[CpuModel]) -> Tuple[Tuple[FpEvent, ...], str]:
    """(events, source) for this CPU; ((), why not) when it is not in the table."""
    if cpu is None:
        return (), "CPU model unknown (no readable cpuinfo)"
    fam = TABLE.get((cpu.vendor, cpu.family))
    entry = None
    if fam is not None:
        entry = fam.get(cpu.model) or fam.get(None)
    if entry is None:
        return (), f"CPU model not in teye's floating-point event table: {cpu}"
    return entry


# PCIe bandwidth from the programmable counters of the IIO stacks (``uncore_iio_<n>``), for
# kernels or CPUs that expose no ``uncore_iio_free_running_<n>`` PMU:
# (vendor, family, model) -> ((read event, written event) per port group, source).
# Skylake-SP / Cascade Lake (model 0x55): UNC_IIO_DATA_REQ_OF_CPU.MEM_READ.PART0-3 (EventCode
# 0x83, UMask 0x04: "card reading from DRAM") and MEM_WRITE.PART0-3 (EventCode 0x83, UMask 0x01:
# "card writing to DRAM"), PortMask 0x01/0x02/0x04/0x08 for PART0-3, FCMask 0x07, ScaleUnit
# 4Bytes (intel/perfmon SKX/events/skylakex_uncore.json, CLX/events/cascadelakex_uncore.json;
# linux tools/perf/pmu-events/arch/x86/{skylakex,cascadelakex}/uncore-io.json, whose
# LLC_MISSES.PCIE_READ/WRITE metrics sum the four parts x 4 bytes).  The kernel's IIO format
# calls PortMask ``ch_mask`` and FCMask ``fc_mask`` (arch/x86/events/intel/uncore_snbep.c,
# skx_uncore_iio_formats) and lets event 0x83 run on counters 0-1 only
# (skx_uncore_iio_constraints: UNCORE_EVENT_CONSTRAINT(0x83, 0x3)), so each part's read and
# written events form one group of two; the kernel rotates the four groups of a stack and the
# source scales the counts by time enabled / time running.
# Direction: a card reading host memory is host-to-device (teye_pcie_read_bytes_total), a card
# writing host memory device-to-host (teye_pcie_written_bytes_total).
def _skx_iio_parts() -> Tuple[Tuple[UncoreEvent, UncoreEvent], ...]:
    return tuple((UncoreEvent(f"unc_iio_data_req_of_cpu.mem_read.part{p}",
                              f"event=0x83,umask=0x04,ch_mask={1 << p:#04x},fc_mask=0x07", 4.0),
                  UncoreEvent(f"unc_iio_data_req_of_cpu.mem_write.part{p}",
                              f"event=0x83,umask=0x01,ch_mask={1 << p:#04x},fc_mask=0x07", 4.0))
                 for p in range(4))


UNCORE_PCIE = {
    ("GenuineIntel", 6, 0x55): (_skx_iio_parts(), "Skylake-SP / Cascade Lake: intel/perfmon SKX, CLX uncore json "
                                                  "UNC_IIO_DATA_REQ_OF_CPU.MEM_{READ,WRITE}.PART0-3"),
}


def pcie_events(cpu: Optional[CpuModel]) -> Tuple[Tuple[Tuple[UncoreEvent, UncoreEvent], ...], str]:
    """(per port group (read, written) events, source) for this CPU's IIO stacks; ((), why not) otherwise."""
    if cpu is None:
        return (), "CPU model unknown (no readable cpuinfo)"
    entry = UNCORE_PCIE.get((cpu.vendor, cpu.family, cpu.model))
    if entry is None:
        return (), f"CPU model not in teye's IIO event table: {cpu}"
    return entry


# Memory bandwidth from the AMD data fabric (``amd_df`` PMU) on Zen 2 and Zen 3, which have no
# per-controller UMC PMU: dram_channel_data_controller_0-7, "DRAM Channel Controller Request
# Types: Requests with Data (64B)", EventCode 0x07 + 0x40 x N, UMask 0x38, 64 bytes per count
# (linux tools/perf/pmu-events/arch/x86/amdzen2/data-fabric.json and amdzen3/data-fabric.json;
# their nps1_die_to_dram metric sums the eight channels).  A count is a 64-byte request with
# data in either direction: reads and writes together, so teye exports it as
# teye_memory_transferred_bytes_total and leaves the read/written families absent (no split
# is invented).  The data fabric has 4 counters before PerfMonV2 (arch/x86/events/amd/uncore.c,
# NUM_COUNTERS_NB): two groups of four channels, rotated by the kernel and scaled.
def _df_dram_channels() -> Tuple[UncoreEvent, ...]:
    return tuple(UncoreEvent(f"dram_channel_data_controller_{n}", f"event={0x07 + 0x40 * n:#x},umask=0x38", 64.0)
                 for n in range(8))


DF_GROUP_MAX = 4
# (vendor, family) -> (models, source); perf's pmu-events/arch/x86/mapfile.csv maps family 0x17
# models 0x30 and up to amdzen2 (below: amdzen1), family 0x19 models 0x00-0x0f and 0x20-0x5f to amdzen3.
DF_MEMORY = {
    ("AuthenticAMD", 0x17): (range(0x30, 0x100), "Zen 2: perf amdzen2/data-fabric.json dram_channel_data_controller_0-7"),
    ("AuthenticAMD", 0x19): (tuple(range(0x00, 0x10)) + tuple(range(0x20, 0x60)),
                             "Zen 3: perf amdzen3/data-fabric.json dram_channel_data_controller_0-7"),
}


def df_memory_events(cpu: Optional[CpuModel]) -> Tuple[UncoreEvent, ...]:
    """The data-fabric DRAM channel events for this CPU (empty when it is not a Zen 2 or Zen 3)."""
    if cpu is None:
        return ()
    entry = DF_MEMORY.get((cpu.vendor, cpu.family))
    return _df_dram_channels() if entry is not None and cpu.model in entry[0] else ()
