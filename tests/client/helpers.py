"""Shared by the zero-code tests: run a command under `teye run` next to a live phase receiver."""
from __future__ import annotations

import array
import fcntl
import json
import os
import subprocess
import sys
import termios
import time
from typing import Optional

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


QUIET_S, SETTLE_S = 0.1, 0.5   # LiveAgent.jobs (SETTLE_S for everything before stop 65)


def _queued(sock) -> int:
    """Bytes of the next datagram waiting in the socket's queue (SIOCINQ: 0 when none waits)."""
    buf = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, buf)
    return buf[0]


class LiveAgent:
    """The agent's phase path (receiver + job table) on a private socket, in this process."""

    def __init__(self, sockdir: str, record_intervals: int = 0, **cfg):
        """``record_intervals``: keep that many raw intervals, (train_job, phase or "step", start, end), in
        ``self.src.table.recorded`` (as `teye profile` does for its timeline)."""
        self.path = os.path.join(sockdir, "phases.sock")
        self.src = PhaseSource(phases_cfg(**cfg), AgentContext(), socket_path=self.path,
                               record_intervals=record_intervals)
        self._handled: dict = {}
        self._watch(self.src.receiver)

    def jobs(self, settle_s: Optional[float] = None):
        """The job views once all the clients sent is in: nothing new has arrived for SETTLE_S, or for QUIET_S
        with nothing waiting in the socket's queue, no client connected and every datagram read handled by the
        receiver's thread (a process that ended had sent all it will).  ``settle_s``: only once nothing new has
        arrived for that long (a client still running, whose flush thread sends on a timer)."""
        last, quiet_since = None, time.monotonic()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            rx = self.src.receiver
            n = rx.received
            quiet = time.monotonic() - quiet_since
            if n != last:
                last, quiet_since = n, time.monotonic()
            elif settle_s is not None:
                if quiet >= settle_s:
                    break
            elif quiet >= SETTLE_S or (quiet >= QUIET_S and self._handled.get(rx) == n and not rx.connections
                                       and not _queued(rx.sock)):
                break
            time.sleep(0.02)
        return {j.train_job: j for j in self.src.collect(force=True).jobs}

    def _watch(self, rx) -> None:
        """Count what the receiver's thread handled: it calls on_activity after handling each round it read."""
        inner = rx.on_activity

        def activity():
            self._handled[rx] = rx.received   # (the round's datagrams are counted when read)
            if inner is not None:
                inner()

        rx.on_activity = activity

    def close(self):
        self.src.close()


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])
