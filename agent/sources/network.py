"""Network interface counters per interface, from <procfs>/net/dev.

Format (net/core/net-procfs.c): two header lines, then one line per interface,
``%6s:%8lu %7lu ...``: the name right-aligned, a colon, then 8 receive and 8
transmit counters.  Counters wider than the column are glued to the colon
(``eth0:12345678901``), so the name is split off at the colon, not at whitespace
(interface names cannot contain a colon or whitespace).
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace
from typing import Dict, Iterator, Optional, Pattern, Union

from ..errors import ParseError, parse_int
from ..logutil import RateLimitedLog
from ..metrics import COUNTER, Point, metric, point
from ._files import KeptFiles, KeptFilesSource, under
from .softnet import SoftnetReading, parse_softnet

log = RateLimitedLog(logging.getLogger("teye.network"))

# Column order of /proc/net/dev (8 receive, then 8 transmit).
COLUMNS = ("rx_bytes", "rx_packets", "rx_errors", "rx_drops", "rx_fifo", "rx_frame", "rx_compressed",
           "rx_multicast",
           "tx_bytes", "tx_packets", "tx_errors", "tx_drops", "tx_fifo", "tx_collisions", "tx_carrier",
           "tx_compressed")

_D = ["device"]
_SPECS = {
    "rx_bytes": metric("teye_network_receive_bytes_total", COUNTER, "Bytes received (/proc/net/dev).", _D),
    "rx_packets": metric("teye_network_receive_packets_total", COUNTER, "Packets received (/proc/net/dev).", _D),
    "rx_errors": metric("teye_network_receive_errors_total", COUNTER,
                        "Receive errors detected by the driver (/proc/net/dev).", _D),
    "rx_drops": metric("teye_network_receive_drops_total", COUNTER,
                       "Received packets dropped (/proc/net/dev).", _D),
    "rx_fifo": metric("teye_network_receive_fifo_errors_total", COUNTER,
                      "Receive FIFO buffer errors (/proc/net/dev).", _D),
    "rx_frame": metric("teye_network_receive_frame_errors_total", COUNTER,
                       "Receive framing errors (/proc/net/dev).", _D),
    "rx_compressed": metric("teye_network_receive_compressed_total", COUNTER,
                            "Compressed packets received (/proc/net/dev).", _D),
    "rx_multicast": metric("teye_network_receive_multicast_total", COUNTER,
                           "Multicast frames received (/proc/net/dev).", _D),
    "tx_bytes": metric("teye_network_transmit_bytes_total", COUNTER, "Bytes transmitted (/proc/net/dev).", _D),
    "tx_packets": metric("teye_network_transmit_packets_total", COUNTER,
                         "Packets transmitted (/proc/net/dev).", _D),
    "tx_errors": metric("teye_network_transmit_errors_total", COUNTER,
                        "Transmit errors detected by the driver (/proc/net/dev).", _D),
    "tx_drops": metric("teye_network_transmit_drops_total", COUNTER,
                       "Packets dropped while transmitting (/proc/net/dev).", _D),
    "tx_fifo": metric("teye_network_transmit_fifo_errors_total", COUNTER,
                      "Transmit FIFO buffer errors (/proc/net/dev).", _D),
    "tx_collisions": metric("teye_network_transmit_collisions_total", COUNTER,
                            "Collisions detected on the interface (/proc/net/dev).", _D),
    "tx_carrier": metric("teye_network_transmit_carrier_errors_total", COUNTER,
                         "Carrier losses detected by the driver (/proc/net/dev).", _D),
    "tx_compressed": metric("teye_network_transmit_compressed_total", COUNTER,
                            "Compressed packets transmitted (/proc/net/dev).", _D),
}


@dataclass(frozen=True)
class InterfaceStats:
    """One interface's cumulative counters (bytes and packets), in /proc/net/dev column order."""

    rx_bytes: int
    rx_packets: int
    rx_errors: int
    rx_drops: int
    rx_fifo: int
    rx_frame: int
    rx_compressed: int
    rx_multicast: int
    tx_bytes: int
    tx_packets: int
    tx_errors: int
    tx_drops: int
    tx_fifo: int
    tx_collisions: int
    tx_carrier: int
    tx_compressed: int


