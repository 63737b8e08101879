"""Link state of every network interface, from <sysfs>/class/net/<iface>/ (node_exporter's ``netclass``).

Per interface: administrative/operational state, carrier, MTU, negotiated speed, duplex and the
kernel's carrier-change counters, so a link that went down, flaps or renegotiated to a lower speed is
seen beside its traffic (``network`` collector, /proc/net/dev).  An attribute the driver does not
report (``speed`` on a virtual interface reads -1 or fails with EINVAL; ``carrier`` fails while the
interface is administratively down) is absent, not zero.  An interface that disappears between the
directory listing and its reads is left out of that pass (counted in ``teye_network_interfaces_vanished_total``).

The same pass reads the other attributes node_exporter's netclass exports (``ATTRS``: index, link, flags,
queue length, ...: read again every minute, and at once for a new interface or one whose state or carrier
changed, since an admin's change is all that moves them), ``statistics/rx_nohandler`` (every pass), the ARP table's entries per interface (``<procfs>/net/arp``,
node_exporter's ``arp``) and the bonding masters' slaves (``bonding_masters``, node_exporter's ``bonding``:
absent without bonding).
"""
from __future__ import annotations

import errno
import logging
import os
import re
import time
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
# The other attributes node_exporter's netclass exports per interface: (sysfs file, teye family suffix, HELP).
# Integers; dev_id and flags are hexadecimal in sysfs.  An attribute the driver lacks is absent.
ATTRS = (
    ("addr_assign_type", "address_assign_type", "How the hardware address was assigned (0 permanent, 1 random, "
                                                "2 stolen from another device, 3 set by user space)"),
    ("dev_id", "device_id", "Device port of a network device sharing one hardware address (dev_id)"),
    ("dormant", "dormant", "1 while the interface is dormant (RFC 2863: waiting for an external event, e.g. "
                           "802.1X authentication)"),
    ("flags", "flags", "The interface's flags word (IFF_UP 0x1, IFF_BROADCAST 0x2, IFF_RUNNING 0x40, "
                       "IFF_PROMISC 0x100, ...)"),
    ("ifindex", "iface_id", "The interface's index (ifindex)"),
    ("iflink", "iface_link", "Index of the interface this one sends through (iflink; its own index for a "
                             "physical interface)"),
    ("link_mode", "iface_link_mode", "Link mode (0 default, 1 dormant: user space sets the interface up)"),
    ("name_assign_type", "name_assign_type", "How the interface got its name (1 the kernel's enumeration, 2 "
                                             "predictable by the kernel, 3 set by user space, 4 renamed)"),
    ("netdev_group", "net_dev_group", "The interface's device group"),
    ("type", "protocol_type", "Link-layer type (ARPHRD_*: 1 Ethernet, 32 InfiniBand, 772 loopback)"),
    ("tx_queue_len", "transmit_queue_length", "Length of the transmit queue in packets (txqueuelen)"),
)
ATTR_SPECS = {f: metric(f"teye_network_{name}", GAUGE, f"{h} (/sys/class/net/<device>/{f}; "
                        f"node_network_{name}).", LINK) for f, name, h in ATTRS}
NOHANDLER = metric("teye_network_receive_nohandler_total", COUNTER, "Packets received that no protocol handler "
                   "took (e.g. a VLAN or protocol nothing on the host listens for; "
                   "/sys/class/net/<device>/statistics/rx_nohandler; node_network_receive_nohandler_total).",
                   LINK)
ARP = metric("teye_arp_entries", GAUGE, "Entries in the kernel's IPv4 neighbour (ARP) table for the interface "
             "(/proc/net/arp; node_arp_entries).", LINK)
BOND_SLAVES = metric("teye_bonding_slaves", GAUGE, "Interfaces enslaved to the bonding master "
                     "(/sys/class/net/<master>/bonding/slaves; node_bonding_slaves); absent without bonding.",
                     ("master",))
BOND_ACTIVE = metric("teye_bonding_active", GAUGE, "Slaves of the bonding master whose MII status is up "
                     "(node_bonding_active): fewer than teye_bonding_slaves is a degraded bond.", ("master",))
