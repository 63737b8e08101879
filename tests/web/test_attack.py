"""The slow-connection attack from issue 11 against a real agent under a low fd limit.

More half-sent requests than the process has file descriptors, re-opened as fast as the agent
closes them, while a normal client scrapes: every scrape must succeed, threads and RSS stay
bounded, and the agent serves at once when the attackers go.  (Figures: benchmarks/web.py.)
"""
from __future__ import annotations

import resource
import selectors
import socket
import threading

import pytest

from tests.web.agentproc import WebAgent

FD_LIMIT = 256
ATTACKERS = 400  # more than FD_LIMIT


class SlowLoris(threading.Thread):
    """Keeps `n` connections open, each having sent half a request; reconnects those the server closes."""

    def __init__(self, port: int, n: int):
        super().__init__(daemon=True)
        self.port, self.n = port, n
        self.stop = threading.Event()
        self.opened = 0
        self.closed_by_server = 0
        self.ready = threading.Event()

    def _open(self, sel):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", self.port))
        sel.register(s, selectors.EVENT_WRITE)
        self.opened += 1

    def run(self):
        sel = selectors.DefaultSelector()
        for _ in range(self.n):
            self._open(sel)
        while not self.stop.is_set():
            for key, ev in sel.select(0.05):
                s = key.fileobj
                if ev & selectors.EVENT_WRITE and key.events == selectors.EVENT_WRITE:
                    try:
                        s.send(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Wait: ")
                        sel.modify(s, selectors.EVENT_READ)
                        continue
                    except OSError:
                        pass
                elif ev & selectors.EVENT_READ:
                    try:
                        if s.recv(4096):
                            continue
                    except OSError:
                        pass
                self.closed_by_server += 1
                sel.unregister(s)
                s.close()
                self._open(sel)
            if self.opened >= self.n:
                self.ready.set()
        for key in list(sel.get_map().values()):
            key.fileobj.close()
        sel.close()


@pytest.mark.e2e
def test_slow_connections_beyond_the_fd_limit_never_blind_the_scraper(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < ATTACKERS + 100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, ATTACKERS + 200), hard))
    agent = WebAgent(str(tmp_path), wrap=["prlimit", f"--nofile={FD_LIMIT}:{FD_LIMIT}", "--"])
    attack = SlowLoris(agent.port, ATTACKERS)
    try:
        for _ in range(3):
            assert b"teye_build_info" in agent.get()
        threads0, rss0 = agent.threads(), agent.rss_bytes()

        attack.start()
        assert attack.ready.wait(30)
        peak_threads = peak_rss = peak_fds = 0
        for _ in range(20):
            body = agent.get(timeout=10)         # every normal scrape succeeds
            assert b"teye_build_info" in body
            peak_threads = max(peak_threads, agent.threads())
            peak_rss = max(peak_rss, agent.rss_bytes())
            peak_fds = max(peak_fds, agent.fds())
        assert attack.closed_by_server > 0       # the table was full: waiting connections were closed
        assert peak_fds <= FD_LIMIT
        # one event loop: the attack adds no thread (workers start on first use, at most 4)
        assert peak_threads <= threads0 + 4
        assert peak_rss - rss0 < 32 << 20

        attack.stop.set()
        attack.join(10)
        assert b"teye_build_info" in agent.get(timeout=2)  # recovers at once
        log = agent.log()
        assert "Traceback" not in log and "Error" not in log
    finally:
        attack.stop.set()
        agent.stop()
