"""NFS client: per-mount statistics from <procfs>/self/mountstats, RPC totals from <procfs>/net/rpc/nfs.

Format facts (kernel fs/nfs/super.c nfs_show_stats, net/sunrpc/stats.c, xprtsock.c):
  - each mount starts with ``device EXPORT mounted on MOUNTPOINT with fstype nfs|nfs4 statvers=1.1``;
    names are octal-escaped (a space is ``\\040``);
  - ``bytes:`` normalreadbytes normalwritebytes directreadbytes directwritebytes
    serverreadbytes serverwritebytes readpages writepages;
  - ``events:`` 27 counters (nfs_iostat.h order);
  - ``xprt:`` one line per transport: ``tcp`` port bind_count connect_count connect_time idle_time
    sends recvs bad_xids req_u bklog_u [max_slots sending_u pending_u] (``udp`` lacks the three
    connect fields, ``rdma`` shares tcp's first ten);
  - per-op lines ``NAME: ops trans timeouts bytes_sent bytes_recv queue_ms rtt_ms execute_ms [errors]``.
Times in mountstats are milliseconds; exported in seconds.

A mountpoint can appear more than once (a second NFS mount stacked on the same directory). Only the
last one, the mount the path resolves to, is reported, so no series is duplicated.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from ..errors import ParseError
from ..metrics import COUNTER, GAUGE, Point, metric, point
from ._files import FileRefused, Refusals, counting, read_text, refused_points, under

_M = ["mountpoint"]
_OP = ["mountpoint", "operation"]
_XP = ["mountpoint", "transport"]

READ_BYTES = metric("teye_nfs_client_read_bytes_total", COUNTER,
                    "Bytes read from the NFS server by this mount, over the wire, including O_DIRECT and "
                    "readahead (mountstats serverreadbytes).", _M)
WRITE_BYTES = metric("teye_nfs_client_write_bytes_total", COUNTER,
                     "Bytes written to the NFS server by this mount, over the wire (mountstats serverwritebytes).",
                     _M)
NORMAL_READ_BYTES = metric("teye_nfs_client_normal_read_bytes_total", COUNTER,
                           "Bytes applications read with read() without O_DIRECT, served from cache or server "
                           "(mountstats normalreadbytes).", _M)
NORMAL_WRITE_BYTES = metric("teye_nfs_client_normal_write_bytes_total", COUNTER,
                            "Bytes applications wrote with write() without O_DIRECT (mountstats normalwritebytes).",
                            _M)
DIRECT_READ_BYTES = metric("teye_nfs_client_direct_read_bytes_total", COUNTER,
                           "Bytes applications read with O_DIRECT (mountstats directreadbytes).", _M)
DIRECT_WRITE_BYTES = metric("teye_nfs_client_direct_write_bytes_total", COUNTER,
                            "Bytes applications wrote with O_DIRECT (mountstats directwritebytes).", _M)
READ_PAGES = metric("teye_nfs_client_read_pages_total", COUNTER,
                    "Pages read through the page cache's readpage(s) paths (mountstats readpages).", _M)
WRITE_PAGES = metric("teye_nfs_client_write_pages_total", COUNTER,
                     "Pages written through the page cache's writepage(s) paths (mountstats writepages).", _M)
AGE = metric("teye_nfs_client_mount_age_seconds", GAUGE, "Seconds since the NFS mount was made (mountstats age).",
             _M)
MOUNT_INFO = metric("teye_nfs_client_mount_info", GAUGE,
                    "Always 1 per NFS mount: the export, NFS version and transport protocol. When several NFS "
                    "mounts are stacked on one mountpoint, only the last (visible) one is reported.",
                    ["mountpoint", "export", "version", "protocol"])
EVENTS = metric("teye_nfs_client_events_total", COUNTER,
                "NFS client events per mount (mountstats events: cache revalidations, VFS calls, short "
                "reads/writes, jukebox delays, pNFS I/O...).", ["mountpoint", "event"])
OPS = metric("teye_nfs_client_operations_total", COUNTER,
             "NFS operations (RPC requests) issued per mount and operation (mountstats per-op ops).", _OP)
OP_TRANSMISSIONS = metric("teye_nfs_client_operation_transmissions_total", COUNTER,
                          "RPC transmissions per operation, retransmissions included (per-op trans).", _OP)
OP_MAJOR_TIMEOUTS = metric("teye_nfs_client_operation_major_timeouts_total", COUNTER,
                           "Major timeouts per operation (per-op timeouts).", _OP)
OP_SENT_BYTES = metric("teye_nfs_client_operation_sent_bytes_total", COUNTER,
                       "Bytes sent per operation, RPC headers and payload (per-op bytes_sent).", _OP)
OP_RECEIVED_BYTES = metric("teye_nfs_client_operation_received_bytes_total", COUNTER,
                           "Bytes received per operation, RPC headers and payload (per-op bytes_recv).", _OP)
OP_QUEUE_SECONDS = metric("teye_nfs_client_operation_queue_seconds_total", COUNTER,
                          "Seconds requests waited in the client queue before transmission (per-op queue, ms/1000).",
                          _OP)
OP_RTT_SECONDS = metric("teye_nfs_client_operation_rtt_seconds_total", COUNTER,
                        "RPC round-trip seconds from transmission to reply (per-op rtt, ms/1000); divide by "
                        "operations for the mean.", _OP)
OP_EXECUTE_SECONDS = metric("teye_nfs_client_operation_execute_seconds_total", COUNTER,
                            "Seconds from queueing to completion of requests (per-op execute, ms/1000).", _OP)
OP_ERRORS = metric("teye_nfs_client_operation_errors_total", COUNTER,
                   "Operations that completed with an error status (per-op errors; kernels 5.3+).", _OP)
XPRT_BINDS = metric("teye_nfs_client_transport_binds_total", COUNTER,
                    "Times the transport bound a local port from scratch (xprt bind_count).", _XP)
XPRT_CONNECTS = metric("teye_nfs_client_transport_connects_total", COUNTER,
                       "Times a connection-oriented transport (TCP, RDMA) connected (xprt connect_count).", _XP)
XPRT_IDLE = metric("teye_nfs_client_transport_idle_seconds", GAUGE,
                   "Seconds since the transport last carried traffic (xprt idle_time).", _XP)
XPRT_SENDS = metric("teye_nfs_client_transport_sends_total", COUNTER, "RPC requests sent (xprt sends).", _XP)
XPRT_RECEIVES = metric("teye_nfs_client_transport_receives_total", COUNTER, "RPC replies received (xprt recvs).",
                       _XP)
XPRT_BAD_XIDS = metric("teye_nfs_client_transport_bad_xids_total", COUNTER,
                       "Replies with a transaction id the client did not expect (xprt bad_xids).", _XP)
XPRT_ACTIVE = metric("teye_nfs_client_transport_active_requests_total", COUNTER,
                     "Sum over sends of the requests in flight (xprt req_u); divide by sends for the mean.", _XP)
XPRT_BACKLOG = metric("teye_nfs_client_transport_backlog_queue_total", COUNTER,
                      "Sum over sends of the backlog queue length (xprt bklog_u).", _XP)
XPRT_MAX_SLOTS = metric("teye_nfs_client_transport_max_slots", GAUGE,
                        "Most RPC slots ever in use at once (xprt max_slots).", _XP)
XPRT_SENDING = metric("teye_nfs_client_transport_sending_queue_total", COUNTER,
                      "Sum over sends of the sending queue length (xprt sending_u).", _XP)
XPRT_PENDING = metric("teye_nfs_client_transport_pending_queue_total", COUNTER,
                      "Sum over sends of the pending queue length (xprt pending_u).", _XP)

PACKETS = metric("teye_nfs_client_packets_total", COUNTER,
                 "Network packets counted by the NFS client RPC layer, by protocol (/proc/net/rpc/nfs net).",
                 ["protocol"])
CONNECTIONS = metric("teye_nfs_client_connections_total", COUNTER,
                     "TCP connections counted by the NFS client RPC layer (/proc/net/rpc/nfs net).")
RPC_CALLS = metric("teye_nfs_client_rpc_calls_total", COUNTER, "RPC calls made by the NFS client, all mounts "
                   "(/proc/net/rpc/nfs rpc).")
RPC_RETRANSMISSIONS = metric("teye_nfs_client_rpc_retransmissions_total", COUNTER,
                             "RPC calls the NFS client retransmitted, all mounts (/proc/net/rpc/nfs rpc).")
RPC_AUTH_REFRESHES = metric("teye_nfs_client_rpc_auth_refreshes_total", COUNTER,
                            "RPC credential refreshes by the NFS client (/proc/net/rpc/nfs rpc).")
PROCEDURES = metric("teye_nfs_client_procedure_calls_total", COUNTER,
                    "NFS procedures called by the client, all mounts, by NFS version (/proc/net/rpc/nfs procN).",
                    ["version", "procedure"])

# Event counters in the order of the mountstats events: line (include/linux/nfs_iostat.h).
EVENT_NAMES = (
    "inode_revalidate", "dentry_revalidate", "data_invalidate", "attribute_invalidate",
    "vfs_open", "vfs_lookup", "vfs_access", "vfs_update_page", "vfs_read_page", "vfs_read_pages",
    "vfs_write_page", "vfs_write_pages", "vfs_getdents", "vfs_setattr", "vfs_flush", "vfs_fsync",
    "vfs_lock", "vfs_release", "congestion_wait", "truncation", "write_extension", "silly_rename",
    "short_read", "short_write", "jukebox_delay", "pnfs_read", "pnfs_write",
)
BYTES_FIELDS = 8
OP_FIELDS = 8  # a ninth (errors) follows on kernels 5.3+

# Procedure names by version, in the order of the procN lines (the kernel's procedure tables).
PROC_NAMES = {
    "2": ("NULL", "GETATTR", "SETATTR", "ROOT", "LOOKUP", "READLINK", "READ", "WRCACHE", "WRITE", "CREATE",
          "REMOVE", "RENAME", "LINK", "SYMLINK", "MKDIR", "RMDIR", "READDIR", "STATFS"),
    "3": ("NULL", "GETATTR", "SETATTR", "LOOKUP", "ACCESS", "READLINK", "READ", "WRITE", "CREATE", "MKDIR",
          "SYMLINK", "MKNOD", "REMOVE", "RMDIR", "RENAME", "LINK", "READDIR", "READDIRPLUS", "FSSTAT", "FSINFO",
          "PATHCONF", "COMMIT"),
}
# NFSv4 client procedures (NFSPROC4_CLNT_* in include/linux/nfs4.h; index 0 is NULL).
NFS4_CLIENT_PROCS = (
    "NULL", "READ", "WRITE", "COMMIT", "OPEN", "OPEN_CONFIRM", "OPEN_NOATTR", "OPEN_DOWNGRADE", "CLOSE",
    "SETATTR", "FSINFO", "RENEW", "SETCLIENTID", "SETCLIENTID_CONFIRM", "LOCK", "LOCKT", "LOCKU", "ACCESS",
    "GETATTR", "LOOKUP", "LOOKUP_ROOT", "REMOVE", "RENAME", "LINK", "SYMLINK", "CREATE", "PATHCONF", "STATFS",
    "READLINK", "READDIR", "SERVER_CAPS", "DELEGRETURN", "GETACL", "SETACL", "FS_LOCATIONS",
    "RELEASE_LOCKOWNER", "SECINFO", "FSID_PRESENT",
    # NFSv4.1
    "EXCHANGE_ID", "CREATE_SESSION", "DESTROY_SESSION", "SEQUENCE", "GET_LEASE_TIME", "RECLAIM_COMPLETE",
    "LAYOUTGET", "GETDEVICEINFO", "LAYOUTCOMMIT", "LAYOUTRETURN", "SECINFO_NO_NAME", "TEST_STATEID",
    "FREE_STATEID", "GETDEVICELIST", "BIND_CONN_TO_SESSION", "DESTROY_CLIENTID",
    # NFSv4.2
    "SEEK", "ALLOCATE", "DEALLOCATE", "LAYOUTSTATS", "CLONE", "COPY", "OFFLOAD_CANCEL", "LOOKUPP",
    "LAYOUTERROR", "COPY_NOTIFY", "GETXATTR", "SETXATTR", "LISTXATTRS", "REMOVEXATTR", "READ_PLUS",
)

_DEVICE = re.compile(r"^device (.+) mounted on (\S+) with fstype (\S+)(?:\s+statvers=(\S+))?\s*$")
_ESCAPE = re.compile(r"\\([0-7]{3})")
NFS_FSTYPES = ("nfs", "nfs4")


def unescape(name: str) -> str:
    """Undo the kernel's octal escaping of mount names ('\\040' -> ' ')."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), name)


