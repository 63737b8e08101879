"""The pmu source on the scripted syscall fake: exact bytes, operations, scaling, totals and errors."""
import errno
import os
import logging

import pytest

from agent.errors import SourceUnavailable
from agent.metrics import point
from agent.pmu import source as src_mod

CPU, IMC0, IMC1, IIO0, IIO1 = 4, 14, 15, 30, 31      # perf types in the cascadelake tree
CYCLES, INSTR = 0x3c, 0xc0
CAS_READ, CAS_WRITE = 0x0304, 0x0c04
MIB = 1024.0 ** 2
IIO_SKX = 3.814697266e-6 * MIB    # bytes per count of SKX free-running IIO bandwidth (kernel's scale x unit)


def fp(umask):
    return umask << 8 | 0xc7


def bw_in(port):
    return (0x20 + port) << 8 | 0xff


def bw_out(port):
    return (0x24 + port) << 8 | 0xff


def rows(reading, name):
    return {r[:-1]: r[-1] for r in getattr(reading, name)}


def test_bytes_are_count_times_scale_summed_per_socket(fake, make_source):
    s = make_source("cascadelake")
    fake.set(IMC0, CAS_READ, 0, 1000)
    fake.set(IMC1, CAS_READ, 0, 500)
    fake.set(IMC0, CAS_WRITE, 0, 7)
    fake.set(IMC0, CAS_READ, 2, 3)
    fake.set(IIO0, bw_in(0), 0, 1000)
    fake.set(IIO0, bw_in(3), 0, 24)
    fake.set(IIO1, bw_out(1), 2, 250)
    r = s.collect()
    assert rows(r, "memory_read") == {("0",): 1500 * 64.0, ("1",): 3 * 64.0}
    assert rows(r, "memory_written") == {("0",): 7 * 64.0, ("1",): 0.0}
    assert rows(r, "pcie_written")[("0", "0000:00")] == 1000 * IIO_SKX + 24 * IIO_SKX
    assert rows(r, "pcie_read")[("1", "0000:85")] == 250 * IIO_SKX   # stack 1, die 1 -> root bus 0000:85
    assert set(rows(r, "pcie_read")) == {("0", "0000:00"), ("1", "0000:80"), ("0", "0000:17"), ("1", "0000:85")}


def test_flop_weights_per_width_and_precision(fake, make_source):
    s = make_source("cascadelake")
    lanes = {0x01: 1, 0x02: 1, 0x04: 2, 0x08: 4, 0x10: 4, 0x20: 8, 0x40: 8, 0x80: 16}
    for umask in lanes:
        fake.set(CPU, fp(umask), 1, 100 + umask)
    got = rows(s.collect(), "flops")
    names = {0x01: ("double", "scalar"), 0x02: ("single", "scalar"), 0x04: ("double", "128"),
             0x08: ("single", "128"), 0x10: ("double", "256"), 0x20: ("single", "256"),
             0x40: ("double", "512"), 0x80: ("single", "512")}
    for umask, n in lanes.items():
        assert got[("1",) + names[umask]] == (100 + umask) * n
    assert got[("0", "double", "256")] == 0.0


def test_amd_flops_are_all_precisions_and_widths(fake, make_source):
    s = make_source("zen3")
    fake.set(CPU, 0xff03, 3, 12345)
    r = s.collect()
    assert rows(r, "flops")[("3", "all", "all")] == 12345.0


def df_dram(channel):
    """dram_channel_data_controller_<channel>: event 0x07 + 0x40 x channel (bits 0-7 in config[7:0], bits 8-11
    in config[35:32] by the amd_df format), umask 0x38."""
    ev = 0x07 + 0x40 * channel
    return (ev & 0xff) | 0x38 << 8 | (ev >> 8) << 32


