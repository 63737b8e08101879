"""Link state of every network interface, from <sysfs>/class/net/<iface>/ (node_exporter's ``netclass``).

Per interface: administrative/operational state, carrier, MTU, negotiated speed, duplex and the
kernel's carrier-change counters, so a link that went down, flaps or renegotiated to a lower speed is
seen beside its traffic (``network`` collector, /proc/net/dev).  An attribute the driver does not
report (``speed`` on a virtual interface reads -1 or fails with EINVAL; ``carrier`` fails while the
interface is administratively down) is absent, not zero.  An interface that disappears between the
directory listing and its reads is left out of that pass (counted in ``teye_network_interfaces_vanished_total``).
"""
from __future__ import annotations

import errno
import logging
import os
import re
from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Pattern, Tuple

from ..errors import ParseError, SourceUnavailable
from ..logutil import RateLimitedLog
from ..metrics import COUNTER, GAUGE, Point, metric, point
from ._files import read_text, under

LINK = ("device",)
INFO = metric("teye_network_info", GAUGE, "1 per interface, with its operational state (RFC 2863: up, down, "
              "dormant, lowerlayerdown, notpresent, testing, unknown), duplex and hardware address "
              "(/sys/class/net/<device>/{operstate,duplex,address}; node_network_info).",
              ("device", "operstate", "duplex", "address"))
UP = metric("teye_network_up", GAUGE, "1 when the interface's operational state is 'up' (node_network_up).", LINK)
CARRIER = metric("teye_network_carrier", GAUGE, "1 when the interface has a carrier (a link to its peer), 0 "
                 "when it has none; absent while it is administratively down (/sys/class/net/<device>/carrier; "
                 "node_network_carrier).", LINK)
MTU = metric("teye_network_mtu_bytes", GAUGE, "MTU in bytes (node_network_mtu_bytes).", LINK)
SPEED = metric("teye_network_speed_bytes", GAUGE,
               "Negotiated link speed in bytes per second (/sys/class/net/<device>/speed Mbit/s × 125000; "
               "node_network_speed_bytes); absent where the driver reports none (virtual interfaces).", LINK)
CHANGES = metric("teye_network_carrier_changes_total", COUNTER,
                 "Times the carrier went up or down since the interface was created "
                 "(node_network_carrier_changes_total): a flapping link.", LINK)
UP_CHANGES = metric("teye_network_carrier_up_changes_total", COUNTER,
                    "Times the carrier came up (node_network_carrier_up_changes_total; kernel 4.16+).", LINK)
DOWN_CHANGES = metric("teye_network_carrier_down_changes_total", COUNTER,
                      "Times the carrier went down (node_network_carrier_down_changes_total; kernel 4.16+).", LINK)
VANISHED = metric("teye_network_interfaces_vanished_total", COUNTER,
                  "Interfaces that disappeared while being read (left out of that pass).")
UNREADABLE = metric("teye_network_interfaces_unreadable_total", COUNTER,
                    "Interface reads refused because an attribute was garbled (that interface left out of that "
                    "pass, the file named in the log).")

log = RateLimitedLog(logging.getLogger("teye.netclass"))

OPERSTATES = ("up", "down", "dormant", "lowerlayerdown", "notpresent", "testing", "unknown")
MAX_INTERFACES = 1024
_ADDRESS = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5,19}$")


@dataclass(frozen=True)
class Link:
    operstate: str
    duplex: str
    address: str
    carrier: Optional[int]
    mtu: Optional[int]
    speed_bytes: Optional[int]
    changes: Optional[int]
    up_changes: Optional[int]
    down_changes: Optional[int]


@dataclass(frozen=True)
class NetclassReading:
    links: Tuple[Tuple[str, Link], ...]
    vanished_total: int
    unreadable_total: int = 0

    def points(self) -> Iterator[Point]:
        for dev, l in self.links:
            yield point(INFO, 1, dev, l.operstate, l.duplex, l.address)
            yield point(UP, 1 if l.operstate == "up" else 0, dev)
            yield point(CARRIER, l.carrier, dev)  # None: absent
            yield point(MTU, l.mtu, dev)
            yield point(SPEED, l.speed_bytes, dev)
            yield point(CHANGES, l.changes, dev)
            yield point(UP_CHANGES, l.up_changes, dev)
            yield point(DOWN_CHANGES, l.down_changes, dev)
        yield point(VANISHED, self.vanished_total)
        yield point(UNREADABLE, self.unreadable_total)


