"""HTTP(S) endpoint: /metrics (Prometheus text or OpenMetrics), / (landing page), /healthz.

One event-loop thread owns every connection (a selector, not a thread per connection), so
slow or idle clients cost a few kilobytes each, never a thread.  Rendering runs on a small fixed
pool of worker threads, bcrypt on a thread of its own.  The bounds (``web.*`` in the config):

- ``max_connections`` open connections, clamped below the process's fd limit (RLIMIT_NOFILE
  minus the fds open when the server starts, minus :data:`FD_RESERVE` for what opens later).  When the
  table is full, a new connection evicts the one that has waited longest for its request
  (a half-sent request or an idle keep-alive), so connections that hold without asking can
  never lock a scraper out; a connection being answered is never evicted.
- ``header_timeout_seconds``: the TLS handshake and the request head must arrive within it.
- ``idle_timeout_seconds``: an idle keep-alive connection is closed after it.
- ``write_timeout_seconds``: a client that stops reading its response is dropped.
- ``max_requests``: concurrent /metrics renders (as node_exporter's ``--web.max-requests``);
  beyond it a scrape gets 503 at once.
- ``max_header_bytes``: a longer request head gets 431.

TLS, basic auth, security headers and rate limiting come from the exporter-toolkit web
configuration file (:mod:`exporters.webconfig`).  /healthz answers without credentials (it
carries no data) so liveness probes need none.

Basic auth cannot be used to starve the scrape (issue 36):

- a credential verified before is recognised on the event loop (a SHA-256 and a dict lookup) and
  the request goes straight to its render: it never queues behind password hashing, as
  exporter-toolkit answers it from its cache without taking its bcrypt lock;
- a credential neither cache holds is hashed on :data:`HASH_THREADS` thread(s) of its own (never the
  render pool), with at most ``max_auth_hashes`` credentials waiting or hashing in all and
  ``max_auth_hashes_per_client`` from one client address; beyond them the request is refused at once
  (429 for the client's bound, 503 for the server's) without hashing.  The same credential sent on
  several connections at once is hashed once;
- wrong passwords are remembered apart from verified ones (:class:`exporters.webconfig.WebConfig`), so
  they never evict a good credential;
- with basic auth on, ``rate_limit`` is charged after authentication: only requests with a valid
  credential spend its tokens, so clients that never authenticate cannot spend it to refuse the
  ones that do.  Without users it applies to every request, as exporter-toolkit's does.

Malformed requests, unknown methods and paths get a 4xx; a client that goes away mid-response
costs one debug line.  Requests, refusals, evictions, timeouts, failed handshakes and logins are
counted in a :class:`exporters.webstats.WebStats` that /metrics exports (``teye_web_*``).
"""
from __future__ import annotations

import asyncio
import errno
import logging
import os
import re
import resource
import socket
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, Iterable, List, Optional, Tuple

if TYPE_CHECKING:   # never imported by the agent: prometheus_client's package brings http.server and email
    from prometheus_client.registry import CollectorRegistry

from agent import heap
from agent.logutil import RateLimitedLog

from .render import render as render_exposition
from .webconfig import WebConfig, parse_basic_auth
from .webstats import WebStats, tls_reason

log = logging.getLogger("teye.http")
_rlog = RateLimitedLog(log)

LANDING = b"""<!doctype html>
<html><head><title>teye agent</title></head>
<body><h1>teye agent</h1>
<p>Per-node monitoring for GPU training clusters.</p>
<ul><li><a href="metrics">/metrics</a> (Prometheus)</li><li><a href="healthz">/healthz</a></li></ul>
</body></html>
"""
TEXT = "text/plain; charset=utf-8"
# File descriptors kept free, beyond those open at start, for what opens later: /proc and /sys
# reads (one at a time per collector thread), a GPU coming back (NVML opens its device nodes),
# the render workers, logs.
FD_RESERVE = 64
WORKER_THREADS = 4              # renders
HASH_THREADS = 1                # bcrypt checks at a time (each ~60 ms at cost 10): one core at most
MAX_HEADERS = 100
MAX_DISCARDED_BODY = 65536
LINGER_S = 1.0                  # after the answer, unread client bytes are read for at most this long
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
           413: "Content Too Large", 500: "Internal Server Error", 429: "Too Many Requests", 431: "Request Header Fields Too Large",
           503: "Service Unavailable"}
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")   # in a header value: NUL and the other controls (HTAB allowed)
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")

