"""InfiniBand devices and ports, from <sysfs>/class/infiniband/<device>/ports/<port>/.

Facts this module relies on (see the kernel's Documentation/ABI/stable/sysfs-class-infiniband):
  - ``port_rcv_data`` / ``port_xmit_data`` (and their ``counters_ext/*_64`` twins) count
    4-byte words, so bytes = value x 4;
  - the 32-bit ``counters/`` files saturate; where ``counters_ext/`` holds the 64-bit
    PortCountersExtended values they are preferred;
  - a counter the HCA cannot report reads ``N/A (no PMA)`` (e.g. iWARP devices): that value
    is absent, as is one whose file cannot be read;
  - ``rate`` reads like ``40 Gb/sec (4X QDR)`` (signalling rate in 1e9 bit/s);
  - ``state`` / ``phys_state`` read like ``4: ACTIVE`` / ``5: LinkUp``.
A device or port that disappears while it is being read (hot unplug, driver reload) is
skipped for that read; a garbled value is a ParseError naming the file.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import Dict, Iterator, Mapping, Optional, Tuple

from ..errors import HardwareAbsent, ParseError, SourceUnavailable
from ..metrics import COUNTER, GAUGE, Point, metric, point
from ._files import Refusals, counting, read_or_none, refused_points, under

_L = ["device", "port"]

RECEIVE_BYTES = metric("teye_infiniband_receive_bytes_total", COUNTER,
                       "Data bytes received on the port (port_rcv_data x 4; the 64-bit counters_ext file "
                       "when present).", _L)
TRANSMIT_BYTES = metric("teye_infiniband_transmit_bytes_total", COUNTER,
                        "Data bytes transmitted from the port (port_xmit_data x 4; the 64-bit counters_ext file "
                        "when present).", _L)
RECEIVE_PACKETS = metric("teye_infiniband_receive_packets_total", COUNTER,
                         "Packets received on all VLs of the port, including errors (port_rcv_packets; "
                         "counters_ext/port_rcv_packets_64 when present).", _L)
TRANSMIT_PACKETS = metric("teye_infiniband_transmit_packets_total", COUNTER,
                          "Packets transmitted on all VLs of the port, including errors (port_xmit_packets; "
                          "counters_ext/port_xmit_packets_64 when present).", _L)
UNICAST_RECEIVE_PACKETS = metric("teye_infiniband_unicast_receive_packets_total", COUNTER,
                                 "Unicast packets received, including errors (unicast_rcv_packets).", _L)
UNICAST_TRANSMIT_PACKETS = metric("teye_infiniband_unicast_transmit_packets_total", COUNTER,
                                  "Unicast packets transmitted, including errors (unicast_xmit_packets).", _L)
MULTICAST_RECEIVE_PACKETS = metric("teye_infiniband_multicast_receive_packets_total", COUNTER,
                                   "Multicast packets received, including errors (multicast_rcv_packets).", _L)
MULTICAST_TRANSMIT_PACKETS = metric("teye_infiniband_multicast_transmit_packets_total", COUNTER,
                                    "Multicast packets transmitted, including errors (multicast_xmit_packets).", _L)
LINK_DOWNED = metric("teye_infiniband_link_downed_total", COUNTER,
                     "Times the link failed to recover from an error state and went down (link_downed).", _L)
LINK_ERROR_RECOVERY = metric("teye_infiniband_link_error_recovery_total", COUNTER,
                             "Times the link recovered from an error state (link_error_recovery).", _L)
SYMBOL_ERRORS = metric("teye_infiniband_symbol_errors_total", COUNTER,
                       "Minor link errors detected on physical lanes (symbol_error).", _L)
RECEIVE_ERRORS = metric("teye_infiniband_receive_errors_total", COUNTER,
                        "Packets with an error received on the port (port_rcv_errors).", _L)
RECEIVE_DISCARDS = metric("teye_infiniband_receive_discards_total", COUNTER,
                          "Inbound packets discarded because the port was down or congested "
                          "(port_rcv_discards).", _L)
TRANSMIT_DISCARDS = metric("teye_infiniband_transmit_discards_total", COUNTER,
                           "Outbound packets discarded because the port was down or congested "
                           "(port_xmit_discards).", _L)
RECEIVE_REMOTE_PHYSICAL_ERRORS = metric("teye_infiniband_receive_remote_physical_errors_total", COUNTER,
                                        "Packets received marked with the EBP delimiter "
                                        "(port_rcv_remote_physical_errors).", _L)
RECEIVE_SWITCH_RELAY_ERRORS = metric("teye_infiniband_receive_switch_relay_errors_total", COUNTER,
                                     "Packets discarded because they could not be forwarded by the switch relay "
                                     "(port_rcv_switch_relay_errors).", _L)
RECEIVE_CONSTRAINT_ERRORS = metric("teye_infiniband_receive_constraint_errors_total", COUNTER,
                                   "Packets received and discarded by partition/raw constraint checks "
                                   "(port_rcv_constraint_errors).", _L)
TRANSMIT_CONSTRAINT_ERRORS = metric("teye_infiniband_transmit_constraint_errors_total", COUNTER,
                                    "Packets not transmitted because of partition/raw constraint checks "
                                    "(port_xmit_constraint_errors).", _L)
LOCAL_LINK_INTEGRITY_ERRORS = metric("teye_infiniband_local_link_integrity_errors_total", COUNTER,
                                     "Times the local physical errors exceeded the threshold "
                                     "(local_link_integrity_errors).", _L)
EXCESSIVE_BUFFER_OVERRUN_ERRORS = metric("teye_infiniband_excessive_buffer_overrun_errors_total", COUNTER,
                                         "Times consecutive flow-control update periods had buffer overruns "
                                         "(excessive_buffer_overrun_errors).", _L)
VL15_DROPPED = metric("teye_infiniband_vl15_dropped_packets_total", COUNTER,
                      "Subnet-management (VL15) packets dropped for lack of buffers (VL15_dropped).", _L)
TRANSMIT_WAIT = metric("teye_infiniband_transmit_wait_total", COUNTER,
                       "Clock ticks during which the port had data to send but sent none (port_xmit_wait); "
                       "a congestion indicator. The 32-bit counter saturates at 4294967295.", _L)
LINK_RATE = metric("teye_infiniband_link_rate_bytes_per_second", GAUGE,
                   "Signalling rate of the port in bytes per second (rate, e.g. '40 Gb/sec' = 5e9).", _L)
PORT_STATE = metric("teye_infiniband_port_state", GAUGE,
                    "Logical port state number (1 down, 2 init, 3 armed, 4 active, 5 active defer); "
                    "the state label holds the kernel's name for it.", _L + ["state"])
PORT_PHYSICAL_STATE = metric("teye_infiniband_port_physical_state", GAUGE,
                             "Physical port state number (1 sleep, 2 polling, 3 disabled, 4 port configuration "
                             "training, 5 link up, 6 link error recovery, 7 phy test); the state label holds "
                             "the kernel's name for it.", _L + ["state"])
INFO = metric("teye_infiniband_info", GAUGE,
              "Always 1 for each InfiniBand device; labels carry board_id, fw_ver and hca_type.",
              ["device", "board_id", "firmware_version", "hca_type"])

# Counter key -> (spec, files to try in order of preference (relative to the port dir), multiplier).
COUNTERS: Dict[str, Tuple[object, Tuple[str, ...], int]] = {
    "receive_bytes": (RECEIVE_BYTES, ("counters_ext/port_rcv_data_64", "counters/port_rcv_data"), 4),
    "transmit_bytes": (TRANSMIT_BYTES, ("counters_ext/port_xmit_data_64", "counters/port_xmit_data"), 4),
    "receive_packets": (RECEIVE_PACKETS, ("counters_ext/port_rcv_packets_64", "counters/port_rcv_packets"), 1),
    "transmit_packets": (TRANSMIT_PACKETS, ("counters_ext/port_xmit_packets_64", "counters/port_xmit_packets"), 1),
    "unicast_receive_packets": (UNICAST_RECEIVE_PACKETS, ("counters_ext/port_unicast_rcv_packets",
                                                          "counters/unicast_rcv_packets"), 1),
    "unicast_transmit_packets": (UNICAST_TRANSMIT_PACKETS, ("counters_ext/port_unicast_xmit_packets",
                                                            "counters/unicast_xmit_packets"), 1),
    "multicast_receive_packets": (MULTICAST_RECEIVE_PACKETS, ("counters_ext/port_multicast_rcv_packets",
                                                              "counters/multicast_rcv_packets"), 1),
    "multicast_transmit_packets": (MULTICAST_TRANSMIT_PACKETS, ("counters_ext/port_multicast_xmit_packets",
                                                                "counters/multicast_xmit_packets"), 1),
    "link_downed": (LINK_DOWNED, ("counters/link_downed",), 1),
    "link_error_recovery": (LINK_ERROR_RECOVERY, ("counters/link_error_recovery",), 1),
    "symbol_errors": (SYMBOL_ERRORS, ("counters/symbol_error",), 1),
    "receive_errors": (RECEIVE_ERRORS, ("counters/port_rcv_errors",), 1),
    "receive_discards": (RECEIVE_DISCARDS, ("counters/port_rcv_discards",), 1),
    "transmit_discards": (TRANSMIT_DISCARDS, ("counters/port_xmit_discards",), 1),
    "receive_remote_physical_errors": (RECEIVE_REMOTE_PHYSICAL_ERRORS, ("counters/port_rcv_remote_physical_errors",), 1),
    "receive_switch_relay_errors": (RECEIVE_SWITCH_RELAY_ERRORS, ("counters/port_rcv_switch_relay_errors",), 1),
    "receive_constraint_errors": (RECEIVE_CONSTRAINT_ERRORS, ("counters/port_rcv_constraint_errors",), 1),
    "transmit_constraint_errors": (TRANSMIT_CONSTRAINT_ERRORS, ("counters/port_xmit_constraint_errors",), 1),
    "local_link_integrity_errors": (LOCAL_LINK_INTEGRITY_ERRORS, ("counters/local_link_integrity_errors",), 1),
    "excessive_buffer_overrun_errors": (EXCESSIVE_BUFFER_OVERRUN_ERRORS,
                                        ("counters/excessive_buffer_overrun_errors",), 1),
    "vl15_dropped": (VL15_DROPPED, ("counters/VL15_dropped",), 1),
    "transmit_wait": (TRANSMIT_WAIT, ("counters/port_xmit_wait",), 1),
}

# Every counter file this module reads, relative to the port directory.
COUNTER_FILES = frozenset(f for _, files, _ in COUNTERS.values() for f in files)
PORT_ATTRS = ("state", "phys_state", "rate", "link_layer")
DEVICE_ATTRS = ("board_id", "fw_ver", "hca_type")

_NOT_AVAILABLE = "N/A"
_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s+Gb/sec\b")
_STATE = re.compile(r"^(\d+):\s*(\S.*)$")


@dataclass(frozen=True)
class IbPort:
    """One port. ``counters`` maps a COUNTERS key to its value (bytes already x4); absent when unsupported."""

    device: str
    port: str
    counters: Dict[str, int]
    state: Optional[Tuple[int, str]] = None           # (number, name), e.g. (4, "ACTIVE")
    physical_state: Optional[Tuple[int, str]] = None  # e.g. (5, "LinkUp")
    rate_bytes_per_second: Optional[float] = None
    link_layer: Optional[str] = None                  # "InfiniBand" or "Ethernet" (RoCE)
    counter_files: Optional[Dict[str, str]] = None    # COUNTERS key -> file the value came from

    def points(self) -> Iterator[Point]:
        for key, (spec, _, _) in COUNTERS.items():
            if key in self.counters:
                yield point(spec, self.counters[key], self.device, self.port)
        if self.rate_bytes_per_second is not None:
            yield point(LINK_RATE, self.rate_bytes_per_second, self.device, self.port)
        if self.state is not None:
            yield point(PORT_STATE, self.state[0], self.device, self.port, self.state[1])
        if self.physical_state is not None:
            yield point(PORT_PHYSICAL_STATE, self.physical_state[0], self.device, self.port, self.physical_state[1])


@dataclass(frozen=True)
class IbDevice:
    name: str
    board_id: str = ""
    firmware_version: str = ""
    hca_type: str = ""


@dataclass(frozen=True)
class InfinibandReading:
    devices: Tuple[IbDevice, ...]
    ports: Tuple[IbPort, ...]
    refused: Tuple[Tuple[str, int], ...] = ()   # files refused so far, by reason

    def port(self, device: str, port: str) -> Optional[IbPort]:
        for p in self.ports:
            if p.device == device and p.port == port:
                return p
        return None

    def points(self) -> Iterator[Point]:
        for d in self.devices:
            yield point(INFO, 1, d.name, d.board_id, d.firmware_version, d.hca_type)
        for p in self.ports:
            yield from p.points()
        yield from refused_points("infiniband", self.refused)


def parse_counter(text: str, path: str) -> Optional[int]:
    """A counter file's value; None for 'N/A (no PMA)' (the HCA cannot count it). ParseError if garbled."""
    value = text.strip()
    if not value:
        raise ParseError(path, "file is empty")
    if value.startswith(_NOT_AVAILABLE):
        return None
    if not (value.isascii() and value.isdigit()):   # int() takes "²" only to fail, "٤" as 4
        raise ParseError(path, f"expected a non-negative integer counter, got {value!r}")
    return int(value)


