"""Real counters on a real PMU (marked ``pmu``).

Skipped only where the machine truly has no PMU this process may use, checked directly and apart
from the code under test: no ``cpu`` PMU under sysfs (a virtual machine without a virtual PMU, or a
hybrid CPU teye does not count yet), or the kernel refusing a system-wide ``perf_event_open`` of
cycles (perf_event_paranoid without CAP_PERFMON, or a seccomp filter).  Anywhere else the source must
collect, its core group must be ok, and the memory and floating-point groups must be ok wherever the
machine has a memory-controller PMU and teye's event table covers the CPU: a detection bug is a
failure, never a skip.

Oracles, bounded from both sides: bytes a numpy copy must move (its reads and writes, at most those
plus the write-allocate reads and a margin for the rest of the machine), 2 n^3 operations of a
float64 matrix multiply, cycles between what the loop's own CPU time needs at a low clock and what
every CPU could spend in the wall time, and a CPI in the range ``perf stat`` shows for an interpreter
loop.  The skip decision itself is tested everywhere with fake sysfs trees and a fake open.
"""
from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import time
from typing import Callable, Optional

import pytest

from agent.pmu.events import fp_events, read_cpuinfo
from agent.pmu.source import LiveReader, PmuSource

PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241, "ppc64le": 319, "s390x": 331}
CAP_SYS_ADMIN, CAP_PERFMON = 21, 38


# -- whether this machine has a PMU we may use: checked directly ---------------------------------
def open_system_wide_cycles(event_type: int = 0) -> int:
    """perf_event_open(cycles, pid=-1, cpu=0) by hand: 0 when it opened (closed again), else the errno.
    (``event_type`` 1, PERF_TYPE_SOFTWARE, makes it cpu-clock: for checking this code where no PMU is.)"""
    nr = PERF_EVENT_OPEN.get(platform.machine())
    if nr is None:
        return errno.ENOSYS
    # struct perf_event_attr, PERF_ATTR_SIZE_VER0 (64 bytes): type HARDWARE (0), config CPU_CYCLES (0),
    # flags: disabled (bit 0)
    attr = ctypes.create_string_buffer(struct.pack("=IIQQQQQIIQ", event_type, 64, 0, 0, 0, 0, 1, 0, 0, 0), 64)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    fd = libc.syscall(ctypes.c_long(nr), attr, ctypes.c_int(-1), ctypes.c_int(0), ctypes.c_int(-1),
                      ctypes.c_ulong(8))   # PERF_FLAG_FD_CLOEXEC
    if fd < 0:
        return ctypes.get_errno() or errno.EIO
    os.close(fd)
    return 0


def _capabilities(procfs: str) -> int:
    try:
        with open(os.path.join(procfs, "self", "status")) as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def no_pmu_reason(sysfs: str = "/sys", procfs: str = "/proc",
                  try_open: Callable[[], int] = open_system_wide_cycles) -> Optional[str]:
    """Why this machine has no PMU this process may use, or None: then the hardware tests must pass."""
    devices = os.path.join(sysfs, "bus", "event_source", "devices")
    if not os.path.isdir(os.path.join(devices, "cpu")):
        return f"no hardware PMU here (no {devices}/cpu: a virtual machine without a vPMU, or a hybrid CPU)"
    err = try_open()
    if err in (errno.EACCES, errno.EPERM):
        try:
            with open(os.path.join(procfs, "sys", "kernel", "perf_event_paranoid")) as fh:
                paranoid = fh.read().strip()
        except OSError:
            paranoid = "unreadable"
        caps = _capabilities(procfs)
        return (f"perf_event_open refused ({errno.errorcode[err]}): kernel.perf_event_paranoid={paranoid}, "
                f"CAP_PERFMON {'yes' if caps >> CAP_PERFMON & 1 else 'no'}, "
                f"CAP_SYS_ADMIN {'yes' if caps >> CAP_SYS_ADMIN & 1 else 'no'}")
    return None   # it opened, or failed for another reason: the tests run, and fail if the source does


