import os
import shutil

import pytest

from agent.pmu.perf import Counters
from agent.pmu.source import LiveReader, PmuSource
from tests.conftest import DATA
from tests.pmu.fake_perf import FakeSyscalls

TREES = os.path.join(DATA, "pmu")


def tree(name):
    return os.path.join(TREES, name, "sys"), os.path.join(TREES, name, "proc")


class Clock:
    def __init__(self):
        self.ns = 1_000_000_000

    def __call__(self):
        return self.ns


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def fake():
    return FakeSyscalls()


@pytest.fixture
def copy_tree(tmp_path):
    """A writable copy of a fixture tree: (sysfs, procfs)."""
    def make(name):
        dst = tmp_path / name
        shutil.copytree(os.path.join(TREES, name), dst)
        return str(dst / "sys"), str(dst / "proc")
    return make


@pytest.fixture
def make_source(fake, clock):
    def make(name_or_roots, reprobe_seconds=60.0):
        sysfs, procfs = tree(name_or_roots) if isinstance(name_or_roots, str) else name_or_roots
        counters = Counters(fake)
        src = PmuSource(lambda: LiveReader(counters), sysfs=sysfs, procfs=procfs, reprobe_seconds=reprobe_seconds,
                        clock=clock)
        src.counters = counters
        return src
    return make
