"""`teye report`'s HTTP client (issue 36) and its bad answers and flags (issue 39), through the real CLI.

Oracles: servers of the test's own that record every request they receive (method, path, headers, body, the
client certificate presented), the test's own clock around the command, bytes the server counted as sent.
Each redirect rule has two servers: the configured one, which redirects, and a second one (another host:
``localhost`` instead of ``127.0.0.1``, another port), which answers as a Prometheus that knows no job, so
that a report that got through exits 7 (unknown job) with its JSON on stdout."""
from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from tests.procs import REPO, free_port
from tests.web.certs import write_pki

pytestmark = pytest.mark.e2e

NOW = 1_800_000_000.0
CREDS = "Basic " + base64.b64encode(b"reporter:s3cret").decode()


def report(*args, timeout=90):
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "agent", "report", *args], capture_output=True, text=True,
                       timeout=timeout, cwd=REPO, env={**os.environ, "TEYE_PROMETHEUS_URL": ""})
    return p.returncode, p.stdout, p.stderr, time.monotonic() - t


def api_answer(path: str, params: dict) -> bytes:
    """What a Prometheus with no teye series answers."""
    q = params.get("query", [""])[0]
    if q == "time()":
        data = {"resultType": "scalar", "result": [NOW, repr(NOW)]}
    elif path.endswith("/query_range"):
        data = {"resultType": "matrix", "result": []}
    else:
        data = {"resultType": "vector", "result": []}
    return json.dumps({"status": "success", "data": data}).encode()