def memory_pmu_missing(sysfs: str = "/sys", procfs: str = "/proc") -> Optional[str]:
    """Why the memory group cannot be ok here (no memory-controller PMU teye reads), or None."""
    devices = os.path.join(sysfs, "bus", "event_source", "devices")
    names = os.listdir(devices) if os.path.isdir(devices) else []
    if any(n.startswith(("uncore_imc_", "amd_umc_")) for n in names) or "amd_df" in names:
        return None
    return f"no memory-controller PMU under {devices} (uncore_imc_*, amd_umc_*, amd_df)"


def double_fp_missing(procfs: str = "/proc") -> Optional[str]:
    """Why there is no double-precision flop count here (teye's table has no such events), or None."""
    events, why = fp_events(read_cpuinfo(procfs))
    if not events:
        return why
    if not any(e.precision == "double" for e in events):
        return f"{why}: all precisions counted together, no double-precision count"
    return None


@pytest.mark.parametrize("devices, err, want", [
    ((), 0, "no hardware PMU here"),                                     # a VM without a vPMU
    (("cpu_core", "cpu_atom"), 0, "no hardware PMU here"),               # hybrid: no cpu PMU
    (("cpu",), errno.EACCES, "perf_event_open refused (EACCES): kernel.perf_event_paranoid=2, CAP_PERFMON no"),
    (("cpu",), errno.EPERM, "perf_event_open refused (EPERM)"),          # seccomp in a container
    (("cpu",), 0, None),                                                 # usable: must run
    (("cpu",), errno.ENOENT, None),                                      # a PMU that fails: must fail, not skip
    (("cpu",), errno.EINVAL, None),
    (("cpu", "uncore_imc_0"), errno.EBUSY, None),
])
def test_the_hardware_tests_skip_only_without_a_usable_pmu(tmp_path, devices, err, want):
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    (sysfs / "bus" / "event_source" / "devices").mkdir(parents=True)
    for d in devices:
        (sysfs / "bus" / "event_source" / "devices" / d).mkdir()
    (procfs / "sys" / "kernel").mkdir(parents=True)
    (procfs / "sys" / "kernel" / "perf_event_paranoid").write_text("2\n")
    (procfs / "self").mkdir()
    (procfs / "self" / "status").write_text("Name:\tpython\nCapEff:\t00000000a80425fb\n")  # docker's default
    calls = []
    got = no_pmu_reason(str(sysfs), str(procfs), lambda: calls.append(1) or err)
    if want is None:
        assert got is None
    else:
        assert got is not None and got.startswith(want), got
    assert calls == ([1] if "cpu" in devices else [])     # no open attempted where sysfs has no PMU


def test_capabilities_are_read_from_capeff(tmp_path):
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "status").write_text(f"CapEff:\t{1 << CAP_PERFMON:016x}\n")
    (tmp_path / "sys" / "kernel").mkdir(parents=True)
    (tmp_path / "sys" / "kernel" / "perf_event_paranoid").write_text("3\n")
    sysfs = tmp_path / "sysfs"
    (sysfs / "bus" / "event_source" / "devices" / "cpu").mkdir(parents=True)
    got = no_pmu_reason(str(sysfs), str(tmp_path), lambda: errno.EACCES)
    assert got.endswith("kernel.perf_event_paranoid=3, CAP_PERFMON yes, CAP_SYS_ADMIN no"), got


def test_memory_and_fp_are_expected_where_the_machine_has_them(tmp_path):
    devices = tmp_path / "bus" / "event_source" / "devices"
    (devices / "cpu").mkdir(parents=True)
    assert memory_pmu_missing(str(tmp_path)).startswith("no memory-controller PMU")
    for name in ("uncore_imc_0", "amd_umc_3", "amd_df"):
        (devices / name).mkdir()
        assert memory_pmu_missing(str(tmp_path)) is None
        (devices / name).rmdir()
    cpuinfo = "vendor_id\t: {}\ncpu family\t: {}\nmodel\t\t: {}\nmodel name\t: x\n\n"
    for (vendor, fam, model), missing in ((("GenuineIntel", 6, 0x55), None), (("GenuineIntel", 6, 0x55 + 1), "not in"),
                                          (("AuthenticAMD", 0x19, 1), "all precisions")):
        (tmp_path / "cpuinfo").write_text(cpuinfo.format(vendor, fam, model))
        got = double_fp_missing(str(tmp_path))
        assert (got is None) if missing is None else (missing in got), got


