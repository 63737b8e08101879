"""Memory and swap, from <procfs>/meminfo (values in bytes)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, Optional

from ..errors import ParseError, parse_int
from ..metrics import GAUGE, Point, metric, point
from ._files import read_text, under

_ESTIMATE = ("On kernels before 3.14, which have no MemAvailable, it is estimated as "
             "MemFree + Buffers + Cached + SReclaimable (see teye_memory_available_estimated).")

TOTAL = metric("teye_memory_total_bytes", GAUGE, "Usable RAM in bytes (/proc/meminfo MemTotal).")
FREE = metric("teye_memory_free_bytes", GAUGE, "RAM left completely unused, in bytes (/proc/meminfo MemFree).")
AVAILABLE = metric("teye_memory_available_bytes", GAUGE,
                   "RAM available for starting new applications without swapping, in bytes "
                   "(/proc/meminfo MemAvailable). " + _ESTIMATE)
USED = metric("teye_memory_used_bytes", GAUGE,
              "RAM in use, in bytes: MemTotal - MemAvailable (/proc/meminfo). " + _ESTIMATE)
AVAILABLE_ESTIMATED = metric("teye_memory_available_estimated", GAUGE,
                             "1 when teye_memory_available_bytes (and so used) is estimated because the kernel "
                             "has no MemAvailable (before 3.14), 0 when read from /proc/meminfo.")
CACHED = metric("teye_memory_cached_bytes", GAUGE, "Page cache in bytes (/proc/meminfo Cached).")
BUFFERS = metric("teye_memory_buffers_bytes", GAUGE, "Block device buffers in bytes (/proc/meminfo Buffers).")
SHMEM = metric("teye_memory_shmem_bytes", GAUGE,
               "Shared memory and tmpfs in bytes, included in Cached (/proc/meminfo Shmem).")
SLAB_RECLAIMABLE = metric("teye_memory_slab_reclaimable_bytes", GAUGE,
                          "Reclaimable kernel slab memory in bytes (/proc/meminfo SReclaimable).")
DIRTY = metric("teye_memory_dirty_bytes", GAUGE, "Memory waiting to be written back to disk, in bytes "
               "(/proc/meminfo Dirty).")
WRITEBACK = metric("teye_memory_writeback_bytes", GAUGE,
                   "Memory being written back to disk now, in bytes (/proc/meminfo Writeback).")
SWAP_TOTAL = metric("teye_memory_swap_total_bytes", GAUGE, "Swap space in bytes (/proc/meminfo SwapTotal).")
SWAP_FREE = metric("teye_memory_swap_free_bytes", GAUGE, "Unused swap space in bytes (/proc/meminfo SwapFree).")
SWAP_CACHED = metric("teye_memory_swap_cached_bytes", GAUGE,
                     "Swapped-out memory also still in RAM, in bytes (/proc/meminfo SwapCached).")

# Fields every kernel since 2.6 prints; a file without one of them is truncated or garbled.
REQUIRED = ("MemTotal", "MemFree", "Buffers", "Cached", "SwapTotal", "SwapFree")


@dataclass(frozen=True)
class MemoryReading:
    """Memory in bytes. Optional fields are None when the kernel does not report them."""

    total: int
    free: int
    available: int
    available_estimated: bool  # True when the kernel has no MemAvailable
    cached: int
    buffers: int
    swap_total: int
    swap_free: int
    swap_cached: Optional[int] = None
    shmem: Optional[int] = None
    slab_reclaimable: Optional[int] = None
    dirty: Optional[int] = None
    writeback: Optional[int] = None

    @property
    def used(self) -> int:
        """MemTotal - MemAvailable, in bytes."""
        return self.total - self.available

    def points(self) -> Iterator[Point]:
        yield point(TOTAL, self.total)
        yield point(FREE, self.free)
        yield point(AVAILABLE, self.available)
        yield point(USED, self.used)
        yield point(AVAILABLE_ESTIMATED, 1 if self.available_estimated else 0)
        yield point(CACHED, self.cached)
        yield point(BUFFERS, self.buffers)
        yield point(SWAP_TOTAL, self.swap_total)
        yield point(SWAP_FREE, self.swap_free)
        # Absent (None) values are skipped by the exporter.
        yield point(SWAP_CACHED, self.swap_cached)
        yield point(SHMEM, self.shmem)
        yield point(SLAB_RECLAIMABLE, self.slab_reclaimable)
        yield point(DIRTY, self.dirty)
        yield point(WRITEBACK, self.writeback)


def parse_fields(text: str, path: str = "meminfo") -> Dict[str, int]:
    """Every ``Key: value [kB]`` line of /proc/meminfo, with kB converted to bytes."""
    out: Dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        key, sep, rest = line.partition(":")
        key = key.strip()
        fields = rest.split()
        if not sep or not key:
            raise ParseError(path, f"line {lineno}: expected 'Key: value', got {line!r}")
        if not fields:
            raise ParseError(path, f"line {lineno}: {key} has no value (truncated?)")
        if len(fields) > 2 or (len(fields) == 2 and fields[1] != "kB"):
            raise ParseError(path, f"line {lineno}: {key}: unexpected value {rest.strip()!r}")
        value = parse_int(fields[0], path, f"line {lineno} {key}")
        if value < 0:
            raise ParseError(path, f"line {lineno}: {key}: negative value {value}")
        out[key] = value * 1024 if len(fields) == 2 else value
    return out


def parse_meminfo(text: str, path: str = "meminfo") -> MemoryReading:
    """Parse /proc/meminfo. Raises ParseError on an empty, truncated or non-numeric file."""
    f = parse_fields(text, path)
    if not f:
        raise ParseError(path, "file is empty")
    missing = [k for k in REQUIRED if k not in f]
    if missing:
        raise ParseError(path, f"missing field(s) {', '.join(missing)} (truncated?)")
    if "MemAvailable" in f:
        available, estimated = f["MemAvailable"], False
    else:
        available = f["MemFree"] + f["Buffers"] + f["Cached"] + f.get("SReclaimable", 0)
        available, estimated = min(available, f["MemTotal"]), True
    return MemoryReading(
        total=f["MemTotal"], free=f["MemFree"], available=available, available_estimated=estimated,
        cached=f["Cached"], buffers=f["Buffers"], swap_total=f["SwapTotal"], swap_free=f["SwapFree"],
        swap_cached=f.get("SwapCached"), shmem=f.get("Shmem"), slab_reclaimable=f.get("SReclaimable"),
        dirty=f.get("Dirty"), writeback=f.get("Writeback"))


class MemorySource:
    name = "memory"

    def __init__(self, procfs: str = "/proc"):
        self.path = under(procfs, "meminfo")

    def collect(self) -> MemoryReading:
        return parse_meminfo(read_text(self.path), self.path)


def from_config(cfg, ctx=None) -> MemorySource:
    return MemorySource(cfg["procfs"])
