"""NFS server (nfsd), from <procfs>/net/rpc/nfsd.

Lines (kernel fs/nfsd/stats.c and net/sunrpc/stats.c svc_seq_show):
  rc HITS MISSES NOCACHE            reply cache
  fh STALE ...                      file handles (only the first value is still maintained)
  io READ_BYTES WRITE_BYTES         bytes read from / written to disk on behalf of clients
  th THREADS FULLCNT 10x0.000       nfsd threads (the histogram is deprecated, always zero)
  ra ...                            read-ahead cache (deprecated; not exported)
  net COUNT UDP TCP TCPCONN         packets and TCP connections
  rpc CALLS BADCALLS BADFMT BADAUTH BADCLNT
  procN COUNT v1..vCOUNT            procedures by NFS version; proc4 is NULL and COMPOUND
  proc4ops COUNT v0..               NFSv4 operations inside COMPOUNDs, indexed by operation number
  wdeleg_getattr N                  (6.9+) GETATTRs answered by a write delegation holder
The file only exists while the nfsd module is loaded: without it the source is unavailable.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Tuple

from ..errors import HardwareAbsent, ParseError, SourceUnavailable
from ..metrics import COUNTER, GAUGE, Point, metric, point
from ._files import read_text, under
from .nfs import PROC_NAMES, parse_ints, parse_proc_line

READ_BYTES = metric("teye_nfsd_read_bytes_total", COUNTER,
                    "Bytes the NFS server read from disk for clients (/proc/net/rpc/nfsd io).")
WRITE_BYTES = metric("teye_nfsd_write_bytes_total", COUNTER,
                     "Bytes the NFS server wrote to disk for clients (/proc/net/rpc/nfsd io).")
REPLY_CACHE_HITS = metric("teye_nfsd_reply_cache_hits_total", COUNTER,
                          "Requests answered from the duplicate reply cache, i.e. client retransmissions "
                          "(/proc/net/rpc/nfsd rc).")
REPLY_CACHE_MISSES = metric("teye_nfsd_reply_cache_misses_total", COUNTER,
                            "Cacheable (non-idempotent) requests not found in the reply cache (rc).")
REPLY_CACHE_NOCACHE = metric("teye_nfsd_reply_cache_nocache_total", COUNTER,
                             "Requests that bypass the reply cache (idempotent operations) (rc).")
STALE_FILE_HANDLES = metric("teye_nfsd_file_handles_stale_total", COUNTER,
                            "Requests that carried a stale file handle (/proc/net/rpc/nfsd fh).")
THREADS = metric("teye_nfsd_threads", GAUGE, "nfsd kernel threads running (/proc/net/rpc/nfsd th).")
PACKETS = metric("teye_nfsd_packets_total", COUNTER,
                 "Network packets received by the NFS server, by protocol (/proc/net/rpc/nfsd net).", ["protocol"])
CONNECTIONS = metric("teye_nfsd_connections_total", COUNTER,
                     "TCP connections accepted by the NFS server (/proc/net/rpc/nfsd net).")
RPC_CALLS = metric("teye_nfsd_rpc_calls_total", COUNTER, "RPC calls received by the NFS server (rpc).")
RPC_BAD_CALLS = metric("teye_nfsd_rpc_bad_calls_total", COUNTER,
                       "RPC calls rejected by the NFS server, all reasons (rpc badcalls).")
RPC_ERRORS = metric("teye_nfsd_rpc_errors_total", COUNTER,
                    "RPC calls rejected by the NFS server by reason: format (bad format), auth (bad "
                    "authentication), client (bad client) (rpc).", ["error"])
PROCEDURES = metric("teye_nfsd_procedure_calls_total", COUNTER,
                    "NFS procedures served, by NFS version (/proc/net/rpc/nfsd procN; version 4 has only NULL "
                    "and COMPOUND, see teye_nfsd_v4_operations_total).", ["version", "procedure"])
V4_OPERATIONS = metric("teye_nfsd_v4_operations_total", COUNTER,
                       "NFSv4 operations served inside COMPOUND requests (/proc/net/rpc/nfsd proc4ops).",
                       ["operation"])
WDELEG_GETATTRS = metric("teye_nfsd_write_delegation_getattrs_total", COUNTER,
                         "GETATTRs that conflicted with a write delegation and were answered by it "
                         "(/proc/net/rpc/nfsd wdeleg_getattr, kernels 6.9+).")

NFSD4_PROCS = ("NULL", "COMPOUND")
# NFSv4 operation numbers (RFC 7530, 8881, 7862, 8276); 0-2 are unassigned and skipped.
NFS4_OPS = {
    3: "ACCESS", 4: "CLOSE", 5: "COMMIT", 6: "CREATE", 7: "DELEGPURGE", 8: "DELEGRETURN", 9: "GETATTR",
    10: "GETFH", 11: "LINK", 12: "LOCK", 13: "LOCKT", 14: "LOCKU", 15: "LOOKUP", 16: "LOOKUPP", 17: "NVERIFY",
    18: "OPEN", 19: "OPENATTR", 20: "OPEN_CONFIRM", 21: "OPEN_DOWNGRADE", 22: "PUTFH", 23: "PUTPUBFH",
    24: "PUTROOTFH", 25: "READ", 26: "READDIR", 27: "READLINK", 28: "REMOVE", 29: "RENAME", 30: "RENEW",
    31: "RESTOREFH", 32: "SAVEFH", 33: "SECINFO", 34: "SETATTR", 35: "SETCLIENTID", 36: "SETCLIENTID_CONFIRM",
    37: "VERIFY", 38: "WRITE", 39: "RELEASE_LOCKOWNER",
    40: "BACKCHANNEL_CTL", 41: "BIND_CONN_TO_SESSION", 42: "EXCHANGE_ID", 43: "CREATE_SESSION",
    44: "DESTROY_SESSION", 45: "FREE_STATEID", 46: "GET_DIR_DELEGATION", 47: "GETDEVICEINFO",
    48: "GETDEVICELIST", 49: "LAYOUTCOMMIT", 50: "LAYOUTGET", 51: "LAYOUTRETURN", 52: "SECINFO_NO_NAME",
    53: "SEQUENCE", 54: "SET_SSV", 55: "TEST_STATEID", 56: "WANT_DELEGATION", 57: "DESTROY_CLIENTID",
    58: "RECLAIM_COMPLETE",
    59: "ALLOCATE", 60: "COPY", 61: "COPY_NOTIFY", 62: "DEALLOCATE", 63: "IO_ADVISE", 64: "LAYOUTERROR",
    65: "LAYOUTSTATS", 66: "OFFLOAD_CANCEL", 67: "OFFLOAD_STATUS", 68: "READ_PLUS", 69: "SEEK",
    70: "WRITE_SAME", 71: "CLONE", 72: "GETXATTR", 73: "SETXATTR", 74: "LISTXATTRS", 75: "REMOVEXATTR",
}
FIRST_NFS4_OP = 3

# Line -> fewest values it must carry. A file without one of these lines is truncated.
REQUIRED = {"rc": 3, "fh": 1, "io": 2, "th": 1, "net": 4, "rpc": 5}


def op_name(index: int) -> str:
    return NFS4_OPS.get(index, f"OP{index}")


@dataclass(frozen=True)
class NfsdReading:
    read_bytes: int
    write_bytes: int
    reply_cache_hits: int
    reply_cache_misses: int
    reply_cache_nocache: int
    stale_file_handles: int
    threads: int
    packets: int
    udp_packets: int
    tcp_packets: int
    tcp_connections: int
    rpc_calls: int
    rpc_bad_calls: int
    rpc_bad_format: int
    rpc_bad_auth: int
    rpc_bad_client: int
    procedures: Dict[str, Tuple[Tuple[str, int], ...]] = field(default_factory=dict)  # version -> ((name, n), ..)
    v4_operations: Tuple[Tuple[str, int], ...] = ()
    wdeleg_getattrs: Optional[int] = None

    def points(self) -> Iterator[Point]:
        yield point(READ_BYTES, self.read_bytes)
        yield point(WRITE_BYTES, self.write_bytes)
        yield point(REPLY_CACHE_HITS, self.reply_cache_hits)
        yield point(REPLY_CACHE_MISSES, self.reply_cache_misses)
        yield point(REPLY_CACHE_NOCACHE, self.reply_cache_nocache)
        yield point(STALE_FILE_HANDLES, self.stale_file_handles)
        yield point(THREADS, self.threads)
        yield point(PACKETS, self.udp_packets, "udp")
        yield point(PACKETS, self.tcp_packets, "tcp")
        yield point(CONNECTIONS, self.tcp_connections)
        yield point(RPC_CALLS, self.rpc_calls)
        yield point(RPC_BAD_CALLS, self.rpc_bad_calls)
        yield point(RPC_ERRORS, self.rpc_bad_format, "format")
        yield point(RPC_ERRORS, self.rpc_bad_auth, "auth")
        yield point(RPC_ERRORS, self.rpc_bad_client, "client")
        for version, procs in self.procedures.items():
            for name, count in procs:
                yield point(PROCEDURES, count, version, name)
        for name, count in self.v4_operations:
            yield point(V4_OPERATIONS, count, name)
        yield point(WDELEG_GETATTRS, self.wdeleg_getattrs)


def parse_nfsd(text: str, path: str = "net/rpc/nfsd") -> NfsdReading:
    """Parse /proc/net/rpc/nfsd. ParseError naming the file when empty, truncated or non-numeric."""
    if not text.strip():
        raise ParseError(path, "file is empty")
    lines: Dict[str, List[int]] = {}
    procs: Dict[str, Tuple[Tuple[str, int], ...]] = {}
    ops: Tuple[Tuple[str, int], ...] = ()
    wdeleg: Optional[int] = None
    for lineno, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        key, where = fields[0], f"line {lineno} {fields[0]}"
        if key in REQUIRED:
            if key == "th":  # thread count, all-busy count, then the deprecated histogram (floats)
                values = parse_ints(fields[1:3], path, where)
            else:
                values = parse_ints(fields[1:], path, where)
            if len(values) < REQUIRED[key]:
                raise ParseError(path, f"{where}: has {len(values)} values, expected {REQUIRED[key]}")
            lines[key] = values
        elif key.startswith("proc") and key[4:].isascii() and key[4:].isdigit():
            version = key[4:]
            names = NFSD4_PROCS if version == "4" else PROC_NAMES.get(version, ())
            values = parse_proc_line(fields[1:], path, where)
            procs[version] = tuple((names[i] if i < len(names) else f"PROC{i}", n) for i, n in enumerate(values))
        elif key == "proc4ops":
            values = parse_proc_line(fields[1:], path, where)
            ops = tuple((op_name(i), n) for i, n in enumerate(values) if i >= FIRST_NFS4_OP)
        elif key == "wdeleg_getattr":
            values = parse_ints(fields[1:], path, where)
            if len(values) != 1:
                raise ParseError(path, f"{where}: has {len(values)} values, expected 1")
            wdeleg = values[0]
        # ra and any line a newer kernel adds: not exported
    missing = [k for k in REQUIRED if k not in lines]
    if missing:
        raise ParseError(path, f"no {', '.join(missing)} line{'s' if len(missing) > 1 else ''} (file truncated?)")
    rc, fh, io, th, net, rpc = (lines[k] for k in ("rc", "fh", "io", "th", "net", "rpc"))
    return NfsdReading(read_bytes=io[0], write_bytes=io[1],
                       reply_cache_hits=rc[0], reply_cache_misses=rc[1], reply_cache_nocache=rc[2],
                       stale_file_handles=fh[0], threads=th[0],
                       packets=net[0], udp_packets=net[1], tcp_packets=net[2], tcp_connections=net[3],
                       rpc_calls=rpc[0], rpc_bad_calls=rpc[1], rpc_bad_format=rpc[2], rpc_bad_auth=rpc[3],
                       rpc_bad_client=rpc[4], procedures=procs, v4_operations=ops, wdeleg_getattrs=wdeleg)


class NfsdSource:
    name = "nfsd"

    def __init__(self, procfs: str = "/proc"):
        self.path = under(procfs, "net", "rpc", "nfsd")

    def collect(self) -> NfsdReading:
        try:
            text = read_text(self.path)
        except FileNotFoundError:
            raise HardwareAbsent(f"{self.path} does not exist (NFS server module nfsd not loaded)") from None
        return parse_nfsd(text, self.path)


def from_config(cfg, ctx=None) -> NfsdSource:
    return NfsdSource(cfg["procfs"])
