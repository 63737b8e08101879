"""`teye report` against a Prometheus that is down, slow, behind TLS and a password, or misconfigured:
each gets its own message and exit status (docs/report.md)."""
from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from tests.procs import REPO, Prometheus, free_port, prometheus_binary
from tests.web.certs import bcrypt_hash, write_pki

pytestmark = pytest.mark.e2e


def report(*args, env=None):
    p = subprocess.run([sys.executable, "-m", "agent", "report", *args], capture_output=True, text=True,
                       timeout=60, cwd=REPO, env={**os.environ, **(env or {})})
    return p.returncode, p.stdout, p.stderr


def test_prometheus_down():
    rc, out, err = report("--prometheus", f"http://127.0.0.1:{free_port()}", "--slurm-job", "1")
    assert rc == 3 and out == "" and "cannot reach Prometheus" in err


def test_prometheus_too_slow():
    """A server that accepts the connection and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                pass
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        rc, out, err = report("--prometheus", f"http://127.0.0.1:{srv.getsockname()[1]}", "--slurm-job", "1",
                              "--timeout", "0.5")
        assert rc == 4 and out == "" and "did not answer within 0.5 s" in err
    finally:
        stop.set()
        t.join()
        for c in held:
            c.close()
        srv.close()


def test_usage_errors(tmp_path):
    rc, _, err = report("--slurm-job", "1", env={"TEYE_PROMETHEUS_URL": ""})
    assert rc == 2 and "no Prometheus" in err
    rc, _, err = report("--prometheus", "http://127.0.0.1:1", env={})
    assert rc == 2 and "name the jobs" in err
    bad = tmp_path / "http.yml"
    bad.write_text("basic_auth: {username: a, password: b}\nbearer_token: c\n")
    rc, _, err = report("--prometheus", "http://127.0.0.1:1", "--http.config.file", str(bad), "--slurm-job", "1")
    assert rc == 2 and "at most one of" in err
    bad.write_text("tls_confg: {}\n")
    rc, _, err = report("--prometheus", "http://127.0.0.1:1", "--http.config.file", str(bad), "--slurm-job", "1")
    assert rc == 2 and "unknown key(s) tls_confg" in err
    rc, _, err = report("--prometheus", "http://127.0.0.1:1", "--slurm-job", "1", "--since", "yesterday-ish")
    assert rc == 2 and "cannot read time" in err


def test_url_from_environment_and_config_file(tmp_path):
    port = free_port()
    rc, _, err = report("--slurm-job", "1", env={"TEYE_PROMETHEUS_URL": f"http://127.0.0.1:{port}"})
    assert rc == 3 and f"127.0.0.1:{port}" in err
    conf = tmp_path / "teye.yml"
    conf.write_text(f"report:\n  prometheus_url: http://127.0.0.1:{port + 1}\n")
    rc, _, err = report("--config", str(conf), "--slurm-job", "1", env={"TEYE_PROMETHEUS_URL": ""})
    assert rc == 3 and f"127.0.0.1:{port + 1}" in err


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """A real Prometheus serving its API over TLS with basic auth (its own --web.config.file)."""
    if not prometheus_binary():
        pytest.skip("prometheus not installed (./dev.sh test installs it)")
    tmp = tmp_path_factory.mktemp("secure")
    pki = write_pki(str(tmp))
    web = tmp / "web.yml"
    web.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": pki["server"], "key_file": pki["server-key"]},
                                   "basic_auth_users": {"reporter": bcrypt_hash("s3cret")}}))
    prom = Prometheus.__new__(Prometheus)
    import shutil
    import time
    prom.port = free_port()
    cfg = tmp / "prometheus.yml"
    cfg.write_text("global: {scrape_interval: 1s}\nscrape_configs: []\n")
    prom._log = open(tmp / "prometheus.log", "w+")
    prom.proc = subprocess.Popen([shutil.which("prometheus"), f"--config.file={cfg}",
                                  f"--storage.tsdb.path={tmp}/data", f"--web.listen-address=127.0.0.1:{prom.port}",
                                  f"--web.config.file={web}"], stdout=prom._log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", prom.port)) == 0:
                break
        time.sleep(0.2)
    pw = tmp / "password"
    pw.write_text("s3cret\n")
    yield {"url": f"https://127.0.0.1:{prom.port}", "pki": pki, "tmp": tmp, "pw": str(pw)}
    prom.stop()


def http_config(secured, name, doc):
    path = secured["tmp"] / name
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_tls_and_password_right(secured):
    good = http_config(secured, "good.yml", {"basic_auth": {"username": "reporter", "password_file": secured["pw"]},
                                            "tls_config": {"ca_file": secured["pki"]["ca"]}})
    rc, out, err = report("--prometheus", secured["url"], "--http.config.file", good, "--slurm-job", "77",
                          "--format", "json")
    assert rc == 7, err      # it got through: Prometheus answered, and knows no job 77
    assert json.loads(out)["unknown_jobs"] == ["77"]


def test_password_wrong(secured):
    bad = http_config(secured, "badpw.yml", {"basic_auth": {"username": "reporter", "password": "guess"},
                                             "tls_config": {"ca_file": secured["pki"]["ca"]}})
    rc, out, err = report("--prometheus", secured["url"], "--http.config.file", bad, "--slurm-job", "77")
    assert rc == 6 and out == "" and "refused the credentials (HTTP 401)" in err


def test_tls_not_trusted(secured):
    untrusted = http_config(secured, "noca.yml", {"basic_auth": {"username": "reporter", "password": "s3cret"}})
    rc, out, err = report("--prometheus", secured["url"], "--http.config.file", untrusted, "--slurm-job", "77")
    assert rc == 5 and out == "" and "TLS handshake" in err and "CERTIFICATE_VERIFY_FAILED" in err
    wrong_name = http_config(secured, "name.yml", {"basic_auth": {"username": "reporter", "password": "s3cret"},
                                                   "tls_config": {"ca_file": secured["pki"]["ca"],
                                                                  "server_name": "not-this-host.example"}})
    rc, _, err = report("--prometheus", secured["url"], "--http.config.file", wrong_name, "--slurm-job", "77")
    assert rc == 5 and "TLS handshake" in err


class _Answer(BaseHTTPRequestHandler):
    """A plain-HTTP stand-in for Prometheus that answers every API call with one status."""
    status = 403

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"status":"error","error":"forbidden"}'
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def plain_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def test_credentials_forbidden_is_an_auth_failure(plain_server):
    """A proxy or Prometheus that knows the user and forbids the API (HTTP 403) is refused credentials: 6."""
    rc, out, err = report("--prometheus", f"http://127.0.0.1:{plain_server}", "--slurm-job", "1")
    assert (rc, out) == (6, "") and "refused the credentials (HTTP 403)" in err


def test_https_url_to_a_plain_http_prometheus_is_a_tls_failure(plain_server):
    """An https:// URL to a Prometheus serving plain HTTP: no certificate involved, still TLS (5), not 'down' (3)."""
    rc, out, err = report("--prometheus", f"https://127.0.0.1:{plain_server}", "--slurm-job", "1")
    assert (rc, out) == (5, "") and "TLS" in err and "WRONG_VERSION_NUMBER" in err, err


