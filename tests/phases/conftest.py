"""Fixtures shared by the phase tests: a private socket directory and a socket standing in for the agent."""
from __future__ import annotations

import os
import shutil
import socket

import pytest

from tests.phases.helpers import require_fast, shared_tmpdir


@pytest.fixture
def sockdir():
    d = shared_tmpdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def listener(sockdir):
    """A plain datagram socket standing in for the agent: (path, socket) with a 2 s receive timeout."""
    path = os.path.join(sockdir, "agent.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(2.0)
    yield path, s
    s.close()


@pytest.fixture(params=["compiled", "python"])
def phase_path(request, monkeypatch):
    """Runs a test on the compiled helpers (agent/phases/_fast.c) and again on the Python code alone."""
    from agent.phases import fast, jobs, protocol
    if request.param == "python":
        monkeypatch.setattr(protocol, "_fast_decode", None)
        monkeypatch.setattr(jobs, "_fast_apply", None)
        monkeypatch.setattr(jobs, "_fast_handle", None)
        monkeypatch.setattr(jobs, "_fast_serve", None)
        monkeypatch.setattr(fast, "module", None)  # receivers created from now on call recvmsg themselves
    else:
        require_fast()
    return request.param
