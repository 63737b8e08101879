"""Host sensors: hardware monitoring chips (<sysfs>/class/hwmon) and thermal zones (<sysfs>/class/thermal),
as node_exporter's ``hwmon`` and ``thermal_zone`` collectors.

hwmon (Documentation/hwmon/sysfs-interface): each ``hwmonN`` directory is one chip with a ``name`` and
sensor files ``tempN_input`` (millidegrees Celsius), ``tempN_crit``/``tempN_max``, ``fanN_input`` (RPM),
``powerN_input``/``powerN_average`` (microwatts) and ``inN_input`` (millivolts); ``<kind>N_label`` names a
sensor where the driver says what it measures ("Package id 0", "Core 3").  A chip is labelled ``chip``:
its device's bus path (``platform_coretemp_0``, ``pci0000:00_0000:00:18_3``) where it has a device, else
``hwmonN``; ``teye_hwmon_chip_info{chip,chip_name}`` gives the driver's name.  A sensor without a label
is ``sensor="temp1"``.  A sensor whose file fails (drivers return EIO/ENODATA for a probe that is not
fitted) is left out alone; a chip that vanishes is left out of that pass.

Thermal zones: ``thermal_zoneN/{type,temp}`` (millidegrees) as ``teye_thermal_zone_temp_celsius{zone,type}``.

A node without either (most VMs) exports nothing from them: absent hardware, not a failure.
"""
from __future__ import annotations

import errno
import logging
import os
import re
from dataclasses import dataclass
from typing import Iterator, List, Optional, Tuple

from ..errors import ParseError
from ..logutil import RateLimitedLog
from ..metrics import COUNTER, GAUGE, Point, metric, point
from ._files import read_text, under

SENSOR = ("chip", "sensor")
CHIP_INFO = metric("teye_hwmon_chip_info", GAUGE, "1 per hwmon chip, with the driver's name for it "
                   "(/sys/class/hwmon/hwmonN/name; node_hwmon_chip_names).", ("chip", "chip_name"))
TEMP = metric("teye_hwmon_temp_celsius", GAUGE, "Sensor temperature in degrees Celsius (tempN_input; "
              "node_hwmon_temp_celsius).", SENSOR)
TEMP_CRIT = metric("teye_hwmon_temp_crit_celsius", GAUGE, "The sensor's critical temperature, where the "
                   "hardware protects itself (tempN_crit; node_hwmon_temp_crit_celsius).", SENSOR)
TEMP_MAX = metric("teye_hwmon_temp_max_celsius", GAUGE, "The sensor's maximum temperature (tempN_max; "
                  "node_hwmon_temp_max_celsius).", SENSOR)
FAN = metric("teye_hwmon_fan_rpm", GAUGE, "Fan speed in revolutions per minute (fanN_input; node_hwmon_fan_rpm).",
             SENSOR)
POWER = metric("teye_hwmon_power_watts", GAUGE, "Power in watts (powerN_input, else powerN_average; "
               "node_hwmon_power_average_watt).", SENSOR)
VOLTS = metric("teye_hwmon_in_volts", GAUGE, "Voltage in volts (inN_input; node_hwmon_in_volts).", SENSOR)
UNREADABLE = metric("teye_hwmon_sensor_errors_total", COUNTER, "Sensor files whose value was garbled (not an "
                    "integer): that sensor left out of that read, the file named in the log.")
ZONE_TEMP = metric("teye_thermal_zone_temp_celsius", GAUGE, "Temperature of a thermal zone in degrees Celsius "
                   "(/sys/class/thermal/thermal_zoneN/temp; node_thermal_zone_temp).", ("zone", "type"))

MAX_CHIPS = 256
MAX_SENSORS = 256  # per chip
_SENSOR_FILE = re.compile(r"^(temp|fan|power|in)([0-9]{1,4})_(input|crit|max|average)$")
# kind, suffix -> (spec, scale to base units)
_WHAT = {("temp", "input"): (TEMP, 1e-3), ("temp", "crit"): (TEMP_CRIT, 1e-3), ("temp", "max"): (TEMP_MAX, 1e-3),
         ("fan", "input"): (FAN, 1.0), ("power", "input"): (POWER, 1e-6), ("power", "average"): (POWER, 1e-6),
         ("in", "input"): (VOLTS, 1e-3)}
log = RateLimitedLog(logging.getLogger("teye.hwmon"))
_SKIP_ERRNOS = (errno.EIO, errno.ENODATA, errno.EAGAIN, errno.ENXIO, errno.EINVAL, errno.ENODEV, errno.EOPNOTSUPP)


def _clean(s: str) -> str:
    return re.sub(r"[^a-zA-Z0-9:_.-]", "_", s)[:128]


