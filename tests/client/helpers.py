"""Shared by the zero-code tests: run a command under `teye run` next to a live phase receiver."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from agent.context import AgentContext
from agent.phases.source import PhaseSource
from tests.phases.helpers import phases_cfg
from tests.procs import REPO
from tests.reference import job_env

HERE = os.path.dirname(os.path.abspath(__file__))
SITE = os.path.join(REPO, "teye_client", "_site")


def base_env(**extra) -> dict:
    """The test's environment without any teye switch of the caller's (the child's output is the oracle)."""
    return job_env(**extra)


def teye_run(args, socket_path=None, job=None, env=None, timeout=120, **kw) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "agent", "run"]
    if socket_path:
        cmd += ["--socket", socket_path]
    if job:
        cmd += ["--job", job]
    return subprocess.run(cmd + ["--"] + list(args), env=env or base_env(), capture_output=True, text=True,
                          timeout=timeout, cwd=kw.pop("cwd", REPO), **kw)


def plain_run(args, env=None, timeout=120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), env=env or base_env(), capture_output=True, text=True, timeout=timeout,
                          cwd=kw.pop("cwd", REPO), **kw)


class LiveAgent:
    """The agent's phase path (receiver + job table) on a private socket, in this process."""

    def __init__(self, sockdir: str, record_intervals: int = 0, **cfg):
        """``record_intervals``: keep that many raw intervals, (train_job, phase or "step", start, end), in
        ``self.src.table.recorded`` (as `teye profile` does for its timeline)."""
        self.path = os.path.join(sockdir, "phases.sock")
        self.src = PhaseSource(phases_cfg(**cfg), AgentContext(), socket_path=self.path,
                               record_intervals=record_intervals)

    def jobs(self, settle_s: float = 0.5):
        """The job views once nothing new has arrived for settle_s (the client's last flush is in)."""
        last, quiet_since = None, time.monotonic()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            n = self.src.receiver.received
            if n != last:
                last, quiet_since = n, time.monotonic()
            elif time.monotonic() - quiet_since >= settle_s:
                break
            time.sleep(0.05)
        return {j.train_job: j for j in self.src.collect(force=True).jobs}

    def close(self):
        self.src.close()


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])
