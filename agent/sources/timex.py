"""Clock synchronisation, from the kernel's NTP state (adjtimex(2) with no modes: read-only), as
node_exporter's ``timex`` collector.

``teye_timex_sync_status`` is 1 while the kernel's clock is disciplined by an NTP client (chrony, ntpd,
systemd-timesyncd): the STA_UNSYNC bit is clear.  Offsets and errors are seconds (the kernel's
microseconds, or nanoseconds when STA_NANO is set).  Clocks that drift apart make a job's phases, the GPU
samples and other nodes' series disagree, and the report's multi-node figures wrong.

The same pass reads the loop, tick and pulse-per-second fields of the same call, the kernel's clock sources
(``<sysfs>/devices/system/clocksource``) and the agent's time zone: node_exporter's ``time`` collector but
``node_time_seconds``, which teye's HTTP server writes at each scrape (``teye_time_seconds``: a value sampled in
the background would be up to an interval old).

The syscall is this module's one door (``read_adjtimex``); tests hand the source a fake of it.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import time
from dataclasses import dataclass, replace
from typing import Callable, Dict, Iterator, Optional, Tuple

from ..errors import ParseError, SourceUnavailable
from ..logutil import RateLimitedLog
from ..metrics import COUNTER, GAUGE, MetricSpec, Point, metric, point
from ._files import read_text

log = RateLimitedLog(logging.getLogger("teye.timex"))

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
LOOP = metric("teye_timex_loop_time_constant", GAUGE, "Phase-locked loop time constant (adjtimex constant; "
              "node_timex_loop_time_constant).")
TICK = metric("teye_timex_tick_seconds", GAUGE, "Seconds between clock ticks (adjtimex tick, microseconds; "
              "node_timex_tick_seconds).")
PPS_FREQ = metric("teye_timex_pps_frequency_hertz", GAUGE, "Pulse-per-second frequency (adjtimex ppsfreq / 2^16 "
                  "ppm; node_timex_pps_frequency_hertz); 0 without a PPS source.")
PPS_JITTER = metric("teye_timex_pps_jitter_seconds", GAUGE, "Pulse-per-second jitter in seconds (adjtimex jitter; "
                    "node_timex_pps_jitter_seconds).")
PPS_SHIFT = metric("teye_timex_pps_shift_seconds", GAUGE, "Pulse-per-second interval duration, as the kernel's "
                   "shift (log2 seconds; adjtimex shift; node_timex_pps_shift_seconds).")
PPS_STABILITY = metric("teye_timex_pps_stability_hertz", GAUGE, "Pulse-per-second stability, the average of "
                       "recent frequency changes (adjtimex stabil / 2^16 ppm; node_timex_pps_stability_hertz).")
PPS_JITTER_TOTAL = metric("teye_timex_pps_jitter_total", COUNTER, "Pulse-per-second signals over the jitter limit "
                          "(adjtimex jitcnt; node_timex_pps_jitter_total).")
PPS_CALIBRATION = metric("teye_timex_pps_calibration_total", COUNTER, "Pulse-per-second calibration intervals "
                         "(adjtimex calcnt; node_timex_pps_calibration_total).")
PPS_ERROR = metric("teye_timex_pps_error_total", COUNTER, "Pulse-per-second calibration errors (adjtimex errcnt; "
                   "node_timex_pps_error_total).")
PPS_STABILITY_EXCEEDED = metric("teye_timex_pps_stability_exceeded_total", COUNTER, "Pulse-per-second signals over "
                                "the stability limit (adjtimex stbcnt; node_timex_pps_stability_exceeded_total).")
CLOCKSOURCE_AVAILABLE = metric("teye_time_clocksource_available_info", GAUGE, "1 per clock source the kernel "
                               "offers (/sys/devices/system/clocksource/clocksource<device>/available_clocksource; "
                               "node_time_clocksource_available_info).", ("device", "clocksource"))
CLOCKSOURCE_CURRENT = metric("teye_time_clocksource_current_info", GAUGE, "1 for the clock source the kernel uses "
                             "(current_clocksource; node_time_clocksource_current_info): tsc on a healthy x86 "
                             "host, hpet or acpi_pm after the kernel found the TSC unstable (slow clock reads).",
                             ("device", "clocksource"))
ZONE_OFFSET = metric("teye_time_zone_offset_seconds", GAUGE, "The agent's local time zone's offset from UTC in "
                     "seconds, by zone abbreviation (node_time_zone_offset_seconds).", ("time_zone",))


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


FIELDS = ("offset", "freq", "maxerror", "esterror", "status", "tai", "constant", "tick", "ppsfreq", "jitter", "shift",
          "stabil", "jitcnt", "calcnt", "errcnt", "stbcnt")
PPM16 = 65536 * 1e6   # the kernel's scaled-ppm unit (2^-16 ppm)
MAX_CLOCKSOURCES = 16

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
    more: Tuple[Tuple[MetricSpec, float], ...] = ()   # loop, tick and PPS, in node_exporter's units
    clocksources: Tuple[Tuple[str, Tuple[str, ...], str], ...] = ()   # (device, available, current)
    zone: Optional[Tuple[str, int]] = None

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
        for spec, v in self.more:
            yield point(spec, v)
        for dev, available, current in self.clocksources:
            for cs in available:
                yield point(CLOCKSOURCE_AVAILABLE, 1, dev, cs)
            if current:
                yield point(CLOCKSOURCE_CURRENT, 1, dev, current)
        if self.zone is not None:
            yield point(ZONE_OFFSET, self.zone[1], self.zone[0])


def reading(state: int, f: Dict[str, int]) -> TimexReading:
    per_s = 1e9 if f["status"] & STA_NANO else 1e6
    more = tuple((spec, value) for spec, key, value in (
        (LOOP, "constant", lambda v: v), (TICK, "tick", lambda v: v / 1e6), (PPS_FREQ, "ppsfreq", lambda v: v / PPM16),
        (PPS_JITTER, "jitter", lambda v: v / per_s), (PPS_SHIFT, "shift", lambda v: v),
        (PPS_STABILITY, "stabil", lambda v: v / PPM16), (PPS_JITTER_TOTAL, "jitcnt", lambda v: v),
        (PPS_CALIBRATION, "calcnt", lambda v: v), (PPS_ERROR, "errcnt", lambda v: v),
        (PPS_STABILITY_EXCEEDED, "stbcnt", lambda v: v)) if key in f for value in (value(f[key]),))
    return TimexReading(state, f["offset"] / per_s, f["freq"] / 65536 / 1e6, f["maxerror"] / 1e6,
                        f["esterror"] / 1e6, f["status"], f["tai"], more)


def read_clocksources(sysfs: str) -> Tuple[Tuple[str, Tuple[str, ...], str], ...]:
    """(device, available clock sources, current) per <sysfs>/devices/system/clocksource/clocksource<N>; () where
    the kernel has no such directory."""
    base = os.path.join(sysfs, "devices", "system", "clocksource")
    try:
        names = sorted(n for n in os.listdir(base) if n.startswith("clocksource") and n[11:].isdigit())
    except (FileNotFoundError, NotADirectoryError):
        return ()
    out = []
    for n in names[:MAX_CLOCKSOURCES]:
        d = os.path.join(base, n)
        try:
            available = read_text(os.path.join(d, "available_clocksource"), allow_empty=True, limit=4096).split()
            current = read_text(os.path.join(d, "current_clocksource"), allow_empty=True, limit=4096).split()
        except FileNotFoundError:
            continue
        if len(current) > 1 or any(not c.replace("_", "").replace("-", "").isalnum() for c in available + current):
            raise ParseError(d, f"not clock source names: {(available + current)[:4]!r}")
        out.append((n[11:], tuple(available[:MAX_CLOCKSOURCES]), current[0] if current else ""))
    return tuple(out)


def local_zone(now: Optional[float] = None) -> Tuple[str, int]:
    """(the zone's abbreviation, its offset from UTC in seconds) for the agent's local time (TZ, /etc/localtime)."""
    lt = time.localtime(now)
    return lt.tm_zone or "", int(lt.tm_gmtoff or 0)


class TimexSource:
    name = "timex"

    def __init__(self, adjtimex: Callable[[], Tuple[int, Dict[str, int]]] = read_adjtimex, sysfs: str = "/sys",
                 zone: Callable[[], Tuple[str, int]] = local_zone):
        self._adjtimex = adjtimex
        self.sysfs = sysfs
        self._zone = zone

    def collect(self) -> TimexReading:
        try:
            state, fields = self._adjtimex()
        except (AttributeError, OSError) as e:  # no adjtimex in this libc, or refused by a seccomp filter
            raise SourceUnavailable(f"adjtimex(2) failed: {e}") from None
        try:
            sources = read_clocksources(self.sysfs)
        except (ParseError, OSError) as e:   # garbled or refused: the clock-source families only
            log.warning("clocksource", "timex: %s (clock sources left out)", e)
            sources = ()
        return replace(reading(state, fields), clocksources=sources, zone=self._zone())


def from_config(cfg, ctx=None) -> TimexSource:
    return TimexSource(sysfs=cfg["sysfs"])
