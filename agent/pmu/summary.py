"""Hardware counters over one interval (``teye profile``): rates and the host-saturation evidence.

Pure functions over two :class:`agent.pmu.source.PmuReading` totals; nothing here reads
hardware.  A figure is None where its counters are absent (VM, no permission, CPU model not
in the table, no uncore driver).
"""
from __future__ import annotations

from typing import Any, Dict, Optional

# The host is "saturated" for an input-bound job when its CPUs are at least this busy, or
# its memory bandwidth reaches this share of the configured peak (pmu.memory_peak_bytes_per_second).
CPU_SATURATED = 0.9
MEMORY_SATURATED = 0.8

HOST_INPUT_RECOMMENDATION = (
    "The input pipeline waits on the host, not on storage: its CPUs or its memory bandwidth are saturated "
    "while the GPUs wait for data. Move decoding and augmentation off the CPU (NVIDIA DALI, GPU-side "
    "augmentation), cache decoded or pre-resized samples (tf.data cache(), smaller stored images), "
    "vectorize the preprocessing (batch before map so ops run on whole batches; check the vectorization "
    "ratio), avoid copies between Python objects, give the input pipeline more cores (fewer other "
    "processes, tf.data AUTOTUNE) or a node with more memory bandwidth per GPU.")


NO_FIGURES = "no counter figures"


def _delta(before, after, name: str) -> Optional[float]:
    a = after.total(name)
    b = before.total(name)
    if a is None or b is None:
        return None
    return max(0.0, a - b)


def summarize(before, after, seconds: float) -> Dict[str, Any]:
    """CPI, GFLOP/s (total and by precision/width), vectorization ratio, memory and PCIe GB/s (memory read and
    written, or only transferred where the hardware counts both together)."""
    out: Dict[str, Any] = {"seconds": round(seconds, 3), "cpi": None, "gflops": None, "gflops_by_class": {},
                           "vectorization_ratio": None, "memory_read_gbps": None, "memory_written_gbps": None,
                           "memory_transferred_gbps": None, "pcie_read_gbps": None, "pcie_written_gbps": None}
    if seconds <= 0:
        return out
    cycles, instr = _delta(before, after, "cycles"), _delta(before, after, "instructions")
    if cycles is not None and instr:
        out["cpi"] = round(cycles / instr, 4)
    prev = {r[:-1]: r[-1] for r in before.flops}
    by_class: Dict[str, float] = {}
    for r in after.flops:
        if r[:-1] in prev:
            key = f"{r[1]}/{r[2]}"
            by_class[key] = by_class.get(key, 0.0) + max(0.0, r[-1] - prev[r[:-1]])
    if by_class:
        total = sum(by_class.values())
        out["gflops"] = round(total / seconds / 1e9, 4)
        out["gflops_by_class"] = {k: round(v / seconds / 1e9, 4) for k, v in sorted(by_class.items())}
        split = {k: v for k, v in by_class.items() if not k.endswith("/all")}
        if split and sum(split.values()) > 0:
            packed = sum(v for k, v in split.items() if not k.endswith("/scalar"))
            out["vectorization_ratio"] = round(packed / sum(split.values()), 4)
    for key, name in (("memory_read_gbps", "memory_read"), ("memory_written_gbps", "memory_written"),
                      ("memory_transferred_gbps", "memory_transferred"),
                      ("pcie_read_gbps", "pcie_read"), ("pcie_written_gbps", "pcie_written")):
        d = _delta(before, after, name)
        out[key] = None if d is None else round(d / seconds / 1e9, 4)
    return out


def render(s: Dict[str, Any]) -> str:
    """One line: the figures that are there."""
    parts = []
    if s.get("cpi") is not None:
        parts.append(f"CPI {s['cpi']:.2f}")
    if s.get("gflops") is not None:
        parts.append(f"{s['gflops']:.2f} GFLOP/s")
    if s.get("vectorization_ratio") is not None:
        parts.append(f"vectorization {100 * s['vectorization_ratio']:.0f} %")
    if s.get("memory_read_gbps") is not None:
        parts.append(f"memory {s['memory_read_gbps']:.2f} GB/s read, {s['memory_written_gbps']:.2f} GB/s written")
    elif s.get("memory_transferred_gbps") is not None:   # AMD Zen 2/3: the data fabric does not split them
        parts.append(f"memory {s['memory_transferred_gbps']:.2f} GB/s read and written together")
    if s.get("pcie_read_gbps") is not None or s.get("pcie_written_gbps") is not None:
        rd = "n/a" if s.get("pcie_read_gbps") is None else f"{s['pcie_read_gbps']:.2f}"
        wr = "n/a" if s.get("pcie_written_gbps") is None else f"{s['pcie_written_gbps']:.2f}"
        parts.append(f"PCIe {rd} GB/s host-to-device, {wr} GB/s device-to-host")
    return ", ".join(parts) if parts else NO_FIGURES


def host_saturation(s: Optional[Dict[str, Any]], cpu_busy_ratio: Optional[float],
                    memory_peak_bytes_per_second: Optional[float] = None) -> Optional[str]:
    """Why the host is saturated (text for the verdict's evidence), or None when it is not (or unknown).

    Only with hardware counters (``s``): without them teye cannot tell decoding work from other load,
    and the verdict stays what the phases say."""
    if not s:
        return None
    why = []
    if cpu_busy_ratio is not None and cpu_busy_ratio >= CPU_SATURATED:
        why.append(f"host CPUs {100 * cpu_busy_ratio:.0f} % busy")
    if s.get("memory_read_gbps") is not None:
        moved: Optional[float] = s["memory_read_gbps"] + (s.get("memory_written_gbps") or 0.0)
    else:
        moved = s.get("memory_transferred_gbps")
    if memory_peak_bytes_per_second and moved is not None:
        total = moved * 1e9
        if total >= MEMORY_SATURATED * memory_peak_bytes_per_second:
            why.append(f"memory bandwidth {total / 1e9:.1f} GB/s, {100 * total / memory_peak_bytes_per_second:.0f} % "
                       f"of the configured peak")
    return " and ".join(why) or None


def refine_verdict(verdict: Dict[str, str], s: Optional[Dict[str, Any]], cpu_busy_ratio: Optional[float],
                   memory_peak_bytes_per_second: Optional[float] = None) -> Dict[str, str]:
    """The job's verdict with the host counters cited; an input-bound job on a saturated host becomes 'host'."""
    v = dict(verdict)
    cited = f"host counters: {render(s)}" if s else ""
    saturated = host_saturation(s, cpu_busy_ratio, memory_peak_bytes_per_second)
    if v.get("kind") == "input" and saturated:
        v["kind"] = "host"
        v["evidence"] = (f"{v.get('evidence', '')}; but the host itself is saturated ({saturated}), so the input "
                         f"pipeline is limited by host CPU/memory, not storage" + (f"; {cited}" if cited else ""))
        v["recommendation"] = HOST_INPUT_RECOMMENDATION
    elif cited:
        v["evidence"] = f"{v.get('evidence', '')}; {cited}"
    return v
