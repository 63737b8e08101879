"""The kernel's protocol counters and socket use, as node_exporter's ``netstat``, ``sockstat`` and
``conntrack`` collectors: <procfs>/net/{snmp,netstat} (the fields node_exporter exports by default: errors,
TCP opens/segments/retransmits/resets, listen-queue overflows, SYN cookies, UDP buffer errors...),
<procfs>/net/sockstat (sockets in use, TCP orphans and TIME-WAIT, socket buffer memory) and the connection
tracking table's fill (<procfs>/sys/net/netfilter/nf_conntrack_{count,max}, absent while the module is not
loaded).

Names keep node_exporter's field spelling so its users find them: ``node_netstat_Tcp_RetransSegs`` is
``teye_netstat_Tcp_RetransSegs_total`` (a counter, hence ``_total``), ``node_sockstat_TCP_tw`` is
``teye_sockstat_TCP_tw``.  A field this kernel does not print is absent.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Tuple

from ..errors import ParseError, parse_int
from ..metrics import COUNTER, GAUGE, Point, metric, point
from ._files import read_text, under

# (file, "Proto_Field", HELP); Ip_Forwarding and Tcp_CurrEstab are gauges, the rest counters
NETSTAT_FIELDS = (
    ("snmp", "Ip_Forwarding", "1 when IP forwarding is on, 2 when off"),
    ("snmp", "Icmp_InErrors", "ICMP messages received with errors"),
    ("snmp", "Icmp_InMsgs", "ICMP messages received"),
    ("snmp", "Icmp_OutMsgs", "ICMP messages sent"),
    ("snmp", "Tcp_ActiveOpens", "TCP connections this host opened (SYN sent)"),
    ("snmp", "Tcp_PassiveOpens", "TCP connections this host accepted"),
    ("snmp", "Tcp_CurrEstab", "TCP connections established or closing now"),
    ("snmp", "Tcp_InErrs", "TCP segments received with errors"),
    ("snmp", "Tcp_InSegs", "TCP segments received"),
    ("snmp", "Tcp_OutSegs", "TCP segments sent"),
    ("snmp", "Tcp_OutRsts", "TCP resets sent"),
    ("snmp", "Tcp_RetransSegs", "TCP segments retransmitted (a lossy or congested path)"),
    ("snmp", "Udp_InDatagrams", "UDP datagrams received"),
    ("snmp", "Udp_OutDatagrams", "UDP datagrams sent"),
    ("snmp", "Udp_InErrors", "UDP datagrams received that could not be delivered"),
    ("snmp", "Udp_NoPorts", "UDP datagrams received for a port nothing listens on"),
    ("snmp", "Udp_RcvbufErrors", "UDP datagrams dropped because a socket's receive buffer was full"),
    ("snmp", "Udp_SndbufErrors", "UDP datagrams dropped because a socket's send buffer was full"),
    ("netstat", "IpExt_InOctets", "Bytes received by IP"),
    ("netstat", "IpExt_OutOctets", "Bytes sent by IP"),
    ("netstat", "TcpExt_ListenDrops", "Connections dropped at a listening socket"),
    ("netstat", "TcpExt_ListenOverflows", "Connections dropped because a listen queue was full"),
    ("netstat", "TcpExt_SyncookiesFailed", "SYN cookies received that were invalid"),
    ("netstat", "TcpExt_SyncookiesRecv", "SYN cookies received"),
    ("netstat", "TcpExt_SyncookiesSent", "SYN cookies sent (a listen queue overflowed)"),
    ("netstat", "TcpExt_TCPSynRetrans", "SYN retransmits (a peer that does not answer)"),
    ("netstat", "TcpExt_TCPTimeouts", "TCP retransmission timeouts"),
    ("netstat", "TcpExt_TCPOFOQueue", "TCP segments queued out of order"),
)
_GAUGES = ("Ip_Forwarding", "Tcp_CurrEstab")
NETSTAT = {f: metric(f"teye_netstat_{f}" + ("" if f in _GAUGES else "_total"), GAUGE if f in _GAUGES else COUNTER,
                     f"{h} (/proc/net/{src} {f.replace('_', ' ', 1)}; node_exporter's node_netstat_{f}).")
           for src, f, h in NETSTAT_FIELDS}

# (Proto, field) of /proc/net/sockstat -> HELP
SOCKSTAT_FIELDS = (
    ("sockets", "used", "Sockets in use, all protocols"),
    ("TCP", "inuse", "TCP sockets in use"), ("TCP", "orphan", "TCP sockets no process holds any more"),
    ("TCP", "tw", "TCP sockets in TIME-WAIT"), ("TCP", "alloc", "TCP sockets allocated"),
    ("TCP", "mem", "Pages of TCP socket buffers"),
    ("UDP", "inuse", "UDP sockets in use"), ("UDP", "mem", "Pages of UDP socket buffers"),
    ("UDPLITE", "inuse", "UDP-Lite sockets in use"), ("RAW", "inuse", "Raw sockets in use"),
    ("FRAG", "inuse", "IP fragment queues"), ("FRAG", "memory", "Bytes held by IP fragment queues"),
)
SOCKSTAT = {(p, f): metric(f"teye_sockstat_{p}_{f}", GAUGE, f"{h} (/proc/net/sockstat; node_sockstat_{p}_{f}).")
            for p, f, h in SOCKSTAT_FIELDS}
MEM_BYTES = {p: metric(f"teye_sockstat_{p}_mem_bytes", GAUGE, f"Bytes of {p} socket buffers (/proc/net/sockstat "
                       f"{p} mem × the page size; node_sockstat_{p}_mem_bytes).") for p in ("TCP", "UDP")}
CONNTRACK = metric("teye_nf_conntrack_entries", GAUGE, "Connections in the connection-tracking table "
                   "(nf_conntrack_count; node_nf_conntrack_entries): when it reaches the limit, new "
                   "connections are dropped.")
CONNTRACK_LIMIT = metric("teye_nf_conntrack_entries_limit", GAUGE, "Size of the connection-tracking table "
                         "(nf_conntrack_max; node_nf_conntrack_entries_limit).")


def parse_snmp(text: str, path: str) -> Dict[str, int]:
    """The 'Proto: names' / 'Proto: values' line pairs of /proc/net/snmp or netstat -> {'Proto_Name': value}."""
    out: Dict[str, int] = {}
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) % 2:
        raise ParseError(path, f"{len(lines)} lines: expected pairs of header and value lines (truncated?)")
    for i in range(0, len(lines), 2):
        hp, _, hnames = lines[i].partition(":")
        vp, _, hvalues = lines[i + 1].partition(":")
        names, values = hnames.split(), hvalues.split()
        if hp != vp or len(names) != len(values):
            raise ParseError(path, f"line {i + 2}: {vp!r} does not match the header {hp!r} "
                                   f"({len(values)} values for {len(names)} names)")
        for n, v in zip(names, values):
            out[f"{hp}_{n}"] = parse_int(v, path, f"{hp} {n}")
    return out


def parse_sockstat(text: str, path: str) -> Dict[Tuple[str, str], int]:
    out: Dict[Tuple[str, str], int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        proto, sep, rest = line.partition(":")
        if not line.strip():
            continue
        words = rest.split()
        if not sep or len(words) % 2:
            raise ParseError(path, f"line {lineno}: expected 'PROTO: name value ...', got {line[:80]!r}")
        for k, v in zip(words[::2], words[1::2]):
            out[(proto, k)] = parse_int(v, path, f"{proto} {k}")
    if not out:
        raise ParseError(path, "file is empty")
    return out


@dataclass(frozen=True)
class NetstatReading:
    counters: Dict[str, int]
    sockets: Dict[Tuple[str, str], int]
    page_size: int
    conntrack: Optional[Tuple[int, int]]

    def points(self) -> Iterator[Point]:
        for f, spec in NETSTAT.items():
            if f in self.counters:
                yield point(spec, self.counters[f])
        for key, spec in SOCKSTAT.items():
            if key in self.sockets:
                yield point(spec, self.sockets[key])
        for proto, spec in MEM_BYTES.items():
            if (proto, "mem") in self.sockets:
                yield point(spec, self.sockets[(proto, "mem")] * self.page_size)
        if self.conntrack is not None:
            yield point(CONNTRACK, self.conntrack[0])
            yield point(CONNTRACK_LIMIT, self.conntrack[1])


class NetstatSource:
    name = "netstat"

    def __init__(self, procfs: str = "/proc", page_size: Optional[int] = None):
        self.procfs = procfs
        self.page_size = page_size or os.sysconf("SC_PAGE_SIZE")

    def _conntrack(self) -> Optional[Tuple[int, int]]:
        d = under(self.procfs, "sys", "net", "netfilter")
        try:
            count = read_text(os.path.join(d, "nf_conntrack_count")).strip()
            limit = read_text(os.path.join(d, "nf_conntrack_max")).strip()
        except FileNotFoundError:
            return None   # nf_conntrack not loaded: nothing tracked, nothing to say
        return (parse_int(count, d, "nf_conntrack_count"), parse_int(limit, d, "nf_conntrack_max"))

    def collect(self) -> NetstatReading:
        counters: Dict[str, int] = {}
        for f in ("snmp", "netstat"):
            path = under(self.procfs, "net", f)
            counters.update(parse_snmp(read_text(path), path))
        path = under(self.procfs, "net", "sockstat")
        return NetstatReading(counters, parse_sockstat(read_text(path), path), self.page_size, self._conntrack())


def from_config(cfg, ctx=None) -> NetstatSource:
    return NetstatSource(cfg["procfs"])
