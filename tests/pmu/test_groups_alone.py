"""Each hardware-counter group stands alone: a tree without the ``cpu`` PMU, without memory controllers or
without IIO stacks loses that group only, with its reason in `teye doctor`, and the others count as on the
whole tree (the oracle: the same doctor lines and the same bytes as the complete cascadelake tree)."""
import os
import shutil

import pytest

from agent.doctor import pmu_lines
from agent.errors import SourceUnavailable
from agent.pmu.perf import Counters
from agent.pmu.source import LiveReader, build_plan
from tests.pmu.conftest import tree

CPU, IMC0, IMC1, IIO0, IIO1 = 4, 14, 15, 30, 31      # perf types in the cascadelake tree
CYCLES, INSTR = 0x3c, 0xc0
CAS_READ, CAS_WRITE = 0x0304, 0x0c04
IIO_SKX = 3.814697266e-6 * 1024.0 ** 2               # bytes per count of the free-running IIO counters


def bw_in(port):
    return (0x20 + port) << 8 | 0xff


def without(copy_tree, *patterns):
    """A copy of the cascadelake tree without the PMUs whose names start with one of ``patterns``."""
    sysfs, procfs = copy_tree("cascadelake")
    dev = os.path.join(sysfs, "bus", "event_source", "devices")
    for name in os.listdir(dev):
        if name.startswith(patterns):
            shutil.rmtree(os.path.join(dev, name))
    return sysfs, procfs, dev


def lines(fake, sysfs, procfs):
    return pmu_lines(sysfs, procfs, reader=LiveReader(Counters(fake)))


@pytest.fixture
def whole(fake):
    return lines(fake, *tree("cascadelake"))


def script(fake):
    """Counts on every PMU of the tree: cpu 1 cycles and instructions, socket 0 DRAM, stack 0 PCIe."""
    fake.set(CPU, CYCLES, 1, 3000)
    fake.set(CPU, INSTR, 1, 1000)
    fake.set(IMC0, CAS_READ, 0, 1000)
    fake.set(IMC1, CAS_WRITE, 0, 10)
    fake.set(IIO0, bw_in(0), 0, 250)


def groups(reading):
    return dict(reading.groups)


def test_without_the_cpu_pmu_memory_and_pcie_still_count(fake, copy_tree, make_source, whole):
    sysfs, procfs, dev = without(copy_tree, "cpu")
    why = f"no hardware PMU: {dev} has no 'cpu' PMU (a virtual machine without a virtual PMU, or perf events " \
          f"not built into the kernel)"
    assert lines(fake, sysfs, procfs) == [f"pmu core cycles/instructions: not supported: {why}",
                                          f"pmu floating point: not supported: {why}", whole[2], whole[3]]
    src = make_source((sysfs, procfs))
    script(fake)
    r = src.collect()
    assert groups(r) == {"core": why, "fp": why, "memory": "ok", "pcie": "ok"}
    assert r.cycles == r.instructions == r.flops == ()
    assert dict(((s,), v) for s, v in r.memory_read)[("0",)] == 1000 * 64.0
    assert dict(((s,), v) for s, v in r.memory_written)[("0",)] == 10 * 64.0
    assert dict(((s, b), v) for s, b, v in r.pcie_written)[("0", "0000:00")] == 250 * IIO_SKX
    assert {t for t, _, _, _ in fake.fds.values()} == {IMC0, IMC1, IIO0, IIO1}   # nothing opened on cpu
    assert src.fds_wanted() == sum(len(g.events) for g in build_plan(*tree("cascadelake")).groups
                                   if g.group in ("memory", "pcie"))


def test_without_memory_controllers_core_fp_and_pcie_still_count(fake, copy_tree, make_source, whole):
    sysfs, procfs, dev = without(copy_tree, "uncore_imc")
    assert lines(fake, sysfs, procfs) == [
        whole[0], whole[1],
        f"pmu memory bandwidth: not supported: no memory-controller PMU under {dev} (uncore_imc_* on Intel servers "
        f"with the intel_uncore driver, amd_umc_* on AMD Zen 4 and later with Linux >= 6.8, amd_df on AMD Zen 2/Zen 3)",
        whole[3]]
    src = make_source((sysfs, procfs))
    script(fake)
    r = src.collect()
    assert groups(r)["memory"].startswith("no memory-controller PMU under ")
    assert [g for g, st in groups(r).items() if st == "ok"] == ["core", "fp", "pcie"]
    assert dict(r.cycles)["1"] == 3000 and dict(r.instructions)["1"] == 1000
    assert r.memory_read == r.memory_written == r.memory_transferred == ()
    assert dict(((s, b), v) for s, b, v in r.pcie_written)[("0", "0000:00")] == 250 * IIO_SKX


def test_without_iio_core_fp_and_memory_still_count(fake, copy_tree, make_source, whole):
    sysfs, procfs, dev = without(copy_tree, "uncore_iio")
    assert lines(fake, sysfs, procfs) == [
        whole[0], whole[1], whole[2],
        f"pmu PCIe bandwidth: not supported: no uncore_iio_free_running or uncore_iio PMU under {dev} (not an Intel "
        f"server CPU, or intel_uncore not loaded)"]
    src = make_source((sysfs, procfs))
    script(fake)
    r = src.collect()
    assert [g for g, st in groups(r).items() if st == "ok"] == ["core", "fp", "memory"]
    assert dict(r.cycles)["1"] == 3000
    assert dict(((s,), v) for s, v in r.memory_read)[("0",)] == 1000 * 64.0
    assert r.pcie_read == r.pcie_written == ()


def test_without_any_hardware_pmu_the_collector_is_down_with_the_reason(fake, copy_tree, make_source):
    sysfs, procfs, dev = without(copy_tree, "cpu", "uncore_")
    with pytest.raises(SourceUnavailable, match=r"^no hardware PMU: .* has no 'cpu' PMU"):
        make_source((sysfs, procfs)).collect()
    assert all(" not supported: no hardware PMU: " in line for line in lines(fake, sysfs, procfs))
