"""One wheelhouse per test session, shared by the wheelhouse and image tests."""
from __future__ import annotations

import pytest

from tests.dist import wheelhouse as wh


@pytest.fixture(scope="session")
def house(tmp_path_factory):
    return wh.build(tmp_path_factory.mktemp("dist"))
