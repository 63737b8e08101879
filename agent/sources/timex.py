"""Clock synchronisation, from the kernel's NTP state (adjtimex(2) with no modes: read-only), as
node_exporter's ``timex`` collector.

``teye_timex_sync_status`` is 1 while the kernel's clock is disciplined by an NTP client (chrony, ntpd,
systemd-timesyncd): the STA_UNSYNC bit is clear.  Offsets and errors are seconds (the kernel's
microseconds, or nanoseconds when STA_NANO is set).  Clocks that drift apart make a job's phases, the GPU
samples and other nodes' series disagree, and the report's multi-node figures wrong.

The syscall is this module's one door (``read_adjtimex``); tests hand the source a fake of it.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, Tuple

from ..errors import SourceUnavailable
from ..metrics import GAUGE, Point, metric, point

STA_UNSYNC = 0x0040
STA_NANO = 0x2000
TIME_ERROR = 5

SYNC = metric("teye_timex_sync_status", GAUGE, "1 when the kernel's clock is synchronised by an NTP client "
              "(adjtimex status without STA_UNSYNC; node_timex_sync_status).")
OFFSET = metric("teye_timex_offset_seconds", GAUGE, "Time offset between the local clock and the NTP reference, "
                "in seconds (adjtimex offset; node_timex_offset_seconds).")
MAXERROR = metric("teye_timex_maxerror_seconds", GAUGE, "Maximum error of the clock, in seconds (adjtimex "
                  "maxerror; node_timex_maxerror_seconds).")
ESTERROR = metric("teye_timex_estimated_error_seconds", GAUGE, "Estimated error of the clock, in seconds "
                  "(adjtimex esterror; node_timex_estimated_error_seconds).")
FREQ = metric("teye_timex_frequency_adjustment_ratio", GAUGE, "Frequency adjustment of the local clock, as a "
              "ratio (adjtimex freq / 2^16 ppm; node_timex_frequency_adjustment_ratio).")
STATUS = metric("teye_timex_status", GAUGE, "The kernel's NTP status word (adjtimex status bits; "
                "node_timex_status).")
TAI = metric("teye_timex_tai_offset_seconds", GAUGE, "International Atomic Time offset from UTC, in seconds "
             "(adjtimex tai; node_timex_tai_offset_seconds).")


class _Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


class Timex(ctypes.Structure):
    """struct timex of <sys/timex.h> (glibc, LP64 and ILP32 alike: longs and ints in this order)."""

    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long), ("status", ctypes.c_int),
                ("constant", ctypes.c_long), ("precision", ctypes.c_long), ("tolerance", ctypes.c_long),
                ("time", _Timeval), ("tick", ctypes.c_long), ("ppsfreq", ctypes.c_long), ("jitter", ctypes.c_long),
                ("shift", ctypes.c_int), ("stabil", ctypes.c_long), ("jitcnt", ctypes.c_long),
                ("calcnt", ctypes.c_long), ("errcnt", ctypes.c_long), ("stbcnt", ctypes.c_long),
                ("tai", ctypes.c_int), ("_reserved", ctypes.c_int * 11)]


FIELDS = ("offset", "freq", "maxerror", "esterror", "status", "tai")

_libc = None


def read_adjtimex() -> Tuple[int, Dict[str, int]]:
    """adjtimex(2) with modes 0 (reads, changes nothing): (clock state, the FIELDS). OSError on failure."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    tx = Timex()
    state = _libc.adjtimex(ctypes.byref(tx))
    if state < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return state, {f: getattr(tx, f) for f in FIELDS}


@dataclass(frozen=True)
class TimexReading:
    state: int
    offset_s: float
    freq_ratio: float
    maxerror_s: float
    esterror_s: float
    status: int
    tai_s: int

    @property
    def synced(self) -> bool:
        return not self.status & STA_UNSYNC

    def points(self) -> Iterator[Point]:
        yield point(SYNC, 1 if self.synced else 0)
        yield point(OFFSET, self.offset_s)
        yield point(FREQ, self.freq_ratio)
        yield point(MAXERROR, self.maxerror_s)
        yield point(ESTERROR, self.esterror_s)
        yield point(STATUS, self.status)
        yield point(TAI, self.tai_s)


def reading(state: int, f: Dict[str, int]) -> TimexReading:
    per_s = 1e9 if f["status"] & STA_NANO else 1e6
    return TimexReading(state, f["offset"] / per_s, f["freq"] / 65536 / 1e6, f["maxerror"] / 1e6,
                        f["esterror"] / 1e6, f["status"], f["tai"])


class TimexSource:
    name = "timex"

    def __init__(self, adjtimex: Callable[[], Tuple[int, Dict[str, int]]] = read_adjtimex):
        self._adjtimex = adjtimex

    def collect(self) -> TimexReading:
        try:
            state, fields = self._adjtimex()
        except (AttributeError, OSError) as e:  # no adjtimex in this libc, or refused by a seccomp filter
            raise SourceUnavailable(f"adjtimex(2) failed: {e}") from None
        return reading(state, fields)


def from_config(cfg, ctx=None) -> TimexSource:
    return TimexSource()
