"""TLS, client certificates and basic auth from an exporter-toolkit web config, served in-process."""
from __future__ import annotations

import logging
import os
import ssl
import subprocess
import sys
import time

import pytest

from agent.errors import ConfigError
from exporters import webconfig
from tests.procs import REPO, free_port
from tests.web.certs import bcrypt_hash, write_pki
from tests.web.server_helpers import BODY, client_context, connect, no_tracebacks, read_all, request, start


@pytest.fixture
def pki(tmp_path):
    return write_pki(str(tmp_path))


def write_web(path, text):
    tmp = str(path) + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)  # as a config manager would: readers never see half a file


def web_yaml(pki, extra_tls="", users=None, headers=""):
    text = f"""tls_server_config:
  cert_file: {pki['server']}
  key_file: {os.path.basename(pki['server-key'])}   # relative: resolved against the file's directory
{extra_tls}http_server_config:
  http2: true
{headers}"""
    if users:
        text += "basic_auth_users:\n" + "".join(f"  {u}: '{h}'\n" for u, h in users.items())
    return text


def test_basic_auth_over_tls(tmp_path, pki, caplog):
    caplog.set_level(logging.DEBUG, logger="teye.http")
    path = tmp_path / "web.yml"
    write_web(path, web_yaml(pki, users={"prom": bcrypt_hash("s3cret")},
                             headers="  headers:\n    X-Content-Type-Options: nosniff\n    X-Frame-Options: deny\n"))
    srv, render = start(str(path))
    ctx = client_context(pki["ca"])
    try:
        code, hdrs, body = request(srv, ctx=ctx, auth=("prom", "s3cret"))
        assert (code, body) == (200, BODY)
        assert hdrs["x-content-type-options"] == "nosniff" and hdrs["x-frame-options"] == "deny"
        for auth in (("prom", "wrong"), ("nobody", "s3cret"), ("prom", ""), None):
            code, hdrs, body = request(srv, ctx=ctx, auth=auth)
            assert code == 401 and hdrs["www-authenticate"].startswith("Basic")
            assert body == b"unauthorized\n"
        assert render.calls == 1  # a refused scrape never renders
        assert request(srv, "/healthz", ctx=ctx)[0] == 200  # no data, no credentials needed
        assert no_tracebacks(caplog.records) == []
    finally:
        srv.stop()


def test_plain_http_on_the_tls_port_gets_a_clean_400(tmp_path, pki):
    path = tmp_path / "web.yml"
    write_web(path, web_yaml(pki))
    srv, _ = start(str(path))
    try:
        code, _, body = request(srv)
        assert code == 400 and b"HTTP request to an HTTPS server" in body
        assert request(srv, ctx=client_context(pki["ca"]))[0] == 200
    finally:
        srv.stop()


def handshake_refused(srv, ctx) -> bool:
    """True when the server refuses the TLS session (at handshake, or its first read in TLS 1.3)."""
    try:
        with connect(srv, ctx) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = s.recv(65536)
            return data == b""
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        return True


def test_client_certificate_required(tmp_path, pki):
    path = tmp_path / "web.yml"
    write_web(path, web_yaml(pki, extra_tls=f"  client_auth_type: RequireAndVerifyClientCert\n"
                                            f"  client_ca_file: {pki['ca']}\n"
                                            f"  client_allowed_sans: [client.teye.test]\n"))
    srv, _ = start(str(path))
    try:
        assert handshake_refused(srv, client_context(pki["ca"]))
        other = write_pki(str(tmp_path / "other") if os.makedirs(tmp_path / "other") is None else "")
        assert handshake_refused(srv, client_context(pki["ca"], other["client"], other["client-key"]))
        code, _, body = request(srv, ctx=client_context(pki["ca"], pki["client"], pki["client-key"]))
        assert (code, body) == (200, BODY)
        # a certificate from the right CA but a SAN not allowed: closed without an answer
        assert handshake_refused(srv, client_context(pki["ca"], pki["server"], pki["server-key"]))
    finally:
        srv.stop()


