"""The exporter-toolkit web configuration file (``--web.config.file``), read the way node_exporter reads it.

A site's existing file works unchanged::

    tls_server_config: {cert_file, key_file, cert, key, client_auth_type, client_ca_file, client_ca,
                        client_allowed_sans, min_version, max_version, cipher_suites,
                        prefer_server_cipher_suites, curve_preferences}
    http_server_config: {http2, headers}
    basic_auth_users: {user: bcrypt hash}
    rate_limit: {interval, burst}

Every key the toolkit defines is accepted; any other key is a :class:`ConfigError` naming it
(exit 2 at start).  Where Python's ``ssl`` differs from Go's ``crypto/tls`` the behaviour is the
stricter one and the difference is logged once at load:

- ``RequestClientCert`` / ``RequireAnyClientCert``: Python verifies every client certificate it
  asks for, so an unverifiable certificate fails the handshake (Go would accept it).
- ``cipher_suites``: Go names are mapped to OpenSSL names; TLS 1.3 suites are fixed by the
  standard (Go ignores them too); suites OpenSSL cannot offer are an error.
- ``curve_preferences``: Python can select one curve; the first one listed is used.
- ``http2``: accepted and ignored (the agent speaks HTTP/1.1; it offers ``http/1.1`` by ALPN).

:class:`WebConfig` re-reads the file and the files it names whenever one of them changes
(mtime, size, inode), as the toolkit re-reads them on every request, so certificate rotation
and password changes need no restart.  A change that does not load keeps the last good
configuration and logs why.  A change that would guard /metrics less than the configuration in force
(basic auth removed or emptied, client certificates no longer required, turning TLS off) is refused
the same way (:func:`weakened`): a half-written file must never open the endpoint; the operator turns a
guard off with a restart.

bcrypt results are cached, keyed by a SHA-256 of user, hash and password, so a scrape pays the
hash once per credential, not once per request.  Verified credentials and refused ones are kept
in two separate bounded LRUs (:data:`AUTH_CACHE_SIZE`, :data:`FAILED_CACHE_SIZE`): any number of
wrong passwords only ever evicts other wrong passwords, never a credential that verified.  The
server looks a credential up on its event loop (:meth:`WebConfig.cached`) and hashes only what
neither cache holds (:meth:`WebConfig.verify`, on its own bounded thread: exporters/http.py).
"""
from __future__ import annotations

import base64
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    import ssl

from agent.config import key_text, short_repr
from agent.errors import ConfigError
from agent.logutil import RateLimitedLog

log = logging.getLogger("teye.http")
_rlog = RateLimitedLog(log)

# Go crypto/tls cipher suite names -> OpenSSL names (TLS 1.2 and older).
GO_CIPHERS = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256": "AES128-SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
TLS13_SUITES = {"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"}
GO_CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1", "X25519": "X25519"}
# (names in ssl, looked up where a TLS section is read: without TLS the agent never loads OpenSSL, 5 MiB of its
# resident memory; exporters/lean.py)
TLS_VERSIONS = {"TLS10": "TLSv1", "TLS11": "TLSv1_1", "TLS12": "TLSv1_2", "TLS13": "TLSv1_3"}
CLIENT_AUTH = {"NoClientCert": "CERT_NONE", "RequestClientCert": "CERT_OPTIONAL",
               "RequireAnyClientCert": "CERT_REQUIRED", "VerifyClientCertIfGiven": "CERT_OPTIONAL",
               "RequireAndVerifyClientCert": "CERT_REQUIRED"}
# Header -> allowed values (None: any string), as the toolkit validates them.
HEADERS = {"Content-Security-Policy": None, "X-Frame-Options": ("deny", "sameorigin"),
           "X-Content-Type-Options": ("nosniff",), "X-XSS-Protection": None, "Strict-Transport-Security": None}

_TLS_KEYS = {"cert_file", "key_file", "cert", "key", "client_auth_type", "client_ca_file", "client_ca",
             "client_allowed_sans", "min_version", "max_version", "cipher_suites", "prefer_server_cipher_suites",
             "curve_preferences"}
