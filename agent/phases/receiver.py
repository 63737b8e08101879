"""The phase socket: a Unix datagram socket and a listener for connections, read by one thread, with kernel
credentials.

Each client connects to the ``SOCK_SEQPACKET`` listener at the path + ``SEQ_SUFFIX`` and sends on a
connection of its own (a queue no other sender can fill; its pid and uid from ``SO_PEERCRED``); the
datagram socket stays for clients of earlier releases and for one refused a connection (docs/phases.md,
"Connections").

``SO_PASSCRED`` makes the kernel attach ``SCM_CREDENTIALS`` (pid, uid, gid of the
sending process, translated into the agent's pid namespace) to every datagram; the job
table attributes messages with those, never with anything the message claims.

Where the socket lives (``phases.socket`` / ``--phase-socket`` override all of this):
``/run/teye/phases.sock`` when the agent may create it (root), else
``$XDG_RUNTIME_DIR/teye/phases.sock``, else ``<tempdir>/teye-<uid>/phases.sock``.  The
socket is mode 0666 so other users' jobs can send: credentials make that safe.  A stale
socket file from an earlier run (a socket nobody receives on) is replaced; a path that
is not a socket, or a socket another agent still receives on, is never touched: for a
configured path that is a ConfigError (exit 2), for the default path the phase collector
reports itself down with the reason and the rest of the agent runs.

The directory of a default location is the agent's own (issue 36): ``$XDG_RUNTIME_DIR/teye`` and
``<tempdir>/teye-<uid>`` must be a real directory (not a symbolic link) owned by the agent's uid that
no one else can write to, else the agent refuses to start (ConfigError, exit 2, naming the directory
and why): another user who made ``/tmp/teye-<uid>`` first could otherwise unlink the socket and receive
every job's datagrams.  ``/run/teye`` is skipped when it is not writable (another user's, as before) and
refused when it is writable by others.  The socket's mode is set through a descriptor of the file bound
(``O_PATH|O_NOFOLLOW``, checked to be a socket of the agent's uid), never by following a path.  Each
collector pass checks that the path still names the socket bound (device and inode,
``Receiver.socket_state``); when it is gone or replaced the pass reports ``teye_collector_up 0`` with
the reason and the agent binds the path again (``PhaseSource``), unless another process now receives
there (then it stays down, saying so).

The receive loop never blocks the sampler: it holds the job table's lock only to apply
one validated message, and it spends at most ``phases.max_messages_per_second`` units of handling a second,
charged by cost (issue 48): each datagram handled costs its measured handling time in ``UNIT_NS`` units (at
least one; a typical datagram one or two, the most expensive shape hundreds).  Past that budget it does not
pause (the kernel's queue is shared by every sender: full, it refuses everyone's datagrams): until what was
spent is paid back it keeps the queue drained (a flood then costs the agent up to a core; docs/phases.md);
draining, it hands on each process's and uid's datagrams up to their share of a slice's budget (estimated
from their size before they are read) and discards the rest unread, charging them to the sender's job
(``JobTable.shed``): one job's flood never makes another lose records (``_shed_until``).  A uid that has
spent more than a slice's budget beyond its share (a leaky bucket per uid) is shed on sight, so a uid
sending expensive datagrams is the first shed.  It waits
on one epoll and reads each round up to PER_ROUND_DGRAM datagrams and PER_ROUND messages of each connection;
``close()`` wakes it with an empty datagram.  A datagram whose
handling raises (a bug) is logged and dropped; the thread and the other datagrams go on.  (Issue 38 removed
the receive loop in C: clients sum fast steps, so a process sends about ten datagrams a second whatever its
step rate, and the Python loop is the only one.)
"""
from __future__ import annotations

import math
import gc
import logging
import os
import select
import socket
import stat
import struct
import tempfile
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

from ..errors import ConfigError, SourceUnavailable
from ..logutil import RateLimitedLog

log = logging.getLogger("teye.phases")

