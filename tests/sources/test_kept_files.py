"""A source's kernel pseudo-files kept open between reads and read again from offset 0 (issue 49, idle CPU:
``agent/sources/_files.KeptFiles``).

Oracles: the kernel's own files (/proc/uptime changes every 10 ms, /proc/stat's btime never), read again
by path with ``read_bytes`` as before; the open calls counted; files a test writes, in place and by a rename.
"""
from __future__ import annotations

import errno
import os
import time

import pytest

from agent.errors import ParseError
from agent.sources import _files
from agent.sources._files import KeptFiles, read_bytes
from agent.sources.cpu import CpuSource, parse_stat


def _count_opens(monkeypatch):
    opened = []
    real = os.open

    def counting(path, *a, **kw):
        opened.append(path)
        return real(path, *a, **kw)
    monkeypatch.setattr(_files.os, "open", counting)
    return opened


def test_a_kernel_file_is_kept_open_and_made_anew_at_each_read(monkeypatch):
    files = KeptFiles()
    opened = _count_opens(monkeypatch)
    first = files.read_text("/proc/uptime")
    assert files.kept == ("/proc/uptime",) and opened == ["/proc/uptime"]
    time.sleep(0.05)
    second = files.read_text("/proc/uptime")
    assert opened == ["/proc/uptime"]                        # not opened again
    assert float(second.split()[0]) > float(first.split()[0])  # the kernel's text of now, not the first one
    assert files.read_bytes("/proc/version") == read_bytes("/proc/version")
    files.close()
    assert files.kept == ()
    files.read_text("/proc/uptime")                          # read again by path after close()
    assert opened.count("/proc/uptime") == 2


def test_a_source_keeps_its_proc_file_with_the_same_values():
    src = CpuSource("/proc")
    a, b = src.collect(), src.collect()
    cold = parse_stat(read_bytes("/proc/stat").decode(), "/proc/stat", src.user_hz)
    assert src._files.kept == ("/proc/stat",)
    assert a.boot_time == b.boot_time == cold.boot_time and set(a.seconds) == set(cold.seconds)
    assert a.context_switches <= b.context_switches <= cold.context_switches
    src.close()
    assert src._files.kept == ()


def test_a_regular_file_is_read_and_closed_as_before(tmp_path):
    p = tmp_path / "stat"
    p.write_text("cpu0 1 2 3 4\n")
    files = KeptFiles()
    assert files.read_text(str(p)) == "cpu0 1 2 3 4\n"
    assert files.kept == ()                                  # a fixture tree's file has its size: not kept
    tmp = tmp_path / "new"
    tmp.write_text("cpu0 5 6 7 8\n")
    os.replace(tmp, p)
    assert files.read_text(str(p)) == "cpu0 5 6 7 8\n"


def test_an_empty_regular_file_kept_is_read_by_its_path_once_written_or_replaced(tmp_path):
    p = tmp_path / "meminfo"
    p.write_text("")
    files = KeptFiles()
    with pytest.raises(ParseError, match="empty"):
        files.read_text(str(p))
    assert files.read_text(str(p), allow_empty=True) == "" and files.kept == (str(p),)
    p.write_text("MemTotal: 1 kB\n")                         # written in place: it has a size now
    assert files.read_text(str(p)) == "MemTotal: 1 kB\n"
    assert files.kept == ()
    p.write_text("")
    files.read_text(str(p), allow_empty=True)
    assert files.kept == (str(p),)
    tmp = tmp_path / "new"
    tmp.write_text("MemTotal: 2 kB\n")
    os.replace(tmp, p)                                       # replaced: the kept file has no link any more
    assert files.read_text(str(p)) == "MemTotal: 2 kB\n"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(_files.FileRefused):                  # refused at open as before, never kept
        files.read_text(str(fifo))
    assert str(fifo) not in files.kept


def test_a_kept_file_that_cannot_be_read_again_is_read_by_its_path_and_never_kept_again(monkeypatch):
    files = KeptFiles()
    files.read_text("/proc/loadavg")
    assert files.kept == ("/proc/loadavg",)

    def espipe(fd, n, offset):
        raise OSError(errno.ESPIPE, os.strerror(errno.ESPIPE))
    monkeypatch.setattr(_files.os, "pread", espipe)
    text = files.read_text("/proc/loadavg")
    assert len(text.split()) == 5                            # read by its path (open, read, close)
    assert files.kept == ()
    monkeypatch.undo()
    files.read_text("/proc/loadavg")
    assert files.kept == ()


def test_each_source_keeps_no_more_descriptors_than_it_asks_the_http_server_to_leave_aside():
    """The HTTP server's connection budget leaves room for the fds sources open after it started
    (``fds_wanted``, agent/daemon.py): each source keeping files open says at most how many."""
    from agent.errors import SourceUnavailable
    from agent.sources.disk import DiskSource
    from agent.sources.loadavg import LoadavgSource
    from agent.sources.memory import MemorySource
    from agent.sources.netstat import NetstatSource
    from agent.sources.network import NetworkSource
    from agent.sources.pressure import PressureSource
    from agent.sources.vmstat import VmstatSource
    kept = {}
    for cls in (CpuSource, MemorySource, VmstatSource, LoadavgSource, NetworkSource, DiskSource, PressureSource,
                NetstatSource):
        src = cls("/proc")
        for _ in range(2):
            try:
                src.collect()
            except SourceUnavailable:   # e.g. a kernel without PSI
                pass
        kept[cls.__name__] = (len(src._files.kept), src.fds_wanted())
        src.close()
        assert src._files.kept == ()
    assert all(n <= wanted for n, wanted in kept.values()), kept
    assert kept["CpuSource"] == (1, 1) and kept["NetstatSource"][0] >= 4, kept   # snmp, netstat, sockstat, udp...
