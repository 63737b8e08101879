"""The kernel's file table and random pool, as node_exporter's ``filefd`` and ``entropy`` collectors:
``<procfs>/sys/fs/file-nr`` (``allocated  0  maximum``: file handles the kernel has allocated and its limit,
``fs.file-max``) and ``<procfs>/sys/kernel/random/{entropy_avail,poolsize}`` (bits).

They are read by the ``loadavg`` collector in the same pass as ``/proc/loadavg`` (three small files, no thread
of their own).  A file this kernel lacks leaves its families absent; a garbled one leaves them absent too and
is named in the log and counted in ``teye_kernel_tables_unreadable_total`` (the load average is still
exported).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator, Optional, Tuple

from ..errors import ParseError, parse_int
from ..logutil import RateLimitedLog
from ..metrics import COUNTER, GAUGE, Point, metric, point
from ._files import read_text, under

FILEFD_ALLOCATED = metric("teye_filefd_allocated", GAUGE, "File handles the kernel has allocated "
                          "(/proc/sys/fs/file-nr, first field; node_filefd_allocated).")
FILEFD_MAXIMUM = metric("teye_filefd_maximum", GAUGE, "The most file handles the kernel will allocate "
                        "(fs.file-max, /proc/sys/fs/file-nr third field; node_filefd_maximum).")
ENTROPY_AVAILABLE = metric("teye_entropy_available_bits", GAUGE, "Bits of entropy in the kernel's random pool "
                           "(/proc/sys/kernel/random/entropy_avail; node_entropy_available_bits).")
ENTROPY_POOL = metric("teye_entropy_pool_size_bits", GAUGE, "Size of the kernel's random pool in bits "
                      "(/proc/sys/kernel/random/poolsize; node_entropy_pool_size_bits).")
UNREADABLE = metric("teye_kernel_tables_unreadable_total", COUNTER,
                    "Reads of /proc/sys/fs/file-nr or /proc/sys/kernel/random/* refused because the file was garbled "
                    "(its families left out of that pass, the file named in the log), by file.", ("file",))

log = RateLimitedLog(logging.getLogger("teye.kernel"))
FILES = ("file-nr", "entropy_avail", "poolsize")


def parse_file_nr(text: str, path: str = "file-nr") -> Tuple[int, int]:
    """``allocated unused maximum`` -> (allocated, maximum).  ParseError on anything else."""
    words = text.split()
    if len(words) != 3:
        raise ParseError(path, f"expected 3 fields 'allocated unused maximum', got {len(words)}")
    allocated, maximum = parse_int(words[0], path, "allocated"), parse_int(words[2], path, "maximum")
    if allocated < 0 or maximum < 0:
        raise ParseError(path, f"negative count in {text.strip()[:60]!r}")
    return allocated, maximum


def parse_bits(text: str, path: str) -> int:
    words = text.split()
    if len(words) != 1:
        raise ParseError(path, f"expected one number, got {len(words)} fields")
    n = parse_int(words[0], path, "bits")
    if n < 0:
        raise ParseError(path, f"negative bit count {n}")
    return n


@dataclass(frozen=True)
class KernelTables:
    filefd: Optional[Tuple[int, int]]
    entropy_available: Optional[int]
    entropy_pool: Optional[int]
    unreadable: Tuple[Tuple[str, int], ...] = ()

    def points(self) -> Iterator[Point]:
        if self.filefd is not None:
            yield point(FILEFD_ALLOCATED, self.filefd[0])
            yield point(FILEFD_MAXIMUM, self.filefd[1])
        if self.entropy_available is not None:
            yield point(ENTROPY_AVAILABLE, self.entropy_available)
        if self.entropy_pool is not None:
            yield point(ENTROPY_POOL, self.entropy_pool)
        for f, n in self.unreadable:
            yield point(UNREADABLE, n, f)


class KernelTablesReader:
    """Reads the three files once per call; counts garbled ones per file (a reader lives as long as its source)."""

    def __init__(self, procfs: str = "/proc"):
        self.paths = {"file-nr": under(procfs, "sys", "fs", "file-nr"),
                      "entropy_avail": under(procfs, "sys", "kernel", "random", "entropy_avail"),
                      "poolsize": under(procfs, "sys", "kernel", "random", "poolsize")}
        self._bad = {f: 0 for f in FILES}

    def _one(self, f: str, parse):
        path = self.paths[f]
        try:
            return parse(read_text(path, limit=4096), path)
        except FileNotFoundError:
            return None
        except (ParseError, OSError) as e:   # garbled, refused or unreadable: this file's families only
            self._bad[f] += 1
            log.warning(path, "kernel tables: %s (its families left out)", e)
            return None

    def read(self) -> KernelTables:
        return KernelTables(self._one("file-nr", parse_file_nr), self._one("entropy_avail", parse_bits),
                            self._one("poolsize", parse_bits),
                            tuple((f, n) for f, n in self._bad.items() if n))
