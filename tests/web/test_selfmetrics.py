"""The web server's own counters, read back from its /metrics by real clients.

Each test drives a known number of requests, refusals, handshake failures, timeouts and reloads
(the oracle is the test's own count of what it did) and reads the exact values from /metrics
as a scraper would: the server renders teye's registry with its WebStats attached.
"""
from __future__ import annotations

import base64
import http.client
import os
import socket
import ssl
import subprocess
import sys
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.sampler import Snapshot
from exporters.http import Limits, MetricsServer, registry_renderer
from exporters.prometheus import make_registry
from exporters.webconfig import WebConfig
from exporters.webstats import WebStats
from tests.procs import REPO
from tests.web.certs import bcrypt_hash, write_pki
from tests.web.server_helpers import client_context, connect, parse_response, read_all, request

HOLD = "application/x-hold"     # Accept value that makes the renderer wait on the test's gate
BIG = "application/x-big"       # Accept value that makes the renderer return a large body


class Renderer:
    """teye's real registry (an empty snapshot plus the server's counters); HOLD and BIG for the tests."""

    def __init__(self, stats: WebStats):
        self.real = registry_renderer(make_registry(lambda: Snapshot(), extra=stats.state))
        self.gate = threading.Event()
        self.entered = threading.Semaphore(0)

    def __call__(self, accept: str, accept_encoding: str):
        if accept == HOLD:
            self.entered.release()
            self.gate.wait(10)
        if accept == BIG:
            return b"x" * (32 << 20), "text/plain", []
        return self.real(accept, accept_encoding)


def serve(web_path=None, **limits):
    stats = WebStats()
    render = Renderer(stats)
    srv = MetricsServer("127.0.0.1", 0, render, web=WebConfig(web_path), limits=Limits(**limits), stats=stats)
    srv.start()
    return srv, render


def values(body: bytes):
    """{(sample name, frozenset(labels)): value} of a text exposition."""
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def web_series(body: bytes, family: str):
    """{label values tuple: value} of one family (labels in name order), only teye_web_* families."""
    out = {}
    for (name, labels), v in values(body).items():
        if name == family:
            out[tuple(v for _, v in sorted(labels))] = v
    return out


def open_connections(srv) -> float:
    """The server's teye_web_connections as its counters give it (what a scrape would show)."""
    return next(p.value for p in srv.stats.points() if p.spec.name == "teye_web_connections")


def scrape(srv, ctx=None, auth=None):
    code, _, body = request(srv, "/metrics", ctx=ctx, auth=auth)
    assert code == 200, body
    return body


def eventually(read, expected, seconds=3.0):
    """read() until it equals expected (the server counts a connection once it is done with it)."""
    deadline = time.monotonic() + seconds
    while True:
        got = read()
        if got == expected or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


def write_web(path, text):
    tmp = str(path) + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    main = write_pki(str(d))
    os.makedirs(d / "other")
    main["other"] = write_pki(str(d / "other"))
    return main


