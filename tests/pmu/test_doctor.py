"""`teye doctor`: one line per counter group, supported or exactly why not."""
import errno
import os

from agent.doctor import pmu_lines
from agent.pmu.perf import Counters
from agent.pmu.source import LiveReader
from tests.pmu.conftest import tree


def test_all_groups_supported_on_cascadelake(fake):
    lines = pmu_lines(*tree("cascadelake"), reader=LiveReader(Counters(fake)))
    assert lines == [
        "pmu core cycles/instructions: supported: 4 group(s) on 4 CPU(s): cpu/cpu-cycles/, cpu/instructions/",
        "pmu floating point: supported: 8 group(s) on 4 CPU(s): cpu/fp_arith_inst_retired.128b_packed_double/, "
        "cpu/fp_arith_inst_retired.128b_packed_single/, cpu/fp_arith_inst_retired.256b_packed_double/, "
        "cpu/fp_arith_inst_retired.256b_packed_single/ and 4 more",
        "pmu memory bandwidth: supported: 4 group(s) on 2 CPU(s): uncore_imc_*/cas_count_read/, "
        "uncore_imc_*/cas_count_write/",
        "pmu PCIe bandwidth: supported: 8 group(s) on 2 CPU(s): uncore_iio_free_running_*/bw_in_port0/, "
        "uncore_iio_free_running_*/bw_in_port1/, uncore_iio_free_running_*/bw_in_port2/, "
        "uncore_iio_free_running_*/bw_in_port3/ and 4 more"]
    assert fake.fds == {}          # trial opens are closed


def test_zen3_says_which_groups_are_missing(fake):
    lines = pmu_lines(*tree("zen3"), reader=LiveReader(Counters(fake)))
    assert lines[1] == "pmu floating point: supported: 4 group(s) on 4 CPU(s): cpu/fp_ret_sse_avx_ops.all/"
    assert lines[2] == ("pmu memory bandwidth: supported: 4 group(s) on 2 CPU(s): "
                        "amd_df/dram_channel_data_controller_0/, amd_df/dram_channel_data_controller_1/, "
                        "amd_df/dram_channel_data_controller_2/, amd_df/dram_channel_data_controller_3/ and 4 more")
    assert lines[3].startswith("pmu PCIe bandwidth: not supported: no uncore_iio_free_running or uncore_iio PMU under ")


def test_paranoid_without_capability_and_unknown_model(fake, copy_tree):
    sysfs, procfs = copy_tree("cascadelake")

    os.makedirs(procfs + "/sys/kernel")
    with open(procfs + "/sys/kernel/perf_event_paranoid", "w") as fh:
        fh.write("2\n")
    with open(procfs + "/cpuinfo") as fh:
        text = fh.read().replace("model\t\t: 85", "model\t\t: 63")
    with open(procfs + "/cpuinfo", "w") as fh:
        fh.write(text)
    fake.open_errors[(4, None, None)] = errno.EACCES          # the cpu PMU; uncore PMUs still open
    lines = pmu_lines(sysfs, procfs, reader=LiveReader(Counters(fake)))
    assert lines[0] == ("pmu core cycles/instructions: not supported: not permitted: kernel.perf_event_paranoid=2 "
                        "and teye has neither CAP_PERFMON nor CAP_SYS_ADMIN (grant CAP_PERFMON, or set "
                        "kernel.perf_event_paranoid=0 as the fallback)")
    assert lines[1] == ("pmu floating point: not supported: CPU model not in teye's floating-point event table: "
                        "GenuineIntel family 0x6 model 0x3f (Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz)")
    assert lines[2].startswith("pmu memory bandwidth: supported")


def test_virtual_machine_says_so_on_every_line():
    lines = pmu_lines(*tree("vm"))
    assert len(lines) == 4
    for line in lines:
        assert "not supported: no hardware PMU:" in line and "this is a virtual machine" in line


def test_programmed_iio_pcie_line_and_its_open_error(fake):
    lines = pmu_lines(*tree("cascadelake_programmed_iio"), reader=LiveReader(Counters(fake)))
    assert lines[3] == ("pmu PCIe bandwidth: supported: 16 group(s) on 2 CPU(s): "
                        "uncore_iio_*/unc_iio_data_req_of_cpu.mem_read.part0/, "
                        "uncore_iio_*/unc_iio_data_req_of_cpu.mem_read.part1/, "
                        "uncore_iio_*/unc_iio_data_req_of_cpu.mem_read.part2/, "
                        "uncore_iio_*/unc_iio_data_req_of_cpu.mem_read.part3/ and 4 more")
    fake.open_errors[(20, None, None)] = errno.ENOENT     # a kernel whose uncore_iio_0 rejects the encoding
    lines = pmu_lines(*tree("cascadelake_programmed_iio"), reader=LiveReader(Counters(fake)))
    assert lines[3].startswith("pmu PCIe bandwidth: not supported: [Errno 2] perf_event_open(uncore_iio_0/"
                               "unc_iio_data_req_of_cpu.mem_read.part0,unc_iio_data_req_of_cpu.mem_write.part0/ on cpu 0)")
    assert "ENOENT" in lines[3] and fake.fds == {}
