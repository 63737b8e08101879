"""`teye agent` as a subprocess for the web tests: optional prlimit wrapper and web config, https aware."""
from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import List, Optional

from tests.procs import REPO, free_port


def stop_process(proc: subprocess.Popen, sig=signal.SIGTERM, timeout: float = 10.0) -> int:
    """Send sig, wait; SIGKILL when it does not exit in time.  Returns the exit status."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


class WebAgent:
    def __init__(self, tmpdir: str, web_config: Optional[str] = None, ca: Optional[str] = None,
                 wrap: List[str] = (), args: List[str] = (), port: Optional[int] = None):
        self.port = port or free_port()
        self.scheme = "https" if ca else "http"
        self.url = f"{self.scheme}://127.0.0.1:{self.port}"
        self.ctx = ssl.create_default_context(cafile=ca) if ca else None
        self.log_path = os.path.join(tmpdir, f"agent-{self.port}.log")
        self.sock_path = os.path.join(tmpdir, "phases.sock")
        cmd = list(wrap) + [sys.executable, "-m", "agent", "agent", "--listen", f"127.0.0.1:{self.port}",
                            "--phase-socket", self.sock_path] + list(args)
        if web_config:
            cmd += ["--web.config.file", web_config]
        self._log = open(self.log_path, "a+")
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT)
        self.wait_ready()

    def get(self, path: str = "/metrics", timeout: float = 10.0, headers=None) -> bytes:
        req = urllib.request.Request(self.url + path, headers=headers or {})
        with urllib.request.urlopen(req, timeout=timeout, context=self.ctx) as r:
            return r.read()

    def wait_ready(self, timeout: float = 30.0) -> float:
        """Seconds until /healthz answers."""
        t0 = time.monotonic()
        last = None
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited with {self.proc.returncode}: {self.log()}")
            try:
                self.get("/healthz", timeout=2)
                return time.monotonic() - t0
            except (OSError, urllib.error.URLError) as e:
                last = e
                time.sleep(0.05)
        raise TimeoutError(f"agent not ready in {timeout}s: {last}")

    def status(self) -> dict:
        """/proc/<pid>/status of the agent (the python process, also under prlimit, which execs)."""
        out = {}
        with open(f"/proc/{self.proc.pid}/status") as fh:
            for line in fh:
                k, _, v = line.partition(":")
                out[k] = v.strip()
        return out

    def threads(self) -> int:
        return int(self.status()["Threads"])

    def rss_bytes(self) -> int:
        return int(self.status()["VmRSS"].split()[0]) * 1024

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def log(self) -> str:
        with open(self.log_path) as fh:
            return fh.read()

    def stop(self, sig=signal.SIGTERM) -> int:
        self._log.close()
        return stop_process(self.proc, sig)
