"""The one door to the kernel's perf events: perf_event_open, read, ioctl and close.

:class:`Syscalls` is the only code in teye that calls ``perf_event_open(2)`` (through
ctypes; no new dependency).  Tests replace it with a scripted fake of the same four
methods, so everything above it (group layout, read decoding, scaling) runs unchanged.

:class:`Counters` opens and reads *groups*: one leader plus members on one CPU, read in
one ``read()`` with ``PERF_FORMAT_GROUP | PERF_FORMAT_TOTAL_TIME_ENABLED |
PERF_FORMAT_TOTAL_TIME_RUNNING``, whose layout is (include/uapi/linux/perf_event.h)::

    u64 nr; u64 time_enabled; u64 time_running; u64 value[nr];

errno values are translated into the few behaviours the source needs (:class:`PerfError`
``kind``): ``denied`` (EACCES/EPERM: perf_event_paranoid without CAP_PERFMON),
``unsupported`` (ENOENT/EINVAL/EOPNOTSUPP/E2BIG: no such PMU or event here), ``offline``
(ENODEV/ENXIO: the CPU is offline or the PMU is gone), ``fds`` (EMFILE/ENFILE) and
``busy`` (EBUSY: another user holds the PMU exclusively).
"""
from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

PERF_FORMAT_TOTAL_TIME_ENABLED = 1 << 0
PERF_FORMAT_TOTAL_TIME_RUNNING = 1 << 1
PERF_FORMAT_GROUP = 1 << 3
READ_FORMAT = PERF_FORMAT_GROUP | PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING

PERF_FLAG_FD_CLOEXEC = 1 << 3
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_DISABLE = 0x2401
PERF_IOC_FLAG_GROUP = 1

ATTR_FLAG_DISABLED = 1 << 0   # perf_event_attr bit 0: the leader starts disabled, enabled with the group

# __NR_perf_event_open per architecture (arch/*/include/uapi/asm/unistd*.h, syscall tables).
SYSCALL_NUMBERS = {"x86_64": 298, "aarch64": 241, "ppc64le": 319, "ppc64": 319, "s390x": 331, "riscv64": 241,
                   "i686": 336, "i386": 336}


