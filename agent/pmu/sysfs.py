"""Resolve ``pmu/event`` the way ``perf stat -e pmu/event/`` does, from the kernel's PMU descriptions.

Under ``<sysfs>/bus/event_source/devices/<pmu>/`` (Documentation/ABI/testing/
sysfs-bus-event_source-devices-{format,events}):

- ``type``: the number to put in ``perf_event_attr.type``;
- ``cpumask``: for uncore PMUs, the CPUs (one per socket or die) to open them on;
- ``format/<term>``: where a term's value goes, e.g. ``config:0-7``, ``config:21``,
  ``config1:0-63`` or several ranges ``config:0-7,32-35`` (the value's low bits fill the
  first range, the next bits the next one);
- ``events/<name>``: a description such as ``event=0x04,umask=0x03`` (a term without a
  value means 1), with optional ``events/<name>.scale`` (multiply the count) and
  ``events/<name>.unit`` (of the scaled value, e.g. ``MiB``).

``uncore_iio_<n>/die<X>`` (Documentation/ABI/testing/sysfs-devices-mapping) names the PCIe
root bus ``SEGMENT:BUS`` behind IIO stack ``n`` on die ``X``.

Anything that does not parse raises :class:`PmuFormatError` naming the file.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ..errors import ParseError
from ..sources import _files

CONFIG_FIELDS = ("config", "config1", "config2")

# Units of scaled uncore values -> bytes per unit.
UNIT_BYTES = {"B": 1.0, "Bytes": 1.0, "KiB": 1024.0, "MiB": 1024.0 ** 2, "GiB": 1024.0 ** 3,
              "KB": 1e3, "MB": 1e6, "GB": 1e9}


class PmuFormatError(ParseError):
    """A PMU description file that does not parse, or an event that cannot be encoded."""


def devices_dir(sysfs: str) -> str:
    return os.path.join(sysfs, "bus", "event_source", "devices")


def read_text(path: str) -> str:
    """A sysfs attribute's text without the trailing newline (OSError when unreadable, FileRefused when not a
    regular file or too large: agent/sources/_files.py)."""
    return _files.read_text(path, allow_empty=True).strip()


_read = read_text


@dataclass(frozen=True)
class Format:
    """One format term: the attr field it goes in and its bit ranges (low bits first)."""

    field: str
    ranges: Tuple[Tuple[int, int], ...]

    @property
    def width(self) -> int:
        return sum(hi - lo + 1 for lo, hi in self.ranges)


_FORMAT_RE = re.compile(r"^(config[12]?):(\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*)$")


def parse_format(text: str, path: str = "format") -> Format:
    m = _FORMAT_RE.match(text.strip())
    if not m:
        raise PmuFormatError(path, f"expected 'config[12]:LO-HI[,LO-HI...]', got {text.strip()!r}")
    ranges = []
    for part in m.group(2).split(","):
        lo, _, hi = part.partition("-")
        lo_i, hi_i = int(lo), int(hi or lo)
        if hi_i < lo_i or hi_i > 63:
            raise PmuFormatError(path, f"bad bit range {part!r}")
        ranges.append((lo_i, hi_i))
    return Format(m.group(1), tuple(ranges))


def parse_terms(text: str, path: str = "event") -> List[Tuple[str, int]]:
    """'event=0x04,umask=0x03,edge' -> [('event', 4), ('umask', 3), ('edge', 1)]."""
    out = []
    text = text.strip()
    if not text:
        raise PmuFormatError(path, "empty event description")
    for term in text.split(","):
        name, sep, value = term.strip().partition("=")
        name = name.strip()
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            raise PmuFormatError(path, f"bad term {term!r} in {text!r}")
        if not sep:
            out.append((name, 1))
            continue
        try:
            out.append((name, int(value.strip(), 0)))
        except ValueError:
            raise PmuFormatError(path, f"term {name!r}: value {value.strip()!r} is not a number "
                                       f"(placeholders such as '?' need a value teye does not supply)") from None
    return out


@dataclass(frozen=True)
class EventAlias:
    name: str
    terms: Tuple[Tuple[str, int], ...]
    scale: float = 1.0
    unit: str = ""


@dataclass
class Pmu:
    """One PMU's description; events are parsed on demand (a bad one breaks only itself)."""

    name: str
    type: int
    path: str
    cpumask: Optional[Tuple[int, ...]] = None
    formats: Dict[str, Format] = field(default_factory=dict)

    def has_event(self, event: str) -> bool:
        return os.path.isfile(os.path.join(self.path, "events", event))

    def event_names(self) -> List[str]:
        try:
            names = os.listdir(os.path.join(self.path, "events"))
        except OSError:
            return []
        return sorted(n for n in names if "." not in n)

    def alias(self, event: str) -> EventAlias:
        base = os.path.join(self.path, "events", event)
        try:
            terms = parse_terms(_read(base), base)
        except OSError as e:
            raise PmuFormatError(base, f"cannot read: {e.strerror}") from None
        scale, unit = 1.0, ""
        if os.path.exists(base + ".scale"):
            text = _read(base + ".scale")
            try:
                scale = float(text)
            except ValueError:
                raise PmuFormatError(base + ".scale", f"expected a number, got {text!r}") from None
        if os.path.exists(base + ".unit"):
            unit = _read(base + ".unit")
        return EventAlias(event, tuple(terms), scale, unit)

    def encode(self, terms, what: str = "") -> Tuple[int, int, int]:
        """(config, config1, config2) of the terms, placed by this PMU's format files."""
        out = {f: 0 for f in CONFIG_FIELDS}
        where = what or self.path
        for name, value in terms:
            fmt = self.formats.get(name)
            if fmt is None:
                raise PmuFormatError(where, f"unknown format field {name!r} for PMU {self.name} "
                                            f"(known: {', '.join(sorted(self.formats)) or 'none'})")
            if value < 0 or value >= 1 << fmt.width:
                raise PmuFormatError(where, f"value {value:#x} of {name!r} does not fit in {fmt.width} bits")
            v = value
            for lo, hi in fmt.ranges:
                n = hi - lo + 1
                out[fmt.field] |= (v & ((1 << n) - 1)) << lo
                v >>= n
        return out["config"], out["config1"], out["config2"]


