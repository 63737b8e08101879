"""A reload never weakens the guard (issue 48): a web config that removes or empties basic auth, or asks
for client certificates less than the one in force, is refused like turning TLS off; the last good
configuration stays and the refusal is counted.  The oracle is the endpoint itself: what a client without
credentials (or without a certificate) gets after each write."""
from __future__ import annotations

import base64
import os
import ssl
import threading
import time
import urllib.error
import urllib.request

import pytest

from exporters import webconfig
from tests.web.certs import bcrypt_hash, write_pki
from tests.web.server_helpers import BODY, client_context, request, start
from tests.web.test_selfmetrics import serve, scrape, web_series
from tests.web.test_tls import handshake_refused, web_yaml, write_web


@pytest.fixture(scope="module")
def hashes():
    return {"prom": bcrypt_hash("s3cret"), "bob": bcrypt_hash("b0b")}


@pytest.fixture
def pki(tmp_path):
    return write_pki(str(tmp_path))


def users_yaml(users):
    return "basic_auth_users:\n" + "".join(f"  {u}: '{h}'\n" for u, h in users.items())


def write_in_place(path, text):
    """As an editor or `cat > file` writes: the same inode, truncated then written (readers can see a cut)."""
    with open(path, "r+" if os.path.exists(path) else "w") as fh:
        fh.truncate(0)
        fh.write(text)


def reloads(srv):
    body = scrape(srv, auth=("prom", "s3cret"))
    return web_series(body, "teye_web_config_reloads_total")


# Each edit below would open /metrics to anyone if it loaded; each is refused and counted as a failure.
WEAKER = {
    "cut after the key": "basic_auth_users:\n",
    "cut after the key, no newline": "basic_auth_users:",
    "users section present and empty": "basic_auth_users: {}\n",
    "users section removed": "rate_limit: {interval: 1s, burst: 100}\n",
    "empty file": "",
    "comments only": "# nothing here yet\n",
}


@pytest.mark.parametrize("name", list(WEAKER))
def test_a_reload_that_drops_basic_auth_is_refused_and_the_old_guard_stays(tmp_path, hashes, name):
    path = tmp_path / "web.yml"
    write_web(path, users_yaml({"prom": hashes["prom"]}))
    srv, render = serve(str(path))
    try:
        assert request(srv)[0] == 401
        assert reloads(srv) == {("success",): 0, ("failure",): 0}
        write_in_place(path, WEAKER[name])
        assert request(srv)[0] == 401                      # still guarded: the weaker file never loads
        assert request(srv, auth=("prom", "s3cret"))[0] == 200
        assert reloads(srv) == {("success",): 0, ("failure",): 1}
        assert srv._web.last_reload_ok is False
        write_in_place(path, users_yaml({"prom": hashes["prom"], "bob": hashes["bob"]}))   # the whole write
        assert request(srv, auth=("bob", "b0b"))[0] == 200
        assert request(srv)[0] == 401
        assert reloads(srv) == {("success",): 1, ("failure",): 1}
    finally:
        srv.stop()


def test_the_refusal_is_one_line_naming_the_reason(tmp_path, hashes, caplog, monkeypatch):
    from agent.logutil import RateLimitedLog
    monkeypatch.setattr(webconfig, "_rlog", RateLimitedLog(webconfig.log))   # earlier tests' lines forgotten
    path = tmp_path / "web.yml"
    write_web(path, users_yaml({"prom": hashes["prom"]}))
    srv, _ = start(str(path))
    try:
        caplog.clear()
        write_in_place(path, "rate_limit: {interval: 1s, burst: 5}\n")
        assert request(srv)[0] == 401
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 1 and "\n" not in errors[0]
        assert "basic_auth_users removed or empty while basic auth is on" in errors[0]
        assert "needs a restart" in errors[0] and str(path) in errors[0]
    finally:
        srv.stop()


def test_present_but_empty_users_is_refused_at_start_too(tmp_path):
    path = tmp_path / "web.yml"
    path.write_text("basic_auth_users:\n")
    with pytest.raises(webconfig.ConfigError) as e:
        webconfig.read(str(path))
    assert "basic_auth_users: present but empty" in str(e.value)
    path.write_text("basic_auth_users: {}\n")      # an explicit empty mapping is a deliberate "no users"
    assert webconfig.read(str(path))[0].users == {}


def test_changing_users_and_adding_auth_still_reload(tmp_path, hashes):
    path = tmp_path / "web.yml"
    write_web(path, "rate_limit: {interval: 1s, burst: 100}\n")
    srv, _ = start(str(path))
    try:
        assert request(srv)[0] == 200
        write_web(path, users_yaml({"prom": hashes["prom"]}))         # turning auth on: stronger, loads
        assert request(srv)[0] == 401
        write_web(path, users_yaml({"bob": hashes["bob"]}))           # another user in place: not weaker
        assert request(srv, auth=("bob", "b0b"))[0] == 200
        assert request(srv, auth=("prom", "s3cret"))[0] == 401
        assert (srv._web.reloads_ok, srv._web.reloads_failed) == (2, 0)
    finally:
        srv.stop()


