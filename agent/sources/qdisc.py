"""Queueing disciplines of the network interfaces, from the kernel's rtnetlink (node_exporter's ``qdisc``
collector, which it leaves off by default).

One ``RTM_GETQDISC`` dump over a ``NETLINK_ROUTE`` socket lists every qdisc of the agent's network
namespace with its counters (``TCA_STATS2``: bytes, packets; drops, requeues, overlimits, queue length,
backlog).  teye exports the root qdisc of each interface (the one traffic leaves through) and, for a
token-bucket shaper (``tbf``), its rate: a link shaped below its speed is as full at that rate as an
unshaped one at its speed, and ``overlimits`` counts the packets the shaper held back.  A class-based
shaper (``htb``) keeps its rates on its classes, not on the qdisc: its rate is not read.

The socket is the door (``dump``); ``parse_qdiscs`` is pure and is what the tests replay, against
iproute2's ``tc -s -j qdisc show`` (its own parser of the same messages).
"""
from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from ..errors import ParseError, SourceUnavailable
from ..metrics import COUNTER, GAUGE, Point, metric, point

LABELS = ("device", "kind")
BYTES = metric("teye_network_qdisc_bytes_total", COUNTER, "Bytes the interface's root qdisc sent (rtnetlink "
               "TCA_STATS_BASIC; node_exporter's node_qdisc_bytes_total).", LABELS)
PACKETS = metric("teye_network_qdisc_packets_total", COUNTER, "Packets the root qdisc sent "
                 "(node_qdisc_packets_total).", LABELS)
DROPS = metric("teye_network_qdisc_drops_total", COUNTER, "Packets the root qdisc dropped: its queue was full "
               "(node_qdisc_drops_total).", LABELS)
REQUEUES = metric("teye_network_qdisc_requeues_total", COUNTER, "Packets the root qdisc requeued: the driver "
                  "could not take them (node_qdisc_requeues_total).", LABELS)
OVERLIMITS = metric("teye_network_qdisc_overlimits_total", COUNTER, "Times the root qdisc held a packet back "
                    "because it was over its rate: a shaper that is full (node_qdisc_overlimits_total).", LABELS)
QLEN = metric("teye_network_qdisc_queue_length", GAUGE, "Packets queued in the root qdisc now "
              "(node_qdisc_current_queue_length).", LABELS)
BACKLOG = metric("teye_network_qdisc_backlog_bytes", GAUGE, "Bytes queued in the root qdisc now "
                 "(node_qdisc_backlog).", LABELS)
RATE = metric("teye_network_qdisc_rate_bytes", GAUGE, "The rate a token-bucket root qdisc (tbf) shapes the "
              "interface to, in bytes per second (TCA_TBF_PARMS / TCA_TBF_RATE64); absent for other kinds.", LABELS)

RTM_NEWQDISC, RTM_GETQDISC = 36, 38
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
TC_H_ROOT = 0xFFFFFFFF
TCA_KIND, TCA_OPTIONS, TCA_STATS, TCA_STATS2 = 1, 2, 3, 7
TCA_STATS_BASIC, TCA_STATS_QUEUE = 1, 3
TCA_TBF_PARMS, TCA_TBF_RATE64 = 1, 4
_NLMSG = struct.Struct("=IHHII")
_TCMSG = struct.Struct("=BxxxiIII")
_RTA = struct.Struct("=HH")
MAX_DUMP_BYTES = 8 << 20      # a namespace with thousands of interfaces: refuse rather than grow without bound


@dataclass(frozen=True)
class Qdisc:
    ifindex: int
    kind: str
    parent: int
    bytes: int
    packets: int
    drops: int
    requeues: int
    overlimits: int
    qlen: int
    backlog: int
    rate_bps: Optional[int] = None    # tbf's rate, bytes per second

    @property
    def root(self) -> bool:
        return self.parent == TC_H_ROOT


