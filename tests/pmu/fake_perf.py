"""A scripted fake of :class:`agent.pmu.perf.Syscalls`: the syscall boundary, nothing above it.

Counters are addressed by (perf type, config, cpu).  A test sets what the next read()
returns with :meth:`FakeSyscalls.set` (cumulative value, time enabled, time running, as
the kernel returns them) and which opens fail with :attr:`FakeSyscalls.open_errors`.
Reads are answered in the kernel's PERF_FORMAT_GROUP | TOTAL_TIME_ENABLED |
TOTAL_TIME_RUNNING layout, packed into bytes.
"""
import errno
import struct

from agent.pmu import perf


class FakeSyscalls:
    def __init__(self, max_fds=100000):
        self.values = {}          # (type, config, cpu) -> (value, enabled, running)
        self.open_errors = {}     # (type, config, cpu) or (type, None, cpu) or (None, None, cpu) -> errno
        self.read_errors = {}     # same keys -> errno
        self.fds = {}             # fd -> (type, config, cpu, leader fd)
        self.members = {}         # leader fd -> [fds in order]
        self.enabled = set()
        self.max_fds = max_fds
        self.closed = []
        self.attrs = []           # every attr passed to perf_event_open: (type, config, config1, config2, flags, fmt)
        self._next = 100

    def set(self, typ, config, cpu, value, enabled=1_000_000_000, running=None):
        self.values[(typ, config, cpu)] = (value, enabled, enabled if running is None else running)

    def _err(self, table, typ, config, cpu):
        for k in ((typ, config, cpu), (typ, None, cpu), (None, None, cpu), (typ, config, None), (typ, None, None)):
            if k in table:
                return table[k]
        return None

    def perf_event_open(self, attr, pid, cpu, group_fd, flags):
        assert pid == -1 and flags == perf.PERF_FLAG_FD_CLOEXEC
        assert attr.size == 112 and attr.read_format == perf.READ_FORMAT
        self.attrs.append((attr.type, attr.config, attr.config1, attr.config2, attr.flags, attr.read_format))
        err = self._err(self.open_errors, attr.type, attr.config, cpu)
        if err:
            raise OSError(err, "scripted")
        if len(self.fds) >= self.max_fds:
            raise OSError(errno.EMFILE, "scripted")
        fd = self._next
        self._next += 1
        if group_fd == -1:
            assert attr.flags & perf.ATTR_FLAG_DISABLED, "a group leader starts disabled"
            self.members[fd] = [fd]
            leader = fd
        else:
            assert group_fd in self.members and self.fds[group_fd][2] == cpu
            self.members[group_fd].append(fd)
            leader = group_fd
        self.fds[fd] = (attr.type, attr.config, cpu, leader)
        return fd

    def ioctl(self, fd, request, arg):
        assert request == perf.PERF_EVENT_IOC_ENABLE and arg == perf.PERF_IOC_FLAG_GROUP
        self.enabled.add(fd)

    def read(self, fd, size):
        assert fd in self.enabled, "read of a group that was never enabled"
        typ, config, cpu, _ = self.fds[fd]
        err = self._err(self.read_errors, typ, config, cpu)
        if err:
            raise OSError(err, "scripted")
        fds = self.members[fd]
        assert size == 8 * (3 + len(fds))
        vals = [self.values.get(self.fds[f][:3], (0, 0, 0)) for f in fds]
        _, enabled, running = self.values.get((typ, config, cpu), (0, 1_000_000_000, 1_000_000_000))
        return struct.pack(f"={3 + len(fds)}Q", len(fds), enabled, running, *(v[0] for v in vals))

    def close(self, fd):
        assert fd in self.fds, f"close of unknown fd {fd}"
        _, _, _, leader = self.fds.pop(fd)
        self.closed.append(fd)
        if leader == fd:
            assert self.members[fd] == [fd] or all(f not in self.fds for f in self.members[fd][1:]), \
                "members are closed before their leader"
            del self.members[fd]
            self.enabled.discard(fd)
