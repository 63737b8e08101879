"""Block device I/O per device, from <procfs>/diskstats.

Column layout (Documentation/admin-guide/iostats.rst): ``major minor name`` then
11 fields (every kernel since 2.6.25), 15 (4.18+: discards) or 17 (5.5+: flushes).
Sector counts are in 512-byte units whatever the device's sector size; times are
in milliseconds.

The same pass gives each device's ``teye_disk_info`` (its numbers and udev's properties of it, read from
``udev_data`` once a minute) and reads the md arrays (``<procfs>/mdstat``, agent/sources/md.py).
"""
from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass, field, replace
from typing import Dict, Iterator, Optional, Pattern, Tuple, Union

from ..errors import ParseError, parse_int
from ..logutil import RateLimitedLog
from ..metrics import COUNTER, GAUGE, Point, metric, point
from ._files import KeptFiles, KeptFilesSource, read_text, under
from .md import MdReading, parse_mdstat

log = RateLimitedLog(logging.getLogger("teye.disk"))

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

INFO_LABELS = ("device", "major", "minor", "path", "wwn", "model", "serial", "revision")
INFO = metric("teye_disk_info", GAUGE, "1 per block device, labelled with its device numbers and udev's properties of "
              "it: path (ID_PATH), wwn (ID_WWN), model (ID_MODEL), serial (SCSI_IDENT_SERIAL, else ID_SERIAL_SHORT, "
              "else ID_SERIAL), revision (ID_REVISION); empty where udev has none (udev_data, node_exporter's "
              "--path.udev.data; node_disk_info).", INFO_LABELS)
UDEV_REFRESH_S = 60.0
MAX_LABEL = 256
_UDEV_KEYS = ("ID_PATH", "ID_WWN", "ID_MODEL", "SCSI_IDENT_SERIAL", "ID_SERIAL_SHORT", "ID_SERIAL", "ID_REVISION")

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
    numbers: Dict[str, Tuple[int, int]] = field(default_factory=dict)   # device -> (major, minor)
    info: Tuple[Tuple[str, ...], ...] = ()   # teye_disk_info's labels per device
    md: Optional[MdReading] = None

    def points(self) -> Iterator[Point]:
        for dev, st in self.devices.items():
            for spec, attr in _POINTS:
                value = getattr(st, attr)
                if value is not None:
                    yield point(spec, value, dev)
        for labels in self.info:
            yield point(INFO, 1, *labels)
        if self.md is not None:
            yield from self.md.points()


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


def parse_udev(text: str) -> Dict[str, str]:
    """The ``E:KEY=value`` properties of a udev database file (udevadm(8)) that teye_disk_info reads."""
    out: Dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("E:"):
            key, sep, value = line[2:].partition("=")
            if sep and key in _UDEV_KEYS:
                out[key] = value[:MAX_LABEL]
    return out


def info_labels(device: str, numbers: Tuple[int, int], udev: Dict[str, str]) -> Tuple[str, ...]:
    serial = udev.get("SCSI_IDENT_SERIAL") or udev.get("ID_SERIAL_SHORT") or udev.get("ID_SERIAL", "")
    return (device, str(numbers[0]), str(numbers[1]), udev.get("ID_PATH", ""), udev.get("ID_WWN", ""),
            udev.get("ID_MODEL", ""), serial, udev.get("ID_REVISION", ""))


def parse_diskstats(text: str, path: str = "diskstats",
                    exclude: Union[None, str, Pattern[str]] = None) -> DiskReading:
    """Parse /proc/diskstats; devices whose name matches ``exclude`` (re.search) are left out.

    Raises ParseError on an empty file, a truncated line (a column count no kernel
    prints) or a non-numeric field.
    """
    if isinstance(exclude, str):
        exclude = re.compile(exclude)
    devices: Dict[str, DiskStats] = {}
    numbers: Dict[str, Tuple[int, int]] = {}
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
        major = parse_int(fields[0], path, f"line {lineno} major")
        minor = parse_int(fields[1], path, f"line {lineno} minor")
        if any(x < 0 for x in values) or major < 0 or minor < 0:
            raise ParseError(path, f"line {lineno}: {name}: negative counter")
        if exclude is not None and exclude.search(name):
            continue
        devices[name] = _device(values)
        numbers[name] = (major, minor)
    if not seen:
        raise ParseError(path, "file is empty")
    return DiskReading(devices, numbers=numbers)


class DiskSource(KeptFilesSource):
    name = "disk"
    KEPT = 2   # diskstats and mdstat

    def __init__(self, procfs: str = "/proc", exclude: Optional[str] = None, udev_data: str = "/run/udev/data",
                 clock=time.monotonic):
        self.path = under(procfs, "diskstats")
        self.mdstat = under(procfs, "mdstat")
        self.exclude = re.compile(exclude) if exclude else None
        self.udev_data = udev_data
        self.clock = clock
        self.md_unreadable = 0
        self._files = KeptFiles()    # diskstats and mdstat (udev's files are read as before)
        # udev's properties of a device change only when the device does: read again every UDEV_REFRESH_S
        # and at once for a new device or new device numbers
        self._udev: Dict[str, Tuple[float, Tuple[int, int], Tuple[str, ...]]] = {}

    def _info(self, name: str, numbers: Tuple[int, int], now: float) -> Tuple[str, ...]:
        cached = self._udev.get(name)
        if cached is not None and cached[1] == numbers and now - cached[0] < UDEV_REFRESH_S:
            return cached[2]
        path = os.path.join(self.udev_data, f"b{numbers[0]}:{numbers[1]}")
        try:
            udev = parse_udev(read_text(path, allow_empty=True, limit=1 << 16))
        except OSError:   # no udev database (a container without it, a host without udev), or not this device
            udev = {}
        labels = info_labels(name, numbers, udev)
        self._udev[name] = (now, numbers, labels)
        return labels

    def _md(self) -> Optional[MdReading]:
        try:
            return MdReading(parse_mdstat(self._files.read_text(self.mdstat, allow_empty=True, limit=1 << 20),
                                             self.mdstat),
                             self.md_unreadable)
        except FileNotFoundError:   # no md driver
            return None
        except (ParseError, OSError) as e:   # garbled or refused: the md families only
            self.md_unreadable += 1
            log.warning(self.mdstat, "disk: %s (md arrays left out)", e)
            return MdReading((), self.md_unreadable)

    def collect(self) -> DiskReading:
        reading = parse_diskstats(self._files.read_text(self.path), self.path, self.exclude)
        now = self.clock()
        info = tuple(self._info(name, reading.numbers[name], now) for name in reading.devices)
        for gone in set(self._udev) - set(reading.devices):
            del self._udev[gone]
        return replace(reading, info=info, md=self._md())


def from_config(cfg, ctx=None) -> DiskSource:
    return DiskSource(cfg["procfs"], cfg["disk"]["exclude"], cfg["udev_data"])