def proc_name(version: str, index: int) -> str:
    """Name of procedure ``index`` in a procN line; 'PROC<i>' for an index newer than this table."""
    names = NFS4_CLIENT_PROCS if version == "4" else PROC_NAMES.get(version, ())
    return names[index] if index < len(names) else f"PROC{index}"


@dataclass(frozen=True)
class NfsOperation:
    """Per-operation totals of one mount; times in seconds."""

    name: str
    ops: int
    transmissions: int
    major_timeouts: int
    bytes_sent: int
    bytes_received: int
    queue_seconds: float
    rtt_seconds: float
    execute_seconds: float
    errors: Optional[int] = None


@dataclass(frozen=True)
class NfsTransport:
    """One xprt: line. Fields a protocol or kernel does not print are None."""

    protocol: str
    port: int
    bind_count: int
    sends: int
    receives: int
    bad_xids: int
    active_requests: int  # req_u
    backlog: int          # bklog_u
    connect_count: Optional[int] = None
    idle_seconds: Optional[int] = None
    max_slots: Optional[int] = None
    sending: Optional[int] = None  # sending_u
    pending: Optional[int] = None  # pending_u


@dataclass(frozen=True)
class NfsMount:
    export: str
    mountpoint: str
    fstype: str
    statvers: str
    version: str   # vers= mount option ('' when absent)
    protocol: str  # proto= mount option, else the first transport's protocol
    age_seconds: int
    normal_read_bytes: int
    normal_write_bytes: int
    direct_read_bytes: int
    direct_write_bytes: int
    server_read_bytes: int
    server_write_bytes: int
    read_pages: int
    write_pages: int
    events: Dict[str, int]
    operations: Tuple[NfsOperation, ...]
    transports: Tuple[NfsTransport, ...]

    def operation(self, name: str) -> Optional[NfsOperation]:
        for op in self.operations:
            if op.name == name:
                return op
        return None

    def points(self) -> Iterator[Point]:
        mp = self.mountpoint
        yield point(MOUNT_INFO, 1, mp, self.export, self.version, self.protocol)
        yield point(AGE, self.age_seconds, mp)
        yield point(READ_BYTES, self.server_read_bytes, mp)
        yield point(WRITE_BYTES, self.server_write_bytes, mp)
        yield point(NORMAL_READ_BYTES, self.normal_read_bytes, mp)
        yield point(NORMAL_WRITE_BYTES, self.normal_write_bytes, mp)
        yield point(DIRECT_READ_BYTES, self.direct_read_bytes, mp)
        yield point(DIRECT_WRITE_BYTES, self.direct_write_bytes, mp)
        yield point(READ_PAGES, self.read_pages, mp)
        yield point(WRITE_PAGES, self.write_pages, mp)
        for name, value in self.events.items():
            yield point(EVENTS, value, mp, name)
        for op in self.operations:
            yield point(OPS, op.ops, mp, op.name)
            yield point(OP_TRANSMISSIONS, op.transmissions, mp, op.name)
            yield point(OP_MAJOR_TIMEOUTS, op.major_timeouts, mp, op.name)
            yield point(OP_SENT_BYTES, op.bytes_sent, mp, op.name)
            yield point(OP_RECEIVED_BYTES, op.bytes_received, mp, op.name)
            yield point(OP_QUEUE_SECONDS, op.queue_seconds, mp, op.name)
            yield point(OP_RTT_SECONDS, op.rtt_seconds, mp, op.name)
            yield point(OP_EXECUTE_SECONDS, op.execute_seconds, mp, op.name)
            yield point(OP_ERRORS, op.errors, mp, op.name)  # None (absent) before kernel 5.3
        for i, x in enumerate(self.transports):
            t = str(i)
            yield point(XPRT_BINDS, x.bind_count, mp, t)
            yield point(XPRT_CONNECTS, x.connect_count, mp, t)
            yield point(XPRT_IDLE, x.idle_seconds, mp, t)
            yield point(XPRT_SENDS, x.sends, mp, t)
            yield point(XPRT_RECEIVES, x.receives, mp, t)
            yield point(XPRT_BAD_XIDS, x.bad_xids, mp, t)
            yield point(XPRT_ACTIVE, x.active_requests, mp, t)
            yield point(XPRT_BACKLOG, x.backlog, mp, t)
            yield point(XPRT_MAX_SLOTS, x.max_slots, mp, t)
            yield point(XPRT_SENDING, x.sending, mp, t)
            yield point(XPRT_PENDING, x.pending, mp, t)