_TOP_KEYS = {"tls_server_config", "http_server_config", "basic_auth_users", "rate_limit"}
_BCRYPT = re.compile(r"^\$2[abxy]?\$\d\d\$[./A-Za-z0-9]{53}$")
_DURATION = re.compile(r"(\d+(?:\.\d*)?)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
# A bcrypt hash of a random password: unknown users pay the same hash as known ones.
_DUMMY_HASH = b"$2b$10$u8pv5d/dAiK04VFrifWeNusg90XamH0PCFbZj1.RD0/helTL2Yzzi"
AUTH_CACHE_SIZE = 256       # credentials that verified (only these: wrong passwords never evict them)
FAILED_CACHE_SIZE = 1024    # credentials that did not (a stale password is not hashed again every scrape)


def go_duration(text: Any, key: str) -> float:
    """Go duration ('1s', '1m30s', '250ms', '0') -> seconds."""
    s = str(text).strip()
    if s == "0":
        return 0.0
    pos, total = 0, 0.0
    for m in _DURATION.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s) or not s:
        raise ConfigError(f"{key}: expected a duration such as 1s or 250ms, got {short_repr(text)}")
    return total


@dataclass(frozen=True)
class TLSSettings:
    context: ssl.SSLContext
    allowed_sans: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Settings:
    """One loaded web configuration."""

    tls: Optional[TLSSettings] = None
    users: Dict[str, bytes] = field(default_factory=dict)
    headers: Tuple[Tuple[str, str], ...] = ()
    rate_interval: float = 0.0
    rate_burst: int = 0


def _mapping(value: Any, key: str) -> Dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
    return value


def _check_keys(section: Dict[str, Any], allowed, where: str) -> None:
    for k in section:
        if k not in allowed:
            raise ConfigError(f"{where}{key_text(k)}: unknown key (known here: {', '.join(sorted(allowed))})")


def _string(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key}: expected a non-empty string, got {short_repr(value)}")
    return value


