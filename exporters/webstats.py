"""The HTTP server's own counters: what an operator needs to see a refused, evicted, timed-out,
failed-handshake or wrong-password client from Prometheus.

The server (one event-loop thread) bumps plain integers; a scrape reads them from a render
worker and formats a few dozen series (:meth:`WebStats.points`), so counting costs an integer
increment per event and nothing is locked.  Every label value comes from a short fixed list
(never from what a client sent: a path is one of four, a user name is never exported).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sized, Tuple

from agent.metrics import COUNTER, GAUGE, Point, metric

from .specs import Layout

REQUESTS = metric("teye_web_requests_total", COUNTER,
                  "HTTP requests answered by the agent's web server by path (/metrics, /, /healthz, other) and "
                  "status code; a scrape counts after its answer.", ["path", "code"])
IN_FLIGHT = metric("teye_web_requests_in_flight", GAUGE,
                   "HTTP requests being answered now (a scrape counts itself).")
CONNECTIONS = metric("teye_web_connections", GAUGE,
                     "Open client connections of the web server (TLS handshakes and idle keep-alives included).")
CONNECTIONS_MAX = metric("teye_web_connections_max", GAUGE,
                         "Connections the web server holds at most: web.max_connections, lowered to fit the "
                         "process's open-files limit.")
EVICTED = metric("teye_web_connections_evicted_total", COUNTER,
                 "Connections closed to make room for a new one while the table was full (the one that had waited "
                 "longest for its request: a half-sent request or an idle keep-alive), or because the process "
                 "ran out of file descriptors.")
REFUSED = metric("teye_web_connections_refused_total", COUNTER,
                 "New connections closed at once because the table was full and every open connection was being "
                 "answered.")
TIMEOUTS = metric("teye_web_timeouts_total", COUNTER,
                  "Connections the web server closed on a timeout, by kind: header (TLS handshake, request head or "
                  "body not in within web.header_timeout_seconds), idle (keep-alive with no new request within "
                  "web.idle_timeout_seconds), write (client not reading its answer within "
                  "web.write_timeout_seconds).", ["kind"])
TLS_FAILURES = metric("teye_web_tls_handshake_failures_total", COUNTER,
                      "TLS connections that failed before a request, by reason class: plain_http (an HTTP request "
                      "on the TLS port, answered 400), protocol (no common TLS version or cipher, or not TLS at "
                      "all), client_certificate (missing, not verified, or its SAN not in client_allowed_sans), "
                      "server_certificate (the client rejected the agent's certificate), closed (the client closed "
                      "or reset mid-handshake), other. Handshakes timing out count as header timeouts. Absent "
                      "without TLS.", ["reason"])
AUTH_FAILURES = metric("teye_web_basic_auth_failures_total", COUNTER,
                       "Requests refused with 401 by basic auth, by reason: missing (no Authorization header), "
                       "malformed (not Basic user:password in base64), unknown_user, wrong_password. The user name "
                       "sent is never exported (an attacker chooses it). Absent without basic_auth_users.",
                       ["reason"])
AUTH_CHECKS = metric("teye_web_basic_auth_checks_total", COUNTER,
                     "Credentials checked by basic auth, by how: cache (verified or refused before, answered on "
                     "the event loop without queuing behind password hashing), bcrypt (hashed on the web "
                     "server's hashing thread, or waiting for the same credential's hash already under way). "
                     "Absent without basic_auth_users.", ["by"])
AUTH_THROTTLED = metric("teye_web_basic_auth_throttled_total", COUNTER,
                        "Requests refused without checking their credential because too many credentials were "
                        "already waiting for password hashing, by limit: client (from the same address; answered "
                        "429), server (in all; answered 503). A credential verified before is never refused so. "
                        "Absent without basic_auth_users.", ["limit"])
RELOADS = metric("teye_web_config_reloads_total", COUNTER,
                 "Reloads of the web config file (it is re-read when it or a file it names changes) by result: "
                 "success, or failure (the last good configuration stays in force). Absent without a web config "
                 "file.", ["result"])
RELOAD_OK = metric("teye_web_config_last_reload_successful", GAUGE,
                   "1 if the web config file's last load succeeded, 0 if the last reload failed (the previous "
                   "configuration is still served). Absent without a web config file.")
RELOAD_TIME = metric("teye_web_config_last_reload_success_timestamp_seconds", GAUGE,
                     "Unix time of the last successful load of the web config file (the start counts). Absent "
                     "without a web config file.")

PATHS = ("/metrics", "/", "/healthz")
OTHER_PATH = "other"
TIMEOUT_KINDS = ("header", "idle", "write")
TLS_REASONS = ("plain_http", "protocol", "client_certificate", "server_certificate", "closed", "other")
AUTH_REASONS = ("missing", "malformed", "unknown_user", "wrong_password")
AUTH_CHECK_WAYS = ("cache", "bcrypt")
AUTH_LIMITS = ("client", "server")

# OpenSSL reasons (ssl.SSLError.reason) -> class.  Alerts the client sends about the agent's certificate
# mean the client rejected it; the server's own verification of a client certificate is client_certificate.
_SERVER_CERT_ALERTS = ("ALERT_UNKNOWN_CA", "ALERT_BAD_CERTIFICATE", "ALERT_CERTIFICATE_EXPIRED",
                       "ALERT_CERTIFICATE_UNKNOWN", "ALERT_CERTIFICATE_REVOKED", "ALERT_UNSUPPORTED_CERTIFICATE",
                       "ALERT_DECRYPT_ERROR")
_CLIENT_CERT = ("PEER_DID_NOT_RETURN_A_CERTIFICATE", "CERTIFICATE_VERIFY_FAILED", "CERTIFICATE_REQUIRED",
                "NO_CERTIFICATE_RETURNED")
_PROTOCOL = ("UNSUPPORTED_PROTOCOL", "WRONG_VERSION_NUMBER", "VERSION_TOO_LOW", "VERSION_TOO_HIGH",
             "NO_SHARED_CIPHER", "NO_CIPHERS_AVAILABLE", "NO_SHARED_GROUPS", "NO_SUITABLE_KEY_SHARE",
             "ALERT_PROTOCOL_VERSION", "ALERT_HANDSHAKE_FAILURE", "ALERT_INSUFFICIENT_SECURITY",
             "HTTP_REQUEST", "HTTPS_PROXY_REQUEST", "UNKNOWN_PROTOCOL", "INAPPROPRIATE_FALLBACK",
             "PACKET_LENGTH_TOO_LONG", "RECORD_LENGTH_MISMATCH", "WRONG_SSL_VERSION", "UNEXPECTED_MESSAGE",
             "UNEXPECTED_RECORD", "NO_APPLICATION_PROTOCOL", "ALERT_NO_APPLICATION_PROTOCOL")


def tls_reason(exc: BaseException) -> str:
    """The reason class of a failed TLS handshake (an ssl.SSLError, or the connection lost mid-way)."""
    reason = getattr(exc, "reason", None)
    if isinstance(reason, str):
        if reason.endswith(_SERVER_CERT_ALERTS):
            return "server_certificate"
        if reason in _CLIENT_CERT:
            return "client_certificate"
        if reason.endswith(_PROTOCOL):
            return "protocol"
    if isinstance(exc, (ConnectionError, EOFError)) or type(exc).__name__ in ("SSLEOFError", "SSLZeroReturnError"):
        return "closed"
    return "other"


class WebStats:
    """Counters of one web server (bumped on its event-loop thread) and the series they make."""

    def __init__(self):
        self.requests: Dict[Tuple[str, str], int] = {("/metrics", "200"): 0}
        self.in_flight = 0
        self.evicted = 0
        self.refused = 0
        self.timeouts = dict.fromkeys(TIMEOUT_KINDS, 0)
        self.tls_failures = dict.fromkeys(TLS_REASONS, 0)
        self.auth_failures = dict.fromkeys(AUTH_REASONS, 0)
        self.auth_checks = dict.fromkeys(AUTH_CHECK_WAYS, 0)
        self.auth_throttled = dict.fromkeys(AUTH_LIMITS, 0)
        self._connections: Sized = ()
        self._limit: Optional[int] = None
        self._web = None
        self._layout_key: tuple = ()
        self._layout = Layout((), 0)
        self._order: List[Tuple[str, str]] = []

    def attach(self, connections: Sized, limit: int, web) -> None:
        """Called by the server it counts for: its connection table, its limit, its WebConfig."""
        self._connections, self._limit, self._web = connections, limit, web

    # -- counting (event-loop thread) -----------------------------------------------------------
    def request(self, path: str, code: int) -> None:
        key = (path if path in PATHS else OTHER_PATH, str(code))
        self.requests[key] = self.requests.get(key, 0) + 1

    def timeout(self, kind: str) -> None:
        self.timeouts[kind] += 1

    def tls_failure(self, reason: str) -> None:
        self.tls_failures[reason] += 1

    def auth_failure(self, reason: str) -> None:
        self.auth_failures[reason] += 1

    def auth_check(self, by: str) -> None:
        self.auth_checks[by] += 1

    def auth_throttle(self, limit: str) -> None:
        self.auth_throttled[limit] += 1

    # -- the series (any thread) -----------------------------------------------------------------
    def state(self) -> Tuple[Layout, List[float]]:
        """(layout, values): every series in a fixed order, the family that changes with every scrape
        (requests; in flight and connections stay at 1 while Prometheus scrapes alone) first; the layout object stays the same while the set of series
        does (label sets only ever grow: a new path and code, basic auth turned on by a reload)."""
        web = self._web
        tls = web is not None and web.tls_enabled
        users = web is not None and web.has_users
        reloads = web is not None and bool(web.path)
        requests = self.requests
        key = (len(requests), self._limit is not None, tls, users, reloads)
        if key != self._layout_key:
            self._order = sorted(requests)
            entries = [(REQUESTS, k) for k in self._order]
            per_scrape = len(entries)
            entries += ((IN_FLIGHT, ()), (CONNECTIONS, ()))
            if self._limit is not None:
                entries.append((CONNECTIONS_MAX, ()))
            entries += ((EVICTED, ()), (REFUSED, ()))
            entries += ((TIMEOUTS, (k,)) for k in TIMEOUT_KINDS)
            if tls:
                entries += ((TLS_FAILURES, (r,)) for r in TLS_REASONS)
            if users:
                entries += ((AUTH_FAILURES, (r,)) for r in AUTH_REASONS)
                entries += ((AUTH_CHECKS, (w,)) for w in AUTH_CHECK_WAYS)
                entries += ((AUTH_THROTTLED, (k,)) for k in AUTH_LIMITS)
            if reloads:
                entries += ((RELOADS, ("success",)), (RELOADS, ("failure",)), (RELOAD_OK, ()), (RELOAD_TIME, ()))
            self._layout, self._layout_key = Layout(tuple(entries), per_scrape), key
        layout = self._layout
        values = [requests[k] for k in self._order]
        values += (self.in_flight, len(self._connections))
        if self._limit is not None:
            values.append(self._limit)
        values += (self.evicted, self.refused)
        values += self.timeouts.values()
        if tls:
            values += self.tls_failures.values()
        if users:
            values += self.auth_failures.values()
            values += self.auth_checks.values()
            values += self.auth_throttled.values()
        if reloads:
            values += (web.reloads_ok, web.reloads_failed, 1 if web.last_reload_ok else 0, web.last_success_time)
        if len(values) != len(layout.entries):  # a series appeared between the layout and the values: next time
            return self.state()
        return layout, values

    def points(self) -> List[Point]:
        """Every series as points (what :meth:`state` says; for tests and tools)."""
        layout, values = self.state()
        return [Point(spec, labels, float(v)) for (spec, labels), v in zip(layout.entries, values)]
