"""systemd's units and their state, as node_exporter's ``systemd`` collector's ``node_systemd_unit_state``: one series
per unit and state (active, activating, deactivating, inactive, failed), 1 for the unit's current state, and the
service's ``Type`` as a label.  Off by default, as in node_exporter.

node_exporter asks systemd over D-Bus.  teye adds no D-Bus library: it runs ``systemctl show`` once per interval
with the three properties it needs for every loaded unit (one process, its output read to at most 8 MiB, killed
after 10 s), so the cost is one fork and exec a period, and nothing at all where the collector is off.  The command
is this module's one door (``run``): tests hand the source a fake of it.

Units are filtered as node_exporter does by default: automount, device, mount, scope and slice units are left out
(``systemd.unit_exclude``), and at most :data:`MAX_UNITS` units are exported.  A node without systemd (no
``systemctl``, or systemd not PID 1: "System has not been booted with systemd") marks the collector absent.
"""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Pattern, Tuple

from ..errors import HardwareAbsent, ParseError, SourceUnavailable
from ..metrics import GAUGE, Point, metric, point

STATES = ("activating", "active", "deactivating", "failed", "inactive")
UNIT_STATE = metric("teye_systemd_unit_state", GAUGE, "1 for the systemd unit's current active state, 0 for the "
                    "others (activating, active, deactivating, failed, inactive); type is a service's Type= "
                    "(simple, forking, oneshot, notify, ...), empty for other units (systemctl show; "
                    "node_systemd_unit_state). The systemd collector is off by default.", ("name", "state", "type"))
COMMAND = ("systemctl", "show", "--all", "--no-pager", "--property=Id,ActiveState,Type", "*")
MAX_OUTPUT = 8 << 20
MAX_UNITS = 4096
TIMEOUT_S = 10.0
DEFAULT_EXCLUDE = r".+\.(automount|device|mount|scope|slice)"
_NAME = re.compile(r"^[A-Za-z0-9:_.\\@-]{1,256}$")


def run_systemctl(cmd: Tuple[str, ...] = COMMAND) -> str:
    """systemctl's output; HardwareAbsent without systemd, SourceUnavailable when it fails or takes too long."""
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise HardwareAbsent("no systemctl on this node (not a systemd host)") from None
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise SourceUnavailable(f"systemctl show took more than {TIMEOUT_S:g} s (killed)") from None
    if proc.returncode != 0:
        text = err.decode("utf-8", "replace").strip()[:200]
        if "not been booted with systemd" in text or "Failed to connect to bus" in text:
            raise HardwareAbsent(f"systemd is not running here: {text}")
        raise SourceUnavailable(f"systemctl show exited {proc.returncode}: {text}")
    if len(out) > MAX_OUTPUT:
        raise SourceUnavailable(f"systemctl show printed more than {MAX_OUTPUT} bytes")
    return out.decode("utf-8", "replace")


def parse_show(text: str, path: str = "systemctl show") -> List[Tuple[str, str, str]]:
    """``Key=value`` blocks separated by blank lines -> (unit, active state, type) per unit."""
    units: List[Tuple[str, str, str]] = []
    for n, block in enumerate(re.split(r"\n\s*\n", text.strip())):
        if not block.strip():
            continue
        props = {}
        for line in block.splitlines():
            key, sep, value = line.partition("=")
            if not sep:
                raise ParseError(path, f"unit {n + 1}: expected Key=value, got {line[:80]!r}")
            props[key.strip()] = value.strip()
        name, state = props.get("Id", ""), props.get("ActiveState", "")
        if not _NAME.match(name) or state not in STATES:
            raise ParseError(path, f"unit {n + 1}: Id {name[:60]!r}, ActiveState {state[:20]!r}")
        units.append((name, state, props.get("Type", "")[:32]))
    return units


@dataclass(frozen=True)
class SystemdReading:
    units: Tuple[Tuple[str, str, str], ...]

    def points(self) -> Iterator[Point]:
        for name, state, type_ in self.units:
            for s in STATES:
                yield point(UNIT_STATE, 1 if s == state else 0, name, s, type_)


class SystemdSource:
    name = "systemd"

    def __init__(self, include: Optional[str] = None, exclude: Optional[str] = DEFAULT_EXCLUDE,
                 run: Callable[[], str] = run_systemctl):
        self.include: Optional[Pattern[str]] = re.compile(include) if include else None
        self.exclude: Optional[Pattern[str]] = re.compile(exclude) if exclude else None
        self._run = run

    def collect(self) -> SystemdReading:
        units = []
        for name, state, type_ in parse_show(self._run()):
            if self.include is not None and not self.include.fullmatch(name):
                continue
            if self.exclude is not None and self.exclude.fullmatch(name):
                continue
            units.append((name, state, type_))
        return SystemdReading(tuple(sorted(units)[:MAX_UNITS]))


def from_config(cfg, ctx=None) -> SystemdSource:
    return SystemdSource(cfg["systemd"]["unit_include"], cfg["systemd"]["unit_exclude"])