def _attrs(buf: bytes, start: int, end: int, path: str) -> Dict[int, Tuple[int, int]]:
    """type -> (offset, end) of the payloads of the rtattrs in buf[start:end] (the last of a type wins)."""
    out = {}
    i = start
    while i + 4 <= end:
        ln, typ = _RTA.unpack_from(buf, i)
        if ln < 4 or i + ln > end:
            raise ParseError(path, f"attribute of length {ln} at byte {i} runs past its message (end {end})")
        out[typ & 0x3FFF] = (i + 4, i + ln)      # NLA_F_NESTED / NET_BYTEORDER flags masked off
        i += (ln + 3) & ~3
    return out


def _u(buf: bytes, span: Tuple[int, int], fmt: str, off: int = 0) -> Optional[int]:
    a, b = span
    size = struct.calcsize(fmt)
    return struct.unpack_from(fmt, buf, a + off)[0] if a + off + size <= b else None


def parse_qdiscs(data: bytes, path: str = "rtnetlink qdisc dump") -> List[Qdisc]:
    """The qdiscs of one RTM_GETQDISC dump (its messages concatenated, up to NLMSG_DONE).  Raises ParseError
    on a truncated or garbled message, or on an error the kernel answered with."""
    out: List[Qdisc] = []
    i = 0
    while i + _NLMSG.size <= len(data):
        ln, typ, _flags, _seq, _pid = _NLMSG.unpack_from(data, i)
        if ln < _NLMSG.size or i + ln > len(data):
            raise ParseError(path, f"message of length {ln} at byte {i} runs past the {len(data)} bytes read")
        body = i + _NLMSG.size
        if typ == NLMSG_DONE:
            return out
        if typ == NLMSG_ERROR:
            code = struct.unpack_from("=i", data, body)[0] if body + 4 <= i + ln else 0
            raise ParseError(path, f"the kernel answered error {-code} ({os.strerror(-code) if code else '?'})")
        if typ == RTM_NEWQDISC:
            if body + _TCMSG.size > i + ln:
                raise ParseError(path, f"qdisc message at byte {i} too short for its header ({ln} bytes)")
            _fam, ifindex, _handle, parent, _info = _TCMSG.unpack_from(data, body)
            at = _attrs(data, body + _TCMSG.size, i + ln, path)
            kind = ""
            if TCA_KIND in at:
                a, b = at[TCA_KIND]
                kind = data[a:b].split(b"\0", 1)[0].decode("ascii", "replace")
            nb = npk = drops = req = over = qlen = backlog = 0
            if TCA_STATS2 in at:
                st = _attrs(data, *at[TCA_STATS2], path)
                if TCA_STATS_BASIC in st:
                    nb = _u(data, st[TCA_STATS_BASIC], "=Q") or 0
                    npk = _u(data, st[TCA_STATS_BASIC], "=I", 8) or 0
                if TCA_STATS_QUEUE in st:
                    q = st[TCA_STATS_QUEUE]
                    qlen, backlog, drops, req, over = (_u(data, q, "=I", 4 * k) or 0 for k in range(5))
            elif TCA_STATS in at:   # the old struct tc_stats
                s = at[TCA_STATS]
                nb, npk, drops, over = _u(data, s, "=Q") or 0, _u(data, s, "=I", 8) or 0, \
                    _u(data, s, "=I", 12) or 0, _u(data, s, "=I", 16) or 0
                qlen, backlog = _u(data, s, "=I", 28) or 0, _u(data, s, "=I", 32) or 0
            rate = None
            if kind == "tbf" and TCA_OPTIONS in at:
                opt = _attrs(data, *at[TCA_OPTIONS], path)
                if TCA_TBF_RATE64 in opt:
                    rate = _u(data, opt[TCA_TBF_RATE64], "=Q")
                elif TCA_TBF_PARMS in opt:
                    rate = _u(data, opt[TCA_TBF_PARMS], "=I", 8)   # tc_ratespec: 8 bytes, then rate
            out.append(Qdisc(ifindex, kind, parent, nb, npk, drops, req, over, qlen, backlog, rate))
        i += (ln + 3) & ~3
    raise ParseError(path, f"dump ended after {len(data)} bytes without NLMSG_DONE (truncated)")