def _attr(d: str, name: str) -> Optional[str]:
    """One attribute, stripped; None where the driver has none (missing file, EINVAL, ENODEV, EOPNOTSUPP)."""
    try:
        return read_text(os.path.join(d, name), allow_empty=True).strip()
    except FileNotFoundError:
        if not os.path.isdir(d):
            raise
        return None
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.ENODEV, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EBUSY):
            return None
        raise


def _int(d: str, name: str, minimum: int = 0) -> Optional[int]:
    v = _attr(d, name)
    if v is None or v == "":
        return None
    try:
        n = int(v)
    except ValueError:
        raise ParseError(os.path.join(d, name), f"expected an integer, got {v[:40]!r}") from None
    return n if n >= minimum else None  # speed -1: unknown


def read_link(d: str) -> Link:
    """The attributes of one interface directory. FileNotFoundError when the interface is gone."""
    oper = _attr(d, "operstate") or "unknown"
    if oper not in OPERSTATES:
        raise ParseError(os.path.join(d, "operstate"), f"unknown operational state {oper[:40]!r}")
    duplex = _attr(d, "duplex") or ""
    if duplex not in ("", "full", "half", "unknown"):
        raise ParseError(os.path.join(d, "duplex"), f"unknown duplex {duplex[:40]!r}")
    addr = (_attr(d, "address") or "").lower()
    if addr and not _ADDRESS.match(addr):
        raise ParseError(os.path.join(d, "address"), f"not a hardware address: {addr[:60]!r}")
    carrier = _int(d, "carrier")
    if carrier is not None and carrier not in (0, 1):
        raise ParseError(os.path.join(d, "carrier"), f"expected 0 or 1, got {carrier}")
    speed = _int(d, "speed", minimum=1)
    return Link(oper, duplex, addr, carrier, _int(d, "mtu", minimum=1),
                speed * 125000 if speed is not None else None,
                _int(d, "carrier_changes"), _int(d, "carrier_up_count"), _int(d, "carrier_down_count"))


class NetclassSource:
    name = "netclass"

    def __init__(self, sysfs: str = "/sys", exclude: Optional[str] = None, ctx=None):
        self.dir = under(sysfs, "class", "net")
        self.ctx = ctx
        self.exclude: Optional[Pattern[str]] = re.compile(exclude) if exclude else None
        self.vanished = 0
        self.unreadable = 0

    def collect(self) -> NetclassReading:
        try:
            names = sorted(os.listdir(self.dir))
        except FileNotFoundError:
            raise SourceUnavailable(f"{self.dir}: no such directory (sysfs not mounted there?)") from None
        links: Dict[str, Link] = {}
        for name in names[:MAX_INTERFACES]:
            if self.exclude is not None and self.exclude.search(name):
                continue
            try:
                links[name] = read_link(os.path.join(self.dir, name))
            except FileNotFoundError:  # the interface went away while we read it (a container's veth)
                self.vanished += 1
            except ParseError as e:  # that interface alone
                self.unreadable += 1
                log.warning(e.path, "netclass: %s (interface %s left out)", e, name)
        if self.ctx is not None:   # for the network cause of communication-bound jobs (AgentContext.links)
            hist, now = self.ctx.links, self.ctx.clock()
            for name, link in links.items():
                if name == "lo":
                    continue
                hist.set(name, "speed_bps", now, link.speed_bytes)
                if link.changes is not None:
                    hist.add(name, "carrier_changes", now, link.changes)
        return NetclassReading(tuple(links.items()), self.vanished, self.unreadable)


def from_config(cfg, ctx=None) -> NetclassSource:
    return NetclassSource(cfg["sysfs"], cfg["network"]["exclude"], ctx)