def test_amd_zen3_memory_from_data_fabric_read_and_written_together(fake, make_source):
    s = make_source("zen3")
    df = 11
    fake.set(df, df_dram(0), 0, 1000)
    fake.set(df, df_dram(7), 0, 24)                                               # 0x1c7: high bits in config[35:32]
    # socket 1: the group of channels 4-7 (leader: channel 4) rotated with 0-3, counted half the time
    fake.set(df, df_dram(4), 2, 0, enabled=2_000_000_000, running=1_000_000_000)
    fake.set(df, df_dram(5), 2, 10, enabled=2_000_000_000, running=1_000_000_000)
    r = s.collect()
    assert rows(r, "memory_transferred") == {("0",): (1000 + 24) * 64.0, ("1",): 10 * 2 * 64.0}
    assert r.memory_read == () and r.memory_written == ()      # no split invented
    assert dict(r.groups)["memory"] == "ok"
    mem = [g for g in s.plan.groups if g.group == "memory"]
    assert [len(g.events) for g in mem] == [4, 4, 4, 4] and {g.cpu for g in mem} == {0, 2}
    assert {p.spec.name for p in r.points()} >= {"teye_memory_transferred_bytes_total"}
    assert "teye_memory_read_bytes_total" not in {p.spec.name for p in r.points()}


def test_amd_data_fabric_only_for_zen2_and_zen3(copy_tree, make_source, fake):
    sysfs, procfs = copy_tree("zen3")
    with open(procfs + "/cpuinfo") as fh:
        text = fh.read()
    with open(procfs + "/cpuinfo", "w") as fh:
        fh.write(text.replace("model\t\t: 1\n", "model\t\t: 17\n"))    # Zen 4 numbering: other DF events
    r = make_source((sysfs, procfs)).collect()
    assert r.memory_transferred == () and dict(r.groups)["memory"].startswith("no memory-controller PMU under ")
    assert all(a[0] != 11 for a in fake.attrs)


def test_amd_zen4_memory_from_umc_cas_commands(fake, make_source):
    s = make_source("zen4")
    umc0, umc1 = 13, 14
    fake.set(umc0, 0x0a | 0x1 << 8, 0, 1000)      # umc_cas_cmd.rd: event 0x0a, rdwrmask 1
    fake.set(umc1, 0x0a | 0x1 << 8, 0, 24)
    fake.set(umc0, 0x0a | 0x2 << 8, 2, 5)         # umc_cas_cmd.wr on socket 1
    r = s.collect()
    assert rows(r, "memory_read") == {("0",): 1024 * 64.0, ("1",): 0.0}
    assert rows(r, "memory_written") == {("0",): 0.0, ("1",): 5 * 64.0}
    assert dict(r.groups)["memory"] == "ok" and dict(r.groups)["pcie"].startswith("no uncore_iio_free_running")


def test_multiplexed_counts_are_scaled_like_perf_and_running_ratio_exported(fake, make_source, clock):
    s = make_source("cascadelake")
    fake.set(CPU, CYCLES, 0, 1000, enabled=2_000_000_000, running=1_000_000_000)
    fake.set(CPU, fp(0x01), 0, 300, enabled=4_000_000_000, running=1_000_000_000)
    r = s.collect()
    assert rows(r, "cycles")[("0",)] == 2000.0
    assert rows(r, "flops")[("0", "double", "scalar")] == 1200.0
    # second poll: +1 s enabled, +0.5 s running for the core group on cpu 0
    fake.set(CPU, CYCLES, 0, 1600, enabled=3_000_000_000, running=1_500_000_000)
    r = s.collect()
    assert rows(r, "cycles")[("0",)] == 1600 * 3 / 1.5
    ratio = dict(r.running)["cpu"]
    # the cpu PMU's groups over the last poll: core cpu0 ran 0.5 of 1 s; the other core/fp groups
    # (all at enabled == running == 1 s, unchanged: delta 0 enabled) add nothing.
    assert ratio == pytest.approx(0.5)
    assert dict(r.running)["uncore_imc_0"] == 1.0   # no time passed there: the ratio since the open


def test_totals_never_go_backwards_across_a_counter_that_stops_and_comes_back(fake, make_source, copy_tree, clock):
    sysfs, procfs = copy_tree("cascadelake")
    s = make_source((sysfs, procfs), reprobe_seconds=1.0)
    online = sysfs + "/devices/system/cpu/online"
    fake.set(CPU, INSTR, 1, 5000)
    assert rows(s.collect(), "instructions")[("1",)] == 5000
    with open(online, "w") as fh:
        fh.write("0,2-3\n")
    r = s.collect()
    assert ("1",) not in rows(r, "instructions") and ("0",) in rows(r, "instructions")  # absent, others unchanged
    assert not any(fd_cpu == 1 for (_, _, fd_cpu, _) in fake.fds.values())            # its fds are closed
    with open(online, "w") as fh:
        fh.write("0-3\n")
    fake.set(CPU, INSTR, 1, 800)     # a fresh counter counts from zero again
    assert rows(s.collect(), "instructions")[("1",)] == 5800
    fake.set(CPU, INSTR, 1, 900)
    assert rows(s.collect(), "instructions")[("1",)] == 5900