ARP_UNREADABLE = metric("teye_arp_unreadable_total", COUNTER, "Reads of /proc/net/arp refused because it was "
                        "garbled (the ARP families left out of that pass, the reason in the log).")
VANISHED = metric("teye_network_interfaces_vanished_total", COUNTER,
                  "Interfaces that disappeared while being read (left out of that pass).")
UNREADABLE = metric("teye_network_interfaces_unreadable_total", COUNTER,
                    "Interface reads refused because an attribute was garbled (that interface left out of that "
                    "pass, the file named in the log).")

log = RateLimitedLog(logging.getLogger("teye.netclass"))

OPERSTATES = ("up", "down", "dormant", "lowerlayerdown", "notpresent", "testing", "unknown")
MAX_INTERFACES = 1024
ATTR_REFRESH_S = 60.0
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
    attrs: Tuple[Optional[int], ...] = ()   # ATTRS order
    nohandler: Optional[int] = None


@dataclass(frozen=True)
class NetclassReading:
    links: Tuple[Tuple[str, Link], ...]
    vanished_total: int
    unreadable_total: int = 0
    arp: Optional[Tuple[Tuple[str, int], ...]] = None   # (device, entries); None: no /proc/net/arp
    bonds: Tuple[Tuple[str, int, int], ...] = ()          # (master, slaves, active)
    arp_unreadable_total: int = 0

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
            for (f, _, _), v in zip(ATTRS, l.attrs):
                yield point(ATTR_SPECS[f], v, dev)
            yield point(NOHANDLER, l.nohandler, dev)
        yield point(VANISHED, self.vanished_total)
        yield point(UNREADABLE, self.unreadable_total)
        for dev, n in self.arp or ():
            yield point(ARP, n, dev)
        if self.arp_unreadable_total:
            yield point(ARP_UNREADABLE, self.arp_unreadable_total)
        for master, slaves, active in self.bonds:
            yield point(BOND_SLAVES, slaves, master)
            yield point(BOND_ACTIVE, active, master)


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
        n = int(v, 16) if v[:2] in ("0x", "0X") else int(v)
    except ValueError:
        raise ParseError(os.path.join(d, name), f"expected an integer, got {v[:40]!r}") from None
    return n if n >= minimum else None  # speed -1: unknown


def read_link(d: str, attrs: Optional[Tuple[Optional[int], ...]] = None) -> Link:
    """The attributes of one interface directory (``ATTRS`` reused from ``attrs`` when given). FileNotFoundError
    when the interface is gone."""
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
                _int(d, "carrier_changes"), _int(d, "carrier_up_count"), _int(d, "carrier_down_count"),
                attrs if attrs is not None else tuple(_int(d, f) for f, _, _ in ATTRS),
                _int(d, os.path.join("statistics", "rx_nohandler")))