@dataclass(frozen=True)
class NfsRpcStats:
    """Client-wide RPC totals from /proc/net/rpc/nfs."""

    calls: int
    retransmissions: int
    auth_refreshes: int
    udp_packets: Optional[int] = None
    tcp_packets: Optional[int] = None
    tcp_connections: Optional[int] = None
    procedures: Dict[str, Tuple[Tuple[str, int], ...]] = field(default_factory=dict)  # version -> ((name, n), ...)

    def points(self) -> Iterator[Point]:
        yield point(PACKETS, self.udp_packets, "udp")
        yield point(PACKETS, self.tcp_packets, "tcp")
        yield point(CONNECTIONS, self.tcp_connections)
        yield point(RPC_CALLS, self.calls)
        yield point(RPC_RETRANSMISSIONS, self.retransmissions)
        yield point(RPC_AUTH_REFRESHES, self.auth_refreshes)
        for version, procs in self.procedures.items():
            for name, count in procs:
                yield point(PROCEDURES, count, version, name)


@dataclass(frozen=True)
class NfsClientReading:
    """Visible NFS mounts (one per mountpoint) and, when /proc/net/rpc/nfs exists, the RPC totals."""

    mounts: Tuple[NfsMount, ...]
    rpc: Optional[NfsRpcStats] = None
    refused: Tuple[Tuple[str, int], ...] = ()   # files refused so far, by reason

    def mount(self, mountpoint: str) -> Optional[NfsMount]:
        for m in self.mounts:
            if m.mountpoint == mountpoint:
                return m
        return None

    def points(self) -> Iterator[Point]:
        for m in self.mounts:
            yield from m.points()
        if self.rpc is not None:
            yield from self.rpc.points()
        yield from refused_points("nfs", self.refused)