class _Handler(BaseHTTPRequestHandler):
    def _any(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        cert = None
        if isinstance(self.connection, ssl.SSLSocket):
            cert = self.connection.getpeercert()
        parts = urllib.parse.urlsplit(self.path)
        params = urllib.parse.parse_qs(body.decode() if self.command == "POST" else parts.query)
        self.server.seen.append({"method": self.command, "path": parts.path, "params": params,
                                 "authorization": self.headers.get("Authorization"), "cert": cert})
        self.server.script(self, parts.path, params)

    do_GET = do_POST = _any

    def send(self, status, body=b"", headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def prometheus_like(h, path, params):
    h.send(200, api_answer(path, params), [("Content-Type", "application/json")])


class Server:
    """A recording HTTP(S) server on 127.0.0.1; ``script(handler, path, params)`` answers."""

    def __init__(self, script=prometheus_like, tls=None, host="127.0.0.1"):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.seen = []
        self.httpd.script = script
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.scheme = "https" if tls is not None else "http"
        self.host = host
        self.port = self.httpd.server_address[1]
        self.url = f"{self.scheme}://{host}:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def seen(self):
        return self.httpd.seen

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def redirect_to(target, status=302):
    def script(h, path, params):
        loc = target(path) if callable(target) else target
        h.send(status, b"", [("Location", loc)])
    return script


def config(tmp_path, **doc):
    p = tmp_path / "http.yml"
    p.write_text(yaml.safe_dump(doc))
    return str(p)


BASIC = {"basic_auth": {"username": "reporter", "password": "s3cret"}}


# ------------------------------------------------------------------------------------------- redirects

@pytest.mark.parametrize("status", [302, 307])
def test_a_redirect_to_another_host_is_followed_without_the_credentials(tmp_path, status):
    """The issue's case: the configured Prometheus redirects to another host, which must not get the password.
    A 307 keeps the POST and its body; a 302 becomes a GET that carries the query in the URL."""
    with Server(host="localhost") as other:
        with Server(redirect_to(lambda path: f"{other.url}{path}", status)) as prom:
            rc, out, err, _ = report("--prometheus", prom.url, "--http.config.file", config(tmp_path, **BASIC),
                                     "--slurm-job", "1", "--format", "json")
    assert rc == 7, err                                           # it got through to the other host
    assert json.loads(out)["unknown_jobs"] == ["1"]
    assert prom.seen and all(r["authorization"] == CREDS for r in prom.seen)
    assert other.seen and all(r["authorization"] is None for r in other.seen), other.seen
    methods = {r["method"] for r in other.seen}
    assert methods == ({"POST"} if status == 307 else {"GET"})
    assert other.seen[0]["params"]["query"] == ["time()"]         # the query arrived, in the body or the URL
    assert len(other.seen) == len(prom.seen)


def test_a_redirect_on_the_same_host_keeps_the_credentials(tmp_path):
    def script(h, path, params):
        if path.startswith("/moved"):
            return prometheus_like(h, path[len("/moved"):], params)
        h.send(307, b"", [("Location", "/moved" + path)])
    with Server(script) as prom:
        rc, _, err, _ = report("--prometheus", prom.url, "--http.config.file", config(tmp_path, **BASIC),
                               "--slurm-job", "1")
    assert rc == 7, err
    moved = [r for r in prom.seen if r["path"].startswith("/moved")]
    assert moved and all(r["authorization"] == CREDS and r["method"] == "POST" for r in moved)


def test_a_bearer_token_is_not_sent_to_another_host(tmp_path):
    with Server(host="localhost") as other:
        with Server(redirect_to(lambda path: f"{other.url}{path}", 308)) as prom:
            rc, _, err, _ = report("--prometheus", prom.url, "--http.config.file",
                                   config(tmp_path, bearer_token="t0ken"), "--slurm-job", "1")
    assert rc == 7, err
    assert prom.seen[0]["authorization"] == "Bearer t0ken"
    assert other.seen and all(r["authorization"] is None for r in other.seen)


def _tls(pki, want_cert):
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=pki["ca"])
    ctx.load_cert_chain(pki["server"], pki["server-key"])
    ctx.verify_mode = ssl.CERT_OPTIONAL if want_cert else ssl.CERT_NONE
    return ctx


def test_the_client_certificate_goes_only_to_the_configured_host(tmp_path):
    pki = write_pki(str(tmp_path))
    conf = config(tmp_path, tls_config={"ca_file": pki["ca"], "cert_file": pki["client"],
                                        "key_file": pki["client-key"]}, **BASIC)
    with Server(tls=_tls(pki, True), host="localhost") as other:
        with Server(redirect_to(lambda path: f"{other.url}{path}", 307), tls=_tls(pki, True)) as prom:
            rc, _, err, _ = report("--prometheus", prom.url, "--http.config.file", conf, "--slurm-job", "1")
    assert rc == 7, err
    assert prom.seen and all(r["cert"] for r in prom.seen)              # the configured host got the certificate
    assert other.seen and all(not r["cert"] and r["authorization"] is None for r in other.seen), other.seen


def test_https_to_plain_http_is_never_followed(tmp_path):
    pki = write_pki(str(tmp_path))
    with Server(host="localhost") as plain:
        with Server(redirect_to(lambda path: f"{plain.url}{path}", 307), tls=_tls(pki, False)) as prom:
            rc, out, err, _ = report("--prometheus", prom.url, "--http.config.file",
                                     config(tmp_path, tls_config={"ca_file": pki["ca"]}, **BASIC), "--slurm-job", "1")
    assert (rc, out) == (5, "") and "from https to plain http" in err and "not followed" in err, err
    assert prom.seen and plain.seen == []


def test_follow_redirects_false_is_honoured(tmp_path):
    with Server(host="localhost") as other:
        with Server(redirect_to(lambda path: f"{other.url}{path}", 302)) as prom:
            rc, out, err, _ = report("--prometheus", prom.url, "--http.config.file",
                                     config(tmp_path, follow_redirects=False, **BASIC), "--slurm-job", "1")
    assert (rc, out) == (1, "") and "follow_redirects is false" in err and "time()" in err, err
    assert len(prom.seen) == 1 and other.seen == []


def test_a_redirect_loop_ends(tmp_path):
    hops = []

    def script(h, path, params):
        hops.append(path)
        h.send(302, b"", [("Location", "/b" if path.endswith("/a") else "/a")])
    with Server(script) as prom:
        rc, out, err, _ = report("--prometheus", prom.url, "--slurm-job", "1")
    assert (rc, out) == (1, "") and "in a loop" in err and len(err.splitlines()) == 1, err
    assert hops == ["/api/v1/query", "/a", "/b"]      # /b sends back to /a, already visited: stopped there


def test_a_redirect_chain_longer_than_ten_ends(tmp_path):
    def script(h, path, params):
        n = int(path.rsplit("/", 1)[1]) if path.startswith("/hop/") else 0
        h.send(307, b"", [("Location", f"/hop/{n + 1}")])
    with Server(script) as prom:
        rc, out, err, _ = report("--prometheus", prom.url, "--slurm-job", "1")
    assert (rc, out) == (1, "") and "more than 10 times" in err, err
    assert len(prom.seen) == 11                       # the first request and ten redirects followed


@pytest.mark.parametrize("location", ["file:///etc/passwd", "ftp://127.0.0.1/x", "http://user:pw@localhost:1/"])
def test_a_redirect_to_another_scheme_or_with_credentials_is_refused(tmp_path, location):
    with Server(redirect_to(location, 302)) as prom:
        rc, out, err, _ = report("--prometheus", prom.url, "--slurm-job", "1")
    assert (rc, out) == (1, "") and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert ("only http and https redirects are followed" if "@" not in location else "holding credentials") in err
    assert "root:" not in err and ":pw@" not in err
    assert len(prom.seen) == 1


def test_credentials_in_the_url_are_refused_before_anything_is_sent():
    with Server() as prom:
        rc, out, err, _ = report("--prometheus", f"http://reporter:s3cret@127.0.0.1:{prom.port}", "--slurm-job", "1")
    assert (rc, out) == (2, "") and "holds credentials" in err and "s3cret" not in err, err
    assert prom.seen == []


# ------------------------------------------------------------------------------------------- deadlines

class Trickle:
    """Accepts, reads the request, and sends an answer one byte every ``every`` s (headers included when
    ``headers_too``); counts what it sent.  ``fast`` queries get their whole answer at once."""

    def __init__(self, every=0.5, fast=(), headers_too=True):
        self.every, self.fast, self.headers_too = every, fast, headers_too
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(16)
        self.port = self.srv.getsockname()[1]
        self.stop = threading.Event()
        self.cut = []          # seconds each trickled answer lasted before the client went away
        self.t = threading.Thread(target=self.serve, daemon=True)

    def serve(self):
        self.srv.settimeout(0.2)
        while not self.stop.is_set():
            try:
                c, _ = self.srv.accept()
            except OSError:
                continue
            threading.Thread(target=self.one, args=(c,), daemon=True).start()

    def one(self, c):
        with c:
            c.settimeout(5)
            data = b""
            while b"\r\n\r\n" not in data:
                data += c.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            n = int([ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")][0])
            while len(body) < n:
                body += c.recv(65536)
            params = urllib.parse.parse_qs(body.decode())
            payload = api_answer(head.split(b" ")[1].decode(), params)
            msg = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(payload)
            if params.get("query", [""])[0] in self.fast:
                c.sendall(msg + payload)
                return
            if not self.headers_too:
                c.sendall(msg)
                msg = b""
            msg += payload
            t = time.monotonic()
            try:
                for i in range(len(msg)):
                    if self.stop.is_set():
                        return
                    c.sendall(msg[i:i + 1])
                    time.sleep(self.every)
            except OSError:          # the client went away
                self.cut.append(time.monotonic() - t)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.t.join()
        self.srv.close()


@pytest.mark.parametrize("headers_too", [True, False])
def test_timeout_bounds_a_query_whose_server_trickles(headers_too):
    """One byte every 0.5 s: each recv is quick, so only a bound on the whole query can end it (the answer
    would take over 40 s)."""
    with Trickle(every=0.5, headers_too=headers_too) as srv:
        rc, out, err, took = report("--prometheus", f"http://127.0.0.1:{srv.port}", "--slurm-job", "1",
                                    "--timeout", "2")
    assert (rc, out) == (4, "") and "did not answer within 2 s (--timeout)" in err and "time()" in err, err
    assert took < 2 + 8, took      # the command's own start-up, then 2 s; the trickle would take > 40 s


def test_the_report_ends_by_its_own_deadline():
    """Prometheus' clock answers at once, the next query trickles; --timeout is far away, --deadline is not."""
    with Trickle(every=0.5, fast=("time()",)) as srv:
        rc, out, err, took = report("--prometheus", f"http://127.0.0.1:{srv.port}", "--slurm-job", "1",
                                    "--timeout", "300", "--deadline", "2")
        wait = time.monotonic() + 5
        while not srv.cut and time.monotonic() < wait:
            time.sleep(0.1)
    assert (rc, out) == (4, "") and "deadline of 2 s (--deadline)" in err and "query_range" in err, err
    assert took < 2 + 8, took
    assert srv.cut and max(srv.cut) < 4    # the trickle ended by the client going away, near the deadline


# ------------------------------------------------------------------------------------------- the body bound

def test_an_answer_above_the_bound_is_refused_and_one_at_it_accepted():
    cap = 1 << 20
    size = {"n": cap}

    def script(h, path, params):
        body = api_answer(path, params)
        h.send(200, body + b" " * (size["n"] - len(body)))
    with Server(script) as prom:
        rc, _, err, _ = report("--prometheus", prom.url, "--slurm-job", "1", "--max-answer-size", "1M")
        assert rc == 7, err                                      # exactly at the bound: accepted
        size["n"] = cap + 1
        rc, out, err, _ = report("--prometheus", prom.url, "--slurm-job", "1", "--max-answer-size", "1M")
    assert (rc, out) == (1, "") and f"{cap + 1} bytes, above the bound of {cap} bytes" in err, err


def test_an_endless_answer_without_a_length_is_cut_at_the_bound():
    """No Content-Length, no end: the client reads at most the bound, then stops (the server counts what it
    could send: the bound plus what the sockets' buffers hold)."""
    sent = []

    def script(h, path, params):
        h.send_response(200)
        h.end_headers()           # HTTP/1.0: the body ends when the connection does
        n = 0
        try:
            while n < (64 << 20):
                h.wfile.write(b" " * 65536)
                n += 65536
        except OSError:
            pass
        sent.append(n)
    with Server(script) as prom:
        rc, out, err, _ = report("--prometheus", prom.url, "--slurm-job", "1", "--max-answer-size", "1M")
    assert (rc, out) == (1, "") and "larger than the bound of 1048576 bytes" in err, err
    time.sleep(0.5)
    assert sent and sent[0] < (1 << 20) + (16 << 20), sent


# ------------------------------------------------------------------------------------------- bad answers (#39)

def _vec(result):
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


TIME_OK = {"status": "success", "data": {"resultType": "scalar", "result": [NOW, repr(NOW)]}}
NESTED = ("[" * 100_000 + "]" * 100_000)
BAD = {
    # name: (answer to time(), answer to the next query (a range query), what stderr names)
    "data_list": ({"status": "success", "data": [1, 2]}, None, "time()"),
    "result_string": ({"status": "success", "data": {"resultType": "scalar", "result": "x"}}, None, "time()"),
    "time_nan": ({"status": "success", "data": {"resultType": "scalar", "result": [NOW, "NaN"]}}, None, "time()"),
    "time_abc": ({"status": "success", "data": {"resultType": "scalar", "result": [NOW, "abc"]}}, None, "time()"),
    "time_empty_vector": (_vec([]), None, "time()"),
    "time_number_not_string": ({"status": "success", "data": {"resultType": "scalar", "result": [NOW, NOW]}},
                               None, "time()"),
    "matrix_result_string": (TIME_OK, {"status": "success", "data": {"resultType": "matrix", "result": "x"}},
                             "query_range"),
    "matrix_without_metric": (TIME_OK, {"status": "success", "data": {"resultType": "matrix",
                                                                      "result": [{"values": [[NOW, "1"]]}]}},
                              "query_range"),
    "matrix_label_not_string": (TIME_OK, {"status": "success", "data": {
        "resultType": "matrix", "result": [{"metric": {"slurm_job": 1}, "values": [[NOW, "1"]]}]}}, "query_range"),
    "matrix_values_not_list": (TIME_OK, {"status": "success", "data": {
        "resultType": "matrix", "result": [{"metric": {}, "values": "1"}]}}, "query_range"),
    "matrix_point_short": (TIME_OK, {"status": "success", "data": {
        "resultType": "matrix", "result": [{"metric": {}, "values": [[NOW]]}]}}, "query_range"),
    "vector_for_range": (TIME_OK, _vec([]), "query_range"),
    "deeply_nested": (NESTED, None, "time()"),
    "not_json": ("<html>proxy login</html>", None, "time()"),
    "status_error_100k": ({"status": "error", "errorType": "bad_data", "error": "x" * 100_000}, None, "time()"),
}


def _serve_bad(first, second, status=200):
    def script(h, path, params):
        doc = first if params.get("query", [""])[0] == "time()" else second
        body = (doc if isinstance(doc, str) else json.dumps(doc)).encode()
        h.send(status, body, [("Content-Type", "application/json")])
    return script


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_malformed_answer_is_exit_1_naming_the_query(case):
    first, second, named = BAD[case]
    with Server(_serve_bad(first, second)) as prom:
        rc, out, err, _ = report("--prometheus", prom.url, "--slurm-job", "1")
    assert (rc, out) == (1, ""), (rc, err[-2000:])
    assert "Traceback" not in err and len(err.splitlines()) == 1 and len(err) < 700, err[-2000:]
    assert named in err, err


def test_a_100k_error_text_is_cut_to_one_line():
    text = "line one\n" + "y" * 100_000
    with Server(_serve_bad({"status": "error", "error": text}, None, status=400)) as prom:
        rc, out, err, _ = report("--prometheus", prom.url, "--slurm-job", "1")
    assert (rc, out) == (1, "") and "HTTP 400" in err and "time()" in err and "line one" in err, err[-500:]
    assert len(err.splitlines()) == 1 and len(err) < 700, len(err)


def test_nan_samples_are_absent_not_a_crash():
    """A range answer whose only series has NaN and infinite values: those points are absent, so job 1 has no
    points and is unknown (7), as with no series at all."""
    series = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"slurm_job": "1", "instance": "n1", "gpu": "0"}, "values": [[NOW - 60, "NaN"], [NOW, "+Inf"]]}]}}
    with Server(_serve_bad(TIME_OK, series)) as prom:
        rc, out, err, _ = report("--prometheus", prom.url, "--slurm-job", "1", "--format", "json")
    assert rc == 7 and json.loads(out)["unknown_jobs"] == ["1"] and "Traceback" not in err, err


