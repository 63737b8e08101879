"""Real counters on a real PMU (marked ``pmu``; skipped with the reason elsewhere).

Oracles: bytes a numpy copy must move, 2 n^3 operations of a float64 matrix multiply,
a CPI that any busy CPU shows.
"""
import os

import pytest

from agent.errors import SourceUnavailable
from agent.pmu.source import LiveReader, PmuSource

pytestmark = pytest.mark.pmu
np = pytest.importorskip("numpy")


@pytest.fixture(scope="module")
def source():
    if not os.path.isdir("/sys/bus/event_source/devices/cpu"):
        pytest.skip("no hardware PMU here (no /sys/bus/event_source/devices/cpu: a virtual machine?)")
    s = PmuSource(LiveReader, "/sys", "/proc")
    try:
        s.collect()
    except SourceUnavailable as e:
        pytest.skip(f"perf events not usable here: {e}")
    yield s
    s.close()


def _delta(source, fn):
    before = source.collect()
    fn()
    after = source.collect()
    return before, after


def _sum(reading, name, **match):
    rows = getattr(reading, name)
    return sum(r[-1] for r in rows if all(r[i] == v for i, v in match.items()))


def test_numpy_copy_moves_at_least_its_bytes(source):
    if not dict(source.collect().groups).get("memory") == "ok":
        pytest.skip("memory bandwidth counters not available here")
    a = np.ones(256 * 1024 * 1024 // 8)          # 256 MiB, far beyond any cache
    b = np.empty_like(a)
    n = 8
    before, after = _delta(source, lambda: [np.copyto(b, a) for _ in range(n)])
    moved = (_sum(after, "memory_read") - _sum(before, "memory_read")
             + _sum(after, "memory_written") - _sum(before, "memory_written")
             + _sum(after, "memory_transferred") - _sum(before, "memory_transferred"))   # AMD Zen 2/3: unsplit
    assert moved >= 2 * n * a.nbytes


def test_float64_matmul_counts_2n3_double_operations_within_10_percent(source):
    if not dict(source.collect().groups).get("fp") == "ok" or any(
            r[1] == "all" for r in source.collect().flops):
        pytest.skip("no per-precision floating-point counters here")
    n = 2048
    x, y = np.random.rand(n, n), np.random.rand(n, n)
    before, after = _delta(source, lambda: x @ y)
    ops = _sum(after, "flops", **{1: "double"}) - _sum(before, "flops", **{1: "double"})
    assert ops == pytest.approx(2 * n ** 3, rel=0.10)


def test_cpi_is_between_0_1_and_20(source):
    before, after = _delta(source, lambda: sum(i * i for i in range(3_000_000)))
    cycles = _sum(after, "cycles") - _sum(before, "cycles")
    instr = _sum(after, "instructions") - _sum(before, "instructions")
    assert instr > 0 and 0.1 <= cycles / instr <= 20