class PerfEventAttr(ctypes.Structure):
    """struct perf_event_attr up to PERF_ATTR_SIZE_VER5 (112 bytes; accepted by every kernel >= 4.1)."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),
        ("config2", ctypes.c_uint64),
        ("branch_sample_type", ctypes.c_uint64),
        ("sample_regs_user", ctypes.c_uint64),
        ("sample_stack_user", ctypes.c_uint32),
        ("clockid", ctypes.c_int32),
        ("sample_regs_intr", ctypes.c_uint64),
        ("aux_watermark", ctypes.c_uint32),
        ("sample_max_stack", ctypes.c_uint16),
        ("reserved_2", ctypes.c_uint16),
    ]


assert ctypes.sizeof(PerfEventAttr) == 112


def make_attr(pmu_type: int, config: int, config1: int = 0, config2: int = 0, leader: bool = True) -> PerfEventAttr:
    """A counting (not sampling) system-wide event; the leader starts disabled and is enabled with its group."""
    a = PerfEventAttr()
    a.type = pmu_type
    a.size = ctypes.sizeof(PerfEventAttr)
    a.config = config
    a.config1 = config1
    a.config2 = config2
    a.read_format = READ_FORMAT
    a.flags = ATTR_FLAG_DISABLED if leader else 0
    return a


class PerfError(OSError):
    """perf_event_open/read/ioctl failed; ``kind`` is the behaviour the caller needs."""

    def __init__(self, err: int, what: str):
        self.kind = classify(err)
        super().__init__(err, f"{what}: {os.strerror(err)} ({errno.errorcode.get(err, err)}): {HINTS[self.kind]}")


HINTS = {
    "denied": "not permitted (kernel.perf_event_paranoid forbids system-wide counting without CAP_PERFMON "
              "or CAP_SYS_ADMIN)",
    "unsupported": "this PMU or event is not supported here",
    "offline": "the CPU is offline or the PMU went away",
    "fds": "out of file descriptors (raise LimitNOFILE)",
    "busy": "the PMU is held exclusively by another user",
    "other": "unexpected error",
}


def classify(err: int) -> str:
    if err in (errno.EACCES, errno.EPERM):
        return "denied"
    if err in (errno.ENOENT, errno.EINVAL, errno.EOPNOTSUPP, errno.E2BIG):
        return "unsupported"
    if err in (errno.ENODEV, errno.ENXIO):
        return "offline"
    if err in (errno.EMFILE, errno.ENFILE):
        return "fds"
    if err == errno.EBUSY:
        return "busy"
    return "other"


class Syscalls:
    """The real system calls.  Raises OSError with errno set; :class:`Counters` translates it."""

    def __init__(self, machine: Optional[str] = None):
        self._nr = SYSCALL_NUMBERS.get(machine or platform.machine())
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._syscall = self._libc.syscall
        self._syscall.restype = ctypes.c_long
        self._ioctl = self._libc.ioctl
        self._ioctl.restype = ctypes.c_int
        self._ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong]

    def perf_event_open(self, attr: PerfEventAttr, pid: int, cpu: int, group_fd: int, flags: int) -> int:
        if self._nr is None:
            raise OSError(errno.ENOSYS, f"perf_event_open: unknown syscall number on {platform.machine()}")
        fd = self._syscall(ctypes.c_long(self._nr), ctypes.byref(attr), ctypes.c_int(pid), ctypes.c_int(cpu),
                           ctypes.c_int(group_fd), ctypes.c_ulong(flags))
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        return int(fd)

    def read(self, fd: int, size: int) -> bytes:
        return os.read(fd, size)

    def ioctl(self, fd: int, request: int, arg: int) -> None:
        if self._ioctl(fd, request, arg) < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))

    def close(self, fd: int) -> None:
        os.close(fd)


@dataclass
class Group:
    """Open file descriptors of one group (leader first) on one CPU."""

    cpu: int
    fds: List[int]


class Counters:
    """Open, read and close groups of counters through a :class:`Syscalls`-like door."""

    def __init__(self, sys=None):
        self.sys = sys if sys is not None else Syscalls()
        self.open_fds = 0

    def open_group(self, cpu: int, events: Sequence[Tuple[int, int, int, int]], what: str = "") -> Group:
        """Open (type, config, config1, config2) events as one group on ``cpu`` (all CPUs' tasks: pid -1)
        and enable it.  On any failure the fds opened so far are closed and PerfError is raised."""
        fds: List[int] = []
        try:
            for i, (typ, config, config1, config2) in enumerate(events):
                attr = make_attr(typ, config, config1, config2, leader=(i == 0))
                try:
                    fd = self.sys.perf_event_open(attr, -1, cpu, fds[0] if fds else -1, PERF_FLAG_FD_CLOEXEC)
                except OSError as e:
                    raise PerfError(e.errno or errno.EIO, f"perf_event_open({what} on cpu {cpu})") from None
                fds.append(fd)
                self.open_fds += 1
            try:
                self.sys.ioctl(fds[0], PERF_EVENT_IOC_ENABLE, PERF_IOC_FLAG_GROUP)
            except OSError as e:
                raise PerfError(e.errno or errno.EIO, f"enable({what} on cpu {cpu})") from None
        except PerfError:
            self._close_fds(fds)
            raise
        return Group(cpu, fds)

    def read_group(self, g: Group, what: str = "") -> Tuple[int, int, Tuple[int, ...]]:
        """(time_enabled_ns, time_running_ns, values in group order) -- cumulative, unscaled."""
        n = len(g.fds)
        size = 8 * (3 + n)
        try:
            data = self.sys.read(g.fds[0], size)
        except OSError as e:
            raise PerfError(e.errno or errno.EIO, f"read({what} on cpu {g.cpu})") from None
        if len(data) != size:
            raise PerfError(errno.EIO, f"read({what} on cpu {g.cpu}): {len(data)} bytes, expected {size}")
        nr, enabled, running, *values = struct.unpack(f"={3 + n}Q", data)
        if nr != n:
            raise PerfError(errno.EIO, f"read({what} on cpu {g.cpu}): group of {nr}, expected {n}")
        return enabled, running, tuple(values)

    def close_group(self, g: Group) -> None:
        self._close_fds(g.fds)
        g.fds = []

    def _close_fds(self, fds: List[int]) -> None:
        for fd in reversed(fds):  # members before the leader
            try:
                self.sys.close(fd)
            except OSError:
                pass  # EBADF/EINTR on close: the fd is released either way (close(2))
            self.open_fds -= 1
        fds.clear()