@pytest.mark.parametrize("err", [errno.EACCES, errno.ENOENT, errno.EMFILE, errno.ENODEV])
def test_open_error_leaves_only_that_group_absent_with_one_log_line(fake, make_source, caplog, err):
    fake.open_errors[(CPU, fp(0x01), 1)] = err      # the double-precision FP group on cpu 1
    s = make_source("cascadelake")
    fake.set(CPU, fp(0x02), 1, 10)
    fake.set(CPU, CYCLES, 1, 99)
    with caplog.at_level(logging.WARNING, logger="teye.pmu"):
        r = s.collect()
        r2 = s.collect()
    flops = rows(r, "flops")
    assert not any(k[0] == "1" and k[1] == "double" for k in flops)
    assert flops[("1", "single", "scalar")] == 10 and ("0", "double", "scalar") in flops
    assert rows(r, "cycles")[("1",)] == 99 and len(r.memory_read) == 2 and len(r.pcie_written) == 4
    assert r2 == r
    lines = [m for m in caplog.messages if "fp_arith_inst_retired.scalar_double" in m]
    assert len(lines) == 1 and lines[0].startswith("pmu cpu event fp_arith_inst_retired.scalar_double,")
    assert " on cpu 1 not counted: " in lines[0]
    assert errno.errorcode[err] in lines[0]


def test_read_error_and_never_running_counter_are_absent(fake, make_source, caplog):
    s = make_source("cascadelake")
    fake.set(IMC1, CAS_READ, 2, 10)
    fake.set(IMC0, CAS_READ, 2, 0, enabled=1_000_000_000, running=0)    # scheduled out the whole time
    fake.read_errors[(IIO1, None, 0)] = errno.ENODEV
    with caplog.at_level(logging.WARNING, logger="teye.pmu"):
        r = s.collect()
    # socket 1 keeps the controller that counts; the never-running one adds nothing (not zero-scaled, not NaN)
    assert rows(r, "memory_read")[("1",)] == 640.0
    assert ("0", "0000:17") not in rows(r, "pcie_written") and ("0", "0000:00") in rows(r, "pcie_written")
    assert any("uncore_imc_0 event cas_count_read,cas_count_write on cpu 2 has not run yet" in m for m in caplog.messages)
    assert any("uncore_iio_free_running_1 event bw_in_port0,bw_in_port1,bw_in_port2,bw_in_port3 on cpu 0 not counted" in m for m in caplog.messages)


def test_unparseable_description_and_unknown_format_field(copy_tree, make_source, fake, caplog):
    sysfs, procfs = copy_tree("cascadelake")
    dev = sysfs + "/bus/event_source/devices/"
    with open(dev + "uncore_imc_1/events/cas_count_write", "w") as fh:
        fh.write("event=0x04,umask=0x0c=\n")
    with open(dev + "cpu/events/cpu-cycles", "w") as fh:
        fh.write("event=0x3c,bogus=1\n")
    with caplog.at_level(logging.WARNING, logger="teye.pmu"):
        r = make_source((sysfs, procfs)).collect()
    groups = dict(r.groups)
    assert "unknown format field 'bogus' for PMU cpu" in groups["core"] and r.cycles == ()
    assert any("uncore_imc_1/cas_count_write/" in m for m in caplog.messages)
    # the controller with the bad description is not counted; the other one is
    assert groups["memory"] == "ok" and len(r.memory_read) == 2 and groups["fp"] == "ok"
    assert all(a[0] != IMC1 for a in fake.attrs)


