"""Helpers for end-to-end tests: free ports, a running `teye agent`, a real Prometheus."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from typing import Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait_http(url: str, timeout: float = 30.0, proc: Optional[subprocess.Popen] = None) -> str:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            return http_get(url, timeout=2)
        except OSError as e:
            last = e
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer in {timeout}s: {last}")


class Agent:
    """`python -m agent agent ...` on a free loopback port."""

    def __init__(self, args: List[str], env: Optional[Dict[str, str]] = None, log_path: Optional[str] = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log_path, "w+") if log_path else subprocess.DEVNULL
        args = list(args)
        if "--phase-socket" not in args:  # never touch the node's real /run/teye socket from a test
            self._sockdir = tempfile.TemporaryDirectory(prefix="teye-test-")
            args += ["--phase-socket", os.path.join(self._sockdir.name, "phases.sock")]
        self.proc = subprocess.Popen([sys.executable, "-m", "agent", "agent", "--listen", f"127.0.0.1:{self.port}"]
                                     + args, cwd=REPO, env={**os.environ, **(env or {})},
                                     stdout=self._log, stderr=subprocess.STDOUT)
        wait_http(self.url + "/healthz", proc=self.proc)

    def metrics(self) -> str:
        return http_get(self.url + "/metrics")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def prometheus_binary() -> Optional[str]:
    return shutil.which("prometheus")


class Prometheus:
    """A real Prometheus (Debian package) scraping the given targets every second.

    ``config`` replaces the generated configuration (targets, rule_files, scrape_job and
    more_scrape_configs are then unused); ``more_scrape_configs`` are YAML list items (indented two
    spaces) appended to scrape_configs; ``args`` are extra command-line flags
    (``--enable-feature=agent``, ...)."""

    def __init__(self, tmpdir: str, targets: List[str] = (), rule_files: List[str] = (), scrape_job: str = "teye",
                 more_scrape_configs: str = "", config: Optional[str] = None, args: List[str] = ()):
        binary = prometheus_binary()
        if not binary:
            raise RuntimeError("prometheus not installed (apt-get install prometheus); .ci/run installs it")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = os.path.join(tmpdir, "prometheus.yml")
        rules = "".join(f"\n  - {r}" for r in rule_files)
        with open(cfg, "w") as fh:
            fh.write(config if config is not None else f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:{rules or ' []'}
scrape_configs:
  - job_name: {scrape_job}
    static_configs:
      - targets: {json.dumps(targets)}
{more_scrape_configs}""")
        self._log = open(os.path.join(tmpdir, "prometheus.log"), "w+")
        storage = "agent" if "--enable-feature=agent" in args else "tsdb"   # agent mode refuses the tsdb flags
        self.proc = subprocess.Popen([binary, f"--config.file={cfg}", f"--storage.{storage}.path={tmpdir}/data",
                                      f"--web.listen-address=127.0.0.1:{self.port}", *args],
                                     stdout=self._log, stderr=subprocess.STDOUT)
        wait_http(self.url + "/-/ready", timeout=60, proc=self.proc)

    def api(self, path: str, **params) -> dict:
        q = urllib.parse.urlencode(params)
        body = json.loads(http_get(f"{self.url}/api/v1/{path}?{q}", timeout=10))
        if body.get("status") != "success":
            raise AssertionError(f"Prometheus {path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list:
        return self.api("query", query=expr)["result"]

    def wait_for(self, expr: str, timeout: float = 30.0) -> list:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            res = self.query(expr)
            if res:
                return res
            time.sleep(0.5)
        raise TimeoutError(f"no result for {expr!r} within {timeout}s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