DEFAULT_SOCKET = "/run/teye/phases.sock"
_CRED = struct.Struct("iII")            # struct ucred: pid_t pid; uid_t uid; gid_t gid
_ANC_SIZE = socket.CMSG_SPACE(_CRED.size)
_CRED_SIZE, _unpack_cred = _CRED.size, _CRED.unpack_from
_SOL_SOCKET, _SCM_CREDENTIALS = socket.SOL_SOCKET, socket.SCM_CREDENTIALS
_MAX_PATH = 107                         # sun_path is 108 bytes including the NUL
_SLICE_S = 0.01                         # rate budget granularity
BATCH = 32                              # datagrams handed to handle_batch together, at most
# Once a slice's budget is spent, each process may have this share of a slice's budget handled more in that
# slice, and each uid this share; the rest of a heavy sender's datagrams is discarded (Receiver._shed_until).
SHED_PID_SHARE = 0.125
SHARE_RENEW_S = _SLICE_S                # the shares are renewed each slice while shedding lasts longer
PID_BURST_SLICES = 3                    # a process's share is a bucket of this many slices' shares, refilled at
                                        # one a slice: what it sent at its share while the receive thread was not
                                        # running arrives together, and is not over its share (_shed_until); 3/4
                                        # of its uid's share, so a flooder leaves its uid's other jobs a quarter
SHED_UID_SHARE = 0.5
SHED_MIN = 4                            # ... and at least this many (a client's flush, close and retry)
# What a datagram costs (issue 48): the budget is spent in units of UNIT_NS (40 us) of the receive thread's CPU time handling
# it (decode and apply, measured), at least one unit a datagram; before a datagram is read its cost is estimated
# from its size, one unit per BYTES_PER_UNIT bytes, for the shares of a slice (benchmarks/datagram_cost.py
# measures both: the estimate is below the cost of the expensive shapes, but any of them is over a share).
UNIT_NS = 40_000
BYTES_PER_UNIT = 400
MAX_DEBTORS = 4096                      # uids whose spending is remembered (the rest: none, as a new uid)
RATE_TAU_NS = 100_000_000               # a process's spending rate: units spent, decayed with this time constant
HEAVY_FRACTION = 0.5                    # of an in-debt uid, the processes spending at least this part of its
                                        # heaviest one's rate are shed on sight (Receiver._in_debt)
_thread_ns = time.thread_time_ns
_QLEN_PATH = "/proc/sys/net/unix/max_dgram_qlen"
_QLEN_DEFAULT = 10                      # the kernel's own default, where the sysctl cannot be read
# Connections (issue 48's flood, mended): beside the datagram socket the agent listens on a SOCK_SEQPACKET socket
# at the same path + SEQ_SUFFIX.  Each client's connection is a queue of its own (the kernel bounds it by the
# sender's buffer), where the datagram socket's queue (net.unix.max_dgram_qlen, 10 here) is everyone's: a
# flooder that keeps it full makes other senders find it full, whatever the agent sheds.  The receive thread
# reads PER_ROUND messages from each socket that has some, so a flooding connection waits its turn.
SEQ_SUFFIX = ".seq"                     # = teye_client.reporter.SEQ_SUFFIX
PER_ROUND = 4                           # messages read from one connection per round
PER_ROUND_DGRAM = 16                    # datagrams read from the shared socket per round
MAX_CONNS_PER_UID = 64                  # a uid's connections; one more is refused (its client uses datagrams)
MAX_CONNS = 512                         # all connections (each an open descriptor of the agent's)
_LISTEN_BACKLOG = 64


def default_candidates() -> List[str]:
    """Socket paths tried in order when none is configured (clients use the same list)."""
    out = [DEFAULT_SOCKET]
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        out.append(os.path.join(xdg, "teye", "phases.sock"))
    out.append(os.path.join(tempfile.gettempdir(), f"teye-{os.getuid()}", "phases.sock"))
    return out


def check_own_dir(d: str, run_dir: bool = False) -> bool:
    """Whether the default socket directory ``d`` may hold the agent's socket.

    Raises ConfigError (the agent refuses to start) when ``d`` is a symbolic link or not a directory, or
    is writable by other users, or (except ``/run/teye``, ``run_dir``) is owned by another uid.  Returns
    False for a ``run_dir`` this uid may not write (skip it: another user's, as for a non-root agent)."""
    try:
        st = os.lstat(d)
    except OSError as e:
        raise ConfigError(f"phase socket directory {d}: {e.strerror or e}") from None
    me = os.geteuid()
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"phase socket directory {d} is a symbolic link; refusing it (remove it, or pass "
                          "--phase-socket)")
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"phase socket directory {d} is not a directory; refusing it")
    if st.st_mode & 0o022:
        raise ConfigError(f"phase socket directory {d} is writable by others (owner uid {st.st_uid}, mode "
                          f"{stat.S_IMODE(st.st_mode):04o}); refusing it (remove it, or pass --phase-socket)")
    if st.st_uid != me:
        if run_dir:
            return False
        raise ConfigError(f"phase socket directory {d} is owned by uid {st.st_uid}, not this agent's uid {me}; "
                          "refusing it (remove it, or pass --phase-socket)")
    return True