# render(accept, accept_encoding) -> (body, content type, extra headers): the one place the
# /metrics body is produced.
Render = Callable[[str, str], Tuple[bytes, str, List[Tuple[str, str]]]]


def registry_renderer(registry: "CollectorRegistry") -> Render:
    """The /metrics body from a registry: text or OpenMetrics by Accept, gzip when asked for.

    teye's registry carries a prepared exposition (exporters.render), so a scrape joins bytes
    formatted once per source reading; any other registry goes through prometheus_client.
    """
    def render(accept: str, accept_encoding: str):
        return render_exposition(registry, accept, accept_encoding)
    return render


@dataclass(frozen=True)
class Limits:
    max_connections: int = 4096
    max_requests: int = 40
    header_timeout_seconds: float = 10.0
    idle_timeout_seconds: float = 120.0
    write_timeout_seconds: float = 30.0
    max_header_bytes: int = 16384
    # credentials waiting for or in a bcrypt check: in all, and from one client address (beyond: refused at
    # once, 503 and 429; a credential verified before never waits for either)
    max_auth_hashes: int = 8
    max_auth_hashes_per_client: int = 2
    # a request refused by those bounds is answered after this delay (the connection evictable meanwhile), so a
    # keep-alive client looping on refusals costs the event loop one answer a second, not thousands
    auth_throttle_delay_seconds: float = 1.0
    # TLS (issue 48): handshakes under way at once (a new one beyond closes the oldest: a half handshake holds
    # a slot no longer than the next connection needs it), and how long an idle keep-alive TLS connection stays
    tls_max_handshakes: int = 64
    tls_idle_timeout_seconds: float = 30.0
    # descriptors sources will open after the server starts (the pmu collector's perf events are
    # opened by its first read, in the sampler's thread), kept out of the connection budget
    reserved_fds: int = 0

    @classmethod
    def from_config(cls, web: Dict) -> "Limits":
        return cls(**{k: web[k] for k in cls.__dataclass_fields__ if k in web})


def open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def fd_budget(wanted: int, reserved: int = 0) -> int:
    """Connections this process can hold: ``wanted``, at most the soft RLIMIT_NOFILE minus the fds open
    now (sources, NVML), minus ``reserved`` (fds sources will open later: perf events), minus FD_RESERVE."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - open_fds() - reserved - FD_RESERVE))


class _BadRequest(Exception):
    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code


class _Request:
    __slots__ = ("method", "path", "version", "headers")

    def __init__(self, method: str, path: str, version: str, headers: Dict[str, str]):
        self.method, self.path, self.version, self.headers = method, path, version, headers

    def keep_alive(self) -> bool:
        conn = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in conn
        return "close" not in conn


def parse_head(head: bytes) -> _Request:
    """Request line and headers (without the final blank line) -> _Request, or _BadRequest."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise _BadRequest(400, "malformed request line")
    method, target, version = parts
    if not method or not set(method) <= _TOKEN:
        raise _BadRequest(400, "malformed method")
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise _BadRequest(400, f"unsupported protocol version {version[:16]!r}")
    if not target.startswith("/") or any(c <= " " or c == "\x7f" for c in target):
        raise _BadRequest(400, "malformed request target")
    if len(lines) - 1 > MAX_HEADERS:
        raise _BadRequest(431, "too many header fields")
    headers: Dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or not set(name) <= _TOKEN:
            raise _BadRequest(400, "malformed header field")
        name = name.lower()
        value = value.strip(" \t")
        if _CONTROL.search(value):
            raise _BadRequest(400, f"a control character in the {name[:40]} header field")
        if name in headers:
            if name in ("content-length", "host", "authorization"):
                raise _BadRequest(400, f"repeated {name} header")
            value = headers[name] + ", " + value
        headers[name] = value
    if version == "HTTP/1.1" and "host" not in headers:
        raise _BadRequest(400, "missing Host header")
    return _Request(method, target.split("?", 1)[0], version, headers)


class _Timeout(asyncio.TimeoutError):
    """A timeout of one kind (header, idle, write), for teye_web_timeouts_total."""

    def __init__(self, kind: str):
        super().__init__(kind)
        self.kind = kind


async def _within(aw, seconds: float, kind: str):
    try:
        return await asyncio.wait_for(aw, seconds)
    except asyncio.TimeoutError:
        raise _Timeout(kind) from None