@dataclass(frozen=True)
class NetworkReading:
    """Per-interface counters keyed by interface name."""

    interfaces: Dict[str, InterfaceStats]
    softnet: Optional[SoftnetReading] = None   # per-CPU receive work, read in the same pass

    def points(self) -> Iterator[Point]:
        for dev, st in self.interfaces.items():
            for col in COLUMNS:
                yield point(_SPECS[col], getattr(st, col), dev)
        if self.softnet is not None:
            yield from self.softnet.points()


def parse_net_dev(text: str, path: str = "net/dev",
                  exclude: Union[None, str, Pattern[str]] = None) -> NetworkReading:
    """Parse /proc/net/dev; interfaces whose name matches ``exclude`` (re.search) are left out.

    Raises ParseError on an empty file, a missing header, a truncated line or a non-numeric field.
    """
    if isinstance(exclude, str):
        exclude = re.compile(exclude)
    lines = text.splitlines()
    if len(lines) < 2 or "|" not in lines[0] or "|" not in lines[1]:
        raise ParseError(path, "missing the two header lines (empty or truncated file?)")
    interfaces: Dict[str, InterfaceStats] = {}
    seen = 0
    for lineno, line in enumerate(lines[2:], 3):
        if not line.strip():
            continue
        name, sep, rest = line.partition(":")
        name = name.strip()
        if not sep or not name or name.split() != [name]:
            raise ParseError(path, f"line {lineno}: expected 'interface: counters', got {line!r}")
        fields = rest.split()
        if len(fields) != len(COLUMNS):
            raise ParseError(path, f"line {lineno}: {name} has {len(fields)} counters, expected {len(COLUMNS)} "
                             "(truncated?)")
        values = [parse_int(f, path, f"line {lineno} {name} {col}") for f, col in zip(fields, COLUMNS)]
        if any(v < 0 for v in values):
            raise ParseError(path, f"line {lineno}: {name}: negative counter")
        seen += 1
        if exclude is not None and exclude.search(name):
            continue
        interfaces[name] = InterfaceStats(*values)
    if not seen:  # every network namespace has at least 'lo'
        raise ParseError(path, "no interface lines after the header (truncated?)")
    return NetworkReading(interfaces)


class NetworkSource(KeptFilesSource):
    name = "network"
    KEPT = 2   # net/dev and net/softnet_stat

    def __init__(self, procfs: str = "/proc", exclude: Optional[str] = None, ctx=None):
        self.path = under(procfs, "net", "dev")
        self.softnet_path = under(procfs, "net", "softnet_stat")
        self.exclude = re.compile(exclude) if exclude else None
        self.ctx = ctx
        self.softnet_unreadable = 0
        self._files = KeptFiles()

    def _softnet(self) -> Optional[SoftnetReading]:
        try:
            cpus = parse_softnet(self._files.read_text(self.softnet_path, limit=1 << 20), self.softnet_path)
        except FileNotFoundError:
            return None
        except (ParseError, OSError) as e:   # garbled or refused: the softnet families only
            self.softnet_unreadable += 1
            log.warning(self.softnet_path, "network: %s (softnet families left out)", e)
            return SoftnetReading((), self.softnet_unreadable)
        return SoftnetReading(cpus, self.softnet_unreadable)

    def collect(self) -> NetworkReading:
        reading = replace(parse_net_dev(self._files.read_text(self.path), self.path, self.exclude),
                          softnet=self._softnet())
        if self.ctx is not None:   # for the network cause of communication-bound jobs (AgentContext.links)
            links, now = self.ctx.links, self.ctx.clock()
            links.sampled = True
            for dev, st in reading.interfaces.items():
                if dev == "lo":
                    continue
                links.add(dev, "rx_bytes", now, st.rx_bytes)
                links.add(dev, "tx_bytes", now, st.tx_bytes)
                links.add(dev, "errors", now, st.rx_errors + st.rx_drops + st.tx_errors + st.tx_drops)
        return reading


def from_config(cfg, ctx=None) -> NetworkSource:
    return NetworkSource(cfg["procfs"], cfg["network"]["exclude"], ctx)