def test_basic_auth_failures_by_reason_and_requests_by_path_and_code(tmp_path, pki):
    path = tmp_path / "web.yml"
    write_web(path, f"tls_server_config:\n  cert_file: {pki['server']}\n  key_file: {pki['server-key']}\n"
                    f"basic_auth_users:\n  prom: '{bcrypt_hash('s3cret')}'\n")
    srv, _ = serve(str(path))
    ctx = client_context(pki["ca"])
    attacker = "mallory-d41d8cd9"
    try:
        def get(target, headers):
            c = http.client.HTTPSConnection("127.0.0.1", srv.address[1], context=ctx, timeout=5)
            try:
                c.request("GET", target, headers=headers)
                r = c.getresponse()
                r.read()
                return r.status
            finally:
                c.close()

        def basic(user, password):
            return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}

        assert [get("/metrics", basic("prom", "wrong")) for _ in range(3)] == [401] * 3
        assert get("/metrics", basic(attacker, "s3cret")) == 401
        assert get("/", basic(attacker, "guess")) == 401
        assert get("/metrics", {}) == 401
        assert get("/metrics", {"Authorization": "Bearer abc"}) == 401
        assert get("/metrics", {"Authorization": "Basic !!!"}) == 401
        assert get("/", basic("prom", "s3cret")) == 200
        assert get("/healthz", {}) == 200                      # no credentials needed
        assert get("/admin?user=" + attacker, basic("prom", "s3cret")) == 404
        assert get("/metrics", basic("prom", "s3cret")) == 200
        body = scrape(srv, ctx, ("prom", "s3cret"))
    finally:
        srv.stop()
    assert web_series(body, "teye_web_basic_auth_failures_total") == {
        ("missing",): 1, ("malformed",): 2, ("unknown_user",): 2, ("wrong_password",): 3}
    assert web_series(body, "teye_web_requests_total") == {
        ("401", "/metrics"): 7, ("401", "/"): 1, ("200", "/"): 1, ("200", "/healthz"): 1, ("404", "other"): 1,
        ("200", "/metrics"): 1}                                 # the scrape reading it counts after its answer
    assert web_series(body, "teye_web_requests_in_flight") == {(): 1}
    assert attacker.encode() not in body and b"prom" not in body.replace(b"prometheus", b"")
    assert web_series(body, "teye_web_tls_handshake_failures_total") == {
        (r,): 0 for r in ("plain_http", "protocol", "client_certificate", "server_certificate", "closed", "other")}
    check = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr


def half_hello(srv):
    """A client that starts a TLS handshake and hangs up in the middle of its ClientHello."""
    with socket.create_connection(srv.address, timeout=5) as s:
        s.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
        s.shutdown(socket.SHUT_WR)
        assert read_all(s) == b""


def refused(srv, ctx) -> bool:
    try:
        with connect(srv, ctx) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return s.recv(65536) == b""
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        return True


def test_tls_handshake_failures_by_reason_class(tmp_path, pki):
    path = tmp_path / "web.yml"
    write_web(path, f"tls_server_config:\n  cert_file: {pki['server']}\n  key_file: {pki['server-key']}\n"
                    f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki['ca']}\n"
                    f"  client_allowed_sans: [client.teye.test]\n  min_version: TLS13\n")
    srv, _ = serve(str(path))
    good = client_context(pki["ca"], pki["client"], pki["client-key"])
    try:
        assert request(srv)[0] == 400                                          # plain HTTP: 1
        old = client_context(pki["ca"], pki["client"], pki["client-key"])
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        assert refused(srv, old)                                               # protocol: 1
        distrust = client_context(pki["other"]["ca"], pki["client"], pki["client-key"])
        assert refused(srv, distrust)                                          # server_certificate: 1
        assert refused(srv, client_context(pki["ca"]))                         # no client certificate
        assert refused(srv, client_context(pki["ca"], pki["other"]["client"], pki["other"]["client-key"]))
        assert refused(srv, client_context(pki["ca"], pki["server"], pki["server-key"]))  # SAN not allowed
        half_hello(srv)                                                        # closed: 1
        half_hello(srv)                                                        # closed: 2
        expected = {("plain_http",): 1, ("protocol",): 1, ("client_certificate",): 3, ("server_certificate",): 1,
                    ("closed",): 2, ("other",): 0}
        got = eventually(lambda: web_series(scrape(srv, good), "teye_web_tls_handshake_failures_total"), expected)
        assert got == expected
        body = scrape(srv, good)
    finally:
        srv.stop()
    assert web_series(body, "teye_web_timeouts_total") == {("header",): 0, ("idle",): 0, ("write",): 0}
    assert "teye_web_basic_auth_failures_total" not in body.decode()   # absent without basic_auth_users


