"""The kernel's protocol counters and socket use, as node_exporter's ``netstat``, ``sockstat`` and
``conntrack`` collectors: <procfs>/net/{snmp,netstat} (the fields node_exporter exports by default: errors,
TCP opens/segments/retransmits/resets, listen-queue overflows, SYN cookies, UDP buffer errors...),
<procfs>/net/sockstat (sockets in use, TCP orphans and TIME-WAIT, socket buffer memory) and the connection
tracking table's fill (<procfs>/sys/net/netfilter/nf_conntrack_{count,max}, absent while the module is not
loaded).

Names keep node_exporter's field spelling so its users find them: ``node_netstat_Tcp_RetransSegs`` is
``teye_netstat_Tcp_RetransSegs_total`` (a counter, hence ``_total``), ``node_sockstat_TCP_tw`` is
``teye_sockstat_TCP_tw``.  A field this kernel does not print is absent.

The same pass reads the optional tables: IPv6 (``<procfs>/net/snmp6`` and ``sockstat6``: absent on a kernel
booted without IPv6, ``teye_netstat_ipv6`` 0 then), connection-tracking statistics
(``<procfs>/net/stat/nf_conntrack``, summed over the CPUs as node_exporter's ``conntrack``) and the bytes queued
in UDP sockets (``<procfs>/net/udp{,6}``, node_exporter's ``udp_queues``).  A garbled optional file leaves only
its families out (``teye_netstat_files_unreadable_total{file}``).
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Tuple

from ..errors import ParseError, parse_int
from ..logutil import RateLimitedLog
from ..metrics import COUNTER, GAUGE, Point, metric, point
from ._files import KeptFiles, KeptFilesSource, under

log = RateLimitedLog(logging.getLogger("teye.netstat"))

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
    ("snmp", "UdpLite_InErrors", "UDP-Lite datagrams received that could not be delivered"),
    # IPv6 (/proc/net/snmp6, absent on a kernel without IPv6): node_exporter's default netstat fields
    ("snmp6", "Ip6_InOctets", "Bytes received by IPv6"),
    ("snmp6", "Ip6_OutOctets", "Bytes sent by IPv6"),
    ("snmp6", "Icmp6_InErrors", "ICMPv6 messages received with errors"),
    ("snmp6", "Icmp6_InMsgs", "ICMPv6 messages received"),
    ("snmp6", "Icmp6_OutMsgs", "ICMPv6 messages sent"),
    ("snmp6", "Udp6_InDatagrams", "UDP datagrams received over IPv6"),
    ("snmp6", "Udp6_OutDatagrams", "UDP datagrams sent over IPv6"),
    ("snmp6", "Udp6_InErrors", "UDP datagrams received over IPv6 that could not be delivered"),
    ("snmp6", "Udp6_NoPorts", "UDP datagrams received over IPv6 for a port nothing listens on"),
    ("snmp6", "Udp6_RcvbufErrors", "UDP datagrams over IPv6 dropped because a socket's receive buffer was full"),
    ("snmp6", "Udp6_SndbufErrors", "UDP datagrams over IPv6 dropped because a socket's send buffer was full"),
    ("snmp6", "UdpLite6_InErrors", "UDP-Lite datagrams received over IPv6 that could not be delivered"),
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
# /proc/net/sockstat6 (absent on a kernel without IPv6)
SOCKSTAT6_FIELDS = (
    ("TCP6", "inuse", "TCP sockets over IPv6 in use"), ("UDP6", "inuse", "UDP sockets over IPv6 in use"),
    ("UDPLITE6", "inuse", "UDP-Lite sockets over IPv6 in use"), ("RAW6", "inuse", "Raw IPv6 sockets in use"),
    ("FRAG6", "inuse", "IPv6 fragment queues"), ("FRAG6", "memory", "Bytes held by IPv6 fragment queues"),
)
SOCKSTAT = {(p, f): metric(f"teye_sockstat_{p}_{f}", GAUGE, f"{h} (/proc/net/sockstat; node_sockstat_{p}_{f}).")
            for p, f, h in SOCKSTAT_FIELDS}
SOCKSTAT.update({(p, f): metric(f"teye_sockstat_{p}_{f}", GAUGE, f"{h} (/proc/net/sockstat6; "
                                f"node_sockstat_{p}_{f}).") for p, f, h in SOCKSTAT6_FIELDS})
MEM_BYTES = {p: metric(f"teye_sockstat_{p}_mem_bytes", GAUGE, f"Bytes of {p} socket buffers (/proc/net/sockstat "
                       f"{p} mem × the page size; node_sockstat_{p}_mem_bytes).") for p in ("TCP", "UDP")}
CONNTRACK = metric("teye_nf_conntrack_entries", GAUGE, "Connections in the connection-tracking table "
                   "(nf_conntrack_count; node_nf_conntrack_entries): when it reaches the limit, new "
                   "connections are dropped.")
CONNTRACK_LIMIT = metric("teye_nf_conntrack_entries_limit", GAUGE, "Size of the connection-tracking table "
                         "(nf_conntrack_max; node_nf_conntrack_entries_limit).")


# /proc/net/stat/nf_conntrack: one line per CPU, hexadecimal; node_exporter's conntrack collector sums the CPUs
CONNTRACK_STAT_FIELDS = (
    ("found", "Lookups in the connection-tracking table that found an entry"),
    ("invalid", "Packets connection tracking could not track (malformed, or a state it cannot follow)"),
    ("ignore", "Packets already tracked or not to be tracked (untracked, template)"),
    ("insert", "Entries inserted into the connection-tracking table"),
    ("insert_failed", "Entries that could not be inserted (a race between two CPUs for one flow)"),
    ("drop", "Packets dropped because connection tracking failed (the table full: no entry could be made)"),
    ("early_drop", "Entries dropped to make room when the table was full"),
    ("search_restart", "Table lookups restarted because the table was resized under them"),
)
CONNTRACK_STAT = {f: metric(f"teye_nf_conntrack_stat_{f}_total", COUNTER, f"{h}, summed over the CPUs "
                            f"(/proc/net/stat/nf_conntrack {f}; node_nf_conntrack_stat_{f}).")
                  for f, h in CONNTRACK_STAT_FIELDS}
UDP_QUEUES = metric("teye_udp_queues_bytes", GAUGE, "Bytes queued in UDP sockets, summed over the sockets, by IP "
                    "version (v4, v6) and queue (rx: received, not yet read by the process; tx: written, not yet "
                    "sent) (/proc/net/udp{,6} rx_queue and tx_queue; node_udp_queues).", ("ip", "queue"))
IPV6 = metric("teye_netstat_ipv6", GAUGE, "1 when the kernel has IPv6 (/proc/net/snmp6 exists), 0 when not: its "
              "IPv6 families (Ip6, Icmp6, Udp6, UdpLite6, sockstat6, udp_queues ip=v6) are then absent.")
UNREADABLE = metric("teye_netstat_files_unreadable_total", COUNTER,
                    "Reads of an optional protocol file refused because it was garbled or unreadable (its families "
                    "left out of that pass, the file named in the log): snmp6, sockstat6, nf_conntrack_stat, udp, "
                    "udp6. The required files (snmp, netstat, sockstat) take the collector down instead.",
                    ("file",))
OPTIONAL_FILES = ("snmp6", "sockstat6", "nf_conntrack_stat", "udp", "udp6")
_HEX = re.compile(r"[0-9a-fA-F]{1,16}")
MAX_UDP_BYTES = 8 << 20   # ~60,000 sockets; more is refused (teye_files_refused_total) and counted here
_SNMP6_LINE = re.compile(r"^(" + "|".join(f.replace("_", "", 1) for src, f, _ in NETSTAT_FIELDS if src == "snmp6")
                         + r")[ \t]*(\S*)[ \t]*$", re.M)


def parse_snmp6(text: str, path: str) -> Dict[str, int]:
    """The fields teye exports of /proc/net/snmp6 (``Ip6InOctets  123`` lines) -> {'Ip6_InOctets': 123}.  The file
    has about 200 lines; only the exported ones are parsed (one regular-expression pass: a fifth of the cost of
    splitting every line), and a garbled value of one of them is a ParseError."""
    if not text.strip():
        raise ParseError(path, "file is empty")
    out: Dict[str, int] = {}
    for name, value in _SNMP6_LINE.findall(text):
        proto, _, field = name.partition("6")
        out[f"{proto}6_{field}"] = parse_int(value, path, name)
    return out


def parse_conntrack_stat(text: str, path: str) -> Dict[str, int]:
    """The header line and one hexadecimal line per CPU -> each field summed over the CPUs."""
    lines = [ln.split() for ln in text.splitlines() if ln.strip()]
    if len(lines) < 2:
        raise ParseError(path, "expected a header line and one line per CPU")
    header = lines[0]
    sums = dict.fromkeys(header, 0)
    for lineno, words in enumerate(lines[1:], 2):
        if len(words) != len(header):
            raise ParseError(path, f"line {lineno}: {len(words)} values for {len(header)} names")
        for name, w in zip(header, words):
            if not _HEX.fullmatch(w):   # int(w, 16) alone takes "-1", "0x1f" and "1_0"
                raise ParseError(path, f"line {lineno}: {name}: expected hexadecimal, got {w[:20]!r}")
            sums[name] += int(w, 16)
    return sums


def parse_udp_queues(text: str, path: str) -> Tuple[int, int]:
    """/proc/net/udp{,6}: a header line, then one line per socket whose 5th field is ``tx_queue:rx_queue`` in
    hexadecimal -> (tx, rx) summed over the sockets."""
    lines = text.splitlines()
    if not lines or "tx_queue" not in lines[0]:
        raise ParseError(path, "expected the header line naming tx_queue rx_queue")
    tx = rx = 0
    for lineno, line in enumerate(lines[1:], 2):
        words = line.split()
        if not words:
            continue
        t, sep, r = words[4].partition(":") if len(words) > 4 else ("", "", "")
        if sep and _HEX.fullmatch(t) and _HEX.fullmatch(r):
            tx += int(t, 16)
            rx += int(r, 16)
        else:
            raise ParseError(path, f"line {lineno}: expected 'tx_queue:rx_queue' in hexadecimal as the 5th "
                                   f"field, got {line[:80]!r}")
    return tx, rx


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
    conntrack_stat: Optional[Dict[str, int]] = None
    udp_queues: Tuple[Tuple[str, int, int], ...] = ()   # (ip, tx, rx)
    ipv6: Optional[bool] = None
    unreadable: Tuple[Tuple[str, int], ...] = ()

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
        if self.conntrack_stat is not None:
            for f, spec in CONNTRACK_STAT.items():
                if f in self.conntrack_stat:
                    yield point(spec, self.conntrack_stat[f])
        for ip, tx, rx in self.udp_queues:
            yield point(UDP_QUEUES, rx, ip, "rx")
            yield point(UDP_QUEUES, tx, ip, "tx")
        if self.ipv6 is not None:
            yield point(IPV6, 1 if self.ipv6 else 0)
        for f, n in self.unreadable:
            yield point(UNREADABLE, n, f)


class NetstatSource(KeptFilesSource):
    name = "netstat"
    KEPT = 3 + len(OPTIONAL_FILES) + 2   # snmp, netstat, sockstat, the optional files, conntrack's two

    def __init__(self, procfs: str = "/proc", page_size: Optional[int] = None):
        self.procfs = procfs
        self.page_size = page_size or os.sysconf("SC_PAGE_SIZE")
        self._bad = dict.fromkeys(OPTIONAL_FILES, 0)
        self._files = KeptFiles()

    def _optional(self, key: str, path: str, parse, limit: int = 1 << 20):
        """An optional file's parse; None when absent (this kernel has no such table), and None, counted and
        logged when garbled or unreadable: the rest of the pass is exported."""
        try:
            return parse(self._files.read_text(path, limit=limit), path)
        except FileNotFoundError:
            return None
        except (ParseError, OSError) as e:
            self._bad[key] += 1
            log.warning(path, "netstat: %s (its families left out)", e)
            return None

    def _conntrack(self) -> Optional[Tuple[int, int]]:
        d = under(self.procfs, "sys", "net", "netfilter")
        try:
            count = self._files.read_text(os.path.join(d, "nf_conntrack_count")).strip()
            limit = self._files.read_text(os.path.join(d, "nf_conntrack_max")).strip()
        except FileNotFoundError:
            return None   # nf_conntrack not loaded: nothing tracked, nothing to say
        return (parse_int(count, d, "nf_conntrack_count"), parse_int(limit, d, "nf_conntrack_max"))

    def collect(self) -> NetstatReading:
        counters: Dict[str, int] = {}
        for f in ("snmp", "netstat"):
            path = under(self.procfs, "net", f)
            counters.update(parse_snmp(self._files.read_text(path), path))
        path = under(self.procfs, "net", "sockstat")
        sockets = parse_sockstat(self._files.read_text(path), path)
        snmp6_path = under(self.procfs, "net", "snmp6")
        snmp6 = self._optional("snmp6", snmp6_path, parse_snmp6)
        counters.update(snmp6 or {})
        ipv6 = os.path.exists(snmp6_path)   # a garbled snmp6 is still IPv6
        if ipv6:
            sockets.update(self._optional("sockstat6", under(self.procfs, "net", "sockstat6"), parse_sockstat) or {})
        stat = self._optional("nf_conntrack_stat", under(self.procfs, "net", "stat", "nf_conntrack"),
                              parse_conntrack_stat)
        queues = []
        for ip, f in (("v4", "udp"), ("v6", "udp6")):
            q = self._optional(f, under(self.procfs, "net", f), parse_udp_queues, MAX_UDP_BYTES)
            if q is not None:
                queues.append((ip, q[0], q[1]))
        return NetstatReading(counters, sockets, self.page_size, self._conntrack(), stat, tuple(queues), ipv6,
                              tuple((f, n) for f, n in self._bad.items() if n))


def from_config(cfg, ctx=None) -> NetstatSource:
    return NetstatSource(cfg["procfs"])
