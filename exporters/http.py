"""HTTP endpoint: /metrics (Prometheus text or OpenMetrics), / (landing page), /healthz."""
from __future__ import annotations

import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional

from prometheus_client.registry import CollectorRegistry

from .render import render

log = logging.getLogger("teye.http")

LANDING = b"""<!doctype html>
<html><head><title>teye agent</title></head>
<body><h1>teye agent</h1>
<p>Per-node monitoring for GPU training clusters.</p>
<ul><li><a href="metrics">/metrics</a> (Prometheus)</li><li><a href="healthz">/healthz</a></li></ul>
</body></html>
"""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr, handler, registry: CollectorRegistry, health: Callable[[], Optional[str]]):
        host = addr[0]
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.registry = registry
        self.health = health
        super().__init__(addr, handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # access log only at debug level
        log.debug("%s " + fmt, self.address_string(), *args)

    def _send(self, code: int, body: bytes, ctype: str, extra=()):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            body, ctype, extra = render(self.server.registry, self.headers.get("Accept", ""),
                                        self.headers.get("Accept-Encoding", ""))
            self._send(200, body, ctype, extra)
        elif path == "/":
            self._send(200, LANDING, "text/html; charset=utf-8")
        elif path == "/healthz":
            problem = self.server.health()
            if problem:
                self._send(503, (problem + "\n").encode(), "text/plain; charset=utf-8")
            else:
                self._send(200, b"ok\n", "text/plain; charset=utf-8")
        else:
            self._send(404, b"not found\n", "text/plain; charset=utf-8")

    do_HEAD = do_GET


class MetricsServer:
    """Binds at construction (so a port in use fails early), serves in a thread after start()."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry,
                 health: Callable[[], Optional[str]] = lambda: None):
        self._srv = _Server((host, port), _Handler, registry, health)
        self._thread: Optional[threading.Thread] = None

    @property
    def address(self):
        return self._srv.server_address[:2]

    def start(self) -> None:
        self._thread = threading.Thread(target=self._srv.serve_forever, kwargs={"poll_interval": 0.5},
                                        name="teye-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()
