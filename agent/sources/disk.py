"""Block device I/O per device, from <procfs>/diskstats.

Column layout (Documentation/admin-guide/iostats.rst): ``major minor name`` then
11 fields (every kernel since 2.6.25), 15 (4.18+: discards) or 17 (5.5+: flushes).
Sector counts are in 512-byte units whatever the device's sector size; times are
in milliseconds.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Pattern, Tuple, Union

from ..errors import ParseError, parse_int
from ..metrics import COUNTER, GAUGE, Point, metric, point
from ._files import read_text, under

SECTOR_BYTES = 512

_D = ["device"]
READS = metric("teye_disk_reads_completed_total", COUNTER, "Reads completed successfully (/proc/diskstats).", _D)
READS_MERGED = metric("teye_disk_reads_merged_total", COUNTER,
                      "Adjacent reads merged into one request (/proc/diskstats).", _D)
READ_BYTES = metric("teye_disk_read_bytes_total", COUNTER,
                    "Bytes read: sectors read x 512 (/proc/diskstats).", _D)
READ_TIME = metric("teye_disk_read_time_seconds_total", COUNTER,
                   "Seconds spent by all reads (/proc/diskstats).", _D)
WRITES = metric("teye_disk_writes_completed_total", COUNTER,
                "Writes completed successfully (/proc/diskstats).", _D)
WRITES_MERGED = metric("teye_disk_writes_merged_total", COUNTER,
                       "Adjacent writes merged into one request (/proc/diskstats).", _D)
WRITTEN_BYTES = metric("teye_disk_written_bytes_total", COUNTER,
                       "Bytes written: sectors written x 512 (/proc/diskstats).", _D)
WRITE_TIME = metric("teye_disk_write_time_seconds_total", COUNTER,
                    "Seconds spent by all writes (/proc/diskstats).", _D)
IO_IN_PROGRESS = metric("teye_disk_io_in_progress", GAUGE,
                        "I/O requests currently in progress (/proc/diskstats).", _D)
IO_TIME = metric("teye_disk_io_time_seconds_total", COUNTER,
                 "Seconds the device had I/O in progress (/proc/diskstats); its rate is the busy ratio.", _D)
IO_TIME_WEIGHTED = metric("teye_disk_io_time_weighted_seconds_total", COUNTER,
                          "Seconds spent doing I/O weighted by the number of requests in progress "
                          "(/proc/diskstats); its rate is the average queue length.", _D)
DISCARDS = metric("teye_disk_discards_completed_total", COUNTER,
                  "Discards completed successfully (/proc/diskstats, kernel 4.18+).", _D)
DISCARDS_MERGED = metric("teye_disk_discards_merged_total", COUNTER,
                         "Adjacent discards merged (/proc/diskstats, kernel 4.18+).", _D)
DISCARDED_BYTES = metric("teye_disk_discarded_bytes_total", COUNTER,
                         "Bytes discarded: sectors discarded x 512 (/proc/diskstats, kernel 4.18+).", _D)
DISCARD_TIME = metric("teye_disk_discard_time_seconds_total", COUNTER,
                      "Seconds spent by all discards (/proc/diskstats, kernel 4.18+).", _D)
FLUSHES = metric("teye_disk_flush_requests_total", COUNTER,
                 "Flush requests completed successfully (/proc/diskstats, kernel 5.5+).", _D)
FLUSH_TIME = metric("teye_disk_flush_time_seconds_total", COUNTER,
                    "Seconds spent by all flush requests (/proc/diskstats, kernel 5.5+).", _D)

# Numbers of statistics columns known kernels print after "major minor name".
BASE_COLUMNS, DISCARD_COLUMNS, FLUSH_COLUMNS = 11, 15, 17


@dataclass(frozen=True)
class DiskStats:
    """One block device's cumulative counters (bytes, seconds); discard/flush fields None when absent."""

    reads: int
    reads_merged: int
    read_bytes: int
    read_time: float
    writes: int
    writes_merged: int
    written_bytes: int
    write_time: float
    io_in_progress: int
    io_time: float
    io_time_weighted: float
    discards: Optional[int] = None
    discards_merged: Optional[int] = None
    discarded_bytes: Optional[int] = None
    discard_time: Optional[float] = None
    flushes: Optional[int] = None
    flush_time: Optional[float] = None