def test_weakened_client_certificates_are_refused(tmp_path, pki):
    path = tmp_path / "web.yml"
    strict = f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki['ca']}\n"
    sans = "  client_allowed_sans: [client.teye.test]\n"
    write_web(path, web_yaml(pki, extra_tls=strict))
    srv, _ = start(str(path))
    no_cert, with_cert = client_context(pki["ca"]), client_context(pki["ca"], pki["client"], pki["client-key"])
    other_san = client_context(pki["ca"], pki["server"], pki["server-key"])   # right CA, SAN not allowed
    try:
        assert handshake_refused(srv, no_cert)
        for weaker in ("", f"  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: {pki['ca']}\n"):
            write_web(path, web_yaml(pki, extra_tls=weaker))
            assert handshake_refused(srv, no_cert)
            assert request(srv, ctx=with_cert)[:3:2] == (200, BODY)
        assert (srv._web.reloads_ok, srv._web.reloads_failed) == (0, 2)
        write_web(path, web_yaml(pki, extra_tls=strict + sans))                # stronger: loads
        assert handshake_refused(srv, other_san)
        write_web(path, web_yaml(pki, extra_tls=strict))                       # the SANs dropped: refused
        assert handshake_refused(srv, other_san)
        assert request(srv, ctx=with_cert)[0] == 200
        assert (srv._web.reloads_ok, srv._web.reloads_failed) == (1, 3)
        write_web(path, web_yaml(pki, extra_tls=strict + sans.replace("client.teye.test", "client.teye.test, other")))
        assert request(srv, ctx=with_cert)[0] == 200                           # other SANs: not weaker
        assert (srv._web.reloads_ok, srv._web.reloads_failed) == (2, 3)
    finally:
        srv.stop()


def test_weakened_is_none_for_equal_or_stronger_and_names_each_weakening(tmp_path, pki, hashes):
    def load(text):
        p = tmp_path / "w.yml"
        p.write_text(text)
        return webconfig.read(str(p))[0]
    auth = load(users_yaml({"prom": hashes["prom"]}))
    none = load("")
    assert webconfig.weakened(none, auth) is None and webconfig.weakened(auth, auth) is None
    assert "basic_auth_users" in webconfig.weakened(auth, none)
    req = load(web_yaml(pki, extra_tls=f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki['ca']}\n"))
    opt = load(web_yaml(pki, extra_tls=f"  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: {pki['ca']}\n"))
    off = load(web_yaml(pki))
    assert webconfig.weakened(off, req) is None and webconfig.weakened(opt, req) is None
    assert "no longer required" in webconfig.weakened(req, opt)
    assert "no longer asked for" in webconfig.weakened(req, off)
    assert "no longer asked for" in webconfig.weakened(opt, off)


def test_a_reload_while_a_scrape_is_in_flight(tmp_path, hashes):
    """The scrape under way finishes with the configuration it started under; the weaker file is refused;
    the next request without credentials still gets 401."""
    path = tmp_path / "web.yml"
    write_web(path, users_yaml({"prom": hashes["prom"]}))
    srv, render = start(str(path))
    render.gate = threading.Event()
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", request(srv, auth=("prom", "s3cret"))))
    try:
        t.start()
        assert render.entered.acquire(timeout=10)         # the render is under way
        write_in_place(path, "basic_auth_users:\n")
        render.gate.set()
        render.gate = None
        assert request(srv)[0] == 401
        t.join(10)
        assert out["r"][0] == 200 and out["r"][2] == BODY
        assert (srv._web.reloads_ok, srv._web.reloads_failed) == (0, 1)
    finally:
        if render.gate is not None:
            render.gate.set()
        srv.stop()


def test_half_written_file_on_a_real_agent_keeps_401(tmp_path, hashes):
    """A real `teye agent`: the file rewritten in place and cut just after `basic_auth_users:`."""
    from tests.web.agentproc import WebAgent
    path = tmp_path / "web.yml"
    full = "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n" + users_yaml({"prom": hashes["prom"]})
    write_web(path, full)
    agent = WebAgent(str(tmp_path), web_config=str(path))
    cred = {"Authorization": "Basic " + base64.b64encode(b"prom:s3cret").decode()}

    def code(headers=None):
        try:
            agent.get("/metrics", headers=headers)
            return 200
        except urllib.error.HTTPError as e:
            return e.code
    try:
        assert code() == 401 and code(cred) == 200
        write_in_place(path, full[:full.index("basic_auth_users:") + len("basic_auth_users:")])
        for _ in range(3):
            assert code() == 401
        body = agent.get("/metrics", headers=cred).decode()
        assert 'teye_web_config_reloads_total{result="failure"} 1' in body
        assert 'teye_web_config_reloads_total{result="success"} 0' in body
        assert "teye_web_config_last_reload_successful 0" in body
        write_in_place(path, full)
        assert code() == 401 and code(cred) == 200
        assert 'teye_web_config_reloads_total{result="success"} 1' in agent.get("/metrics", headers=cred).decode()
        assert "basic_auth_users removed or empty" in agent.log() or "present but empty" in agent.log()
    finally:
        agent.stop()