def _strings(value: Any, key: str) -> List[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{key}: expected a list of strings, got {short_repr(value)}")
    return value


def _resolve(base: str, path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(base, path)


def _load_chain(ctx: ssl.SSLContext, certfile: str, keyfile: str, what: str) -> None:
    import ssl
    try:
        ctx.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"tls_server_config: cannot load {what}: {e}") from None


def _memfile(data: str) -> int:
    """An anonymous in-memory file holding ``data`` (inline PEM never touches the disk)."""
    fd = os.memfd_create("teye-pem", os.MFD_CLOEXEC)
    os.write(fd, data.encode())
    return fd


def _pem_source(section: Dict[str, Any], what: str, base: str, files: List[str], fds: List[int]) -> str:
    """The path ssl loads the certificate or key from: ``{what}_file`` (watched for changes), or the
    inline ``{what}`` PEM in an anonymous in-memory file (its fd appended to fds)."""
    w = "tls_server_config."
    path, inline = section.get(what + "_file"), section.get(what)
    if path and inline:
        raise ConfigError(f"{w}{what} and {w}{what}_file: give one of them, not both")
    if not (path or inline):
        raise ConfigError(f"{w}{what}_file: missing (required when tls_server_config is set)")
    if path:
        path = _resolve(base, _string(path, w + what + "_file"))
        files.append(path)
        return path
    fds.append(_memfile(_string(inline, w + what)))
    return f"/proc/self/fd/{fds[-1]}"


def _tls(section: Dict[str, Any], base: str, files: List[str]) -> TLSSettings:
    import ssl   # (here: a TLS section; see TLS_VERSIONS)
    w = "tls_server_config."
    _check_keys(section, _TLS_KEYS, w)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.options |= ssl.OP_NO_COMPRESSION
    # a client-initiated renegotiation (TLS 1.2) costs the server a handshake's CPU on a connection that is
    # already counted: refused (OpenSSL 3 refuses it by default; 1.1.1, which Python 3.8+ may run on, does not)
    ctx.options |= ssl.OP_NO_RENEGOTIATION
    fds: List[int] = []
    try:
        paths = [_pem_source(section, what, base, files, fds) for what in ("cert", "key")]
        _load_chain(ctx, paths[0], paths[1], "certificate/key")
    finally:
        for fd in fds:
            os.close(fd)

    auth = section.get("client_auth_type", "NoClientCert") or "NoClientCert"
    if not isinstance(auth, str) or auth not in CLIENT_AUTH:
        raise ConfigError(f"{w}client_auth_type: expected one of {', '.join(CLIENT_AUTH)}, got {short_repr(auth)}")
    ca_file, ca = section.get("client_ca_file"), section.get("client_ca")
    if (ca_file or ca) and auth == "NoClientCert":
        raise ConfigError(f"{w}client_ca_file: client CAs are configured but client_auth_type is NoClientCert")
    if ca_file and ca:
        raise ConfigError(f"{w}client_ca and {w}client_ca_file: give one of them, not both")
    ctx.verify_mode = getattr(ssl, CLIENT_AUTH[auth])
    if auth in ("RequestClientCert", "RequireAnyClientCert"):
        log.warning("web config: client_auth_type %s: client certificates are verified too (Python's ssl "
                    "cannot accept an unverified one)", auth)
    try:
        if ca_file:
            path = _resolve(base, _string(ca_file, w + "client_ca_file"))
            files.append(path)
            ctx.load_verify_locations(cafile=path)
        elif ca:
            ctx.load_verify_locations(cadata=_string(ca, w + "client_ca"))
        elif auth != "NoClientCert":
            ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)  # Go: nil ClientCAs means the system roots
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"{w}client_ca_file: cannot load: {e}") from None
    sans = tuple(_strings(section.get("client_allowed_sans"), w + "client_allowed_sans"))
    if sans and auth not in ("RequireAnyClientCert", "RequireAndVerifyClientCert"):
        raise ConfigError(f"{w}client_allowed_sans: needs client_auth_type RequireAnyClientCert or "
                          "RequireAndVerifyClientCert")

    for k, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        v = section.get(k) or default
        if not isinstance(v, str) or v not in TLS_VERSIONS:
            raise ConfigError(f"{w}{k}: expected one of {', '.join(TLS_VERSIONS)}, got {short_repr(v)}")
        try:
            setattr(ctx, k.replace("_version", "imum_version"), getattr(ssl.TLSVersion, TLS_VERSIONS[v]))
        except ValueError as e:
            raise ConfigError(f"{w}{k}: {v} not available here ({e})") from None
    if ctx.minimum_version > ctx.maximum_version:
        raise ConfigError(f"{w}min_version: higher than max_version")

    suites = _strings(section.get("cipher_suites"), w + "cipher_suites")
    names = []
    for s in suites:
        if s in TLS13_SUITES:
            continue
        if s not in GO_CIPHERS:
            raise ConfigError(f"{w}cipher_suites: {short_repr(s)} is not supported (supported: "
                              f"{', '.join(sorted(GO_CIPHERS) + sorted(TLS13_SUITES))})")
        names.append(GO_CIPHERS[s])
    if names:
        try:
            ctx.set_ciphers(":".join(names))
        except ssl.SSLError:
            raise ConfigError(f"{w}cipher_suites: OpenSSL here offers none of {suites}") from None
    prefer = section.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise ConfigError(f"{w}prefer_server_cipher_suites: expected a boolean, got {short_repr(prefer)}")
    if prefer:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    curves = _strings(section.get("curve_preferences"), w + "curve_preferences")
    for c in curves:
        if c not in GO_CURVES:
            raise ConfigError(f"{w}curve_preferences: {short_repr(c)} is not one of {', '.join(GO_CURVES)}")
    if curves:
        ctx.set_ecdh_curve(GO_CURVES[curves[0]])
    ctx.set_alpn_protocols(["http/1.1"])
    return TLSSettings(ctx, sans)