def parse_ints(fields: Sequence[str], path: str, what: str, signed: bool = False) -> List[int]:
    """Decimal integers (non-negative unless ``signed``) or ParseError naming the file and the field."""
    out = []
    for f in fields:
        digits = f[1:] if signed and f.startswith("-") else f
        if not (digits.isascii() and digits.isdigit()):
            raise ParseError(path, f"{what}: expected {'an' if signed else 'a non-negative'} integer, got {f!r}")
        out.append(int(f))
    return out


def _parse_transport(fields: Sequence[str], path: str, where: str) -> Optional[NfsTransport]:
    """An xprt: line's fields after 'xprt:'. None for a transport this module does not decode."""
    if not fields:
        raise ParseError(path, f"{where}: empty xprt line")
    proto = fields[0]
    if proto == "udp":
        v = parse_ints(fields[1:], path, where)
        if len(v) < 7:
            raise ParseError(path, f"{where}: udp xprt line has {len(v)} values, expected >= 7")
        extra = v[7:10] + [None] * (3 - len(v[7:10]))
        return NfsTransport(proto, v[0], v[1], v[2], v[3], v[4], v[5], v[6], None, None, *extra)
    if proto in ("tcp", "rdma") or proto.startswith("tcp"):
        v = parse_ints(fields[1:11], path, where, signed=True)  # idle_time is a signed long; rdma appends its own counters after the first ten
        if len(v) < 10:
            raise ParseError(path, f"{where}: {proto} xprt line has {len(v)} values, expected >= 10")
        extra: List[Optional[int]] = [None, None, None]
        if proto != "rdma" and len(fields) >= 14:
            extra = parse_ints(fields[11:14], path, where)
        # port bind connect connect_time idle sends recvs bad_xids req_u bklog_u [max_slots sending_u pending_u]
        return NfsTransport(proto, v[0], v[1], v[5], v[6], v[7], v[8], v[9], v[2], v[4], *extra)
    return None


