"""Fixtures of the client tests: a private socket directory (shared with the phase tests) and a live
phase receiver on it."""
import pytest

from tests.client.helpers import LiveAgent
from tests.phases.conftest import listener, sockdir  # noqa: F401  (pytest fixtures)


@pytest.fixture
def agent(sockdir):  # noqa: F811 (sockdir: the fixture imported above)
    """The agent's phase path (receiver + job table) on the private socket, closed after the test."""
    a = LiveAgent(sockdir)
    yield a
    a.close()