# ------------------------------------------------------------------------------------------- flags (#39)

@pytest.mark.parametrize("flags, named", [
    (["--since", "1e400"], "out of range"),
    (["--since", "-5"], "out of range"),
    (["--until", "99999999999999"], "out of range"),
    (["--since", "nan"], "out of range"),
    (["--cpus", "-1"], "--cpus"),
    (["--cpus", "0"], "--cpus"),
    (["--timeout", "nan"], "--timeout"),
    (["--timeout", "-1"], "--timeout"),
    (["--timeout", "inf"], "--timeout"),
    (["--deadline", "0"], "--deadline"),
    (["--step", "nan"], "--step"),
    (["--step", "-15"], "--step"),
    (["--mem", "0"], "memory size"),
    (["--mem", "9" * 400], "memory size"),
    (["--max-bytes", "3"], "--max-bytes"),
    (["--max-answer-size", "0"], "memory size"),
    (["--cpus", "abc"], "--cpus"),
])
def test_a_flag_out_of_range_is_a_usage_error(flags, named):
    """Refused before anything is sent: the URL is a closed port, so a flag that slipped through exits 3."""
    rc, out, err, _ = report("--prometheus", f"http://127.0.0.1:{free_port()}", "--slurm-job", "1", *flags)
    assert (rc, out) == (2, "") and named in err and "Traceback" not in err, err