def parse(data: Any, base: str = ".") -> Tuple[Settings, List[str]]:
    """A parsed YAML document -> (Settings, files it names); ConfigError naming the bad key."""
    doc = _mapping(data, "web config")
    _check_keys(doc, _TOP_KEYS, "")
    files: List[str] = []
    tls_section = doc.get("tls_server_config")
    tls = _tls(_mapping(tls_section, "tls_server_config"), base, files) if tls_section else None

    http = _mapping(doc.get("http_server_config"), "http_server_config")
    _check_keys(http, {"http2", "headers"}, "http_server_config.")
    if "http2" in http and not isinstance(http["http2"], bool):
        raise ConfigError(f"http_server_config.http2: expected a boolean, got {http['http2']!r}")
    headers = []
    for name, value in _mapping(http.get("headers"), "http_server_config.headers").items():
        where = f"http_server_config.headers.{key_text(name)}"
        if name not in HEADERS:
            raise ConfigError(f"{where}: unknown header (allowed: {', '.join(HEADERS)})")
        if value in (None, ""):
            continue
        if not isinstance(value, str) or "\r" in value or "\n" in value:
            raise ConfigError(f"{where}: expected a one-line string, got {short_repr(value)}")
        allowed = HEADERS[name]
        if allowed and value.lower() not in allowed:
            raise ConfigError(f"{where}: expected one of {', '.join(allowed)}, got {short_repr(value)}")
        headers.append((name, value))

    if "basic_auth_users" in doc and doc["basic_auth_users"] is None:
        # the shape of a file cut just after the key (or every user commented out): never read as "no auth"
        raise ConfigError("basic_auth_users: present but empty (a file cut short?); list users, or remove the "
                          "key to serve without basic auth")
    users = {}
    for user, h in _mapping(doc.get("basic_auth_users"), "basic_auth_users").items():
        if not isinstance(user, str) or not isinstance(h, str) or not _BCRYPT.match(h):
            raise ConfigError(f"basic_auth_users.{key_text(user)}: expected a bcrypt hash ($2y$10$... as htpasswd -nBC 10 "
                              "writes it)")
        users[user] = h.encode()

    rate = _mapping(doc.get("rate_limit"), "rate_limit")
    _check_keys(rate, {"interval", "burst"}, "rate_limit.")
    interval = go_duration(rate.get("interval", 0), "rate_limit.interval")
    burst = rate.get("burst", 0)
    if not isinstance(burst, int) or isinstance(burst, bool) or burst < 0:
        raise ConfigError(f"rate_limit.burst: expected an integer >= 0, got {short_repr(burst)}")
    return Settings(tls, users, tuple(headers), interval, burst), files


def read(path: str) -> Tuple[Settings, List[str]]:
    """Read and parse the file at ``path`` (relative paths inside resolve against its directory)."""
    import yaml   # (here: a web config file is given)
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as e:
        raise ConfigError(f"web config file {path}: {e.strerror}") from None
    except (yaml.YAMLError, ValueError, RecursionError) as e:
        raise ConfigError(f"web config file {path}: invalid YAML: {str(e).splitlines()[0][:200]}") from None
    try:
        settings, files = parse(data, os.path.dirname(os.path.abspath(path)))
    except ConfigError as e:
        raise ConfigError(f"web config file {path}: {e}") from None
    return settings, [os.path.abspath(path)] + files


_CERT_LEVELS = {"CERT_NONE": 0, "CERT_OPTIONAL": 1, "CERT_REQUIRED": 2}   # (ssl.VerifyMode names)


def weakened(old: Settings, new: Settings) -> Optional[str]:
    """Why ``new`` guards /metrics less than ``old`` (None when it does not): basic auth removed or emptied,
    client certificates no longer asked for or no longer required, ``client_allowed_sans`` dropped.  A reload
    never does that; the operator turns a guard off with a restart.  Changing users, passwords, CAs or SANs
    is not weakening."""
    if old.users and not new.users:
        return "basic_auth_users removed or empty while basic auth is on"
    if old.tls is not None and new.tls is not None:
        was, now = (_CERT_LEVELS[s.tls.context.verify_mode.name] for s in (old, new))
        if now < was:
            return "client_auth_type weaker than the one in force (client certificates no longer " + (
                "asked for)" if now == 0 else "required)")
        if old.tls.allowed_sans and not new.tls.allowed_sans:
            return "client_allowed_sans removed or empty while it is in force"
    return None


def _signature(files: List[str]) -> Tuple:
    out = []
    for f in files:
        try:
            st = os.stat(f)
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