def parse_cpulist(text: str, path: str = "cpumask") -> Tuple[int, ...]:
    """'0-3,8,10-11' -> (0, 1, 2, 3, 8, 10, 11)."""
    cpus: List[int] = []
    text = text.strip()
    if not text:
        return ()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise PmuFormatError(path, f"bad CPU list {text!r}") from None
        cpus.extend(range(a, b + 1))
    return tuple(cpus)


def list_pmus(sysfs: str) -> List[str]:
    try:
        return sorted(os.listdir(devices_dir(sysfs)))
    except OSError:
        return []


def load_pmu(sysfs: str, name: str) -> Pmu:
    """Read type, cpumask and format/* of one PMU; PmuFormatError (or OSError) when they do not parse."""
    path = os.path.join(devices_dir(sysfs), name)
    tpath = os.path.join(path, "type")
    text = _read(tpath)
    try:
        typ = int(text)
    except ValueError:
        raise PmuFormatError(tpath, f"expected an integer, got {text!r}") from None
    cpumask = None
    cpath = os.path.join(path, "cpumask")
    if os.path.exists(cpath):
        cpumask = parse_cpulist(_read(cpath), cpath)
    formats = {}
    fdir = os.path.join(path, "format")
    try:
        names = sorted(os.listdir(fdir))
    except OSError:
        names = []
    for n in names:
        fp = os.path.join(fdir, n)
        formats[n] = parse_format(_read(fp), fp)
    return Pmu(name, typ, path, cpumask, formats)


def root_buses(pmu_path: str) -> Dict[int, str]:
    """die number -> 'SEGMENT:BUS' from an IIO PMU's die<X> files (empty when there are none)."""
    out = {}
    try:
        names = os.listdir(pmu_path)
    except OSError:
        return out
    for n in names:
        m = re.match(r"^die(\d+)$", n)
        if m:
            text = _read(os.path.join(pmu_path, n))
            if re.match(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}$", text):
                out[int(m.group(1))] = text.lower()
    return out


def gpu_root_buses(sysfs: str) -> Dict[str, str]:
    """NVIDIA display/3D controllers -> the PCIe root bus they sit behind.

    Keys are PCI addresses in NVML's form ('00000000:18:00.0', as teye_gpu_info's pci_bus_id);
    values 'SEGMENT:BUS' as in the IIO PMUs' die files, from the device's path under
    <sysfs>/devices (``pci0000:17/0000:17:00.0/0000:18:00.0`` -> ``0000:17``).
    """
    out = {}
    base = os.path.join(sysfs, "bus", "pci", "devices")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return out
    for n in names:
        d = os.path.join(base, n)
        try:
            if _read(os.path.join(d, "vendor")).lower() != "0x10de" or not _read(os.path.join(d, "class")).startswith("0x03"):
                continue
        except OSError:
            continue
        m = re.search(r"/pci([0-9a-fA-F]{4}:[0-9a-fA-F]{2})/", os.path.realpath(d))
        a = re.match(r"^([0-9a-fA-F]{4}):([0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])$", n)
        if m and a:
            out[f"0000{a.group(1)}:{a.group(2)}".upper()] = m.group(1).lower()
    return out


def bytes_per_count(alias: EventAlias, path: str) -> float:
    """Bytes one count stands for: scale x the unit's bytes.  PmuFormatError on a unit that is not bytes."""
    if alias.unit not in UNIT_BYTES:
        raise PmuFormatError(path, f"event {alias.name}: unit {alias.unit!r} is not a byte unit")
    return alias.scale * UNIT_BYTES[alias.unit]


def online_cpus(sysfs: str) -> Optional[Tuple[int, ...]]:
    path = os.path.join(sysfs, "devices", "system", "cpu", "online")
    try:
        return parse_cpulist(_read(path), path)
    except OSError:
        return None


def package_of(sysfs: str, cpu: int) -> int:
    path = os.path.join(sysfs, "devices", "system", "cpu", f"cpu{cpu}", "topology", "physical_package_id")
    try:
        return int(_read(path))
    except (OSError, ValueError):
        return 0
