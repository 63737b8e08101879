"""The report's one door to Prometheus: its HTTP API over a small HTTP/1.1 client, with promtool's client config.

The client is ``http.client`` driven by hand rather than urllib, so that each rule is ours (docs/report.md
"The HTTP client"): credentials and the client certificate only for the configured host and port, redirects
checked one by one (another host without credentials, never https to http, ``follow_redirects``, no loops,
no other schemes), one deadline per query (and the report's own) enforced by shutting the socket down, and
every answer read with a size bound and its shape validated before anyone uses it.

``HttpConfig.load(path)`` reads the HTTP client configuration Prometheus and ``promtool
--http.config.file`` read (``basic_auth`` with ``password``/``password_file``,
``authorization``/``bearer_token``/``bearer_token_file``, ``tls_config`` with ``ca_file``,
``cert_file``, ``key_file``, ``server_name``, ``insecure_skip_verify``); relative file names
are relative to the file, as Prometheus resolves them.

Every failure is translated here into one :class:`PrometheusError` subclass whose ``exit_status``
the command returns: unreachable, timeout, TLS, authentication, or a bad answer.  ``queries``
counts the requests sent, so callers (and the benchmark) can show that it does not grow with
the number of jobs.
"""
from __future__ import annotations

import base64
import http.client
import json
import math
import os
import re
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import yaml

# exit statuses (docs/report.md lists them all)
EXIT_BAD_ANSWER = 1
EXIT_USAGE = 2
EXIT_DOWN = 3
EXIT_TIMEOUT = 4
EXIT_TLS = 5
EXIT_AUTH = 6


class PrometheusError(RuntimeError):
    exit_status = EXIT_BAD_ANSWER


class PrometheusDown(PrometheusError):
    exit_status = EXIT_DOWN


class PrometheusTimeout(PrometheusError):
    exit_status = EXIT_TIMEOUT


class PrometheusTLSError(PrometheusError):
    exit_status = EXIT_TLS


class PrometheusAuthError(PrometheusError):
    exit_status = EXIT_AUTH


class HttpConfigError(PrometheusError):
    exit_status = EXIT_USAGE


# bounds (docs/report.md "Bounds")
MAX_ANSWER_BYTES = 64 * 1024 * 1024     # a successful answer's body; larger ones are refused (exit 1)
ERROR_BODY_BYTES = 4096                 # what is read of an error answer's body
MAX_REDIRECTS = 10                      # redirects followed for one query (Go's client follows 10)
MESSAGE_CHARS = 200                     # an error text from Prometheus, cut to one line of at most this
DEFAULT_TIMEOUT_S = 30.0                # --timeout: one query, redirects included
DEFAULT_DEADLINE_S = 120.0              # --deadline: the whole report


