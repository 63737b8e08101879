"""Event resolution from the kernel's PMU descriptions, checked against hand-encoded configs."""
import pytest

from agent.pmu import events, sysfs
from agent.pmu.source import build_plan
from agent.errors import SourceUnavailable
from tests.pmu.conftest import tree


def test_format_ranges_single_bit_and_config1():
    assert sysfs.parse_format("config:0-7") == sysfs.Format("config", ((0, 7),))
    assert sysfs.parse_format("config:21") == sysfs.Format("config", ((21, 21),))
    assert sysfs.parse_format("config1:0-63").field == "config1"
    assert sysfs.parse_format("config:0-7,32-35").width == 12
    for bad in ("config:7-0", "conf:0-7", "config:0-64", "config:", "config:a-b"):
        with pytest.raises(sysfs.PmuFormatError):
            sysfs.parse_format(bad, "format/x")


def test_multi_range_field_spreads_the_value_low_bits_first():
    s, _ = tree("zen3")
    cpu = sysfs.load_pmu(s, "cpu")
    # AMD's 12-bit event select: bits 0-7 in config[7:0], bits 8-11 in config[35:32].
    assert cpu.encode([("event", 0x1c3), ("umask", 0x02)]) == (0xc3 | 0x02 << 8 | 0x1 << 32, 0, 0)
    with pytest.raises(sysfs.PmuFormatError, match="does not fit in 12 bits"):
        cpu.encode([("event", 0x1000)])


def test_config1_terms_and_flag_terms():
    s, _ = tree("cascadelake")
    cpu = sysfs.load_pmu(s, "cpu")
    assert cpu.type == 4 and cpu.cpumask is None
    assert cpu.encode(sysfs.parse_terms("event=0xcd,umask=0x1,ldlat=3,edge,any")) == (
        0xcd | 0x1 << 8 | 1 << 18 | 1 << 21, 3, 0)
    imc = sysfs.load_pmu(s, "uncore_imc_0")
    assert imc.cpumask == (0, 2)
    a = imc.alias("cas_count_read")
    assert a.terms == (("event", 4), ("umask", 3)) and a.scale == 6.103515625e-5 and a.unit == "MiB"
    assert sysfs.bytes_per_count(a, "x") == 64.0


def test_unknown_format_field_and_unparseable_description_are_named():
    s, _ = tree("cascadelake")
    cpu = sysfs.load_pmu(s, "cpu")
    with pytest.raises(sysfs.PmuFormatError, match="unknown format field 'bogus' for PMU cpu"):
        cpu.encode([("event", 1), ("bogus", 1)])
    with pytest.raises(sysfs.PmuFormatError, match="not a number"):
        sysfs.parse_terms("event=0x04,umask=?", "events/x")
    with pytest.raises(sysfs.PmuFormatError, match="empty"):
        sysfs.parse_terms("  ", "events/x")


def test_iio_die_files_name_the_root_bus_per_socket():
    s, _ = tree("icelake")
    assert sysfs.root_buses(s + "/bus/event_source/devices/uncore_iio_1") == {0: "0000:16", 1: "0000:97"}


def test_plans_per_machine():
    s, p = tree("cascadelake")
    plan = build_plan(s, p)
    assert plan.problems == {}
    assert str(plan.cpu_model).startswith("GenuineIntel family 0x6 model 0x55")
    kinds = {(g.group, g.pmu, g.cpu) for g in plan.groups}
    assert ("memory", "uncore_imc_1", 2) in kinds and ("memory", "uncore_imc_1", 1) not in kinds  # cpumask only
    fp = [g for g in plan.groups if g.group == "fp" and g.cpu == 0]
    assert sorted(len(g.events) for g in fp) == [4, 4]   # fits 4 general counters with HT on
    configs = {e.event: e.config[0] for g in fp for e in g.events}
    assert configs["fp_arith_inst_retired.scalar_double"] == 0x01c7
    assert configs["fp_arith_inst_retired.512b_packed_single"] == 0x80c7
    s, p = tree("icelake")
    mem = [g for g in build_plan(s, p).groups if g.group == "memory"]
    assert {g.pmu for g in mem} == {"uncore_imc_free_running_0", "uncore_imc_free_running_1"}  # preferred over CAS
    assert {(e.event, e.config[0], e.factor) for g in mem for e in g.events} == {("read", 0x20ff, 64.0),
                                                                               ("write", 0x21ff, 64.0)}
    s, p = tree("zen3")
    plan = build_plan(s, p)
    assert set(plan.problems) == {"pcie"}
    df = {e.event: (e.config[0], e.kind, e.factor) for g in plan.groups if g.pmu == "amd_df" for e in g.events}
    assert df["dram_channel_data_controller_0"] == (0x3807, "mem_transferred", 64.0)
    assert df["dram_channel_data_controller_7"] == (0x1 << 32 | 0x38c7, "mem_transferred", 64.0)   # event 0x1c7
    assert {(e.event, e.config[0], e.labels) for g in plan.groups if g.group == "fp" for e in g.events} == {
        ("fp_ret_sse_avx_ops.all", 0xff03, ("all", "all"))}


def test_vm_without_cpu_pmu_is_unavailable_with_the_reason():
    s, p = tree("vm")
    with pytest.raises(SourceUnavailable, match="no hardware PMU: .* has no 'cpu' PMU"):
        build_plan(s, p)


def test_cpu_not_in_table_says_which():
    fe, why = events.fp_events(events.CpuModel("GenuineIntel", 6, 0x3f, "Haswell-EP"))
    assert fe == () and why == ("CPU model not in teye's floating-point event table: GenuineIntel family 0x6 "
                                "model 0x3f (Haswell-EP)")


def test_gpus_are_matched_to_the_root_bus_of_their_iio_stack():
    s, p = tree("cascadelake")
    # NVML's address form (8-digit domain, upper case) -> die-file form; the Mellanox NIC is not a GPU
    assert sysfs.gpu_root_buses(s) == {"00000000:18:00.0": "0000:17", "00000000:86:00.0": "0000:85"}
    assert build_plan(s, p).gpu_root_buses == (("00000000:18:00.0", "0000:17"), ("00000000:86:00.0", "0000:85"))
    # 0000:17 is die 0 of IIO stack 1: the PCIe counters of that stack carry the same root_bus
    assert sysfs.root_buses(s + "/bus/event_source/devices/uncore_iio_1")[0] == "0000:17"


def test_free_running_imc_without_read_falls_back_to_cas_and_hybrid_is_named(copy_tree):
    import os
    import shutil
    sysfs, procfs = copy_tree("icelake")
    dev = os.path.join(sysfs, "bus", "event_source", "devices")
    for i in (0, 1):
        for f in ("read", "read.scale", "read.unit"):
            os.unlink(os.path.join(dev, f"uncore_imc_free_running_{i}", "events", f))
    mem = [g for g in build_plan(sysfs, procfs).groups if g.group == "memory"]
    assert {(g.pmu, e.event, e.config[0]) for g in mem for e in g.events} == {
        (f"uncore_imc_{i}", ev, cfg) for i in (0, 1) for ev, cfg in (("cas_count_read", 0x0f04),
                                                                   ("cas_count_write", 0x3004))}
    shutil.move(os.path.join(dev, "cpu"), os.path.join(dev, "cpu_core"))
    plan = build_plan(sysfs, procfs)     # the core groups are named absent; the uncore ones still count
    assert plan.problems["core"] == plan.problems["fp"] and plan.problems["core"].startswith("hybrid CPU")
    assert {g.group for g in plan.groups} == {"memory", "pcie"}