def _unlink(e: BaseException) -> None:
    """Drops the tracebacks of a connection's ending exception and of those it came from.  The exception is
    also held by the connection's StreamReader and futures (asyncio stores what connection_lost reported, and
    raises that object), and its traceback holds the frames that hold the reader: a cycle, freed only by the
    cyclic GC's rare full pass.  So each closed TLS connection kept its SSL object, buffers and 57 Python
    objects (33 MiB for 1,000) long after the trims meant to hand them back (issue 48)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        e.__traceback__ = None
        e = e.__context__ or e.__cause__


class _Conn:
    __slots__ = ("task", "sock", "transport", "peer")

    def __init__(self, sock: socket.socket, peer: str = ""):
        self.sock = sock
        self.peer = peer            # the client's address: the unit of the per-client hashing bound
        self.task: Optional[asyncio.Task] = None
        self.transport: Optional[asyncio.BaseTransport] = None

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
        else:
            self.sock.close()


# asyncio's SSLProtocol reads the socket into a buffer of max_size (256 KiB) allocated per connection at its
# start: 1,000 half handshakes held 250 MiB.  A TLS record is at most 16 KiB + 2 KiB; reading in 16 KiB pieces
# costs one more recv per record at most.  Used where asyncio's SSLProtocol has the shape this relies on
# (max_size, _app_transport: Python 3.11+), else asyncio's own (TLS_READ_BUFFER unused, said at start).
TLS_READ_BUFFER = 16 * 1024


def _small_buffer_ssl_protocol():
    try:
        from asyncio import sslproto
        base = sslproto.SSLProtocol
    except (ImportError, AttributeError):
        return None
    if not isinstance(getattr(base, "max_size", None), int) or "_app_transport" not in base.__init__.__code__.co_names:
        return None
    return type("SmallBufferSSLProtocol", (base,), {"max_size": TLS_READ_BUFFER})


_SSLProtocol = _small_buffer_ssl_protocol()


class _NoTLS(Exception):
    """Stands for ssl.SSLError in the except clauses below where the process never imported ssl (no TLS is
    served: exporters/lean.py kept OpenSSL out of it); nothing raises it."""


def _ssl_error() -> type:
    """ssl.SSLError where ssl is loaded (a TLS server imported it, at the latest when its web config was
    read), else _NoTLS: this module never imports ssl itself."""
    mod = sys.modules.get("ssl")
    return getattr(mod, "SSLError", _NoTLS)


SSLError = _ssl_error()
TRIM_EVERY_S = 5.0              # after many connections closed, glibc's free pages handed back at most this often
TRIM_AFTER_CLOSED = 64          # ... once this many closed since the last trim and the table is down to a quarter


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); OSError (port in use, no such address) with nothing left open."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(min(socket.SOMAXCONN, 1024))
    except OSError:
        sock.close()
        raise
    return sock


class MetricsServer:
    """Binds at construction (so a port in use or a bad web config fails early), serves after start()."""

    def __init__(self, host: str, port: int, render: Render,
                 health: Callable[[], Optional[str]] = lambda: None,
                 web: Optional[WebConfig] = None, limits: Limits = Limits(), stats: Optional[WebStats] = None,
                 listener: Optional[socket.socket] = None, posts: Optional[Dict[str, Tuple[Callable, int]]] = None):
        """``stats``: where the server counts its requests, timeouts and failures (teye's registry formats
        it: see :func:`exporters.prometheus.make_registry`); a private one when not given.  ``listener``: a
        socket :func:`bind_listener` bound earlier (the agent binds its port before it opens anything else).
        ``posts``: path -> (handler(body) -> (status, JSON bytes), the most body bytes): the paths that take a POST
        (the trace webhook), answered only to a valid basic-auth credential (403 where the web config has none)."""
        self._posts = dict(posts or {})
        self._render = render
        self._health = health
        self._web = web or WebConfig(None)
        global SSLError
        SSLError = _ssl_error()   # (TLS: the web config imported ssl)
        self.limits = limits
        self.max_connections = fd_budget(limits.max_connections, limits.reserved_fds)
        if self.max_connections < limits.max_connections:
            log.warning("web.max_connections %d lowered to %d: the fd limit is %d (raise LimitNOFILE)",
                        limits.max_connections, self.max_connections,
                        resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        self._sock = listener if listener is not None else bind_listener(host, port)
        self._sock.setblocking(False)
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(self._on_loop_error)
        self._pool = ThreadPoolExecutor(max_workers=WORKER_THREADS, thread_name_prefix="teye-http-worker")
        self._hash_pool = ThreadPoolExecutor(max_workers=HASH_THREADS, thread_name_prefix="teye-http-bcrypt")
        self._hashing: Dict[bytes, asyncio.Future] = {}    # credential key -> its bcrypt check under way
        self._hashes_by_client: Dict[str, int] = {}         # client address -> its checks under way
        self._conns: Dict[_Conn, None] = {}
        self.stats = stats if stats is not None else WebStats()
        self.stats.attach(self._conns, self.max_connections, self._web)
        self._waiting: "OrderedDict[_Conn, None]" = OrderedDict()  # evictable, longest waiting first
        self._handshaking: "OrderedDict[_Conn, None]" = OrderedDict()  # TLS handshakes under way, oldest first
        self._peak = 0                    # the most connections open since the last trim
        self._closed_since_trim = 0
        self._trim_at = 0.0
        self._trim_pending = False
        self.trims = 0                    # malloc_trim calls after peers left (tests read it)
        self._renders = 0
        self._tokens: Optional[float] = None  # the bucket starts full
        self._tokens_at = time.monotonic()
        self._thread: Optional[threading.Thread] = None
        self._main: Optional[asyncio.Task] = None

    @property
    def address(self):
        return self._sock.getsockname()[:2]

    @property
    def scheme(self) -> str:
        return "https" if self._web.tls_enabled else "http"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="teye-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._loop.call_soon_threadsafe(self._shutdown)
            self._thread.join(10)
        self._sock.close()
        self._pool.shutdown(wait=False)
        self._hash_pool.shutdown(wait=False)

    # -- event loop ---------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._main = self._loop.create_task(self._accept_loop())
        try:
            self._loop.run_until_complete(self._main)
        except asyncio.CancelledError:
            pass
        finally:
            # every task of the loop, not only the connections' (a wait_for's inner task, a handshake): one left
            # pending when the loop closes is logged as destroyed whenever the collector finds it, in whatever
            # runs then (a later test's log: CI saw it once)
            for _ in range(3):
                pending = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
                if not pending:
                    break
                for t in pending:
                    t.cancel()
                self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()

    def _shutdown(self) -> None:
        if self._main is not None:
            self._main.cancel()

    def _on_loop_error(self, loop, context) -> None:
        exc = context.get("exception")
        if isinstance(exc, (OSError, SSLError)):
            log.debug("http: %s: %s", context.get("message"), exc)
        else:
            _rlog.error("loop", "http: %s", context.get("message"), exc_info=exc)

    async def _accept_loop(self) -> None:
        while True:
            # sock_accept returns without yielding while the backlog is non-empty: yield once per
            # connection so that evicted connections release their fds and new ones start reading.
            await asyncio.sleep(0)
            try:
                sock, addr = await self._loop.sock_accept(self._sock)
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    _rlog.warning("accept", "http: accept failed (%s); closing the longest-waiting connection",
                                  e.strerror)
                    if not self._evict():
                        await asyncio.sleep(0.05)
                continue
            if len(self._conns) >= self.max_connections and not self._evict():
                _rlog.warning("full", "http: %d connections all busy answering; refusing a new one",
                              len(self._conns))
                self.stats.refused += 1
                sock.close()
                continue
            # Responses are written whole: no reason to wait (Nagle) for the ACK of the TLS session
            # tickets sent just before, which the client delays by 40 ms.
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # reset before we got to it
                sock.close()
                continue
            self._start_conn(sock, addr)   # (not a local here: this frame waits in accept, and would keep the last
                                           # connection alive after it closed)

    def _start_conn(self, sock: socket.socket, addr) -> None:
        conn = _Conn(sock, str(addr[0]) if isinstance(addr, tuple) and addr else "")
        self._conns[conn] = None
        self._waiting[conn] = None
        conn.task = self._loop.create_task(self._serve(conn))
        conn.task.add_done_callback(lambda _t, c=conn: self._closed(c))

    def _closed(self, conn: _Conn) -> None:
        """A connection's task ended (answered, timed out, failed, evicted or never started)."""
        self._conns.pop(conn, None)
        self._waiting.pop(conn, None)
        self._handshaking.pop(conn, None)
        conn.abort()
        # the task holds what ended it (a cancelled one its CancelledError), whose traceback holds _serve's
        # frame, which holds conn: without this edge gone the whole connection waits for the cyclic GC
        conn.task = conn.transport = None
        self._closed_since_trim += 1
        self._maybe_trim()

    def _maybe_trim(self) -> None:
        """Once many connections have closed and the table is down to a quarter of its peak, hand glibc's free
        pages back to the kernel (malloc_trim: agent/heap.py): what peers' connections held is returned, not
        kept by the allocator for ever.  At most every TRIM_EVERY_S; a few ms on the event loop."""
        n = len(self._conns)
        self._peak = max(self._peak, n + 1)
        if self._closed_since_trim < TRIM_AFTER_CLOSED or n > self._peak // 4:
            return
        now = time.monotonic()
        if now - self._trim_at < TRIM_EVERY_S:
            if not self._trim_pending:
                self._trim_pending = True
                self._loop.call_later(TRIM_EVERY_S - (now - self._trim_at), self._trim_later)
            return
        self._trim_at = now
        self._closed_since_trim = 0
        self._peak = n
        heap.trim()
        self.trims += 1

    def _trim_later(self) -> None:
        self._trim_pending = False
        self._maybe_trim()

    def _evict(self) -> bool:
        """Close the connection that has waited longest for a request; False if none is waiting."""
        if not self._waiting:
            return False
        conn, _ = self._waiting.popitem(last=False)
        self._conns.pop(conn, None)
        self.stats.evicted += 1
        if conn.transport is not None:
            conn.transport.abort()  # frees the fd now; mid-handshake, cancelling the task does
        if conn.task is not None:
            conn.task.cancel()
        log.debug("http: connection table full, closed the longest-waiting connection")
        return True

    def _set_waiting(self, conn: _Conn, waiting: bool) -> None:
        if waiting:
            self._waiting[conn] = None
            self._waiting.move_to_end(conn)
        else:
            self._waiting.pop(conn, None)

    def _rate_limited(self, interval: float, burst: int) -> bool:
        if interval <= 0:
            return False
        now = time.monotonic()
        full = float(max(burst, 1))
        tokens = full if self._tokens is None else self._tokens
        self._tokens = min(full, tokens + (now - self._tokens_at) / interval)
        self._tokens_at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return False
        return True

    # -- one connection -----------------------------------------------------------------------

    async def _serve(self, conn: _Conn) -> None:
        lim = self.limits
        settings = self._web.current()
        reader = asyncio.StreamReader(limit=lim.max_header_bytes, loop=self._loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=self._loop)
        stats = self.stats
        try:
            tls = settings.tls
            if tls and not await _within(self._looks_like_tls(conn.sock), lim.header_timeout_seconds, "header"):
                stats.tls_failure("plain_http")
                return
            try:
                # asyncio's own handshake deadline is set later than ours, so a slow handshake is always
                # our header timeout (not a ConnectionAbortedError looking like a client gone away)
                if tls:
                    self._handshake_slot(conn)
                    try:
                        transport = await _within(self._tls_accept(conn.sock, protocol, tls.context),
                                                  lim.header_timeout_seconds, "header")
                    finally:
                        self._handshaking.pop(conn, None)
                else:
                    transport, _ = await _within(self._loop.connect_accepted_socket(lambda: protocol, conn.sock),
                                                 lim.header_timeout_seconds, "header")
            except _Timeout:
                raise
            except (SSLError, OSError, EOFError) as e:  # (TimeoutError is an OSError)
                if tls:
                    stats.tls_failure(tls_reason(e))
                raise
            conn.transport = transport
            writer = asyncio.StreamWriter(transport, protocol, reader, self._loop)
            if tls and tls.allowed_sans and not self._san_allowed(writer, tls.allowed_sans):
                log.debug("http: client certificate SAN not in client_allowed_sans; closing")
                stats.tls_failure("client_certificate")
                return
            first = True
            while True:
                self._set_waiting(conn, True)
                head = await self._read_head(reader, first)
                if head is None:
                    return
                first = False
                self._set_waiting(conn, False)
                stats.in_flight += 1
                try:
                    keep = await self._answer(head, reader, writer, conn)
                finally:
                    stats.in_flight -= 1
                if not keep:
                    await self._linger(reader, writer)
                    writer.close()  # flushes what is buffered (TLS: then close_notify) before closing
                    await _within(writer.wait_closed(), lim.write_timeout_seconds, "write")
                    return
        except _Timeout as e:
            stats.timeout(e.kind)
            log.debug("http: connection timed out (%s)", e.kind)
            _unlink(e)
        except (ConnectionError, SSLError, OSError, asyncio.IncompleteReadError) as e:
            log.debug("http: client went away: %s", e.__class__.__name__)
            _unlink(e)

    def _handshake_slot(self, conn: _Conn) -> None:
        """Take a TLS handshake slot; where all tls_max_handshakes are taken, the oldest handshake is closed to
        make room (a client that completes its handshake needs milliseconds; one that holds it half done is the
        first to go, and its buffers with it)."""
        while len(self._handshaking) >= self.limits.tls_max_handshakes:
            old, _ = self._handshaking.popitem(last=False)
            self._conns.pop(old, None)
            self._waiting.pop(old, None)
            self.stats.evicted += 1
            old.abort()
            if old.task is not None:
                old.task.cancel()
        self._handshaking[conn] = None

    async def _tls_accept(self, sock: socket.socket, protocol, context: "ssl.SSLContext"):
        """The TLS handshake on an accepted socket; the app-level transport.  With asyncio's SSLProtocol of the
        shape known here, through one whose read buffer is TLS_READ_BUFFER (not 256 KiB per connection)."""
        timeout = self.limits.header_timeout_seconds + 1
        if _SSLProtocol is None:
            transport, _ = await self._loop.connect_accepted_socket(
                lambda: protocol, sock, ssl=context, ssl_handshake_timeout=timeout)
            return transport
        waiter = self._loop.create_future()
        proto = _SSLProtocol(self._loop, protocol, context, waiter, server_side=True,
                             ssl_handshake_timeout=timeout)
        raw, _ = await self._loop.connect_accepted_socket(lambda: proto, sock)
        try:
            await waiter
        except BaseException:
            raw.close()
            raise
        return proto._app_transport

    async def _looks_like_tls(self, sock: socket.socket) -> bool:
        """Wait for the first byte without consuming it; a plain HTTP request gets a 400 (as Go's
        servers answer it) instead of a failed handshake."""
        await self._readable(sock)
        first = sock.recv(1, socket.MSG_PEEK)
        if first[:1] == b"\x16" or not first:  # a TLS handshake record, or closed (the handshake reports it)
            return True
        log.debug("http: plain HTTP on the TLS port")
        try:
            sock.send(b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
                      b"Client sent an HTTP request to an HTTPS server.\n")
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            return False
        # The request is still unread: closing now would reset the connection and could destroy the 400
        # before the client reads it.  Read what the client sends (as _linger does), then close.
        left = MAX_DISCARDED_BODY
        deadline = self._loop.time() + LINGER_S
        while left > 0:
            try:
                await asyncio.wait_for(self._readable(sock), deadline - self._loop.time())
                got = sock.recv(min(left, 65536))
            except (BlockingIOError, InterruptedError):
                continue
            except (asyncio.TimeoutError, OSError):
                break
            if not got:
                break
            left -= len(got)
        return False

    async def _readable(self, sock: socket.socket) -> None:
        """Wait until the raw (not yet wrapped) socket has something to read, or is closed."""
        ready = self._loop.create_future()
        self._loop.add_reader(sock.fileno(), lambda: ready.done() or ready.set_result(None))
        try:
            await ready
        finally:
            self._loop.remove_reader(sock.fileno())

    async def _linger(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Close after the response: send FIN, then read what the client still sends (at most 1 s,
        64 KiB) so that unread request bytes do not turn the close into a reset that loses the answer."""
        if not writer.can_write_eof():  # TLS has no half-close; its close_notify ends the session
            return
        writer.write_eof()
        try:
            await asyncio.wait_for(reader.read(MAX_DISCARDED_BODY), LINGER_S)
        except (asyncio.TimeoutError, asyncio.LimitOverrunError, ValueError):
            pass

    @staticmethod
    def _san_allowed(writer: asyncio.StreamWriter, allowed: Iterable[str]) -> bool:
        sslobj = writer.get_extra_info("ssl_object")
        cert = sslobj.getpeercert() if sslobj is not None else None
        sans = {v for _, v in (cert or {}).get("subjectAltName", ())}
        return bool(sans & set(allowed))

    async def _read_head(self, reader: asyncio.StreamReader, first: bool):
        """The request head, or None when the client closed (or idled out) between requests."""
        lim = self.limits
        if first:
            start = b""
        else:
            idle = lim.idle_timeout_seconds
            if self._web.tls_enabled:   # an idle TLS session holds more than a socket: it goes sooner
                idle = min(idle, lim.tls_idle_timeout_seconds)
            try:
                start = await asyncio.wait_for(reader.readexactly(1), idle)
            except asyncio.TimeoutError:
                self.stats.timeout("idle")
                return None
            except asyncio.IncompleteReadError:
                return None
        try:
            return await _within(self._head_lines(reader, start), lim.header_timeout_seconds, "header")
        except asyncio.IncompleteReadError as e:
            if first and not e.partial and not start:
                return None  # connected and closed without a request
            raise
        except asyncio.LimitOverrunError:
            return _BadRequest(431, "request head too large")

    async def _head_lines(self, reader: asyncio.StreamReader, start: bytes):
        """The request head line by line, without its final blank line; a line ending in a bare LF is answered
        400 at once (never a wait for a CRLF CRLF that will not come: issue 48), a head over max_header_bytes
        431."""
        head = bytearray(start)
        limit = self.limits.max_header_bytes
        while True:
            line = await reader.readuntil(b"\n")
            head += line
            if len(head) > limit:
                return _BadRequest(431, "request head too large")
            if not head.endswith(b"\r\n"):
                return _BadRequest(400, "a line of the request head ends in a bare LF (CRLF required)")
            if len(head) >= 4 and head[-4:] == b"\r\n\r\n" or head == b"\r\n":
                return bytes(head[:-4] if len(head) >= 4 else b"")

    async def _answer(self, head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      conn: Optional[_Conn] = None) -> bool:
        """Answer one request; returns whether the connection stays open."""
        settings = self._web.current()
        extra = list(settings.headers)
        count = self.stats.request
        req = None
        try:
            if isinstance(head, _BadRequest):
                raise head
            req = parse_head(head)
            post = self._posts.get(req.path) if req.method == "POST" else None
            body = await self._discard_body(req, reader, post[1] if post else 0)
        except _BadRequest as e:
            log.debug("http: %d %s", e.code, e)
            self._write(writer, e.code, (str(e) + "\n").encode(), TEXT, extra, head=False, close=True)
            count(req.path if req is not None else "", e.code)
            return False
        keep = req.keep_alive()
        is_head = req.method == "HEAD"
        if req.method not in ("GET", "HEAD") and post is None or req.method != "POST" and req.path in self._posts:
            code = 405
            allow = "POST" if req.path in self._posts else "GET, HEAD"
            self._write(writer, 405, b"method not allowed\n", TEXT, extra + [("Allow", allow)], is_head, not keep)
        elif post is not None and not settings.users:
            code = 403
            self._write(writer, 403, b"this path needs basic auth: the web config has no basic_auth_users\n", TEXT,
                        extra, False, not keep)
        elif req.path == "/healthz":
            problem = self._health()
            code, body = (503, (problem + "\n").encode()) if problem else (200, b"ok\n")
            self._write(writer, code, body, TEXT, extra, is_head, not keep)
        elif settings.users and (refusal := await self._authenticate(settings, req, conn.peer if conn else "")):
            code = refusal
            if code == 401:
                self._write(writer, 401, b"unauthorized\n", TEXT,
                            extra + [("WWW-Authenticate", 'Basic realm="teye"')], is_head, not keep)
            else:  # the hashing bounds: nothing was checked, try again later
                await self._throttle_delay(conn)
                self._write(writer, code, b"too many credentials waiting to be checked\n", TEXT,
                            extra + [("Retry-After", "1")], is_head, not keep)
        elif self._rate_limited(settings.rate_interval, settings.rate_burst):
            # after authentication: only a valid credential (or, without users, any request) spends a token
            code = 429
            self._write(writer, 429, b"too many requests\n", TEXT, extra, is_head, not keep)
        elif post is not None:
            try:
                code, out = await self._loop.run_in_executor(self._pool, post[0], body)
            except Exception:  # a bug in the handler: logged with its traceback, the caller gets 500
                _rlog.error("post", "http: POST %s failed", req.path, exc_info=True)
                code, out = 500, b"internal error\n"
            self._write(writer, code, out, "application/json", extra, False, not keep)
        elif req.path == "/metrics":
            if self._renders >= self.limits.max_requests:
                _rlog.warning("busy", "http: %d /metrics requests in flight (web.max_requests); answering 503",
                              self._renders)
                code = 503
                self._write(writer, 503, b"too many concurrent scrapes\n", TEXT, extra, is_head, not keep)
            else:
                self._renders += 1
                try:
                    body, ctype, more = await self._loop.run_in_executor(
                        self._pool, self._render, req.headers.get("accept", ""),
                        req.headers.get("accept-encoding", ""))
                    code = 200
                except Exception:  # a bug in rendering: logged with its traceback, the scrape gets 500
                    _rlog.error("render", "http: rendering /metrics failed", exc_info=True)
                    code, body, ctype, more = 500, b"internal error\n", TEXT, ()
                finally:
                    self._renders -= 1
                self._write(writer, code, body, ctype, extra + list(more), is_head, not keep)
        elif req.path == "/":
            code = 200
            self._write(writer, 200, LANDING, "text/html; charset=utf-8", extra, is_head, not keep)
        else:
            code = 404
            self._write(writer, 404, b"not found\n", TEXT, extra, is_head, not keep)
        count(req.path, code)
        await _within(writer.drain(), self.limits.write_timeout_seconds, "write")
        return keep

    async def _discard_body(self, req: _Request, reader: asyncio.StreamReader, keep: int = 0) -> bytes:
        """Read the request's body: kept (at most ``keep`` bytes: a POST path's), else discarded (at most
        MAX_DISCARDED_BODY); beyond, 413."""
        if "transfer-encoding" in req.headers:
            raise _BadRequest(400, "request bodies with Transfer-Encoding are not accepted")
        length = req.headers.get("content-length", "0")
        if not length.isdigit():
            raise _BadRequest(400, "malformed Content-Length")
        n = int(length)
        if n > (keep or MAX_DISCARDED_BODY):
            raise _BadRequest(413, "request body too large")
        if n:
            data = await _within(reader.readexactly(n), self.limits.header_timeout_seconds, "header")
            return data if keep else b""
        return b""

    async def _authenticate(self, settings, req: _Request, peer: str) -> int:
        """0 when the request carries a valid credential; else the status to answer: 401, or 429 / 503 when
        the credential needs a bcrypt check and the client's / the server's hashing bound is reached."""
        header = req.headers.get("authorization")
        creds = parse_basic_auth(header)
        stats = self.stats
        if creds is None:
            stats.auth_failure("malformed" if header else "missing")
            return 401
        user, password = creds
        key = self._web.credential(settings, user, password)
        ok = self._web.cached(key)
        if ok is None:
            check = self._hashing.get(key)
            if check is None:
                lim = self.limits
                if self._hashes_by_client.get(peer, 0) >= lim.max_auth_hashes_per_client:
                    stats.auth_throttle("client")
                    return 429
                if len(self._hashing) >= lim.max_auth_hashes:
                    stats.auth_throttle("server")
                    return 503
                check = self._start_hash(settings, user, password, key, peer)
            stats.auth_check("bcrypt")
            # shielded: a client that goes away does not cancel the check others wait on (its bound is
            # released when the hash is done, whoever waits)
            ok = await asyncio.shield(check)
        else:
            stats.auth_check("cache")
        if ok:
            return 0
        stats.auth_failure("wrong_password" if user in settings.users else "unknown_user")
        return 401

    async def _throttle_delay(self, conn: Optional[_Conn]) -> None:
        """Hold a request refused by the hashing bounds for auth_throttle_delay_seconds before its answer.  The
        connection is evictable meanwhile (as one waiting for its request), so held refusals never fill the
        connection table against a scraper."""
        delay = self.limits.auth_throttle_delay_seconds
        if delay <= 0:
            return
        if conn is not None:
            self._set_waiting(conn, True)
        try:
            await asyncio.sleep(delay)
        finally:
            if conn is not None:
                self._set_waiting(conn, False)

    def _start_hash(self, settings, user: str, password: str, key: bytes, peer: str) -> asyncio.Future:
        """Queue one bcrypt check on the hashing thread; it counts against both bounds until it is done."""
        self._hashes_by_client[peer] = self._hashes_by_client.get(peer, 0) + 1
        check = asyncio.wrap_future(self._hash_pool.submit(self._web.verify, settings, user, password),
                                    loop=self._loop)
        self._hashing[key] = check

        def done(f: asyncio.Future) -> None:
            self._hashing.pop(key, None)
            n = self._hashes_by_client.pop(peer, 1) - 1
            if n > 0:
                self._hashes_by_client[peer] = n
            if not f.cancelled() and f.exception() is None:
                self._web.remember(key, f.result())
        check.add_done_callback(done)
        return check

    @staticmethod
    def _write(writer: asyncio.StreamWriter, code: int, body: bytes, ctype: str,
               extra: List[Tuple[str, str]], head: bool, close: bool) -> None:
        lines = [f"HTTP/1.1 {code} {REASONS.get(code, '')}", f"Content-Type: {ctype}",
                 f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in extra]
        if close:
            lines.append("Connection: close")
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        writer.write(data if head else data + body)