def one_line(text, limit: int = MESSAGE_CHARS) -> str:
    """``text`` (str or bytes from outside) as one printable line of at most ``limit`` characters."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    text = " ".join(str(text).split())
    text = "".join(c if c.isprintable() else "?" for c in text)
    if len(text) > limit:
        text = f"{text[:limit]}... ({len(text) - limit} more characters)"
    return text


_KNOWN = {"basic_auth", "authorization", "bearer_token", "bearer_token_file", "tls_config", "follow_redirects",
          "enable_http2", "proxy_url"}
_TLS_KNOWN = {"ca_file", "cert_file", "key_file", "server_name", "insecure_skip_verify", "ca", "cert", "key",
              "min_version"}


def _read_secret(path: str, base: str, what: str) -> str:
    full = path if os.path.isabs(path) else os.path.join(base, path)
    try:
        with open(full, encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError as e:
        raise HttpConfigError(f"{what}: cannot read {full}: {e.strerror or e}") from None


@dataclass
class HttpConfig:
    """What the client sends: an Authorization header and an SSL context."""

    authorization: Optional[str] = None
    ssl_context: Optional[ssl.SSLContext] = None        # the configured host's: CA, client certificate
    other_context: Optional[ssl.SSLContext] = None      # any other host's (a redirect): CA, no client certificate
    server_name: Optional[str] = None
    follow_redirects: bool = True

    @classmethod
    def load(cls, path: Optional[str]) -> "HttpConfig":
        if not path:
            return cls()
        try:
            with open(path, encoding="utf-8") as fh:
                doc = yaml.safe_load(fh) or {}
        except OSError as e:
            raise HttpConfigError(f"--http.config.file {path}: {e.strerror or e}") from None
        except yaml.YAMLError as e:
            raise HttpConfigError(f"--http.config.file {path}: not valid YAML ({e})") from None
        if not isinstance(doc, dict):
            raise HttpConfigError(f"--http.config.file {path}: expected a mapping of keys")
        unknown = sorted(set(doc) - _KNOWN)
        if unknown:
            raise HttpConfigError(f"--http.config.file {path}: unknown key(s) {', '.join(unknown)} "
                                  f"(known: {', '.join(sorted(_KNOWN))})")
        if doc.get("proxy_url"):
            raise HttpConfigError(f"--http.config.file {path}: proxy_url is not supported by teye report "
                                  f"(it connects to the Prometheus URL directly)")
        base = os.path.dirname(os.path.abspath(path))
        out = cls()
        fr = doc.get("follow_redirects", True)
        if not isinstance(fr, bool):
            raise HttpConfigError(f"--http.config.file {path}: follow_redirects must be true or false, not {fr!r}")
        out.follow_redirects = fr
        auths = [k for k in ("basic_auth", "authorization", "bearer_token", "bearer_token_file") if doc.get(k)]
        if len(auths) > 1:
            raise HttpConfigError(f"--http.config.file {path}: at most one of {', '.join(auths)} may be set")
        ba = doc.get("basic_auth")
        if ba:
            if not isinstance(ba, dict) or not (ba.get("username") or ba.get("username_file")):
                raise HttpConfigError(f"--http.config.file {path}: basic_auth needs a username")
            user = ba.get("username") or _read_secret(ba["username_file"], base, "basic_auth.username_file")
            if ba.get("password_file"):
                pw = _read_secret(ba["password_file"], base, "basic_auth.password_file")
            else:
                pw = str(ba.get("password") or "")
            out.authorization = "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode()
        az = doc.get("authorization")
        if az:
            if not isinstance(az, dict):
                raise HttpConfigError(f"--http.config.file {path}: authorization must be a mapping")
            cred = (_read_secret(az["credentials_file"], base, "authorization.credentials_file")
                    if az.get("credentials_file") else str(az.get("credentials") or ""))
            out.authorization = f"{az.get('type') or 'Bearer'} {cred}"
        if doc.get("bearer_token"):
            out.authorization = f"Bearer {doc['bearer_token']}"
        if doc.get("bearer_token_file"):
            out.authorization = "Bearer " + _read_secret(doc["bearer_token_file"], base, "bearer_token_file")
        tls = doc.get("tls_config")
        if tls:
            if not isinstance(tls, dict):
                raise HttpConfigError(f"--http.config.file {path}: tls_config must be a mapping")
            unknown = sorted(set(tls) - _TLS_KNOWN)
            if unknown:
                raise HttpConfigError(f"--http.config.file {path}: unknown tls_config key(s) {', '.join(unknown)}")

            def f(key):
                v = tls.get(key)
                return None if not v else (v if os.path.isabs(v) else os.path.join(base, v))

            def context(with_cert: bool) -> ssl.SSLContext:
                ctx = ssl.create_default_context()
                try:
                    if f("ca_file"):
                        ctx.load_verify_locations(cafile=f("ca_file"))
                    if with_cert and f("cert_file"):
                        ctx.load_cert_chain(f("cert_file"), f("key_file"))
                except (OSError, ssl.SSLError) as e:
                    raise HttpConfigError(f"--http.config.file {path}: tls_config: {e}") from None
                if tls.get("insecure_skip_verify"):
                    ctx.check_hostname = False
                    ctx.verify_mode = ssl.CERT_NONE
                return ctx
            out.ssl_context = context(True)
            out.other_context = context(False)
            out.server_name = tls.get("server_name") or None
        return out


class PrometheusBadAnswer(PrometheusError):
    """Prometheus (or what answers in its place) sent something that is not a well-formed API answer."""
    exit_status = EXIT_BAD_ANSWER


_REDIRECTS = (301, 302, 303, 307, 308)
_FLOAT = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[Ii]nf|NaN)")


def _origin(parts: urllib.parse.SplitResult) -> Tuple[str, int]:
    """(host, port) of a URL: the credentials' scope."""
    try:
        port = parts.port
    except ValueError:
        port = None
    return ((parts.hostname or "").lower(), port or (443 if parts.scheme == "https" else 80))


