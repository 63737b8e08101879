"""The web server's POST path for the trace webhook (issue 46): answered to a valid basic-auth credential only,
its body handed to the handler whole and bounded, other methods refused; without basic auth in the web
config it is refused (403), never open.  An in-process server, real sockets."""
from __future__ import annotations

import http.client

from exporters.http import MetricsServer
from exporters.webconfig import WebConfig
from tests.web.certs import bcrypt_hash
from tests.web.server_helpers import StubRender
from tests.web.test_auth_flood import GOOD, basic
from tests.web.test_selfmetrics import write_web


def _server(tmp_path, users=True, max_body=1024):
    got = []

    def handler(body):
        got.append(body)
        return 200, b'{"results": []}\n'
    web = tmp_path / "web.yml"
    write_web(web, f"basic_auth_users:\n  {GOOD[0]}: '{bcrypt_hash(GOOD[1], cost=4)}'\n" if users else "")
    srv = MetricsServer("127.0.0.1", 0, StubRender(), web=WebConfig(str(web)),
                        posts={"/-/trace": (handler, max_body)})
    srv.start()
    return srv, got


def _ask(srv, method, path, body=b"", headers=None):
    c = http.client.HTTPConnection(*srv.address, timeout=10)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, r.getheader("Allow"), r.getheader("Content-Type"), r.read()
    finally:
        c.close()


def test_only_a_valid_credential_reaches_the_handler_with_the_whole_body(tmp_path):
    srv, got = _server(tmp_path)
    try:
        payload = b'{"alerts": []}' + b" " * 900
        assert _ask(srv, "POST", "/-/trace", payload)[0] == 401
        assert _ask(srv, "POST", "/-/trace", payload, basic(GOOD[0], "wrong"))[0] == 401
        assert got == []
        status, _, ctype, body = _ask(srv, "POST", "/-/trace", payload, basic(*GOOD))
        assert (status, ctype, body) == (200, "application/json", b'{"results": []}\n') and got == [payload]
        assert _ask(srv, "POST", "/-/trace", b"x" * 1025, basic(*GOOD))[0] == 413   # over its bound
        assert _ask(srv, "GET", "/-/trace", headers=basic(*GOOD))[:2] == (405, "POST")
        assert _ask(srv, "POST", "/metrics", b"{}", basic(*GOOD))[:2] == (405, "GET, HEAD")
        assert _ask(srv, "GET", "/metrics", headers=basic(*GOOD))[0] == 200        # the scrape as before
        assert len(got) == 1
    finally:
        srv.stop()


def test_without_basic_auth_the_path_is_refused_not_open(tmp_path):
    srv, got = _server(tmp_path, users=False)
    try:
        status, _, _, body = _ask(srv, "POST", "/-/trace", b'{"alerts": []}')
        assert status == 403 and b"needs basic auth" in body and got == []
        assert _ask(srv, "GET", "/metrics")[0] == 200
    finally:
        srv.stop()


def test_a_server_without_post_paths_refuses_a_post_as_before(tmp_path):
    srv = MetricsServer("127.0.0.1", 0, StubRender(), web=WebConfig(None))
    srv.start()
    try:
        assert _ask(srv, "POST", "/-/trace", b"{}")[:2] == (405, "GET, HEAD")
    finally:
        srv.stop()