def parse_rate(text: str, path: str) -> float:
    """'40 Gb/sec (4X QDR)' -> 5e9 bytes per second."""
    value = text.strip()
    m = _RATE.match(value)
    if not m:
        raise ParseError(path, f"expected a rate like '40 Gb/sec (4X QDR)', got {value!r}")
    return float(m.group(1)) * 1e9 / 8


def parse_state(text: str, path: str) -> Tuple[int, str]:
    """'4: ACTIVE' -> (4, 'ACTIVE')."""
    value = text.strip()
    m = _STATE.match(value)
    if not m:
        raise ParseError(path, f"expected 'NUMBER: NAME' such as '4: ACTIVE', got {value!r}")
    return int(m.group(1)), m.group(2).strip()


def parse_port(device: str, port: str, files: Mapping[str, Optional[str]], port_dir: str = "") -> IbPort:
    """Build a port reading from its files' contents (path relative to the port dir -> text, None if unreadable).

    For each counter the first readable candidate that is not 'N/A' wins; unreadable files are skipped.
    """
    def where(rel: str) -> str:
        return os.path.join(port_dir, rel) if port_dir else rel

    counters: Dict[str, int] = {}
    origin: Dict[str, str] = {}
    for key, (_, candidates, mult) in COUNTERS.items():
        for rel in candidates:
            text = files.get(rel)
            if text is None:
                continue
            value = parse_counter(text, where(rel))
            if value is None:
                continue
            counters[key] = value * mult
            origin[key] = rel
            break

    def attr(rel, parse):
        text = files.get(rel)
        return None if text is None else parse(text, where(rel))

    link_layer = (files.get("link_layer") or "").strip() or None
    return IbPort(device, port, counters,
                  state=attr("state", parse_state),
                  physical_state=attr("phys_state", parse_state),
                  rate_bytes_per_second=attr("rate", parse_rate),
                  link_layer=link_layer,
                  counter_files=origin)