def dump() -> bytes:
    """One RTM_GETQDISC dump of the agent's network namespace, as the kernel sent it (the door)."""
    try:
        s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE)
    except OSError as e:
        raise SourceUnavailable(f"rtnetlink socket: {e}") from e
    with s:
        s.settimeout(2.0)
        s.bind((0, 0))
        req = _NLMSG.pack(_NLMSG.size + _TCMSG.size, RTM_GETQDISC, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + \
            _TCMSG.pack(0, 0, 0, 0, 0)
        s.send(req)
        chunks, total = [], 0
        while True:
            try:
                part = s.recv(1 << 16)
            except socket.timeout as e:
                raise SourceUnavailable("rtnetlink qdisc dump: no answer in 2 s") from e
            if not part:
                break
            chunks.append(part)
            total += len(part)
            if total > MAX_DUMP_BYTES:
                raise SourceUnavailable(f"rtnetlink qdisc dump larger than {MAX_DUMP_BYTES} bytes: refused")
            if _ends(part):
                break
        return b"".join(chunks)


def _ends(part: bytes) -> bool:
    """Whether a received buffer holds the dump's NLMSG_DONE (or an error: the dump is over)."""
    i = 0
    while i + _NLMSG.size <= len(part):
        ln, typ = struct.unpack_from("=IH", part, i)
        if typ in (NLMSG_DONE, NLMSG_ERROR):
            return True
        if ln < _NLMSG.size:
            return True     # garbled: parse_qdiscs says how
        i += (ln + 3) & ~3
    return False


@dataclass(frozen=True)
class QdiscReading:
    qdiscs: Tuple[Tuple[str, Qdisc], ...]     # (device, root qdisc)

    def points(self) -> Iterator[Point]:
        for dev, q in self.qdiscs:
            lab = (dev, q.kind)
            yield point(BYTES, q.bytes, *lab)
            yield point(PACKETS, q.packets, *lab)
            yield point(DROPS, q.drops, *lab)
            yield point(REQUEUES, q.requeues, *lab)
            yield point(OVERLIMITS, q.overlimits, *lab)
            yield point(QLEN, q.qlen, *lab)
            yield point(BACKLOG, q.backlog, *lab)
            if q.rate_bps is not None:
                yield point(RATE, q.rate_bps, *lab)


def _name(ifindex: int) -> Optional[str]:
    try:
        return socket.if_indextoname(ifindex)
    except OSError:
        return None     # gone since the dump


class QdiscSource:
    name = "qdisc"

    def __init__(self, dump_fn: Callable[[], bytes] = dump, name_fn: Callable[[int], Optional[str]] = _name,
                 ctx=None):
        self.dump = dump_fn
        self.name_of = name_fn
        self.ctx = ctx

    def collect(self) -> QdiscReading:
        qs = parse_qdiscs(self.dump())
        out = []
        for q in qs:
            if not q.root:
                continue
            dev = self.name_of(q.ifindex)
            if dev is not None and dev != "lo":
                out.append((dev, q))
        reading = QdiscReading(tuple(sorted(out, key=lambda x: x[0])))
        links = getattr(self.ctx, "links", None)
        if links is not None:
            now = self.ctx.clock()
            for dev, q in reading.qdiscs:
                links.add(dev, "shaper_overlimits", now, q.overlimits)
                links.add(dev, "qdisc_drops", now, q.drops)
                links.set(dev, "shaper_bps", now, q.rate_bps, q.kind if q.rate_bps is not None else None)
        return reading


def from_config(cfg, ctx=None) -> QdiscSource:
    return QdiscSource(ctx=ctx)