def test_certificates_and_users_are_reloaded_when_they_change(tmp_path, pki):
    path = tmp_path / "web.yml"
    write_web(path, web_yaml(pki, users={"prom": bcrypt_hash("old")}))
    srv, _ = start(str(path))
    try:
        assert request(srv, ctx=client_context(pki["ca"]), auth=("prom", "old"))[0] == 200
        rotated = write_pki(str(tmp_path / "rotated") if os.makedirs(tmp_path / "rotated") is None else "")
        for name in ("server", "server-key"):   # new files in place of the old ones
            os.replace(rotated[name], pki[name])
        write_web(path, web_yaml(pki, users={"prom": bcrypt_hash("new")}))
        new_ctx = client_context(rotated["ca"])
        assert request(srv, ctx=new_ctx, auth=("prom", "new"))[0] == 200
        assert request(srv, ctx=new_ctx, auth=("prom", "old"))[0] == 401
        assert handshake_refused(srv, client_context(pki["ca"]))  # the old CA no longer verifies it
        write_web(path, "tls_server_config: [broken\n")  # a bad edit keeps the last good configuration
        assert request(srv, ctx=new_ctx, auth=("prom", "new"))[0] == 200
    finally:
        srv.stop()


def test_bcrypt_results_are_cached(tmp_path, monkeypatch):
    import bcrypt
    calls = []
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda pw, h: calls.append(pw) or real(pw, h))
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  prom: '{bcrypt_hash('pw')}'\n")
    wc = webconfig.WebConfig(str(path))
    s = wc.current()
    assert [wc.check_password(s, "prom", "pw") for _ in range(5)] == [True] * 5
    assert [wc.check_password(s, "prom", "no") for _ in range(3)] == [False] * 3
    assert wc.check_password(s, "eve", "pw") is False   # unknown users pay a hash too
    assert calls == [b"pw", b"no", b"pw"]
    for i in range(webconfig.FAILED_CACHE_SIZE + 10):   # bounded
        wc.check_password(s, "prom", f"guess{i}")
    assert len(wc._failed) == webconfig.FAILED_CACHE_SIZE
    assert len(calls) == 3 + webconfig.FAILED_CACHE_SIZE + 10
    assert wc.check_password(s, "prom", "pw") is True   # wrong passwords never evict a verified one:
    assert len(calls) == 3 + webconfig.FAILED_CACHE_SIZE + 10   # no hash
    assert wc.check_password(s, "prom", "guess0") is False      # the oldest failures went instead
    assert calls[-1] == b"guess0"


FULL_TOOLKIT_FILE = """
tls_server_config:
  cert_file: {server}
  key_file: {key}
  client_auth_type: VerifyClientCertIfGiven
  client_ca_file: {ca}
  min_version: TLS12
  max_version: TLS13
  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
                  TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305, TLS_AES_128_GCM_SHA256]
  prefer_server_cipher_suites: true
  curve_preferences: [X25519, CurveP256]
http_server_config:
  http2: false
  headers:
    Content-Security-Policy: default-src 'self'
    X-Frame-Options: sameorigin
    X-Content-Type-Options: nosniff
    X-XSS-Protection: 1; mode=block
    Strict-Transport-Security: max-age=31536000
basic_auth_users:
  alice: $2y$10$X0h1gDsPszWURQaxFh.zoubFi6DXncSjhoQNJgRrnGs7EsimhC7zG
rate_limit:
  interval: 1m30s
  burst: 10
"""


def test_every_toolkit_key_is_accepted(tmp_path, pki):
    path = tmp_path / "web.yml"
    path.write_text(FULL_TOOLKIT_FILE.format(server=pki["server"], key=pki["server-key"], ca=pki["ca"]))
    s, files = webconfig.read(str(path))
    assert s.tls.context.verify_mode == ssl.CERT_OPTIONAL
    assert s.tls.context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert {c["name"] for c in s.tls.context.get_ciphers() if c["protocol"] == "TLSv1.2"} == {
        "ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES256-GCM-SHA384", "ECDHE-ECDSA-CHACHA20-POLY1305"}
    assert dict(s.headers)["X-XSS-Protection"] == "1; mode=block" and len(s.headers) == 5
    assert list(s.users) == ["alice"]
    assert (s.rate_interval, s.rate_burst) == (90.0, 10)
    assert files == [str(path), pki["server"], pki["server-key"], pki["ca"]]


