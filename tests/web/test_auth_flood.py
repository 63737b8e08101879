"""Basic auth that cannot be used to starve the scrape (issue 36).

Wrong-password floods over TLS, clients that never authenticate spending the rate limit, 10,000 distinct
wrong passwords and half-sent header lines, against a real agent (urllib over TLS, real sockets) and an
in-process server.  The oracles are the tests' own counts of what each client sent and got back, compared
exactly with the server's counters read from /metrics: a scrape whose credential was verified before is
counted ``teye_web_basic_auth_checks_total{by="cache"}`` (answered without queuing behind bcrypt), each
attacker's wrong password ``by="bcrypt"`` or ``teye_web_basic_auth_throttled_total``.  No timing is asserted
(figures: ``benchmarks/web.py --auth-flood``); a scrape must complete within Prometheus' default 10 s timeout.

Clients bind distinct loopback source addresses (127.0.0.2, ...: all of 127/8 is local on Linux), so that
the per-client bound can be told from the bound in all.
"""
from __future__ import annotations

import base64
import http.client
import os
import threading
import time
from collections import Counter

import pytest

from exporters import webconfig
from tests.web.agentproc import WebAgent
from tests.web.certs import bcrypt_hash, write_pki
from tests.web.server_helpers import client_context
from tests.web.test_selfmetrics import eventually, serve, web_series, write_web

GOOD = ("prometheus", "s3cret-scrape")


def basic(user, password):
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return write_pki(str(tmp_path_factory.mktemp("pki")))


def web_file(tmp_path, pki=None, cost=4, extra=""):
    path = tmp_path / "web.yml"
    text = ""
    if pki:
        text += f"tls_server_config:\n  cert_file: {pki['server']}\n  key_file: {pki['server-key']}\n"
    text += f"basic_auth_users:\n  {GOOD[0]}: '{bcrypt_hash(GOOD[1], cost=cost)}'\n"
    text += f"  second: '{bcrypt_hash('second-pw', cost=cost)}'\n" + extra
    write_web(path, text)
    return str(path)


def connection(port, ctx=None, source="127.0.0.1", timeout=10.0):
    if ctx is not None:
        return http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=timeout,
                                           source_address=(source, 0))
    return http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=(source, 0))


def get(conn, headers):
    conn.request("GET", "/metrics", headers=headers)
    r = conn.getresponse()
    return r.status, r.read()


class Flood:
    """``n`` keep-alive clients, each from its own source address (or all from ``source``), each sending a
    new wrong password (or no credential) per request, as fast as the answers come; counts the answers."""

    def __init__(self, port, n, ctx=None, source=None, credentials="wrong", stop_after=None):
        self.port, self.ctx, self.credentials = port, ctx, credentials
        self.stop = threading.Event()
        self.codes = Counter()
        self.errors = Counter()
        self.lock = threading.Lock()
        self.sent = 0
        self.stop_after = stop_after
        self.threads = [threading.Thread(target=self._run, args=(i, source or f"127.0.0.{2 + i}"), daemon=True)
                        for i in range(n)]

    def _claim(self) -> bool:
        with self.lock:
            if self.stop_after is not None and self.sent >= self.stop_after:
                return False
            self.sent += 1
            return True

    def _run(self, i, source):
        conn = connection(self.port, self.ctx, source)
        k = 0
        try:
            while not self.stop.is_set() and self._claim():
                k += 1
                if self.credentials == "none":
                    headers = {}
                else:
                    headers = basic(GOOD[0], f"wrong-{i}-{k}")   # distinct: never a cache hit
                try:
                    code, _ = get(conn, headers)
                except (OSError, http.client.HTTPException) as e:
                    with self.lock:
                        self.errors[type(e).__name__] += 1
                    conn.close()
                    conn = connection(self.port, self.ctx, source)
                    continue
                with self.lock:
                    self.codes[code] += 1
        finally:
            conn.close()

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(30)
        assert not any(t.is_alive() for t in self.threads)

    def total(self):
        with self.lock:
            return sum(self.codes.values())