def test_fds_are_bounded_by_the_plan_and_closed_on_shutdown(fake, make_source):
    s = make_source("cascadelake")
    wanted = s.fds_wanted()             # before anything is open: what the HTTP server keeps aside
    assert fake.fds == {}
    s.collect()
    assert wanted == len(fake.fds) and s.fds_wanted() == wanted
    planned = sum(len(g.events) for g in s.plan.groups)
    # per CPU: 2 core + 8 fp; per socket: 2 per memory controller (2) + 8 ports per IIO stack (2)
    assert planned == 4 * (2 + 8) + 2 * (2 * 2 + 2 * 8)
    assert len(fake.fds) == planned == s.counters.open_fds
    s.collect()
    assert len(fake.fds) == planned
    s.close()
    assert fake.fds == {} and s.counters.open_fds == 0 and len(fake.closed) == planned


def test_permission_denied_everywhere_is_collector_down_with_the_reason(fake, make_source, clock):
    fake.open_errors[(None, None, 0)] = fake.open_errors[(None, None, 1)] = errno.EACCES
    fake.open_errors[(None, None, 2)] = fake.open_errors[(None, None, 3)] = errno.EACCES
    s = make_source("cascadelake")
    with pytest.raises(SourceUnavailable, match="perf_event_paranoid forbids system-wide counting without "
                                                "CAP_PERFMON"):
        s.collect()
    assert fake.fds == {}
    fake.open_errors.clear()
    with pytest.raises(SourceUnavailable):      # not retried before pmu.reprobe_seconds
        s.collect()
    clock.ns += 61_000_000_000
    fake.set(CPU, CYCLES, 0, 1)
    assert rows(s.collect(), "cycles")[("0",)] == 1


def test_points_carry_the_contract_names(fake, make_source):
    s = make_source("cascadelake")
    fake.set(CPU, CYCLES, 0, 10)
    names = {p.spec.name for p in s.collect().points()}
    assert names == {"teye_cpu_cycles_total", "teye_cpu_instructions_total",
                     "teye_cpu_floating_point_operations_total", "teye_memory_read_bytes_total",
                     "teye_memory_written_bytes_total", "teye_pcie_read_bytes_total",
                     "teye_pcie_written_bytes_total", "teye_pmu_counter_running_ratio", "teye_gpu_pcie_root_bus_info"}
    assert point(src_mod.PCIE_READ, 1.0, "0", "0000:00").labels == ("0", "0000:00")


def iio_req(umask, part):
    """UNC_IIO_DATA_REQ_OF_CPU.MEM_{READ (umask 4), WRITE (umask 1)}.PART<part>, hand-placed by the SKX
    IIO format (ch_mask config:36-43, fc_mask config:44-46)."""
    return 0x83 | umask << 8 | (1 << part) << 36 | 0x7 << 44


def test_programmed_iio_events_where_no_free_running_counters_exist(fake, make_source):
    s = make_source("cascadelake_programmed_iio")
    iio0, iio1 = 20, 21
    fake.set(iio0, iio_req(0x04, 0), 0, 1000)      # stack 0 socket 0, part 0: cards read host memory
    fake.set(iio0, iio_req(0x04, 3), 0, 24)
    fake.set(iio0, iio_req(0x01, 1), 0, 7)         # ... and wrote it
    # stack 1 socket 1, part 2, multiplexed with the other three part groups: counted 1/4 of the time
    fake.set(iio1, iio_req(0x04, 2), 2, 250, enabled=4_000_000_000, running=1_000_000_000)
    r = s.collect()
    assert rows(r, "pcie_read") == {("0", "0000:00"): (1000 + 24) * 4.0, ("1", "0000:80"): 0.0,
                                    ("0", "0000:17"): 0.0, ("1", "0000:85"): 250 * 4 * 4.0}
    assert rows(r, "pcie_written") == {("0", "0000:00"): 7 * 4.0, ("1", "0000:80"): 0.0,
                                       ("0", "0000:17"): 0.0, ("1", "0000:85"): 0.0}
    assert dict(r.groups)["pcie"] == "ok"
    # one group per part (read, written: event 0x83 runs on counters 0-1 only), per stack and socket
    pcie = [g for g in s.plan.groups if g.group == "pcie"]
    assert len(pcie) == 2 * 2 * 4 and all(len(g.events) == 2 for g in pcie)
    assert {(g.pmu, g.cpu) for g in pcie} == {("uncore_iio_0", 0), ("uncore_iio_0", 2), ("uncore_iio_1", 0),
                                              ("uncore_iio_1", 2)}