@pytest.mark.parametrize("version", ["TLSv1_2", "TLSv1_3"])
def test_a_handshake_the_server_refuses_is_a_tls_failure(tmp_path, version):
    """A Prometheus behind mutual TLS refuses a client without a certificate: 5, not 'unreachable'.  TLS 1.2
    refuses within the handshake; TLS 1.3 after the client's side of it is done."""
    pki = write_pki(str(tmp_path))
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=pki["ca"])
    ctx.load_cert_chain(pki["server"], pki["server-key"])
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.minimum_version = ctx.maximum_version = getattr(ssl.TLSVersion, version)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    stop = threading.Event()
    refused = []

    def serve():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            c.settimeout(2)
            tls = ctx.wrap_socket(c, server_side=True, do_handshake_on_connect=False)
            try:
                tls.do_handshake()
            except (ssl.SSLError, OSError) as e:
                refused.append(getattr(e, "reason", type(e).__name__))
                # read what the client still sends (its request, under TLS 1.3) until it closes, so that the
                # close is no reset racing the alert, as a Go server lingers
                raw = socket.socket(fileno=os.dup(tls.fileno()))
                raw.settimeout(2)
                try:
                    while raw.recv(65536):
                        pass
                except OSError:
                    pass
                finally:
                    raw.close()
            finally:
                tls.close()
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    conf = tmp_path / "http.yml"
    conf.write_text(yaml.safe_dump({"tls_config": {"ca_file": pki["ca"]}}))   # trusts the server, no client cert
    try:
        rc, out, err = report("--prometheus", f"https://127.0.0.1:{srv.getsockname()[1]}", "--http.config.file",
                              str(conf), "--slurm-job", "1", "--timeout", "10")
    finally:
        stop.set()
        t.join()
        srv.close()
    assert refused, err                                     # the server did refuse the handshake
    # (TLS 1.3: the alert comes during the client's request or with the answer, or as an EOF: TLS all the same)
    assert (rc, out) == (5, "") and "TLS" in err, err