def parse_arp(text: str, path: str = "net/arp") -> Dict[str, int]:
    """/proc/net/arp: a header line, then ``IP HWtype Flags HWaddress Mask Device`` -> entries per device."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("IP address"):
        raise ParseError(path, "expected the header line 'IP address HW type ...'")
    out: Dict[str, int] = {}
    for lineno, line in enumerate(lines[1:], 2):
        words = line.split()
        if not words:
            continue
        if len(words) != 6:
            raise ParseError(path, f"line {lineno}: expected 6 fields, got {len(words)}: {line[:80]!r}")
        out[words[5]] = out.get(words[5], 0) + 1
    return out


def read_bonds(netdir: str) -> Tuple[Tuple[str, int, int], ...]:
    """(master, slaves, slaves whose MII status is up) for each master in <netdir>/bonding_masters; () without
    bonding.  A master that vanished while read is left out."""
    try:
        masters = read_text(os.path.join(netdir, "bonding_masters"), allow_empty=True, limit=1 << 16).split()
    except FileNotFoundError:
        return ()
    out = []
    for master in masters[:MAX_INTERFACES]:
        mdir = os.path.join(netdir, master)
        try:
            slaves = read_text(os.path.join(mdir, "bonding", "slaves"), allow_empty=True, limit=1 << 16).split()
        except FileNotFoundError:
            continue
        active = 0
        for slave in slaves:
            for link in (f"lower_{slave}", f"slave_{slave}"):   # newer kernels, then older
                try:
                    state = read_text(os.path.join(mdir, link, "bonding_slave", "mii_status"), allow_empty=True,
                                      limit=64).strip()
                except FileNotFoundError:
                    continue
                active += state == "up"
                break
        out.append((master, len(slaves), active))
    return tuple(out)


class NetclassSource:
    name = "netclass"

    def __init__(self, sysfs: str = "/sys", exclude: Optional[str] = None, ctx=None, procfs: str = "/proc",
                 clock=time.monotonic):
        self.dir = under(sysfs, "class", "net")
        self.arp_path = under(procfs, "net", "arp")
        self.ctx = ctx
        self.exclude: Optional[Pattern[str]] = re.compile(exclude) if exclude else None
        self.vanished = 0
        self.unreadable = 0
        self.arp_unreadable = 0
        self.clock = clock
        # ATTRS change only when an admin or the driver reconfigures the interface: read again every
        # ATTR_REFRESH_S, at once for a new name and when its operational state or carrier changed
        self._attrs: Dict[str, Tuple[float, str, Optional[int], Tuple[Optional[int], ...]]] = {}

    def _arp(self) -> Optional[Tuple[Tuple[str, int], ...]]:
        try:
            per_dev = parse_arp(read_text(self.arp_path, allow_empty=True, limit=4 << 20), self.arp_path)
        except FileNotFoundError:
            return None
        except (ParseError, OSError) as e:   # garbled or refused: the ARP families only
            self.arp_unreadable += 1
            log.warning(self.arp_path, "netclass: %s (ARP entries left out)", e)
            return None
        return tuple(sorted((d, n) for d, n in per_dev.items()
                            if self.exclude is None or not self.exclude.search(d)))

    def collect(self) -> NetclassReading:
        try:
            names = sorted(os.listdir(self.dir))
        except FileNotFoundError:
            raise SourceUnavailable(f"{self.dir}: no such directory (sysfs not mounted there?)") from None
        links: Dict[str, Link] = {}
        for name in names[:MAX_INTERFACES]:
            if self.exclude is not None and self.exclude.search(name):
                continue
            cached = self._attrs.get(name)
            now = self.clock()
            try:
                link = read_link(os.path.join(self.dir, name), cached[3] if cached is not None and
                                 now - cached[0] < ATTR_REFRESH_S else None)
                if cached is not None and (link.operstate, link.carrier) != cached[1:3] and \
                        link.attrs is cached[3]:   # the link changed: its flags and dormancy may have too
                    link = read_link(os.path.join(self.dir, name))
                links[name] = link
                if cached is None or link.attrs is not cached[3]:
                    self._attrs[name] = (now, link.operstate, link.carrier, link.attrs)
            except NotADirectoryError:   # bonding_masters: a file beside the interfaces (bonding loaded)
                continue
            except FileNotFoundError:  # the interface went away while we read it (a container's veth)
                self.vanished += 1
            except ParseError as e:  # that interface alone
                self.unreadable += 1
                log.warning(e.path, "netclass: %s (interface %s left out)", e, name)
        for gone in set(self._attrs) - set(links):   # vanished or renamed: a new name is read whole
            del self._attrs[gone]
        if self.ctx is not None:   # for the network cause of communication-bound jobs (AgentContext.links)
            hist, now = self.ctx.links, self.ctx.clock()
            for name, link in links.items():
                if name == "lo":
                    continue
                hist.set(name, "speed_bps", now, link.speed_bytes)
                if link.changes is not None:
                    hist.add(name, "carrier_changes", now, link.changes)
        return NetclassReading(tuple(links.items()), self.vanished, self.unreadable, self._arp(),
                               read_bonds(self.dir), self.arp_unreadable)


def from_config(cfg, ctx=None) -> NetclassSource:
    return NetclassSource(cfg["sysfs"], cfg["network"]["exclude"], ctx, cfg["procfs"])