@pytest.mark.parametrize("text, named", [
    ("tls_server_confg: {{}}\n", "tls_server_confg: unknown key"),
    ("tls_server_config: {{cert_file: {server}, key_file: {key}, ocsp: true}}\n", "tls_server_config.ocsp"),
    ("http_server_config: {{http3: true}}\n", "http_server_config.http3"),
    ("http_server_config: {{headers: {{X-Powered-By: teye}}}}\n", "headers.X-Powered-By: unknown header"),
    ("http_server_config: {{headers: {{X-Frame-Options: allow}}}}\n", "X-Frame-Options: expected one of"),
    ("tls_server_config: {{key_file: {key}}}\n", "cert_file: missing"),
    ("tls_server_config: {{cert_file: {server}, key_file: /nonexistent.pem}}\n", "cannot load"),
    ("tls_server_config: {{cert_file: {server}, key_file: {key}, client_auth_type: Sometimes}}\n",
     "client_auth_type: expected one of"),
    ("tls_server_config: {{cert_file: {server}, key_file: {key}, client_ca_file: {ca}}}\n", "NoClientCert"),
    ("tls_server_config: {{cert_file: {server}, key_file: {key}, min_version: SSL3}}\n", "min_version"),
    ("tls_server_config: {{cert_file: {server}, key_file: {key}, cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]}}\n",
     "TLS_RSA_WITH_RC4_128_SHA' is not supported"),
    ("basic_auth_users: {{prom: plaintext}}\n", "basic_auth_users.prom: expected a bcrypt hash"),
    ("rate_limit: {{interval: soon}}\n", "rate_limit.interval"),
    ("- a list\n", "expected a mapping"),
])
def test_bad_web_configs_name_the_key(tmp_path, pki, text, named):
    path = tmp_path / "web.yml"
    path.write_text(text.format(server=pki["server"], key=pki["server-key"], ca=pki["ca"]))
    with pytest.raises(ConfigError) as e:
        webconfig.read(str(path))
    assert named in str(e.value) and str(path) in str(e.value)


def test_agent_exits_2_naming_an_unknown_key_before_binding(tmp_path):
    path = tmp_path / "web.yml"
    path.write_text("basic_auth_users: {}\ntls_server_config:\n  cert_file: a\n  key_file: b\n  sni: x\n")
    port = free_port()
    res = subprocess.run([sys.executable, "-m", "agent", "agent", "--listen", f"127.0.0.1:{port}",
                          "--phase-socket", str(tmp_path / "p.sock"), "--web.config.file", str(path)],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"teye: web config file {path}: tls_server_config.sni: unknown key (known here: cert, cert_file, "
        "cipher_suites, client_allowed_sans, client_auth_type, client_ca, client_ca_file, curve_preferences, key, "
        "key_file, max_version, min_version, prefer_server_cipher_suites)"]
    assert not (tmp_path / "p.sock").exists()


def test_rate_limit_answers_429(tmp_path, pki):
    path = tmp_path / "web.yml"
    path.write_text("rate_limit: {interval: 1h, burst: 2}\n")
    srv, _ = start(str(path))
    try:
        assert [request(srv)[0] for _ in range(4)] == [200, 200, 429, 429]
    finally:
        srv.stop()


def test_inline_certificate_key_and_client_ca(tmp_path, pki):
    def block(name):
        return "|\n" + "".join("    " + line + "\n" for line in open(pki[name]).read().splitlines())
    path = tmp_path / "web.yml"
    path.write_text(f"tls_server_config:\n  cert: {block('server')}  key: {block('server-key')}"
                    f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca: {block('ca')}")
    srv, _ = start(str(path))
    try:
        code, _, body = request(srv, ctx=client_context(pki["ca"], pki["client"], pki["client-key"]))
        assert (code, body) == (200, BODY)
        assert handshake_refused(srv, client_context(pki["ca"]))
    finally:
        srv.stop()