def _prepare_default_dir(parent: str) -> bool:
    """Create a default socket directory (0755: other users' jobs must reach the socket) and check it."""
    os.makedirs(parent, mode=0o755, exist_ok=True)
    return check_own_dir(parent, run_dir=(parent == os.path.dirname(DEFAULT_SOCKET)))


def _set_mode(path: str, mode: int) -> Tuple[int, int]:
    """chmod the socket just bound at path without following the path: open the file itself (O_PATH,
    O_NOFOLLOW), check it is a socket of this uid, chmod through that descriptor; (dev, inode)."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
            raise ConfigError(f"config key 'phases.socket': {path} was replaced while it was being bound "
                              f"(now uid {st.st_uid}'s, mode {st.st_mode:o}); not changing its mode")
        os.chmod(f"/proc/self/fd/{fd}", mode)      # the inode held by fd (glibc's fchmodat does the same)
        return st.st_dev, st.st_ino
    finally:
        os.close(fd)


def _someone_receives(path: str, kind: int = socket.SOCK_DGRAM) -> bool:
    """True when a process is bound to (datagrams) or listens on (``SOCK_SEQPACKET``) the Unix socket at path:
    a non-blocking connect of that kind succeeds, or fails otherwise than refused or absent (EPROTOTYPE: a
    socket of another kind; EAGAIN: a full backlog, so someone listens): such a path is left alone."""
    probe = socket.socket(socket.AF_UNIX, kind)
    try:
        probe.setblocking(False)
        probe.connect(path)
        return True
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True
    finally:
        probe.close()


def bind_socket(path: str) -> Tuple[socket.socket, Tuple[int, int]]:
    """Bind a credential-passing datagram socket at path, replacing a stale socket file.

    Raises ConfigError naming the problem (missing or unwritable directory, not a socket,
    another agent receiving, path too long).
    """
    if len(os.fsencode(path)) > _MAX_PATH:
        raise ConfigError(f"config key 'phases.socket': path {path!r} is longer than {_MAX_PATH} bytes "
                          "(the Unix socket limit)")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ConfigError(f"config key 'phases.socket': directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"config key 'phases.socket': directory {parent} is not writable by this user")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise ConfigError(f"config key 'phases.socket': {path} exists and is not a socket; not replacing it")
        if _someone_receives(path):
            raise ConfigError(f"config key 'phases.socket': another process (a running teye agent?) receives "
                              f"on {path}; stop it or choose another --phase-socket")
        log.info("replacing stale phase socket %s", path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)  # capped by net.core.rmem_max
        except OSError:
            pass
        sock.bind(path)
        ident = _set_mode(path, 0o666)
    except OSError as e:
        sock.close()
        raise ConfigError(f"config key 'phases.socket': cannot bind {path}: {e.strerror or e}") from None
    except ConfigError:
        sock.close()
        raise
    return sock, ident


def bind_listener(path: str) -> Optional[Tuple[socket.socket, Tuple[int, int]]]:
    """Listen for connections at ``path + SEQ_SUFFIX`` (the datagram socket at ``path`` is bound, so the
    directory is the agent's): (socket, ident), or None, logged, where it cannot (too long a path, a file that
    is not a socket, another agent listening): clients then send datagrams, as to an agent before issue 48."""
    seq = path + SEQ_SUFFIX
    if len(os.fsencode(seq)) > _MAX_PATH:
        log.warning("phase socket %s: no connections (%s would be longer than %d bytes); jobs send datagrams",
                    path, seq, _MAX_PATH)
        return None
    try:
        st = os.lstat(seq)
    except FileNotFoundError:
        st = None
    except OSError as e:
        log.warning("phase socket %s: no connections (%s: %s)", path, seq, e.strerror or e)
        return None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode) or _someone_receives(seq, socket.SOCK_SEQPACKET):
            log.warning("phase socket %s: no connections (%s exists and is %s; not replacing it)", path, seq,
                        "not a socket" if not stat.S_ISSOCK(st.st_mode) else "another process's")
            return None
        try:
            os.unlink(seq)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("phase socket %s: no connections (stale %s: %s)", path, seq, e.strerror or e)
            return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.bind(seq)
        ident = _set_mode(seq, 0o666)
        sock.listen(_LISTEN_BACKLOG)
        sock.setblocking(False)
    except (OSError, ConfigError) as e:
        sock.close()
        log.warning("phase socket %s: no connections (cannot listen on %s: %s)", path, seq,
                    getattr(e, "strerror", None) or e)
        return None
    return sock, ident


def open_socket(configured: Optional[str]) -> Tuple[socket.socket, str, Tuple[int, int]]:
    """Bind the configured path (errors are ConfigError) or the first usable default."""
    if configured:
        sock, ident = bind_socket(configured)
        return sock, configured, ident
    why = []
    for path in default_candidates():
        parent = os.path.dirname(path)
        try:
            if not _prepare_default_dir(parent):
                why.append(f"{parent}: another user's")
                continue
        except OSError as e:
            why.append(f"{parent}: {e.strerror or e}")
            continue
        try:
            sock, ident = bind_socket(path)
        except ConfigError as e:
            if "another process" in str(e):
                # Another agent owns the default socket: clients find that one first, so do not
                # fall back to a path nobody looks at; this agent runs without the phase collector.
                raise SourceUnavailable(f"another process (a running teye agent?) receives on {path}; "
                                        "pass --phase-socket to run a second agent") from None
            why.append(str(e).replace("config key 'phases.socket': ", ""))
            continue
        return sock, path, ident
    raise SourceUnavailable("no usable phase socket location: " + "; ".join(why))


def queue_length(path: str = _QLEN_PATH) -> int:
    """How many datagrams the kernel queues on a Unix datagram socket (net.unix.max_dgram_qlen)."""
    try:
        with open(path) as fh:
            return max(1, int(fh.read().strip()))
    except (OSError, ValueError):
        return _QLEN_DEFAULT


class _Conn(tuple):
    """(data, pid, uid) read from a connection: a queue of its client's own, so its messages are never shed for
    their estimated size while the shared queue is drained, only for what the process spent (_shed_until)."""
    __slots__ = ()


class Receiver:
    """Owns the socket and the receive thread; hands each receive's datagrams to ``handle_batch([(data, pid, uid)])``."""

    def __init__(self, sock: socket.socket, path: str, ident, handle_batch, max_bytes: int, max_rate: int,
                 shed=None, listener: Optional[Tuple[socket.socket, Tuple[int, int]]] = None):
        self.sock = sock
        self._listener, self._listener_ident = listener if listener is not None else (None, None)
        self._conns: Dict[int, Tuple[socket.socket, Optional[int], Optional[int]]] = {}   # fd -> (conn, pid, uid)
        self._uid_conns: Dict[Optional[int], int] = {}   # uid -> its connections
        self.refused_connections = 0                     # over a limit, or from a uid in debt
        self._ep = None
        self.path = path
        self._ident = ident
        self._handle_batch = handle_batch
        self.on_activity: Optional[Callable[[], None]] = None   # called after each round that woke the thread
        self._bufsize = max_bytes + 1          # one byte more, so an oversized datagram is seen as such
        self._per_slice = max(1, int(max_rate * _SLICE_S))
        self._stop = threading.Event()
        self._rlog = RateLimitedLog(log)
        self._thread = threading.Thread(target=self._run, name="teye-phase-receiver", daemon=True)
        self._counts = [0, 0]                  # [datagrams, receives]
        self.shedding_s = 0.0                  # time spent over budget, shedding heavy senders
        self._shed = shed                      # shed({(uid, pid): datagrams}): charge discarded datagrams
        self._spent, self._spent_at = 0.0, time.monotonic_ns()   # the receiver's spending (units), leaky
        self._debts: Dict[int, Tuple[float, int]] = {}            # uid -> (units spent, when), leaky
        self._pid_debts: Dict[int, Tuple[float, int]] = {}        # pid -> (units spent, when), leaky
        self.spent_units: Dict[int, int] = {}                     # uid -> units spent in all (for benchmarks)
        self._pid_rates: Dict[int, Tuple[float, int]] = {}        # pid -> (units spent, when), decaying
        self._heavy: Dict[int, int] = {}                          # uid -> its process spending the most
        self._full_gc_ns, self._gc_t0 = 0, 0                      # this thread's full collections' CPU time
        self._gc_ident: Optional[int] = None                      # (the thread _on_gc times: the receive thread)
        # close()'s wake-up goes to this socket itself, even once its path is gone or another's
        self._waker = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self._waker.connect(path)
        except OSError:
            self._waker.close()
            self._waker = None

    def socket_state(self) -> Optional[str]:
        """None while the path still names the socket this receiver bound, else why not (one line)."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return f"phase socket {self.path} is gone (removed while the agent ran)"
        except OSError as e:
            return f"phase socket {self.path} cannot be checked: {e.strerror or e}"
        if (st.st_dev, st.st_ino) != tuple(self._ident):
            return (f"phase socket {self.path} was replaced (now uid {st.st_uid}'s, mode "
                    f"{stat.S_IMODE(st.st_mode):04o}): jobs' datagrams no longer reach this agent")
        return None

    @property
    def received(self) -> int:
        """Datagrams received so far (the wake-up datagram included)."""
        return self._counts[0]

    @property
    def receives(self) -> int:
        """Receive calls that returned datagrams (wake-ups): received / receives is the datagrams per wake-up."""
        return self._counts[1]

    @property
    def connections(self) -> int:
        """Clients connected now (each sends on a queue of its own)."""
        return len(self._conns)

    def start(self) -> None:
        # One epoll over the datagram socket, the listener and the connections; close() wakes the thread with
        # an empty datagram.
        self.sock.setblocking(False)
        self._ep = select.epoll()
        self._ep.register(self.sock.fileno(), select.EPOLLIN)
        if self._listener is not None:
            self._ep.register(self._listener.fileno(), select.EPOLLIN)
        gc.callbacks.append(self._on_gc)
        self._thread.start()

    def _on_gc(self, phase: str, info: dict) -> None:
        """Time this thread's full collections: one runs in whichever datagram's handling crossed the
        threshold, its cost the whole heap's (a big process's: tens of ms), not that datagram's; the younger
        collections are what the recent datagrams' own allocations cost, and stay theirs."""
        if info.get("generation", 0) < 2 or threading.get_ident() != self._gc_ident:
            return
        if phase == "start":
            self._gc_t0 = _thread_ns()
        elif self._gc_t0:
            self._full_gc_ns += _thread_ns() - self._gc_t0
            self._gc_t0 = 0

    def _receive_round(self):
        """One round, blocking until a socket has something: up to PER_ROUND_DGRAM datagrams of the shared
        socket and PER_ROUND messages of each connection that has some, as [(data, pid, uid)] (pid, uid None: no
        credentials; a connection's are its client's, from SO_PEERCRED); new connections are accepted."""
        batch = []
        for fd, _ev in self._ep.poll():
            if fd == self.sock.fileno():
                for _ in range(PER_ROUND_DGRAM):
                    try:
                        data, anc, _flags, _addr = self.sock.recvmsg(self._bufsize, _ANC_SIZE)
                    except BlockingIOError:
                        break
                    pid = uid = None
                    for lvl, typ, cdata in anc:
                        if lvl == _SOL_SOCKET and typ == _SCM_CREDENTIALS and len(cdata) >= _CRED_SIZE:
                            pid, uid, _gid = _unpack_cred(cdata)
                    batch.append((data, pid, uid))
            elif self._listener is not None and fd == self._listener.fileno():
                self._accept()
            else:
                got = self._conns.get(fd)
                if got is None:
                    continue
                conn, pid, uid = got
                for _ in range(PER_ROUND):
                    try:
                        data = conn.recv(self._bufsize)
                    except BlockingIOError:
                        break
                    except OSError:
                        data = b""
                    if not data:   # the client closed it (what it sent before is read first) or it failed
                        self._drop(fd)
                        break
                    batch.append(_Conn((data, pid, uid)))
        return batch

    def _accept(self) -> None:
        """Accept what connections wait (PER_ROUND a round); refuse, and charge one unit to its uid for, one over
        a limit or from a process in debt: its read side is shut first, so each later send of its client fails
        (EPIPE: it sends datagrams instead) and what it sent before is read, never lost in a closed queue."""
        for _ in range(PER_ROUND):
            try:
                conn, _addr = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as e:   # EMFILE and the like: the client's connect waits in the backlog
                self._rlog.warning("accept", "phase socket %s: accepting a connection failed: %s", self.path, e)
                return
            try:
                pid, uid, _gid = _CRED.unpack(conn.getsockopt(_SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
            except (OSError, struct.error):
                pid = uid = None
            now = time.monotonic_ns()
            n = self._uid_conns.get(uid, 0)
            if (pid is None or n >= MAX_CONNS_PER_UID or len(self._conns) >= MAX_CONNS
                    or self._in_debt(uid, pid, now)):
                self.refused_connections += 1
                self._refuse(conn, pid, uid)
            else:
                conn.setblocking(False)
                self._conns[conn.fileno()] = (conn, pid, uid)
                self._uid_conns[uid] = n + 1
                self._ep.register(conn.fileno(), select.EPOLLIN)
            if uid is not None:
                self._spend(uid, pid, 1, now)

    def _refuse(self, conn: socket.socket, pid, uid) -> None:
        left = []
        try:
            conn.shutdown(socket.SHUT_RD)
            conn.setblocking(False)
            while len(left) < PER_ROUND:   # (a client sends before it learns it was refused: one flush)
                data = conn.recv(self._bufsize)
                if not data:
                    break
                left.append((data, pid, uid))
        except OSError:
            pass
        finally:
            conn.close()
        if left and pid is not None:
            self._take(left)

    def release_listener(self) -> None:
        """Stop listening and remove the listener's file if it is still ours (a rebind's new receiver listens
        there); the connections made go on until close()."""
        sock, self._listener = self._listener, None
        if sock is None:
            return
        try:
            if self._ep is not None:
                self._ep.unregister(sock.fileno())
        except (OSError, ValueError):
            pass
        sock.close()
        _unlink_if(self.path + SEQ_SUFFIX, self._listener_ident)

    def _drop(self, fd: int) -> None:
        conn, _pid, uid = self._conns.pop(fd)
        n = self._uid_conns.get(uid, 0) - 1
        if n > 0:
            self._uid_conns[uid] = n
        else:
            self._uid_conns.pop(uid, None)
        try:
            self._ep.unregister(fd)
        except (OSError, ValueError):
            pass
        conn.close()

    def _run(self) -> None:
        self._gc_ident = threading.get_ident()
        receive = self._receive_round
        while not self._stop.is_set():
            try:
                batch = receive()
                self._counts[0] += len(batch)
                self._counts[1] += 1
            except (socket.timeout, InterruptedError):
                continue
            except OSError as e:
                if self._stop.is_set():
                    break
                self._rlog.warning("recv", "phase socket %s: receive failed: %s", self.path, e)
                self._stop.wait(0.1)
                continue
            if self._stop.is_set():
                break
            if batch:
                try:
                    self._take(batch)
                except Exception as e:  # a bug must not stop the receiver: log it (the rest of that receive is dropped)
                    self._failed(e)
            if self.on_activity is not None:   # (a connection made or closed without a message too)
                self.on_activity()
            over = self._over_budget_s()
            if over > 0:   # over budget: shed the heavy senders' datagrams until what was spent is paid back
                self._shed_until(time.monotonic() + max(over, _SLICE_S / 10), receive)

    # -- the budget, spent by cost ---------------------------------------------------------------
    # Every datagram handled costs what handling it took, in UNIT_NS units (at least one), charged to the
    # receiver's budget (per_slice units per 10 ms slice) and to the sender's uid (its share, SHED_UID_SHARE of
    # that); both are leaky buckets that drain at their rate.  A uid that spent more than a slice's budget
    # beyond its share is shed on sight; once the receiver's own budget is spent, only the senders within
    # their share of what is left are handled (_shed_until).  A cheap datagram costs one unit, the most
    # expensive one found hundreds (docs/phases.md): a uid is charged by what it costs, not by count.

    def _spend(self, uid: Optional[int], pid: Optional[int], cost: int, now_ns: int, own: int = 0) -> None:
        """Charge ``cost`` units to the budget and to the sender's uid and process, and ``own`` (the
        process's share of the handling: a full collection) to the budget alone."""
        rate = self._per_slice / (_SLICE_S * 1e9)
        self._spent = max(0.0, self._spent - (now_ns - self._spent_at) * rate) + cost + own
        self._spent_at = now_ns
        # (a process's bucket drains at its uid's share: a process alone may spend what its uid may)
        for debts, key, share in ((self._debts, uid, SHED_UID_SHARE), (self._pid_debts, pid, SHED_UID_SHARE)):
            if key is None:
                continue
            units, at = debts.get(key, (0.0, now_ns))
            units = max(0.0, units - (now_ns - at) * rate * share) + cost
            if key in debts or len(debts) < MAX_DEBTORS:
                debts[key] = (units, now_ns)
        if uid is not None and (uid in self.spent_units or len(self.spent_units) < MAX_DEBTORS):
            self.spent_units[uid] = self.spent_units.get(uid, 0) + cost
        if pid is not None and (pid in self._pid_rates or len(self._pid_rates) < MAX_DEBTORS):
            lately = self._rate(pid, now_ns) + cost
            self._pid_rates[pid] = (lately, now_ns)
            if uid is not None:   # the uid's process spending the most
                heavy = self._heavy.get(uid)
                if heavy != pid and (heavy is None or lately > self._rate(heavy, now_ns)):
                    if heavy is not None or len(self._heavy) < MAX_DEBTORS:
                        self._heavy[uid] = pid

    def _rate(self, pid: int, now_ns: int) -> float:
        """What ``pid`` spent lately: its units, each decayed by RATE_TAU_NS since it was spent."""
        got = self._pid_rates.get(pid)
        if got is None:
            return 0.0
        units = got[0] * math.exp((got[1] - now_ns) / RATE_TAU_NS)
        if units < 0.5:
            del self._pid_rates[pid]
            return 0.0
        return units

    def _debt(self, debts: Dict[int, Tuple[float, int]], key: int, share: float, now_ns: int) -> float:
        got = debts.get(key)
        if got is None:
            return 0.0
        # (a debt charged after now_ns, by a datagram handled since, is as it was then: never grown by it)
        units = got[0] - max(0, now_ns - got[1]) * self._per_slice / (_SLICE_S * 1e9) * share
        if units <= 0:
            del debts[key]
            return 0.0
        return units

    def _in_debt(self, uid: int, pid: int, now_ns: int) -> bool:
        """Shed on sight: a process that spent more than a slice's budget beyond its uid's share, or one that is
        spending (more than SHED_MIN units beyond it) for a uid that did, at a rate near its heaviest process's
        (HEAVY_FRACTION of it, over RATE_TAU_NS): 64 processes of one uid share one uid's share, while a job
        that spends a fraction of what its uid's flooding process does is not held back by that flood (a
        uid's jobs that spend alike are held back alike: they may stop one another anyway)."""
        per_slice = self._per_slice
        pid_debt = self._debt(self._pid_debts, pid, SHED_UID_SHARE, now_ns)
        if pid_debt > per_slice:
            return True
        if pid_debt <= SHED_MIN:
            return False
        if self._debt(self._debts, uid, SHED_UID_SHARE, now_ns) <= per_slice:
            return False
        heavy = self._heavy.get(uid)
        return heavy is None or heavy == pid or self._rate(pid, now_ns) >= HEAVY_FRACTION * self._rate(heavy, now_ns)

    def _over_budget_s(self) -> float:
        """Seconds until the receiver's spending is paid back, where it spent more than one slice's budget."""
        spent = self._spent - (time.monotonic_ns() - self._spent_at) * self._per_slice / (_SLICE_S * 1e9)
        return spent / self._per_slice * _SLICE_S if spent >= self._per_slice else 0.0

    def _handle_one(self, item) -> int:
        """Handle one datagram, charge its measured cost; the cost in units."""
        t0, gc0 = _thread_ns(), self._full_gc_ns   # the thread's CPU time: not the scheduler's preemptions
        self._handle_batch([item])
        full_gc = self._full_gc_ns - gc0           # (a full collection is the process's: _on_gc)
        cost = max(1, (_thread_ns() - t0 - full_gc) // UNIT_NS)
        self._spend(item[2], item[1], cost, time.monotonic_ns(), full_gc // UNIT_NS)
        return cost

    def _take(self, batch) -> None:
        """The datagrams of one receive, within the budget: each handled and charged, except, while the receiver
        is busy, those of a process in debt (_in_debt), discarded unread and charged as shed."""
        shed: Dict[Tuple[int, int], int] = {}
        for item in batch:
            pid, uid = item[1], item[2]
            if pid is not None and self._in_debt(uid, pid, time.monotonic_ns()):
                shed[(uid, pid)] = shed.get((uid, pid), 0) + 1
                continue
            self._handle_one(item)
        if shed and self._shed is not None:
            self._shed(shed)

    def _shed_until(self, end: float, receive) -> None:
        """Over budget, until ``end``: keep the queue drained so that no other sender finds it full, hand on
        (to ``handle_batch``) the datagrams of senders within their share of a slice's budget in cost units
        (``SHED_PID_SHARE`` per process, ``SHED_UID_SHARE`` per uid, each slice: a datagram counts against them
        as one unit per BYTES_PER_UNIT bytes, an estimate known before it is read; its measured cost is what the
        budget and the debts are charged), and discard the others
        unread, counted by (uid, pid) for ``shed`` (the job table charges them to the sender's job)."""
        tokens: Dict[int, Tuple[float, float]] = {}   # pid -> (its share left, when): a bucket (PID_BURST_SLICES)
        per_pid_n: Dict[int, int] = {}   # datagrams handed on per process this slice
        per_uid: Dict[int, int] = {}
        pid_cap = max(SHED_MIN, int(self._per_slice * SHED_PID_SHARE))
        burst, refill = PID_BURST_SLICES * pid_cap, pid_cap / SHARE_RENEW_S
        uid_cap = max(4 * SHED_MIN, int(self._per_slice * SHED_UID_SHARE))
        start = time.monotonic()
        slice_end = start + SHARE_RENEW_S
        while not self._stop.is_set():
            try:
                batch = receive()
            except (socket.timeout, InterruptedError):
                continue
            except OSError:
                break   # the main loop reports it
            self._counts[0] += len(batch)
            self._counts[1] += 1
            if self._stop.is_set():
                break   # close()'s wake-up
            t = time.monotonic()
            late = t >= end   # it came after the slice (a quiet socket): the next slice's
            if t >= slice_end:   # the shares are a slice's: a long spell of shedding renews them each slice
                per_pid_n.clear()
                per_uid.clear()
                slice_end = t + SHARE_RENEW_S
            shed: Dict[Tuple[int, int], int] = {}
            try:
                for item in batch:
                    now = time.monotonic_ns()   # (each: the items before it were handled meanwhile)
                    pid, uid = item[1], item[2]
                    if pid is None or late or type(item) is _Conn:
                        # no credentials (counted as such by handle()), not this slice's, or a connection's: its
                        # queue is its own (a backlog of a job whose messages waited while this thread did not
                        # run is not a flood), it waits its turn each round, and it is shed once in debt
                        self._take([item])
                        continue
                    est = max(1, len(item[0]) // BYTES_PER_UNIT)
                    left, at = tokens.get(pid, (burst, t))
                    left, nu = min(burst, left + (t - at) * refill), per_uid.get(uid, 0) + est
                    # (a process's first SHED_MIN datagrams of a slice pass its share whatever their size, unless it
                    # is in debt: a job alone sending large datagrams is not shed because the receiver is busy with
                    # them, nor one whose flush, retry of what a full queue refused and close come together; a
                    # flooding process is in debt after its first expensive ones; its uid's share still holds.
                    # Its share is a bucket: a job's datagrams that waited in the queue together while this
                    # thread did not run (a busy machine) pass, a flood past the bucket does not)
                    if ((est > left and per_pid_n.get(pid, 0) >= SHED_MIN) or (nu > uid_cap and uid in per_uid)
                            or self._in_debt(uid, pid, now)):
                        shed[(uid, pid)] = shed.get((uid, pid), 0) + 1
                        tokens[pid] = (left, t)
                    else:   # (the shares count the estimate: what contention adds to a cost is no one's)
                        self._handle_one(item)
                        tokens[pid], per_uid[uid] = (left - est, t), nu
                        per_pid_n[pid] = per_pid_n.get(pid, 0) + 1
                if shed and self._shed is not None:   # charged once per receive, before the next may block
                    self._shed(shed)
            except Exception as e:  # as in _run: a bug must not stop the receiver
                self._failed(e)
            if late or time.monotonic() >= end:
                break
        self.shedding_s += time.monotonic() - start

    def _failed(self, error: BaseException) -> None:
        self._rlog.error("handle", "phase socket %s: handling a datagram failed (dropped): %r", self.path, error,
                         exc_info=error)

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the thread, close the socket and remove the socket file if it is still ours."""
        self._stop.set()
        try:
            gc.callbacks.remove(self._on_gc)
        except ValueError:
            pass   # never started
        if self._thread.is_alive() and self._waker is not None:
            try:
                self._waker.settimeout(1.0)
                self._waker.send(b"")
            except OSError:
                pass  # the queue stayed full: the thread is busy and sees the flag
            self._thread.join(timeout_s)
        if self._waker is not None:
            self._waker.close()
        for fd in list(self._conns):
            self._drop(fd)
        if self._ep is not None:
            self._ep.close()
        self.sock.close()
        _unlink_if(self.path, self._ident)
        self.release_listener()


def _unlink_if(path: str, ident) -> None:
    """Remove the socket file at path where it is still the one bound (device, inode)."""
    try:
        st = os.stat(path)
        if ident is not None and (st.st_dev, st.st_ino) == tuple(ident):
            os.unlink(path)
    except OSError:
        pass