def test_programmed_iio_needs_the_cpu_model_in_the_table(copy_tree, make_source, fake):
    sysfs, procfs = copy_tree("cascadelake_programmed_iio")
    with open(procfs + "/cpuinfo") as fh:
        text = fh.read()
    with open(procfs + "/cpuinfo", "w") as fh:
        fh.write(text.replace("model\t\t: 85", "model\t\t: 79"))    # Broadwell-EP: not in the IIO table
    r = make_source((sysfs, procfs)).collect()
    assert r.pcie_read == () and r.pcie_written == ()
    assert dict(r.groups)["pcie"] == ("uncore_iio_* has no free-running bandwidth counters here and CPU model "
                                      "not in teye's IIO event table: GenuineIntel family 0x6 model 0x4f "
                                      "(Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz)")
    assert all(a[0] not in (20, 21) for a in fake.attrs)


def test_uncore_groups_follow_the_cpumask_when_their_cpu_goes_offline(fake, make_source, copy_tree, caplog):
    sysfs, procfs = copy_tree("cascadelake")
    s = make_source((sysfs, procfs))
    dev = sysfs + "/bus/event_source/devices/"
    uncore = [p for p in os.listdir(dev) if p.startswith("uncore_")]

    def hotplug(online, cpumask):
        with open(sysfs + "/devices/system/cpu/online", "w") as fh:
            fh.write(online + "\n")
        for p in uncore:     # the kernel moves every uncore PMU of the socket and updates its cpumask
            with open(dev + p + "/cpumask", "w") as fh:
                fh.write(cpumask + "\n")

    fake.set(IMC0, CAS_READ, 2, 100)
    fake.set(IIO1, bw_out(0), 2, 10)
    assert rows(s.collect(), "memory_read")[("1",)] == 100 * 64.0
    fake.set(IMC0, CAS_READ, 2, 150)     # counted on cpu 2 (then by the migrated event) since the last poll
    fake.set(IMC0, CAS_READ, 3, 30)      # the reopened counter on cpu 3, from zero
    fake.set(IIO1, bw_out(0), 3, 5)
    hotplug("0-1,3", "0,3")
    with caplog.at_level(logging.WARNING, logger="teye.pmu"):
        r = s.collect()
    assert rows(r, "memory_read") == {("0",): 0.0, ("1",): (150 + 30) * 64.0}
    assert rows(r, "pcie_read")[("1", "0000:85")] == (10 + 5) * IIO_SKX      # same socket, same root bus
    assert dict(r.groups)["memory"] == "ok" and dict(r.groups)["pcie"] == "ok"
    fds_cpus = {cpu for (typ, _, cpu, _) in fake.fds.values() if typ in (IMC0, IMC1, IIO0, IIO1)}
    assert fds_cpus == {0, 3}
    moved = [m for m in caplog.messages if "went offline, the kernel moved the socket's counters" in m]
    assert sorted(moved) == sorted(f"pmu {p}: cpu 2 went offline, the kernel moved the socket's counters to cpu 3 "
                                   f"(cpumask): reopened there" for p in ("uncore_imc_0", "uncore_imc_1", "uncore_iio_free_running_0",
                                                          "uncore_iio_free_running_1"))   # one line per PMU counted
    # cpu 2 back: the kernel leaves the events on cpu 3, so does teye; totals keep growing
    hotplug("0-3", "0,3")
    fake.set(IMC0, CAS_READ, 3, 40)
    assert rows(s.collect(), "memory_read")[("1",)] == (150 + 40) * 64.0
    # the whole socket offline: cpumask names no CPU of it, the socket's series are absent until one is back
    hotplug("0-1", "0")
    r = s.collect()
    assert set(rows(r, "memory_read")) == {("0",)} and ("1", "0000:85") not in rows(r, "pcie_read")
    hotplug("0-2", "0,2")
    fake.set(IMC0, CAS_READ, 2, 7)
    assert rows(s.collect(), "memory_read")[("1",)] == (150 + 40 + 7) * 64.0


def test_a_machine_without_counters_wants_no_descriptors(make_source):
    assert make_source("vm").fds_wanted() == 0
