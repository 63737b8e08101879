"""The HTTP server against bad and hostile clients: a 4xx (never a traceback), bounded connections."""
from __future__ import annotations

import logging
import resource
import socket
import time

import pytest

from tests.web.server_helpers import BODY, StubRender, connect, no_tracebacks, parse_response, read_all, request, start


@pytest.fixture
def logs(caplog):
    caplog.set_level(logging.DEBUG, logger="teye.http")
    return caplog


@pytest.fixture
def server():
    srv, render = start(max_header_bytes=4096)
    yield srv
    srv.stop()


def test_metrics_landing_and_health_answer(server, logs):
    code, hdrs, body = request(server, "/metrics")
    assert (code, body) == (200, BODY)
    assert hdrs["content-type"].startswith("text/plain; version=0.0.4")
    assert hdrs["content-length"] == str(len(BODY))
    assert request(server, "/")[0] == 200
    assert request(server, "/healthz")[:3:2] == (200, b"ok\n")
    code, hdrs, body = request(server, "/metrics", method="HEAD")
    assert (code, hdrs["content-length"], body) == (200, str(len(BODY)), b"")
    assert no_tracebacks(logs.records) == []


@pytest.mark.parametrize("raw, status", [
    (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8000 + b"\r\n\r\n", 431),   # oversized head
    (b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 150 + b"\r\n", 431),    # too many fields
    (b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 405),
    (b"DELETE / HTTP/1.1\r\nHost: x\r\n\r\n", 405),
    (b"BREW /pot HTTP/1.1\r\nHost: x\r\n\r\n", 405),                                   # unknown method
    (b"GET /admin HTTP/1.1\r\nHost: x\r\n\r\n", 404),                                  # unknown path
    (b"GET /metrics/../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n", 404),
    (b"GARBAGE\r\n\r\n", 400),                                                          # malformed line
    (b"GET /\r\n\r\n", 400),                                                            # HTTP/0.9
    (b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", 400),                                        # unsupported version
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400),                                         # h2 prior knowledge
    (b"GET metrics HTTP/1.1\r\nHost: x\r\n\r\n", 400),                                  # target without /
    (b"GET / HTTP/1.1\r\n\r\n", 400),                                                   # no Host
    (b"GET / HTTP/1.1\r\nHost: x\r\nbad header\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", 400),                            # obs-fold
    (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n", 413),
    (b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400),                    # TLS on the plain port
    (bytes(range(256)) + b"\r\n\r\n", 400),
    # issue 48: bare LF line endings, NUL and other control characters in a header value
    (b"GET /metrics HTTP/1.1\n\n", 400),
    (b"GET /metrics HTTP/1.1\r\nHost: x\n\n", 400),
    (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: b\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\nHost: x\x00\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: a\x1bb\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: a\x7fb\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: a\tb\xe9\r\n\r\n", 200),             # HTAB and obs-text are fine
])
def test_bad_requests_get_a_4xx_and_no_traceback(server, logs, raw, status):
    code, hdrs, _ = request(server, raw=raw)
    assert code == status
    if status in (400, 413, 431):  # the request could not be framed: the connection closes
        assert hdrs.get("connection") == "close"
    assert no_tracebacks(logs.records) == []
    assert request(server, "/metrics")[2] == BODY  # and the server still serves


def test_keep_alive_serves_several_requests_on_one_connection(server):
    with connect(server) as s:
        for _ in range(3):
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while not data.endswith(BODY):
                data += s.recv(65536)
            assert parse_response(data)[0] == 200


def test_a_client_leaving_mid_response_costs_one_debug_line(logs):
    big = StubRender(b"x" * (32 << 20))
    srv, _ = start(render=big)
    try:
        for _ in range(3):
            s = connect(srv)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            s.recv(100)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")  # close with RST
            s.close()
        deadline = time.monotonic() + 10
        gone = []
        while len(gone) < 3 and time.monotonic() < deadline:
            gone = [r for r in logs.records if "went away" in r.getMessage()]
            time.sleep(0.05)
        assert len(gone) == 3 and all(r.levelname == "DEBUG" for r in gone)
        assert no_tracebacks(logs.records) == []
    finally:
        srv.stop()


def test_renders_beyond_max_requests_get_503_at_once():
    render = StubRender()
    render.gate = __import__("threading").Event()
    srv, _ = start(render=render, max_requests=1)
    try:
        held = connect(srv)
        held.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert render.entered.acquire(timeout=5)
        assert request(srv, "/metrics")[0] == 503
        assert request(srv, "/healthz")[0] == 200  # only renders are capped
        render.gate.set()
        assert parse_response(held.recv(65536))[0] == 200
        held.close()
        assert request(srv, "/metrics")[0] == 200
    finally:
        srv.stop()


def test_a_full_connection_table_evicts_the_longest_waiting_half_request():
    srv, render = start(max_connections=5)
    try:
        half = []
        for _ in range(5):
            s = connect(srv)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finishes its head
            half.append(s)
            request(srv, "/healthz")  # each is accepted before the next (orders the table)
        for _ in range(10):
            assert request(srv, "/metrics")[2] == BODY
        # every request above needed a slot: the oldest half-requests were closed, in order
        half[0].settimeout(5)
        assert half[0].recv(10) == b""
        for s in half:
            s.close()
    finally:
        srv.stop()


def test_slow_heads_and_idle_keep_alives_are_closed():
    srv, _ = start(header_timeout_seconds=0.2, idle_timeout_seconds=0.2)
    try:
        slow = connect(srv)
        slow.sendall(b"GET /metrics HTTP/1.1\r\n")
        idle = connect(srv)
        idle.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert parse_response(idle.recv(65536))[0] == 200
        assert read_all(slow) == b""   # closed by the server (recv would block until the 5 s timeout)
        assert read_all(idle) == b""
    finally:
        srv.stop()


def test_a_failing_render_is_a_500_with_its_traceback_logged(logs):
    def broken(accept, encoding):
        raise KeyError("bug")
    srv, _ = start(render=broken)
    try:
        code, _, body = request(srv, "/metrics")
        assert (code, body) == (500, b"internal error\n")
        errors = no_tracebacks(logs.records)
        assert len(errors) == 1 and errors[0].exc_info[0] is KeyError
        assert request(srv, "/healthz")[0] == 200
    finally:
        srv.stop()


def test_descriptors_reserved_for_sources_stay_out_of_the_connection_budget():
    """Perf events open on the pmu collector's first read, after the server starts: the server leaves them room."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (2048, hard))
    try:
        plain, _ = start(max_connections=100000)
        plain.stop()
        kept, _ = start(max_connections=100000, reserved_fds=500)
        kept.stop()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert plain.max_connections <= 2048 - 64
    assert plain.max_connections - kept.max_connections == 500


@pytest.mark.parametrize("raw", [b"GET /metrics HTTP/1.1\n", b"GET /metrics HTTP/1.1\nHost: x\n\n",
                                 b"GET /metrics HTTP/1.1\r\nHost: x\n"])
@pytest.mark.measures("the answer's delay against the header timeout")
def test_a_bare_lf_is_answered_at_once_not_after_the_header_timeout(raw):
    """The client keeps its connection open (no FIN): the 400 must come at once, not after the 4 s header
    timeout (the test's own clock), and the connection closes."""
    srv, _ = start(header_timeout_seconds=4.0)
    try:
        with connect(srv, timeout=6) as s:
            t0 = time.monotonic()
            s.sendall(raw)
            data = read_all(s)
            took = time.monotonic() - t0
        code, hdrs, body = parse_response(data)
        assert (code, hdrs.get("connection")) == (400, "close") and b"bare LF" in body
        assert took < 1.5, took
    finally:
        srv.stop()