@pytest.mark.e2e
def test_a_verified_scrape_is_served_from_the_cache_while_64_clients_send_wrong_passwords(tmp_path, pki):
    """The issue's setup: bcrypt cost 10, 64 keep-alive TLS clients each sending different wrong passwords.
    Every real scrape completes (200) without a bcrypt check of its own; the attackers' passwords were
    hashed at most max_auth_hashes at a time, the rest refused (503) at once."""
    agent = WebAgent(str(tmp_path), web_config=web_file(tmp_path, pki, cost=10), ca=pki["ca"])
    ctx = client_context(pki["ca"])
    auth = basic(*GOOD)
    try:
        assert b"teye_build_info" in agent.get(headers=auth)             # quiet: verified once (bcrypt)
        scrapes = 0
        with Flood(agent.port, 64, ctx) as flood:
            while flood.total() < 64:                                       # every attacker is in
                time.sleep(0.05)
            for _ in range(10):
                before = flood.total()
                body = agent.get(headers=auth, timeout=10)                 # Prometheus' default scrape timeout
                assert b"teye_build_info" in body
                scrapes += 1
                while flood.total() < before + 8:                          # the flood went on meanwhile
                    time.sleep(0.01)
        body = agent.get(headers=auth)
        log = agent.log()
    finally:
        agent.stop()
    codes = flood.codes
    assert set(codes) <= {401, 503}, codes
    assert codes[401] > 8 and codes[503] > 0, codes      # hashing was saturated: its bound refused the rest
    assert not flood.errors, flood.errors
    assert web_series(body, "teye_web_basic_auth_checks_total") == {
        ("cache",): scrapes + 1,                                            # every later scrape, this one too
        ("bcrypt",): 1 + codes[401]}                                        # the first scrape, each wrong one
    assert web_series(body, "teye_web_basic_auth_throttled_total") == {("client",): 0, ("server",): codes[503]}
    requests = web_series(body, "teye_web_requests_total")
    assert requests.pop(("200", "/healthz")) >= 1                          # the start-up probe
    assert requests == {("200", "/metrics"): 1 + scrapes, ("401", "/metrics"): codes[401],
                        ("503", "/metrics"): codes[503]}
    assert web_series(body, "teye_web_basic_auth_failures_total")[("wrong_password",)] == codes[401]
    assert "Traceback" not in log


@pytest.mark.e2e
def test_clients_that_never_authenticate_cannot_spend_the_rate_limit(tmp_path, pki):
    """rate_limit burst 8 per hour: two clients sending no credentials and two sending wrong passwords hammer
    the agent; the authenticated scrapes get their 8 tokens all the same (and then 429: the limit holds)."""
    agent = WebAgent(str(tmp_path), web_config=web_file(tmp_path, pki, extra="rate_limit: {interval: 1h, burst: 8}\n"),
                     ca=pki["ca"])
    ctx = client_context(pki["ca"])
    auth = basic(*GOOD)
    try:
        assert b"teye_build_info" in agent.get(headers=auth)              # token 1
        with Flood(agent.port, 2, ctx, credentials="none") as none, Flood(agent.port, 2, ctx) as wrong:
            for flood in (none, wrong):
                while flood.total() < 20:
                    time.sleep(0.02)
            for _ in range(5):                                               # tokens 2-6, under the flood
                before = none.total()
                assert b"teye_build_info" in agent.get(headers=auth)
                while none.total() < before + 5:
                    time.sleep(0.01)
        body = agent.get(headers=auth)                                       # token 7: reads the counters
        assert b"teye_build_info" in agent.get(headers=auth)                # token 8
        with pytest.raises(Exception) as refused:                            # no token left
            agent.get(headers=auth)
        assert getattr(refused.value, "code", None) == 429, refused.value
    finally:
        agent.stop()
    assert set(none.codes) == {401} and set(wrong.codes) == {401}, (none.codes, wrong.codes)
    assert not none.errors and not wrong.errors
    requests = web_series(body, "teye_web_requests_total")
    assert requests.pop(("200", "/healthz")) >= 1                          # the start-up probe (exempt)
    assert requests == {
        ("200", "/metrics"): 6, ("401", "/metrics"): none.codes[401] + wrong.codes[401]}
    assert web_series(body, "teye_web_basic_auth_failures_total") == {
        ("missing",): none.codes[401], ("wrong_password",): wrong.codes[401], ("malformed",): 0,
        ("unknown_user",): 0}