def _read_optional(path: str) -> Optional[str]:
    """File contents, or None when it cannot be read (absent, vanished, EINVAL from the driver, or refused:
    not a regular file, too large; counted and named once by the reader)."""
    return read_or_none(path)


def _listdir(path: str):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return None


def _port_key(name: str):
    return (0, int(name), "") if name.isascii() and name.isdigit() else (1, 0, name)


class InfinibandSource:
    name = "infiniband"

    def __init__(self, sysfs: str = "/sys", ctx=None):
        self.root = under(sysfs, "class", "infiniband")
        self._refusals = Refusals(self.name)
        self.ctx = ctx

    def read_port_files(self, port_dir: str) -> Optional[Dict[str, Optional[str]]]:
        """Contents of the files this module reads under one port dir; None when the port has vanished."""
        files: Dict[str, Optional[str]] = {}
        for sub in ("counters", "counters_ext"):
            names = _listdir(os.path.join(port_dir, sub))
            for name in names or ():
                rel = f"{sub}/{name}"
                if rel in COUNTER_FILES:
                    files[rel] = _read_optional(os.path.join(port_dir, rel))
        for rel in PORT_ATTRS:
            files[rel] = _read_optional(os.path.join(port_dir, rel))
        if not os.path.isdir(port_dir):  # removed while we read it: skip this port for this read
            return None
        return files

    def collect(self) -> InfinibandReading:
        with counting(self._refusals):
            reading = replace(self._collect(), refused=self._refusals.counts())
        if self.ctx is not None:
            publish(reading, self.ctx)
        return reading

    def _collect(self) -> InfinibandReading:
        names = _listdir(self.root)
        if not names:
            raise HardwareAbsent(f"no InfiniBand devices under {self.root}")
        devices = []
        ports = []
        for dev in names:
            dev_dir = os.path.join(self.root, dev)
            attrs = {a: _read_optional(os.path.join(dev_dir, a)) for a in DEVICE_ATTRS}
            port_names = _listdir(os.path.join(dev_dir, "ports"))
            if not os.path.isdir(dev_dir):  # device vanished (hot unplug) between listing and reading
                continue
            devices.append(IbDevice(dev, *((attrs[a] or "").strip() for a in DEVICE_ATTRS)))
            for port in sorted(port_names or (), key=_port_key):
                port_dir = os.path.join(dev_dir, "ports", port)
                files = self.read_port_files(port_dir)
                if files is not None:
                    ports.append(parse_port(dev, port, files, port_dir))
        return InfinibandReading(tuple(devices), tuple(ports))