def _options(text: str) -> Dict[str, str]:
    out = {}
    for opt in text.split(","):
        k, _, v = opt.partition("=")
        out[k.strip()] = v.strip()
    return out


class _MountBuilder:
    def __init__(self, export, mountpoint, fstype, statvers, lineno):
        self.export, self.mountpoint, self.fstype, self.statvers = export, mountpoint, fstype, statvers
        self.lineno = lineno
        self.opts: Dict[str, str] = {}
        self.age: Optional[int] = None
        self.bytes: Optional[List[int]] = None
        self.events: Optional[List[int]] = None
        self.ops: List[NfsOperation] = []
        self.transports: List[NfsTransport] = []
        self.xprt_protocols: List[str] = []
        self.in_ops = False

    def build(self, path: str) -> NfsMount:
        where = f"mount {self.mountpoint!r} (line {self.lineno})"
        for what, value in (("age:", self.age), ("bytes:", self.bytes), ("events:", self.events)):
            if value is None:
                raise ParseError(path, f"{where}: no {what} line (file truncated?)")
        protocol = self.opts.get("proto") or (self.xprt_protocols[0] if self.xprt_protocols else "")
        version = self.opts.get("vers", "")
        return NfsMount(self.export, self.mountpoint, self.fstype, self.statvers, version, protocol, self.age,
                        *self.bytes[:BYTES_FIELDS], dict(zip(EVENT_NAMES, self.events)), tuple(self.ops),
                        tuple(self.transports))


