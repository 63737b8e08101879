"""Memory and swap, from <procfs>/meminfo (values in bytes)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Tuple

from ..errors import ParseError, parse_int
from ..metrics import GAUGE, Point, metric, point
from ._files import KeptFiles, KeptFilesSource, under

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

# The rest of /proc/meminfo (node_exporter's node_memory_<Field>_bytes): field -> (teye name, HELP).
# A fixed table: a family is never named after what a file says; a field this kernel lacks is absent.
_MORE = (
    ("Active", "active", "Memory used recently, not reclaimed unless necessary"),
    ("Inactive", "inactive", "Memory used less recently, first to be reclaimed"),
    ("Active(anon)", "active_anon", "Anonymous memory used recently"),
    ("Inactive(anon)", "inactive_anon", "Anonymous memory used less recently"),
    ("Active(file)", "active_file", "Page cache used recently"),
    ("Inactive(file)", "inactive_file", "Page cache used less recently"),
    ("Unevictable", "unevictable", "Memory that cannot be paged out (mlocked, ramfs, pinned by drivers)"),
    ("Mlocked", "mlocked", "Memory locked with mlock() (RDMA registrations and pinned host buffers count here "
                           "when their drivers lock them)"),
    ("AnonPages", "anon_pages", "Anonymous pages mapped into user page tables"),
    ("Mapped", "mapped", "Files mapped into memory (mmap: shared libraries, datasets read with mmap)"),
    ("Slab", "slab", "Kernel slab allocator memory, reclaimable and not"),
    ("SUnreclaim", "slab_unreclaimable", "Kernel slab memory that cannot be reclaimed"),
    ("KernelStack", "kernel_stack", "Kernel stacks of all tasks"),
    ("PageTables", "page_tables", "Page tables"),
    ("CommitLimit", "commit_limit", "The most memory that can be committed under the overcommit policy"),
    ("Committed_AS", "committed_as", "Memory committed to processes (what they could touch)"),
    ("VmallocTotal", "vmalloc_total", "Size of the vmalloc address space"),
    ("VmallocUsed", "vmalloc_used", "vmalloc address space in use"),
    ("HardwareCorrupted", "hardware_corrupted", "Memory the kernel took out of use after hardware memory "
                                                "errors"),
    ("AnonHugePages", "anon_huge_pages", "Anonymous memory in transparent huge pages"),
    ("ShmemHugePages", "shmem_huge_pages", "Shared memory and tmpfs in transparent huge pages"),
    ("Hugetlb", "hugetlb", "Memory held by the hugetlb pools, all page sizes (4.17+)"),
    ("Hugepagesize", "huge_page_size", "Size of one default huge page"),
    ("NFS_Unstable", "nfs_unstable", "NFS pages sent to the server but not yet committed to its storage"),
    ("Bounce", "bounce", "Bounce buffers for block devices"),
    ("WritebackTmp", "writeback_tmp", "Temporary writeback buffers (FUSE)"),
    ("Percpu", "percpu", "Per-CPU allocator memory"),
    ("DirectMap4k", "direct_map_4k", "Kernel direct map in 4 KiB pages"),
    ("DirectMap2M", "direct_map_2m", "Kernel direct map in 2 MiB pages"),
    ("DirectMap1G", "direct_map_1g", "Kernel direct map in 1 GiB pages"),
    ("KReclaimable", "kernel_reclaimable", "Kernel memory the kernel reclaims under pressure (reclaimable slab "
                                           "and other kernel caches; 4.20+)"),
    ("Zswap", "zswap", "Memory the zswap compressed swap cache uses (5.19+)"),
    ("Zswapped", "zswapped", "Anonymous memory held compressed in zswap, at its uncompressed size (5.19+)"),
    ("Balloon", "balloon", "Memory a hypervisor's balloon driver took back from this guest"),
    ("FileHugePages", "file_huge_pages", "Page cache in transparent huge pages (5.4+)"),
    ("FilePmdMapped", "file_pmd_mapped", "Page cache mapped into user space with huge pages (5.4+)"),
    ("ShmemPmdMapped", "shmem_pmd_mapped", "Shared memory mapped into user space with huge pages"),
    ("SecPageTables", "secondary_page_tables", "Secondary page tables (KVM's and IOMMU's; 6.1+)"),
    ("VmallocChunk", "vmalloc_chunk", "Largest free block of the vmalloc address space (0 since 4.4)"),
)
MORE = {field: metric(f"teye_memory_{name}_bytes", GAUGE, f"{help_}, in bytes (/proc/meminfo {field}; "
                      f"node_exporter's node_memory_{field.replace('(', '_').replace(')', '')}_bytes).")
        for field, name, help_ in _MORE}
# The default huge-page pool, in pages (node_memory_HugePages_{Total,Free,Rsvd,Surp}).
HUGE_PAGES = metric("teye_memory_huge_pages", GAUGE,
                    "Pages of the default huge-page pool by state: total, free, reserved (promised, not yet "
                    "faulted in), surplus (over the pool's size) (/proc/meminfo HugePages_*; "
                    "node_memory_HugePages_*).", ["state"])
_HUGE = (("HugePages_Total", "total"), ("HugePages_Free", "free"), ("HugePages_Rsvd", "reserved"),
         ("HugePages_Surp", "surplus"))

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
    more: Tuple[Tuple[str, int], ...] = ()  # the other fields of _MORE and _HUGE this kernel prints

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
        huge = dict(_HUGE)
        for field, value in self.more:
            if field in huge:
                yield point(HUGE_PAGES, value, huge[field])
            else:
                yield point(MORE[field], value)


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
        dirty=f.get("Dirty"), writeback=f.get("Writeback"),
        more=tuple((k, f[k]) for k in list(MORE) + [h for h, _ in _HUGE] if k in f))


class MemorySource(KeptFilesSource):
    name = "memory"
    KEPT = 1   # meminfo

    def __init__(self, procfs: str = "/proc"):
        self.path = under(procfs, "meminfo")
        self._files = KeptFiles()

    def collect(self) -> MemoryReading:
        return parse_meminfo(self._files.read_text(self.path), self.path)


def from_config(cfg, ctx=None) -> MemorySource:
    return MemorySource(cfg["procfs"])
