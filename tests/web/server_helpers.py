"""An in-process MetricsServer with a stub renderer, and raw-socket clients for it."""
from __future__ import annotations

import base64
import socket
import ssl
import threading
from typing import Dict, List, Optional, Tuple

from exporters.http import Limits, MetricsServer
from exporters.webconfig import WebConfig

BODY = b"# HELP teye_test_value A test value.\n# TYPE teye_test_value gauge\nteye_test_value 42.0\n"


class StubRender:
    """Returns BODY; when gate is set up, each call blocks until released (to hold renders in flight)."""

    def __init__(self, body: bytes = BODY):
        self.body = body
        self.calls = 0
        self.gate: Optional[threading.Event] = None
        self.entered = threading.Semaphore(0)

    def __call__(self, accept: str, accept_encoding: str):
        self.calls += 1
        if self.gate is not None:
            self.entered.release()
            self.gate.wait(10)
        return self.body, "text/plain; version=0.0.4; charset=utf-8", []


def start(web_path: Optional[str] = None, render=None, **limits) -> Tuple[MetricsServer, StubRender]:
    render = render or StubRender()
    srv = MetricsServer("127.0.0.1", 0, render, web=WebConfig(web_path), limits=Limits(**limits))
    srv.start()
    return srv, render


def client_context(ca: Optional[str] = None, cert: Optional[str] = None, key: Optional[str] = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


def connect(srv: MetricsServer, ctx: Optional[ssl.SSLContext] = None, timeout: float = 5.0) -> socket.socket:
    s = socket.create_connection(srv.address, timeout=timeout)
    if ctx is not None:
        s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
    return s


def read_all(s: socket.socket) -> bytes:
    out = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk
    except (ssl.SSLError, ConnectionResetError):
        return out


def request(srv: MetricsServer, path: str = "/metrics", ctx: Optional[ssl.SSLContext] = None,
            auth: Optional[Tuple[str, str]] = None, headers: Dict[str, str] = (), method: str = "GET",
            raw: Optional[bytes] = None) -> Tuple[int, Dict[str, str], bytes]:
    """One request on a fresh connection (Connection: close) -> (status, headers, body)."""
    if raw is None:
        lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
        if auth:
            lines.append("Authorization: Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
        lines += [f"{k}: {v}" for k, v in dict(headers).items()]
        raw = ("\r\n".join(lines) + "\r\n\r\n").encode()
    with connect(srv, ctx) as s:
        s.sendall(raw)
        if ctx is None:
            s.shutdown(socket.SHUT_WR)  # nothing more: the server closes after its answer
        return parse_response(read_all(s))


def parse_response(data: bytes) -> Tuple[int, Dict[str, str], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1]) if lines[0].startswith("HTTP/") else 0
    hdrs = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return status, hdrs, body


def no_tracebacks(records: List) -> List:
    """Log records that carry a traceback or are errors (a robust server logs neither for bad clients)."""
    return [r for r in records if r.exc_info or r.levelname in ("ERROR", "CRITICAL")]
