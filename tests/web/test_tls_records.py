"""What a TLS peer can do inside a connection (issue 48): renegotiate (TLS 1.2), and send its request in
1-byte TLS records.  A real server (exporters.http) with the shipped web config's TLS; the peer is OpenSSL's
own s_client, or Python's ssl writing one record per send()."""
from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import time

import pytest

from exporters.webconfig import WebConfig
from tests.web.server_helpers import client_context, connect, read_all, request, start


def test_the_servers_context_refuses_renegotiation_whatever_openssls_default(tls_web):
    web, _ = tls_web
    assert WebConfig(web).current().tls.context.options & ssl.OP_NO_RENEGOTIATION


@pytest.mark.skipif(not shutil.which("openssl"), reason="needs the openssl command line tool")
def test_a_client_renegotiating_is_refused_and_the_server_still_serves(tls_web):
    """s_client's 'R' command renegotiates a TLS 1.2 session: the server answers with an alert, the
    connection ends, and a new client is answered as before."""
    web, pki = tls_web
    srv, _ = start(web)
    try:
        # (not -quiet: it turns s_client's R command off)
        p = subprocess.Popen(["openssl", "s_client", "-connect", f"127.0.0.1:{srv.address[1]}", "-tls1_2",
                              "-CAfile", pki["ca"], "-crlf"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 10
        while len(srv._conns) < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)   # the handshake done (s_client reads its stdin only after it)
        try:
            p.stdin.write("R\n")
            p.stdin.flush()
            time.sleep(0.5)
            p.stdin.write("GET /metrics HTTP/1.1\nHost: x\nConnection: close\n\n")
            p.stdin.flush()
        except BrokenPipeError:
            pass
        try:
            out, err = p.communicate(timeout=10)
        except ValueError:   # (stdin closed by the broken pipe)
            out, err = p.stdout.read(), p.stderr.read()
        assert "RENEGOTIATING" in err, err[-2000:]
        assert "no renegotiation" in err, err[-2000:]
        assert "HTTP/1.1 200" not in out   # the request after it was never answered on that connection
        assert request(srv, ctx=client_context(pki["ca"]))[0] == 200
    finally:
        srv.stop()


def test_a_request_in_one_byte_tls_records_is_answered(tls_web):
    """Each send() of an SSL socket is one TLS record: a request head sent a byte at a time is 60-odd
    records of one byte each (21 bytes of overhead each); the server reassembles it and answers."""
    web, pki = tls_web
    srv, render = start(web)
    try:
        with connect(srv, client_context(pki["ca"]), timeout=10) as s:
            head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            for b in head:
                s.send(bytes([b]))
            got = read_all(s)
        assert got.startswith(b"HTTP/1.1 200") and b"teye_test_value 42.0\n" in got, got[:300]
    finally:
        srv.stop()