def parse_basic_auth(header: Optional[str]) -> Optional[Tuple[str, str]]:
    """'Basic base64(user:password)' -> (user, password), None when absent or malformed."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        raw = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None
    user, sep, password = raw.partition(":")
    return (user, password) if sep else None


class WebConfig:
    """The current web configuration of one server, reloaded when its files change."""

    def __init__(self, path: Optional[str]):
        self.path = path
        self._lock = threading.Lock()
        self._good: "OrderedDict[bytes, None]" = OrderedDict()     # verified credentials, LRU
        self._failed: "OrderedDict[bytes, None]" = OrderedDict()   # refused credentials, LRU apart
        if path:
            self._settings, self._files = read(path)
            self._sig = _signature(self._files)
        else:
            self._settings, self._files, self._sig = Settings(), [], ()
        self.tls_enabled = self._settings.tls is not None
        # reloads after the first load (which succeeded, or the server would not start)
        self.reloads_ok = self.reloads_failed = 0
        self.last_reload_ok = True
        self.last_success_time = time.time()

    @property
    def has_users(self) -> bool:
        """Basic auth is on in the settings in force (without re-reading the file)."""
        return bool(self._settings.users)

    def current(self) -> Settings:
        """The settings, re-read first if the file or a file it names changed."""
        if not self.path:
            return self._settings
        sig = _signature(self._files)
        if sig == self._sig:
            return self._settings
        with self._lock:
            if sig != self._sig:
                self._sig = sig
                try:
                    settings, files = read(self.path)
                except ConfigError as e:
                    _rlog.error("webconfig", "web config not reloaded, keeping the last good one: %s", e)
                    self._reloaded(False)
                else:
                    weaker = weakened(self._settings, settings)
                    if (settings.tls is not None) != self.tls_enabled:
                        _rlog.error("webconfig", "web config %s: turning TLS on or off needs a restart; "
                                    "keeping the last good configuration", self.path)
                        self._reloaded(False)
                    elif weaker:
                        _rlog.error("webconfig", "web config %s not reloaded: %s (turning authentication off "
                                    "needs a restart); keeping the last good configuration", self.path, weaker)
                        self._reloaded(False)
                    else:
                        self._settings, self._files = settings, files
                        # the file's own signature from before the read: a write that lands while it was
                        # read (a file still being written) is read again at the next request
                        self._sig = (sig[0],) + _signature(files)[1:]
                        log.info("web config %s reloaded", self.path)
                        self._reloaded(True)
            return self._settings

    def _reloaded(self, ok: bool) -> None:
        if ok:
            self.reloads_ok += 1
            self.last_success_time = time.time()
        else:
            self.reloads_failed += 1
        self.last_reload_ok = ok

    @staticmethod
    def credential(settings: Settings, user: str, password: str) -> bytes:
        """The cache key of one credential: a SHA-256 of user, the hash it is checked against, password
        (a changed hash makes new keys, so a password change needs no cache flush)."""
        import hashlib   # (here: basic auth is on; an agent without it never loads OpenSSL's libcrypto)
        hashed = settings.users.get(user, _DUMMY_HASH)
        return hashlib.sha256(b"\0".join((user.encode("utf-8", "surrogateescape"), hashed,
                                           password.encode("utf-8", "surrogateescape")))).digest()

    def cached(self, key: bytes) -> Optional[bool]:
        """True: verified before; False: refused before; None: never checked (or forgotten).  Cheap
        (a dict lookup): the server calls it on its event loop."""
        with self._lock:
            if key in self._good:
                self._good.move_to_end(key)
                return True
            if key in self._failed:
                self._failed.move_to_end(key)
                return False
        return None

    def remember(self, key: bytes, ok: bool) -> None:
        """Keep a bcrypt result: a verified credential among the verified ones, a refused one among the
        refused ones; each LRU is bounded on its own, so refusals never evict a verified credential."""
        cache, size = (self._good, AUTH_CACHE_SIZE) if ok else (self._failed, FAILED_CACHE_SIZE)
        with self._lock:
            cache[key] = None
            cache.move_to_end(key)
            while len(cache) > size:
                cache.popitem(last=False)

    @staticmethod
    def verify(settings: Settings, user: str, password: str) -> bool:
        """The bcrypt check of one credential (slow on purpose: ~60 ms at cost 10); unknown users pay the
        same hash as known ones and are refused."""
        import bcrypt
        known = settings.users.get(user)
        try:
            ok = bcrypt.checkpw(password.encode("utf-8", "surrogateescape"),
                                known if known is not None else _DUMMY_HASH)
        except ValueError:
            ok = False
        # Timing: no secret is compared byte by byte here.  bcrypt's check is constant-time, unknown
        # users pay the same hash as known ones, and the caches are keyed by a SHA-256 digest.
        return ok and known is not None

    def check_password(self, settings: Settings, user: str, password: str) -> bool:
        """bcrypt check of one credential, cached (:meth:`cached`, :meth:`verify`, :meth:`remember` in one
        call, on the caller's thread)."""
        key = self.credential(settings, user, password)
        ok = self.cached(key)
        if ok is None:
            ok = self.verify(settings, user, password)
            self.remember(key, ok)
        return ok