def _number(path: str) -> Optional[float]:
    """A sensor file's integer, or None when the driver has no reading now."""
    try:
        text = read_text(path).strip()
    except OSError as e:
        if e.errno in _SKIP_ERRNOS or isinstance(e, FileNotFoundError):
            return None
        raise
    except ParseError:  # empty
        return None
    try:
        return float(int(text))
    except ValueError:
        raise ParseError(path, f"expected an integer, got {text[:40]!r}") from None


def _chip_label(d: str, fallback: str) -> str:
    dev = os.path.join(d, "device")
    if not os.path.islink(dev):
        return fallback
    real = os.path.realpath(dev)
    parts = real.split("/devices/", 1)[-1].split("/")
    sub = os.path.basename(os.path.realpath(os.path.join(dev, "subsystem"))) if os.path.exists(
        os.path.join(dev, "subsystem")) else ""
    if sub == "platform" or (parts and parts[0] == "platform"):
        return _clean("platform_" + os.path.basename(real))
    return _clean("_".join(p for p in parts if p)) or fallback


@dataclass(frozen=True)
class HwmonReading:
    chips: Tuple[Tuple[str, str], ...]               # (chip, chip_name)
    sensors: Tuple[Tuple[object, str, str, float], ...]  # (spec, chip, sensor, value)
    zones: Tuple[Tuple[str, str, float], ...]        # (zone, type, celsius)
    errors_total: int = 0

    def points(self) -> Iterator[Point]:
        for chip, name in self.chips:
            yield point(CHIP_INFO, 1, chip, name)
        for spec, chip, sensor, value in self.sensors:
            yield point(spec, value, chip, sensor)
        for zone, typ, value in self.zones:
            yield point(ZONE_TEMP, value, zone, typ)
        if self.chips or self.errors_total:
            yield point(UNREADABLE, self.errors_total)


class HwmonSource:
    name = "hwmon"

    def __init__(self, sysfs: str = "/sys"):
        self.hwmon = under(sysfs, "class", "hwmon")
        self.thermal = under(sysfs, "class", "thermal")
        self.errors = 0

    def _value(self, path: str) -> Optional[float]:
        try:
            return _number(path)
        except ParseError as e:
            self.errors += 1
            log.warning(path, "hwmon: %s (that sensor left out)", e)
            return None

    def _chip(self, d: str, label: str) -> List[Tuple[object, str, str, float]]:
        out = []
        seen = set()
        for f in sorted(os.listdir(d))[:4 * MAX_SENSORS]:
            m = _SENSOR_FILE.match(f)
            if not m:
                continue
            kind, n, suffix = m.groups()
            spec, scale = _WHAT[(kind, suffix)]
            sensor_file = f"{kind}{n}"
            try:
                name = read_text(os.path.join(d, f"{sensor_file}_label")).strip()
            except (OSError, ParseError):
                name = ""
            sensor = _clean(name) if name else sensor_file
            if (spec.name, sensor) in seen:  # power input and average: the first (input) wins
                continue
            v = self._value(os.path.join(d, f))
            if v is None:
                continue
            seen.add((spec.name, sensor))
            out.append((spec, label, sensor, v * scale))
            if len(out) >= MAX_SENSORS:
                break
        return out

    def collect(self) -> HwmonReading:
        chips, sensors, zones = [], [], []
        names = sorted(os.listdir(self.hwmon))[:MAX_CHIPS] if os.path.isdir(self.hwmon) else []
        used = set()
        for entry in names:
            d = os.path.join(self.hwmon, entry)
            try:
                label = _chip_label(d, entry)
                if label in used:
                    label = f"{label}_{entry}"
                used.add(label)
                try:
                    chip_name = _clean(read_text(os.path.join(d, "name")).strip())
                except (FileNotFoundError, ParseError):
                    chip_name = ""
                found = self._chip(d, label)
            except FileNotFoundError:  # the chip went away (a hot-unplugged device)
                continue
            chips.append((label, chip_name))
            sensors.extend(found)
        zdirs = sorted(e for e in os.listdir(self.thermal) if e.startswith("thermal_zone")) \
            if os.path.isdir(self.thermal) else []
        for entry in zdirs[:MAX_CHIPS]:
            d = os.path.join(self.thermal, entry)
            try:
                typ = _clean(read_text(os.path.join(d, "type")).strip())
            except (OSError, ParseError):
                continue
            v = self._value(os.path.join(d, "temp"))
            if v is not None:
                zones.append((entry[len("thermal_zone"):], typ, v / 1000.0))
        return HwmonReading(tuple(chips), tuple(sensors), tuple(zones), self.errors)


def from_config(cfg, ctx=None) -> HwmonSource:
    return HwmonSource(cfg["sysfs"])