@dataclass
class _Exchange:
    status: int
    location: Optional[str]
    body: bytes
    reason: str = ""


@dataclass
class _Watchdog:
    """Shuts a socket down at a monotonic deadline: a blocked connect/handshake/recv then returns at once, whatever
    the server trickles (a socket timeout only bounds the wait for each byte)."""
    deadline: float
    fired: bool = False
    _sock: Optional[socket.socket] = None
    _timer: Optional[threading.Timer] = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def arm(self, sock: socket.socket) -> None:
        self._sock = sock
        self._timer = threading.Timer(max(0.0, self.deadline - time.monotonic()), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            if self._sock is not None:
                try:
                    self._sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self._sock = None

    @property
    def passed(self) -> bool:
        return self.fired or time.monotonic() >= self.deadline


class _Connection(http.client.HTTPConnection):
    """One HTTP/1.1 exchange over plain TCP or TLS, every blocking step bounded by one watchdog."""

    def __init__(self, host: str, port: int, tls: Optional[ssl.SSLContext], sni: Optional[str], dog: _Watchdog):
        super().__init__(host, port, timeout=max(0.001, dog.deadline - time.monotonic()))
        self._tls, self._sni, self._dog = tls, sni, dog

    def connect(self):
        left = self._dog.deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("deadline")
        sock = socket.create_connection((self.host, self.port), left)
        self._dog.arm(sock)
        sock.settimeout(max(0.001, self._dog.deadline - time.monotonic()))
        if self._tls is not None:
            sock = self._tls.wrap_socket(sock, server_hostname=self._sni or self.host)
        self.sock = sock


class Prometheus:
    """query / query_range against one Prometheus (or anything speaking its HTTP API).

    ``timeout`` bounds each query (connection, TLS, redirects, the whole answer); ``deadline`` the whole
    report (seconds from construction).  Credentials and the client certificate go only to the URL's own
    host and port; see docs/report.md "The HTTP client" for the redirect rules and the bounds."""

    def __init__(self, url: str, http: Optional[HttpConfig] = None, timeout: float = DEFAULT_TIMEOUT_S,
                 deadline: Optional[float] = None, max_answer_bytes: int = MAX_ANSWER_BYTES):
        parts = urllib.parse.urlsplit(url or "")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise HttpConfigError(f"Prometheus URL {one_line(url or '')!r} must be http://HOST... or https://HOST...")
        if parts.username is not None or parts.password is not None:
            raise HttpConfigError("the Prometheus URL holds credentials (user:password@): they would be printed in "
                                  "errors and in the report's JSON; put them in --http.config.file (basic_auth)")
        try:
            parts.port
        except ValueError:
            raise HttpConfigError(f"Prometheus URL {one_line(url)!r}: bad port") from None
        self.url = url.rstrip("/")
        self.http = http or HttpConfig()
        self.timeout = timeout
        self.deadline_s = deadline
        self._deadline = None if deadline is None else time.monotonic() + deadline
        self.max_answer_bytes = max_answer_bytes
        self.queries = 0
        self._origin = _origin(parts)

    # -- the HTTP API ----------------------------------------------------------------------------
    def _exchange(self, method: str, url: str, body: Optional[bytes], dog: _Watchdog) -> _Exchange:
        parts = urllib.parse.urlsplit(url)
        own = _origin(parts) == self._origin
        tls = None
        if parts.scheme == "https":
            tls = (self.http.ssl_context if own else self.http.other_context) or ssl.create_default_context()
        conn = _Connection(parts.hostname, _origin(parts)[1], tls, self.http.server_name if own else None, dog)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        headers = {"Accept": "application/json", "User-Agent": "teye-report"}
        if body is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        if own and self.http.authorization:
            headers["Authorization"] = self.http.authorization
        try:
            conn.request(method, target, body=body, headers=headers)
            r = conn.getresponse()
            if r.status in _REDIRECTS:
                return _Exchange(r.status, r.getheader("Location"), b"", r.reason)
            ok = 200 <= r.status < 300
            cap = self.max_answer_bytes if ok else ERROR_BODY_BYTES
            declared = r.getheader("Content-Length")
            if ok and declared and declared.strip().isdigit() and int(declared) > cap:
                raise PrometheusBadAnswer(f"its answer is {int(declared)} bytes, above the bound of {cap} bytes")
            chunks, got = [], 0
            while got <= cap:
                b = r.read(min(1 << 20, cap + 1 - got))
                if not b:
                    break
                chunks.append(b)
                got += len(b)
            if got > cap and ok:
                raise PrometheusBadAnswer(f"its answer is larger than the bound of {cap} bytes")
            return _Exchange(r.status, None, b"".join(chunks)[:cap], r.reason)
        finally:
            dog.disarm()
            conn.close()

    def _post(self, path: str, params: Dict[str, str]):
        self.queries += 1
        where = f"Prometheus at {self.url}"
        what = f"{path} {one_line(params.get('query', ''), 120)!r}"
        start = time.monotonic()
        q_deadline = start + self.timeout
        run_bound = self._deadline is not None and self._deadline <= q_deadline
        if run_bound:
            q_deadline = self._deadline

        def timed_out():
            if run_bound:
                return PrometheusTimeout(f"the report did not finish within its deadline of {self.deadline_s:g} s "
                                         f"(--deadline): {where} was still answering {what}")
            return PrometheusTimeout(f"{where} did not answer within {self.timeout:g} s (--timeout): {what}")
        if time.monotonic() >= q_deadline:
            raise timed_out()
        method, url, body = "POST", f"{self.url}/api/v1/{path}", urllib.parse.urlencode(params).encode()
        seen = {url}
        for hop in range(MAX_REDIRECTS + 1):
            dog = _Watchdog(q_deadline)
            try:
                ex = self._exchange(method, url, body, dog)
            except PrometheusBadAnswer as e:
                if dog.passed:
                    raise timed_out() from None
                raise PrometheusBadAnswer(f"{where} answered {what}: {e}") from None
            except (socket.timeout, TimeoutError):
                raise timed_out() from None
            except (ssl.SSLError, ssl.CertificateError) as e:
                if dog.passed:
                    raise timed_out() from None
                raise PrometheusTLSError(f"TLS handshake with {where} failed: {one_line(e)}") from None
            except (http.client.HTTPException, OSError) as e:
                if dog.passed:
                    raise timed_out() from None
                via = f" (redirected to {one_line(url, 120)})" if hop else ""
                raise PrometheusDown(f"cannot reach {where}{via}: {one_line(e) or type(e).__name__}") from None
            if dog.passed:
                raise timed_out()
            if ex.status not in _REDIRECTS:
                break
            # a redirect (docs/report.md "Redirects")
            if not self.http.follow_redirects:
                raise PrometheusBadAnswer(f"{where} answered {what} with a redirect (HTTP {ex.status} to "
                                          f"{one_line(ex.location or '', 120)}) and follow_redirects is false in "
                                          f"--http.config.file: not followed")
            if not ex.location:
                raise PrometheusBadAnswer(f"{where} answered {what} with HTTP {ex.status} and no Location")
            nxt = urllib.parse.urljoin(url, ex.location.strip())
            cur, new = urllib.parse.urlsplit(url), urllib.parse.urlsplit(nxt)
            if new.scheme not in ("http", "https") or not new.hostname:
                raise PrometheusBadAnswer(f"{where} redirected {what} to {one_line(nxt, 120)!r}: only http and "
                                          f"https redirects are followed")
            if cur.scheme == "https" and new.scheme == "http":
                raise PrometheusTLSError(f"{where} redirected {what} from https to plain http "
                                         f"({one_line(nxt, 120)}): not followed")
            if new.username is not None or new.password is not None:
                raise PrometheusBadAnswer(f"{where} redirected {what} to a URL holding credentials: not followed")
            if nxt in seen or hop == MAX_REDIRECTS:
                raise PrometheusBadAnswer(f"{where} redirected {what} in a loop or more than {MAX_REDIRECTS} "
                                          f"times (last to {one_line(nxt, 120)}): not followed")
            seen.add(nxt)
            if ex.status in (301, 302, 303) and method == "POST":
                # as every HTTP client: the next request is a GET; Prometheus' API takes the same parameters
                # in the query string, so they go there (307 and 308 resend the POST and its body)
                method, body = "GET", None
                nxt += ("&" if new.query else "?") + urllib.parse.urlencode(params)
            url = nxt
        if ex.status in (401, 403):
            raise PrometheusAuthError(f"{where} refused the credentials (HTTP {ex.status}): check basic_auth or "
                                      f"the bearer token in --http.config.file")
        if not 200 <= ex.status < 300:
            try:
                err = json.loads(ex.body).get("error") or ex.body
            except (ValueError, AttributeError, RecursionError):
                err = ex.body
            raise PrometheusBadAnswer(f"{where} answered HTTP {ex.status} to {what}: {one_line(err)}")
        body, ex.body = ex.body, b""
        try:
            doc = json.loads(body)
            del body       # the parsed answer is several times the body: do not hold both longer than needed
        except (ValueError, RecursionError):
            raise PrometheusBadAnswer(f"{where} answered {what} with something that is not JSON "
                                      f"(or nested too deeply): {one_line(body[:200], 80)}") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            err = doc.get("error") if isinstance(doc, dict) else doc
            raise PrometheusBadAnswer(f"{where}: {what} failed: {one_line(err if err is not None else doc)}")
        data = doc.get("data")
        if not isinstance(data, dict):
            raise PrometheusBadAnswer(f"{where} answered {what} without a data object: {one_line(data, 80)}")
        return data, f"{where} answered {what} with"

    # -- shape checks: every answer is validated before anyone reads it (a NaN or infinite sample is absent:
    # teye exports no NaN, so one can only come from arithmetic on absent data)
    @staticmethod
    def _labels(r, bad):
        m = r.get("metric") if isinstance(r, dict) else None
        if not isinstance(m, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in m.items()):
            raise bad(f"a series without a metric of string labels: {one_line(json.dumps(r)[:200], 80)}")
        return m

    @staticmethod
    def _point(p, bad) -> Optional[Tuple[float, float]]:
        if not (isinstance(p, list) and len(p) == 2 and isinstance(p[0], (int, float)) and not isinstance(p[0], bool)
                and isinstance(p[1], str) and _FLOAT.fullmatch(p[1])):
            raise bad(f"a sample that is not [time, \"value\"]: {one_line(json.dumps(p)[:200], 80)}")
        t, v = float(p[0]), float(p[1])
        if not math.isfinite(t):
            raise bad(f"a sample time that is not finite: {p[0]!r}")
        return (t, v) if math.isfinite(v) else None

    def _checked(self, path, params, want):
        data, where = self._post(path, params)

        def bad(problem):
            return PrometheusBadAnswer(f"{where} {problem}")
        kind, result = data.get("resultType"), data.get("result")
        if kind not in want:
            raise bad(f"resultType {one_line(repr(kind), 40)}, expected {' or '.join(want)}")
        if kind == "scalar":
            if not isinstance(result, list):
                raise bad(f"a scalar that is not [time, \"value\"]: {one_line(json.dumps(result)[:200], 80)}")
            return kind, self._point(result, bad), bad
        if not isinstance(result, list):
            raise bad(f"a result that is not a list: {one_line(json.dumps(result)[:200], 80)}")
        return kind, result, bad

    def query(self, expr: str, at: Optional[float] = None) -> List[Tuple[Dict[str, str], float, float]]:
        """Instant vector: [(labels, timestamp, value)]."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        kind, result, bad = self._checked("query", params, ("vector", "scalar"))
        if kind == "scalar":
            return [({}, *result)] if result else []
        out = []
        for r in result:
            m = self._labels(r, bad)
            p = self._point(r.get("value"), bad)
            if p:
                out.append((m, p[0], p[1]))
        return out

    def query_range(self, expr: str, start: float, end: float, step: float
                    ) -> List[Tuple[Dict[str, str], List[Tuple[float, float]]]]:
        """Range matrix: [(labels, [(timestamp, value), ...])]."""
        _, result, bad = self._checked("query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                       "step": f"{step:g}"}, ("matrix",))
        out = []
        while result:      # from the end, each series' raw lists freed once converted: memory stays near one copy
            r = result.pop()
            m = self._labels(r, bad)
            vals = r.get("values")
            if not isinstance(vals, list):
                raise bad(f"a series without a list of values: {one_line(json.dumps(r)[:200], 80)}")
            out.append((m, [p for p in (self._point(x, bad) for x in vals) if p]))
        out.reverse()
        return out

    def now(self) -> float:
        """Prometheus' own clock (time())."""
        res = self.query("time()")
        if len(res) != 1:
            raise PrometheusBadAnswer(f"Prometheus at {self.url} answered time() with {len(res)} finite samples, "
                                      f"expected one")
        return res[0][2]