def test_ten_thousand_distinct_wrong_passwords(tmp_path, monkeypatch):
    """10,000 distinct wrong passwords from one address on 8 keep-alive connections: each is answered 401 (hashed)
    or 429 (that client's hashing bound), the refused ones churn through their cache many times over and never
    evict the verified credential; a new credential from another address is still hashed and accepted."""
    monkeypatch.setattr(webconfig, "FAILED_CACHE_SIZE", 64)
    # refusals answered at once (not held a second): 10,000 answers, mostly 429, in a few seconds
    srv, _ = serve(web_file(tmp_path), auth_throttle_delay_seconds=0)
    port = srv.address[1]
    legit = connection(port)
    try:
        assert get(legit, basic(*GOOD))[0] == 200                          # verified (bcrypt)
        scrapes = 0
        with Flood(port, 8, source="127.0.0.2", stop_after=10_000) as flood:
            while flood.total() < 5_000:
                if flood.total() > 1000 * scrapes:
                    assert get(legit, basic(*GOOD))[0] == 200
                    scrapes += 1
                time.sleep(0.01)
            other = connection(port, source="127.0.0.3")
            assert get(other, basic("second", "second-pw"))[0] == 200    # a new credential: hashed, not throttled
            other.close()
            while flood.total() < 10_000 and any(t.is_alive() for t in flood.threads):
                time.sleep(0.05)
        status, body = get(legit, basic(*GOOD))
        assert status == 200
    finally:
        legit.close()
        srv.stop()
    codes = flood.codes
    assert sum(codes.values()) == 10_000 and set(codes) <= {401, 429}, codes
    assert codes[401] > 2 * webconfig.FAILED_CACHE_SIZE, codes              # the failures' cache turned over
    assert codes[429] > 0, codes
    assert web_series(body, "teye_web_basic_auth_checks_total") == {
        ("cache",): scrapes + 1, ("bcrypt",): 2 + codes[401]}
    assert web_series(body, "teye_web_basic_auth_throttled_total") == {("client",): codes[429], ("server",): 0}
    assert len(srv._web._failed) == webconfig.FAILED_CACHE_SIZE
    assert len(srv._web._good) == 2


def test_hashing_bounds_per_client_and_in_all_while_bcrypt_is_stuck(tmp_path, monkeypatch):
    """bcrypt held on a gate: a verified credential is still served (from any address, even one at its bound,
    and with as many checks stuck as there are render threads: hashing has its own thread); the third
    unverified credential from one address gets 429, the fifth in all 503, without being hashed; the same
    credential on another connection shares the check under way."""
    import bcrypt
    gate, entered = threading.Event(), threading.Semaphore(0)
    real = bcrypt.checkpw

    def held(pw, h):
        if pw != GOOD[1].encode():
            entered.release()
            gate.wait(20)
        return real(pw, h)
    monkeypatch.setattr(bcrypt, "checkpw", held)
    srv, _ = serve(web_file(tmp_path), max_auth_hashes=4, max_auth_hashes_per_client=2)
    port = srv.address[1]
    results = {}
    calls = [0]

    def ask(name, source, password, timeout=30):
        c = connection(port, source=source, timeout=timeout)
        try:
            results[name] = get(c, basic(GOOD[0], password))[0]
        finally:
            c.close()

    def checks():
        c = connection(port, source="127.0.0.2", timeout=5)   # the address at its bound
        try:
            status, body = get(c, basic(*GOOD))
        finally:
            c.close()
        assert status == 200
        calls[0] += 1
        return web_series(body, "teye_web_basic_auth_checks_total")[("bcrypt",)]

    waiting = []
    try:
        c = connection(port)
        assert get(c, basic(*GOOD))[0] == 200             # verified before bcrypt gets stuck
        c.close()
        for name, source in (("a1", "127.0.0.2"), ("a2", "127.0.0.2"), ("b1", "127.0.0.3"), ("dup", "127.0.0.5"),
                             ("b2", "127.0.0.3")):
            t = threading.Thread(target=ask, args=(name, source, "a1" if name == "dup" else name))
            t.start()
            waiting.append(t)
            assert entered.acquire(timeout=10) if name == "a1" else True
            assert eventually(checks, 1 + len(waiting)) == 1 + len(waiting)
        ask("a3", "127.0.0.2", "a3", timeout=5)            # a third from 127.0.0.2: its bound
        ask("c1", "127.0.0.4", "c1", timeout=5)            # a fresh address, but 4 under way in all
        assert (results["a3"], results["c1"]) == (429, 503)
        assert all(t.is_alive() for t in waiting)          # still waiting on the gate
        gate.set()
        for t in waiting:
            t.join(30)
        ask("dup-again", "127.0.0.6", "a1")                # refused before: from the cache
        c = connection(port)
        status, body = get(c, basic(*GOOD))
        c.close()
    finally:
        gate.set()
        srv.stop()
    names = ("a1", "a2", "b1", "b2", "dup", "dup-again")
    assert {k: results.get(k) for k in names} == dict.fromkeys(names, 401)
    assert status == 200
    assert web_series(body, "teye_web_basic_auth_throttled_total") == {("client",): 1, ("server",): 1}
    # cache: each checks() scrape, the refused credential sent again, the last scrape
    assert web_series(body, "teye_web_basic_auth_checks_total") == {("bcrypt",): 6, ("cache",): calls[0] + 2}
    assert web_series(body, "teye_web_requests_total") == {
        ("200", "/metrics"): 1 + calls[0], ("401", "/metrics"): 6, ("429", "/metrics"): 1, ("503", "/metrics"): 1}