def test_without_a_cpu_pmu_in_sysfs_cycles_cannot_be_opened_either():
    """The sysfs check hides no usable PMU: where it says none, the direct open fails too."""
    if os.path.isdir("/sys/bus/event_source/devices/cpu"):
        pytest.skip("this machine has a cpu PMU: the hardware tests below run (or say why perf refuses)")
    assert open_system_wide_cycles() != 0


def test_the_hand_made_open_works():
    """The same call for the software cpu-clock event, which every kernel has: it opens, or the kernel
    refuses system-wide counting to this process (so the errno the check reads is the kernel's verdict)."""
    assert open_system_wide_cycles(event_type=1) in (0, errno.EACCES, errno.EPERM)
    assert open_system_wide_cycles(event_type=99) in (errno.ENOENT, errno.EINVAL, errno.EACCES, errno.EPERM)


# -- the hardware tests --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def source():
    why = no_pmu_reason()
    if why:
        pytest.skip(why)
    s = PmuSource(LiveReader, "/sys", "/proc")
    r = s.collect()                 # SourceUnavailable here is a failure: the machine has a usable PMU
    assert dict(r.groups).get("core") == "ok", dict(r.groups)
    yield s
    s.close()


def _delta(source, fn):
    before = source.collect()
    t0, c0 = time.monotonic(), time.process_time()
    fn()
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    after = source.collect()
    return before, after, wall, cpu


def _sum(reading, name, **match):
    rows = getattr(reading, name)
    return sum(r[-1] for r in rows if all(r[i] == v for i, v in match.items()))


@pytest.mark.measures("hardware counts against the loop's own process_time")
@pytest.mark.pmu
def test_numpy_copy_moves_its_bytes_within_a_factor(source):
    why = memory_pmu_missing()
    if why:
        pytest.skip(why)
    assert dict(source.collect().groups).get("memory") == "ok", dict(source.collect().groups)
    np = pytest.importorskip("numpy")
    a = np.ones(256 * 1024 * 1024 // 8)          # 256 MiB, far beyond any cache
    b = np.empty_like(a)
    n = 8
    before, after, _, _ = _delta(source, lambda: [np.copyto(b, a) for _ in range(n)])
    moved = (_sum(after, "memory_read") - _sum(before, "memory_read")
             + _sum(after, "memory_written") - _sum(before, "memory_written")
             + _sum(after, "memory_transferred") - _sum(before, "memory_transferred"))   # AMD Zen 2/3: unsplit
    # each copy reads a and writes b (2 x 256 MiB); write-allocate may read b first (3 x); the rest of
    # the machine adds little in the second or so this takes
    assert 2 * n * a.nbytes <= moved <= 4 * n * a.nbytes, moved / (n * a.nbytes)


@pytest.mark.measures("hardware counts against the loop's own process_time")
@pytest.mark.pmu
def test_float64_matmul_counts_2n3_double_operations_within_10_percent(source):
    why = double_fp_missing()
    if why:
        pytest.skip(why)
    assert dict(source.collect().groups).get("fp") == "ok", dict(source.collect().groups)
    np = pytest.importorskip("numpy")
    n = 2048
    x, y = np.random.rand(n, n), np.random.rand(n, n)
    before, after, _, _ = _delta(source, lambda: x @ y)
    ops = _sum(after, "flops", **{1: "double"}) - _sum(before, "flops", **{1: "double"})
    assert ops == pytest.approx(2 * n ** 3, rel=0.10)


@pytest.mark.measures("hardware counts against the loop's own process_time")
@pytest.mark.pmu
def test_cycles_and_cpi_of_an_interpreter_loop(source):
    before, after, wall, cpu = _delta(source, lambda: sum(i * i for i in range(3_000_000)))
    cycles = _sum(after, "cycles") - _sum(before, "cycles")
    instr = _sum(after, "instructions") - _sum(before, "instructions")
    # the loop's own CPU time at 0.4 GHz or more, and no more than every CPU at 6 GHz for the wall time
    assert 0.4e9 * cpu <= cycles <= 6e9 * wall * os.cpu_count(), (cycles, cpu, wall)
    # CPython runs well over 20 instructions per iteration; perf stat shows a CPI of about 0.3-1 for
    # such a loop (counted system-wide here, so the machine's other work widens the range)
    assert instr >= 20 * 3_000_000 and 0.15 <= cycles / instr <= 5, (instr, cycles / instr)