def parse_mountstats(text: str, path: str = "mountstats") -> List[NfsMount]:
    """Every NFS mount in /proc/<pid>/mountstats, in file order (duplicates included).

    Raises ParseError naming the file on an empty file, a malformed device line, a missing or short
    bytes:/events:/age: line, or a non-numeric value.
    """
    if not text.strip():
        raise ParseError(path, "file is empty")
    mounts: List[NfsMount] = []
    cur: Optional[_MountBuilder] = None
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.startswith("device "):
            if cur is not None:
                mounts.append(cur.build(path))
                cur = None
            m = _DEVICE.match(line)
            if not m:
                raise ParseError(path, f"line {lineno}: malformed device line {line!r}")
            export, mountpoint, fstype, statvers = m.groups()
            if fstype in NFS_FSTYPES:
                if not statvers:
                    raise ParseError(path, f"line {lineno}: NFS mount without statvers")
                cur = _MountBuilder(unescape(export), unescape(mountpoint), fstype, statvers, lineno)
            continue
        if cur is None:
            continue
        stripped = line.strip()
        if not stripped:
            continue
        where = f"line {lineno}"
        key, sep, rest = stripped.partition(":")
        if cur.in_ops:
            fields = rest.split()
            if not sep or not key or " " in key:
                raise ParseError(path, f"{where}: malformed per-op line {stripped!r}")
            if len(fields) < OP_FIELDS:
                raise ParseError(path, f"{where}: {key} has {len(fields)} values, expected >= {OP_FIELDS}")
            v = parse_ints(fields[:OP_FIELDS + 1], path, f"{where} {key}")
            cur.ops.append(NfsOperation(key, v[0], v[1], v[2], v[3], v[4], v[5] / 1000, v[6] / 1000, v[7] / 1000,
                                        v[8] if len(v) > OP_FIELDS else None))
            continue
        if stripped == "per-op statistics":
            cur.in_ops = True
        elif key == "opts":
            cur.opts = _options(rest)
        elif key == "age":
            v = parse_ints(rest.split(), path, f"{where} age")
            if len(v) != 1:
                raise ParseError(path, f"{where}: age line has {len(v)} values, expected 1")
            cur.age = v[0]
        elif key == "bytes":
            v = parse_ints(rest.split(), path, f"{where} bytes")
            if len(v) < BYTES_FIELDS:
                raise ParseError(path, f"{where}: bytes line has {len(v)} values, expected {BYTES_FIELDS}")
            cur.bytes = v
        elif key == "events":
            v = parse_ints(rest.split(), path, f"{where} events")
            if len(v) < len(EVENT_NAMES):
                raise ParseError(path, f"{where}: events line has {len(v)} values, expected {len(EVENT_NAMES)}")
            cur.events = v
        elif key == "xprt":
            fields = rest.split()
            x = _parse_transport(fields, path, where)
            cur.xprt_protocols.append(fields[0])
            if x is not None:
                cur.transports.append(x)
        # other lines (caps, sec, nfsv4, fsc, RPC iostats version...) carry nothing exported
    if cur is not None:
        mounts.append(cur.build(path))
    return mounts