def test_half_a_header_line_then_silence(tmp_path, pki):
    """Clients that send half of a header line (the Authorization one) over TLS and stop: each is closed at
    the header timeout and counted so, nothing is hashed for them, and scrapes go on meanwhile."""
    import socket
    import ssl
    srv, _ = serve(web_file(tmp_path, pki), header_timeout_seconds=0.5)
    ctx = client_context(pki["ca"])
    port = srv.address[1]
    stuck = []
    try:
        c = connection(port, ctx)
        assert get(c, basic(*GOOD))[0] == 200
        token = base64.b64encode(f"{GOOD[0]}:{GOOD[1]}".encode())
        for i in range(20):
            s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10),
                                server_hostname="127.0.0.1")
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Basic " + token[:i % 12 + 1])
            stuck.append(s)
        for _ in range(3):
            assert get(c, basic(*GOOD))[0] == 200
        for s in stuck:                                      # closed by the server at its header timeout
            try:
                assert s.recv(100) == b""
            except (ssl.SSLError, ConnectionResetError):
                pass
        c.close()
        c = connection(port, ctx)
        expected = {("header",): 20, ("idle",): 0, ("write",): 0}

        def timeouts():
            return web_series(get(c, basic(*GOOD))[1], "teye_web_timeouts_total")
        assert eventually(timeouts, expected) == expected
        body = get(c, basic(*GOOD))[1]
        c.close()
    finally:
        for s in stuck:
            s.close()
        srv.stop()
    assert web_series(body, "teye_web_basic_auth_checks_total")[("bcrypt",)] == 1   # only the first scrape
    assert sum(web_series(body, "teye_web_basic_auth_failures_total").values()) == 0


def test_refusals_held_by_the_throttle_delay_never_fill_the_connection_table(tmp_path, monkeypatch):
    """Requests refused by the hashing bounds are held auth_throttle_delay_seconds before their answer; held so,
    their connections are evictable: with the table full of them, a scrape still gets in and is served."""
    import bcrypt
    gate, hashing = threading.Event(), threading.Event()
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda pw, h: (pw == GOOD[1].encode() or hashing.set() or gate.wait(20))
                        and real(pw, h))
    srv, _ = serve(web_file(tmp_path), max_connections=4, max_auth_hashes=1, max_auth_hashes_per_client=1,
                   auth_throttle_delay_seconds=30)
    port = srv.address[1]
    held = []
    stuck = connection(port, source="127.0.0.2", timeout=30)
    try:
        c = connection(port)
        assert get(c, basic(*GOOD))[0] == 200                      # verified before bcrypt gets stuck
        c.close()
        stuck.request("GET", "/metrics", headers=basic(GOOD[0], "stuck"))   # holds the one hashing slot
        # (once it does: before, a held refusal could come first and the scrape evict stuck, unread, instead)
        assert hashing.wait(10)
        for i in range(3):                                          # refused (503), held 30 s: the table is full
            h = connection(port, source=f"127.0.0.{3 + i}", timeout=30)
            h.request("GET", "/metrics", headers=basic(GOOD[0], f"held{i}"))
            held.append(h)
        expected = {("client",): 0, ("server",): 3}
        assert eventually(lambda: {(p.labels[0],): p.value for p in srv.stats.points()
                                   if p.spec.name == "teye_web_basic_auth_throttled_total"}, expected) == expected
        c = connection(port, timeout=5)
        status, body = get(c, basic(*GOOD))                        # evicts a held refusal
        c.close()
        gate.set()
    finally:
        gate.set()
        for h in held + [stuck]:
            h.close()
        srv.stop()
    assert status == 200
    assert web_series(body, "teye_web_connections_evicted_total") == {(): 1}
