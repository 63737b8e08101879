"""The report's one door to Prometheus: its HTTP API over urllib, with promtool's client config.

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
import json
import os
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
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
    ssl_context: Optional[ssl.SSLContext] = None
    server_name: Optional[str] = None

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
        base = os.path.dirname(os.path.abspath(path))
        out = cls()
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
            ctx = ssl.create_default_context()

            def f(key):
                v = tls.get(key)
                return None if not v else (v if os.path.isabs(v) else os.path.join(base, v))
            try:
                if f("ca_file"):
                    ctx.load_verify_locations(cafile=f("ca_file"))
                if f("cert_file"):
                    ctx.load_cert_chain(f("cert_file"), f("key_file"))
            except (OSError, ssl.SSLError) as e:
                raise HttpConfigError(f"--http.config.file {path}: tls_config: {e}") from None
            if tls.get("insecure_skip_verify"):
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            out.ssl_context = ctx
            out.server_name = tls.get("server_name") or None
        return out


class _SNIContext:
    """Wraps an SSLContext so the handshake checks ``server_name`` instead of the URL's host."""

    def __init__(self, ctx: ssl.SSLContext, name: str):
        self._ctx, self._name = ctx, name

    def wrap_socket(self, sock, server_hostname=None, **kw):
        return self._ctx.wrap_socket(sock, server_hostname=self._name, **kw)

    def __getattr__(self, item):
        return getattr(self._ctx, item)


class Prometheus:
    """query / query_range against one Prometheus (or anything speaking its HTTP API)."""

    def __init__(self, url: str, http: Optional[HttpConfig] = None, timeout: float = 30.0):
        if not url or not urllib.parse.urlsplit(url).scheme in ("http", "https"):
            raise HttpConfigError(f"Prometheus URL {url!r} must start with http:// or https://")
        self.url = url.rstrip("/")
        self.http = http or HttpConfig()
        self.timeout = timeout
        self.queries = 0
        ctx = self.http.ssl_context
        if ctx is not None and self.http.server_name:
            ctx = _SNIContext(ctx, self.http.server_name)
        self._handlers = [urllib.request.HTTPSHandler(context=ctx)] if ctx is not None else []
        self._opener = urllib.request.build_opener(*self._handlers)

    # -- the HTTP API ----------------------------------------------------------------------------
    def _post(self, path: str, params: Dict[str, str]):
        self.queries += 1
        body = urllib.parse.urlencode(params).encode()
        req = urllib.request.Request(f"{self.url}/api/v1/{path}", data=body, method="POST",
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
        if self.http.authorization:
            req.add_header("Authorization", self.http.authorization)
        where = f"Prometheus at {self.url}"
        try:
            with self._opener.open(req, timeout=self.timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            text = e.read()[:300].decode("utf-8", "replace")
            if e.code in (401, 403):
                raise PrometheusAuthError(f"{where} refused the credentials (HTTP {e.code}): check basic_auth or "
                                          f"the bearer token in --http.config.file") from None
            try:
                err = json.loads(text).get("error") or text
            except ValueError:
                err = text
            raise PrometheusError(f"{where} answered HTTP {e.code} to {path}: {err}") from None
        except urllib.error.URLError as e:
            reason = e.reason
            if isinstance(reason, ssl.SSLError) or isinstance(reason, ssl.CertificateError):
                raise PrometheusTLSError(f"TLS handshake with {where} failed: {reason}") from None
            if isinstance(reason, (socket.timeout, TimeoutError)):
                raise PrometheusTimeout(f"{where} did not answer within {self.timeout:g} s "
                                        f"(--timeout)") from None
            raise PrometheusDown(f"cannot reach {where}: {reason}") from None
        except (socket.timeout, TimeoutError):
            raise PrometheusTimeout(f"{where} did not answer within {self.timeout:g} s (--timeout)") from None
        except ssl.SSLError as e:
            raise PrometheusTLSError(f"TLS with {where} failed: {e}") from None
        except (ConnectionError, OSError) as e:
            raise PrometheusDown(f"cannot reach {where}: {e}") from None
        try:
            doc = json.loads(raw)
        except ValueError:
            raise PrometheusError(f"{where} answered {path} with something that is not JSON: {raw[:120]!r}") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            raise PrometheusError(f"{where}: {path} failed: {doc.get('error') if isinstance(doc, dict) else doc}")
        return doc.get("data") or {}

    def query(self, expr: str, at: Optional[float] = None) -> List[Tuple[Dict[str, str], float, float]]:
        """Instant vector: [(labels, timestamp, value)]."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._post("query", params)
        if data.get("resultType") == "scalar":
            t, v = data["result"]
            return [({}, float(t), float(v))]
        return [(r["metric"], float(r["value"][0]), float(r["value"][1])) for r in data.get("result", [])]

    def query_range(self, expr: str, start: float, end: float, step: float
                    ) -> List[Tuple[Dict[str, str], List[Tuple[float, float]]]]:
        """Range matrix: [(labels, [(timestamp, value), ...])]."""
        data = self._post("query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                          "step": f"{step:g}"})
        return [(r["metric"], [(float(t), float(v)) for t, v in r["values"]]) for r in data.get("result", [])]

    def now(self) -> float:
        """Prometheus' own clock (time())."""
        (_, _, v), = self.query("time()")
        return v
