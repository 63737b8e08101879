"""Fixtures shared by the phase tests: a private socket directory and a socket standing in for the agent."""
from __future__ import annotations

import os
import shutil
import socket

import pytest

from tests.phases.helpers import shared_tmpdir


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