def test_timeouts_by_kind_with_slow_clients():
    srv, _ = serve(header_timeout_seconds=0.3, idle_timeout_seconds=0.3, write_timeout_seconds=0.3)
    try:
        slow = connect(srv)
        slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")             # never finishes its head: header
        idle = connect(srv)
        idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")            # answered, then idle: idle
        assert parse_response(idle.recv(65536))[0] == 200
        silent = socket.socket()
        silent.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        silent.settimeout(5)
        silent.connect(srv.address)                                          # asks, never reads: write
        silent.sendall(f"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: {BIG}\r\n\r\n".encode())
        assert read_all(slow) == b"" and read_all(idle) == b""
        expected = {("header",): 1, ("idle",): 1, ("write",): 1}
        got = eventually(lambda: web_series(scrape(srv), "teye_web_timeouts_total"), expected)
        body = scrape(srv)               # after the timeouts (the write timeout ended a request being answered)
        silent.close()
        slow.close()
        idle.close()
    finally:
        srv.stop()
    assert got == expected
    assert web_series(body, "teye_web_requests_in_flight") == {(): 1}   # only the scrape reading it


def test_connections_limit_refused_and_evicted():
    srv, render = serve(max_connections=2)
    try:
        held = []
        for _ in range(2):                                   # both slots answering (renders held)
            s = connect(srv)
            s.sendall(f"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: {HOLD}\r\nConnection: close\r\n\r\n".encode())
            assert render.entered.acquire(timeout=5)
            held.append(s)
        third = connect(srv)                                 # nobody to evict: refused
        third.settimeout(5)
        assert read_all(third) == b""
        third.close()
        render.gate.set()
        for s in held:
            assert parse_response(read_all(s))[0] == 200
            s.close()
        assert eventually(lambda: open_connections(srv), 0) == 0   # the server is done with them
        half = []
        for i in range(2):                                   # both slots waiting on half a request
            s = connect(srv)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            half.append(s)
            if i == 0:                                       # accepted before the next (orders the table)
                assert request(srv, "/healthz")[0] == 200
                assert eventually(lambda: open_connections(srv), 1) == 1
        body = scrape(srv)                                   # evicts the oldest half request
        half[0].settimeout(5)
        assert read_all(half[0]) == b""                      # closed (or reset) by the server
        for s in half:
            s.close()
    finally:
        srv.stop()
    assert web_series(body, "teye_web_connections_refused_total") == {(): 1}
    assert web_series(body, "teye_web_connections_evicted_total") == {(): 1}
    assert web_series(body, "teye_web_connections_max") == {(): 2}
    assert web_series(body, "teye_web_connections") == {(): 2}          # the scrape and half[1]
    assert web_series(body, "teye_web_requests_total") == {("200", "/metrics"): 2, ("200", "/healthz"): 1}


def test_web_config_reloads_success_failure_and_last_success_time(tmp_path, pki):
    path = tmp_path / "web.yml"
    write_web(path, f"basic_auth_users:\n  prom: '{bcrypt_hash('old')}'\n")
    t0 = time.time()
    srv, _ = serve(str(path))
    t1 = time.time()
    try:
        body = scrape(srv, auth=("prom", "old"))
        assert web_series(body, "teye_web_config_reloads_total") == {("success",): 0, ("failure",): 0}
        assert web_series(body, "teye_web_config_last_reload_successful") == {(): 1}
        started = web_series(body, "teye_web_config_last_reload_success_timestamp_seconds")[()]
        assert t0 <= started <= t1
        write_web(path, "basic_auth_users: [broken\n")                    # a bad edit: failure, old one kept
        body = scrape(srv, auth=("prom", "old"))
        assert web_series(body, "teye_web_config_reloads_total") == {("success",): 0, ("failure",): 1}
        assert web_series(body, "teye_web_config_last_reload_successful") == {(): 0}
        assert web_series(body, "teye_web_config_last_reload_success_timestamp_seconds") == {(): started}
        write_web(path, f"tls_server_config:\n  cert_file: {pki['server']}\n  key_file: {pki['server-key']}\n")
        assert request(srv, "/healthz")[0] == 200                         # turning TLS on needs a restart: failure
        t2 = time.time()
        write_web(path, f"basic_auth_users:\n  prom: '{bcrypt_hash('new')}'\n")
        body = scrape(srv, auth=("prom", "new"))
        t3 = time.time()
    finally:
        srv.stop()
    assert web_series(body, "teye_web_config_reloads_total") == {("success",): 1, ("failure",): 2}
    assert web_series(body, "teye_web_config_last_reload_successful") == {(): 1}
    assert t2 <= web_series(body, "teye_web_config_last_reload_success_timestamp_seconds")[()] <= t3