# the port counters that say a link loses data or recovers from errors (the network cause's "errors")
LINK_ERRORS = ("symbol_errors", "link_error_recovery", "receive_errors", "receive_discards", "transmit_discards",
               "receive_remote_physical_errors", "local_link_integrity_errors", "excessive_buffer_overrun_errors")


def publish(reading: InfinibandReading, ctx) -> None:
    """Each port's data, errors, downs and rate into the interface history (AgentContext.links) as
    '<device>/<port>': RDMA traffic (NCCL over verbs) never passes /proc/net/dev, so a communication-bound
    job's network cause reads the ports too."""
    links, now = ctx.links, ctx.clock()
    links.sampled = True
    for p in reading.ports:
        c = p.counters
        if "transmit_bytes" not in c or "receive_bytes" not in c:
            continue
        name = f"{p.device}/{p.port}"
        links.add(name, "rx_bytes", now, c["receive_bytes"])
        links.add(name, "tx_bytes", now, c["transmit_bytes"])
        links.add(name, "errors", now, sum(c.get(k, 0) for k in LINK_ERRORS))
        links.add(name, "carrier_changes", now, c.get("link_downed", 0))
        links.set(name, "speed_bps", now, p.rate_bytes_per_second)


def from_config(cfg, ctx=None) -> InfinibandSource:
    return InfinibandSource(cfg["sysfs"], ctx)