_POINTS = (
    (READS, "reads"), (READS_MERGED, "reads_merged"), (READ_BYTES, "read_bytes"), (READ_TIME, "read_time"),
    (WRITES, "writes"), (WRITES_MERGED, "writes_merged"), (WRITTEN_BYTES, "written_bytes"),
    (WRITE_TIME, "write_time"), (IO_IN_PROGRESS, "io_in_progress"), (IO_TIME, "io_time"),
    (IO_TIME_WEIGHTED, "io_time_weighted"), (DISCARDS, "discards"), (DISCARDS_MERGED, "discards_merged"),
    (DISCARDED_BYTES, "discarded_bytes"), (DISCARD_TIME, "discard_time"), (FLUSHES, "flushes"),
    (FLUSH_TIME, "flush_time"),
)


@dataclass(frozen=True)
class DiskReading:
    """Per-device statistics, keyed by kernel device name (e.g. 'sda', 'nvme0n1', 'dm-0')."""

    devices: Dict[str, DiskStats]

    def points(self) -> Iterator[Point]:
        for dev, st in self.devices.items():
            for spec, attr in _POINTS:
                value = getattr(st, attr)
                if value is not None:
                    yield point(spec, value, dev)


def _ms(v: int) -> float:
    return v / 1000.0


def _device(v: Tuple[int, ...]) -> DiskStats:
    discard = flush = {}
    if len(v) >= DISCARD_COLUMNS:
        discard = dict(discards=v[11], discards_merged=v[12], discarded_bytes=v[13] * SECTOR_BYTES,
                       discard_time=_ms(v[14]))
    if len(v) >= FLUSH_COLUMNS:
        flush = dict(flushes=v[15], flush_time=_ms(v[16]))
    return DiskStats(reads=v[0], reads_merged=v[1], read_bytes=v[2] * SECTOR_BYTES, read_time=_ms(v[3]),
                     writes=v[4], writes_merged=v[5], written_bytes=v[6] * SECTOR_BYTES, write_time=_ms(v[7]),
                     io_in_progress=v[8], io_time=_ms(v[9]), io_time_weighted=_ms(v[10]), **discard, **flush)


def parse_diskstats(text: str, path: str = "diskstats",
                    exclude: Union[None, str, Pattern[str]] = None) -> DiskReading:
    """Parse /proc/diskstats; devices whose name matches ``exclude`` (re.search) are left out.

    Raises ParseError on an empty file, a truncated line (a column count no kernel
    prints) or a non-numeric field.
    """
    if isinstance(exclude, str):
        exclude = re.compile(exclude)
    devices: Dict[str, DiskStats] = {}
    seen = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        seen += 1
        ncols = len(fields) - 3
        if ncols not in (BASE_COLUMNS, DISCARD_COLUMNS) and ncols < FLUSH_COLUMNS:
            raise ParseError(path, f"line {lineno}: {len(fields)} fields, expected 14, 18 or 20+ (truncated?)")
        name = fields[2]
        values = tuple(parse_int(f, path, f"line {lineno} {name} column {i + 4}")
                       for i, f in enumerate(fields[3:3 + FLUSH_COLUMNS]))
        parse_int(fields[0], path, f"line {lineno} major")
        parse_int(fields[1], path, f"line {lineno} minor")
        if any(x < 0 for x in values):
            raise ParseError(path, f"line {lineno}: {name}: negative counter")
        if exclude is not None and exclude.search(name):
            continue
        devices[name] = _device(values)
    if not seen:
        raise ParseError(path, "file is empty")
    return DiskReading(devices)


class DiskSource:
    name = "disk"

    def __init__(self, procfs: str = "/proc", exclude: Optional[str] = None):
        self.path = under(procfs, "diskstats")
        self.exclude = re.compile(exclude) if exclude else None

    def collect(self) -> DiskReading:
        return parse_diskstats(read_text(self.path), self.path, self.exclude)


def from_config(cfg, ctx=None) -> DiskSource:
    return DiskSource(cfg["procfs"], cfg["disk"]["exclude"])