def visible_mounts(mounts: Iterable[NfsMount]) -> Tuple[NfsMount, ...]:
    """One mount per mountpoint: the last listed, i.e. the one stacked on top (what the path resolves to)."""
    by_mp: Dict[str, NfsMount] = {}
    for m in mounts:
        by_mp.pop(m.mountpoint, None)  # ordered by the position of the mount that is kept
        by_mp[m.mountpoint] = m
    return tuple(by_mp.values())


def parse_proc_line(fields: Sequence[str], path: str, where: str) -> List[int]:
    """'procN COUNT v1 .. vCOUNT' (fields after procN) -> the values; ParseError if short or garbled."""
    v = parse_ints(fields, path, where)
    if not v:
        raise ParseError(path, f"{where}: no procedure count")
    count, values = v[0], v[1:]
    if len(values) != count:
        raise ParseError(path, f"{where}: says {count} procedures but has {len(values)} values")
    return values


def parse_rpc_nfs(text: str, path: str = "net/rpc/nfs") -> NfsRpcStats:
    """/proc/net/rpc/nfs: the net, rpc and procN lines. ParseError if the rpc line is missing or garbled."""
    if not text.strip():
        raise ParseError(path, "file is empty")
    net: Optional[List[int]] = None
    rpc: Optional[List[int]] = None
    procs: Dict[str, Tuple[Tuple[str, int], ...]] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        key, where = fields[0], f"line {lineno} {fields[0]}"
        if key == "net":
            net = parse_ints(fields[1:], path, where)
            if len(net) < 4:
                raise ParseError(path, f"{where}: has {len(net)} values, expected 4")
        elif key == "rpc":
            rpc = parse_ints(fields[1:], path, where)
            if len(rpc) < 3:
                raise ParseError(path, f"{where}: has {len(rpc)} values, expected 3")
        elif key.startswith("proc") and key[4:].isascii() and key[4:].isdigit():
            version = key[4:]
            values = parse_proc_line(fields[1:], path, where)
            procs[version] = tuple((proc_name(version, i), n) for i, n in enumerate(values))
    if rpc is None:
        raise ParseError(path, "no rpc line (file truncated?)")
    udp = tcp = conns = None
    if net is not None:
        udp, tcp, conns = net[1], net[2], net[3]
    return NfsRpcStats(rpc[0], rpc[1], rpc[2], udp, tcp, conns, procs)


class NfsClientSource:
    """Reads <procfs>/self/mountstats (required) and <procfs>/net/rpc/nfs (optional: absent without the nfs module)."""

    name = "nfs"

    def __init__(self, procfs: str = "/proc"):
        self.mountstats_path = under(procfs, "self", "mountstats")
        self.rpc_path = under(procfs, "net", "rpc", "nfs")
        self._refusals = Refusals(self.name)

    def collect(self) -> NfsClientReading:
        with counting(self._refusals):
            return self._collect()

    def _collect(self) -> NfsClientReading:
        mounts = visible_mounts(parse_mountstats(read_text(self.mountstats_path), self.mountstats_path))
        try:
            rpc_text = read_text(self.rpc_path)
        except (FileNotFoundError, FileRefused):
            rpc = None  # NFS client module not loaded (or a FIFO in its place, counted): only the RPC totals absent
        else:
            rpc = parse_rpc_nfs(rpc_text, self.rpc_path)
        return NfsClientReading(mounts, rpc, self._refusals.counts())


def from_config(cfg, ctx=None) -> NfsClientSource:
    return NfsClientSource(cfg["procfs"])