def test_no_web_config_no_tls_no_auth_series():
    srv, _ = serve(max_connections=37)
    try:
        body = scrape(srv)
    finally:
        srv.stop()
    for family in ("teye_web_tls_handshake_failures_total", "teye_web_basic_auth_failures_total",
                   "teye_web_config_reloads_total", "teye_web_config_last_reload_successful"):
        assert family not in body.decode()
    assert web_series(body, "teye_web_connections_max") == {(): 37}      # the configured limit
    assert web_series(body, "teye_web_requests_total") == {("200", "/metrics"): 0}


LOWERED = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (400, 400))
from tests.web.test_selfmetrics import scrape, serve, web_series
srv, _ = serve(max_connections=4096, reserved_fds=64)
try:
    print(json.dumps(web_series(scrape(srv), "teye_web_connections_max")[()]))
finally:
    srv.stop()
"""


def test_connections_max_is_the_limit_kept_under_a_low_fd_limit():
    """Under RLIMIT_NOFILE 400 (set by the child itself) the server keeps at most 400 less 64 fds reserved for
    sources, 64 held back (exporters.http.FD_RESERVE) and the few already open; the gauge says that, not 4096,
    and the warning names the same figure."""
    r = subprocess.run([sys.executable, "-c", LOWERED], capture_output=True, text=True, timeout=60,
                       cwd=REPO, env={**os.environ, "PYTHONPATH": REPO})
    assert r.returncode == 0, r.stderr
    kept = float(r.stdout)
    assert 400 - 64 - 64 - 40 <= kept <= 400 - 64 - 64, r.stdout
    assert f"web.max_connections 4096 lowered to {kept:.0f}: the fd limit is 400" in r.stderr


def test_every_refused_request_counts_by_path_and_code(tmp_path):
    """Each way a request can be refused (malformed 400, body too large 413, head too large 431, method 405,
    renders busy 503, unknown path 404, rate limit 429) adds exactly one to teye_web_requests_total under
    its path class and code, as each answer served does (issue 39: a refusal that went uncounted survived)."""
    path = tmp_path / "web.yml"
    write_web(path, "rate_limit: {interval: 1h, burst: 4}\n")
    srv, render = serve(str(path), max_requests=1, max_header_bytes=4096)
    try:
        assert request(srv, raw=b"GARBAGE\r\n\r\n")[0] == 400
        assert request(srv, raw=b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n")[0] == 413
        assert request(srv, raw=b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n")[0] == 431
        assert request(srv, "/metrics", method="POST")[0] == 405
        held = connect(srv)                                                   # token 1
        held.sendall(f"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: {HOLD}\r\nConnection: close\r\n\r\n".encode())
        assert render.entered.acquire(timeout=5)
        assert request(srv, "/metrics")[0] == 503                             # token 2
        render.gate.set()
        assert parse_response(read_all(held))[0] == 200
        held.close()
        assert request(srv, "/nothing")[0] == 404                             # token 3
        assert request(srv, "/")[0] == 200                                    # token 4
        assert request(srv, "/metrics")[0] == 429
        assert request(srv, "/healthz")[0] == 200                             # exempt from the limit
        got = eventually(lambda: {(p.labels[1], p.labels[0]): p.value for p in srv.stats.points()
                                  if p.spec.name == "teye_web_requests_total" and p.value},
                         {("400", "other"): 1, ("413", "/metrics"): 1, ("431", "other"): 1, ("405", "/metrics"): 1,
                          ("503", "/metrics"): 1, ("200", "/metrics"): 1, ("404", "other"): 1, ("200", "/"): 1,
                          ("429", "/metrics"): 1, ("200", "/healthz"): 1})
    finally:
        srv.stop()
    assert got == {("400", "other"): 1, ("413", "/metrics"): 1, ("431", "other"): 1, ("405", "/metrics"): 1,
                   ("503", "/metrics"): 1, ("200", "/metrics"): 1, ("404", "other"): 1, ("200", "/"): 1,
                   ("429", "/metrics"): 1, ("200", "/healthz"): 1}
