"""Property tests on this machine's real /proc.

Counters never decrease between two reads; memory used and available never exceed
total; and psutil (an independent reader of the same files) lands between our two
reads: ours(t0) <= psutil(t1) <= ours(t2).
"""
from __future__ import annotations

import os

import time

import psutil
import pytest

from agent.errors import SourceUnavailable
from agent.sources.cpu import MODES, CpuSource
from agent.sources.disk import DiskSource
from agent.sources.memory import MemorySource
from agent.sources.network import NetworkSource
from agent.sources.pressure import PressureSource

PROC = "/proc"
EPS = 1e-6  # float division of tick counts


def _stir(tmp_path):
    """Make a little CPU, disk and loopback activity between two reads."""
    sum(i * i for i in range(20000))
    with open(tmp_path / "blob", "wb") as fh:
        fh.write(os.urandom(256 * 1024))
        fh.flush()
        os.fsync(fh.fileno())
    import socket
    a, b = socket.socketpair()
    a.sendall(b"x" * 1024)
    b.recv(1024)
    a.close()
    b.close()


@pytest.mark.measures("CPU seconds against psutil's, read moments apart")
def test_cpu_seconds_never_decrease_and_psutil_agrees(tmp_path):
    src = CpuSource(PROC)
    r0 = src.collect()
    ps = psutil.cpu_times(percpu=True)
    _stir(tmp_path)
    r1 = src.collect()
    assert r0.seconds, "no CPUs read from /proc/stat"
    for cpu in set(r0.seconds) & set(r1.seconds):
        for mode, a, b in zip(MODES, r0.seconds[cpu], r1.seconds[cpu]):
            assert b >= a, (cpu, mode, a, b)
    # psutil lists the cpuN lines in file order (offline CPUs are absent from both)
    if list(r0.seconds) == list(r1.seconds) and len(ps) == len(r0.seconds):
        for key, t in zip(r0.seconds, ps):
            for mode in ("user", "system", "idle"):
                i = MODES.index(mode)
                assert r0.seconds[key][i] - EPS <= getattr(t, mode) <= r1.seconds[key][i] + EPS, (key, mode)
    # time passes on at least one CPU (the kernel updates /proc/stat per tick, so allow a few)
    total0 = sum(sum(v) for v in r0.seconds.values())
    deadline = time.monotonic() + 3
    while sum(sum(v) for v in r1.seconds.values()) <= total0 and time.monotonic() < deadline:
        time.sleep(0.05)
        r1 = src.collect()
    assert sum(sum(v) for v in r1.seconds.values()) > total0
    assert r1.context_switches >= r0.context_switches > 0


def test_disk_bytes_never_decrease_and_psutil_agrees(tmp_path):
    src = DiskSource(PROC)  # no exclusion: every device the kernel lists
    r0 = src.collect()
    ps = psutil.disk_io_counters(perdisk=True) or {}
    _stir(tmp_path)
    r1 = src.collect()
    common = set(r0.devices) & set(r1.devices)
    assert common, "no block devices in /proc/diskstats"
    for dev in common:
        a, b = r0.devices[dev], r1.devices[dev]
        assert b.read_bytes >= a.read_bytes and b.written_bytes >= a.written_bytes, dev
        assert b.reads >= a.reads and b.writes >= a.writes and b.io_time >= a.io_time, dev
    checked = 0
    for dev in common & set(ps):
        assert r0.devices[dev].read_bytes <= ps[dev].read_bytes <= r1.devices[dev].read_bytes, dev
        assert r0.devices[dev].written_bytes <= ps[dev].write_bytes <= r1.devices[dev].written_bytes, dev
        checked += 1
    assert checked or not ps


def test_network_bytes_never_decrease_and_psutil_agrees(tmp_path):
    src = NetworkSource(PROC)
    r0 = src.collect()
    ps = psutil.net_io_counters(pernic=True)
    _stir(tmp_path)
    r1 = src.collect()
    assert "lo" in r0.interfaces  # every network namespace has a loopback
    common = set(r0.interfaces) & set(r1.interfaces)
    for dev in common:
        a, b = r0.interfaces[dev], r1.interfaces[dev]
        assert b.rx_bytes >= a.rx_bytes and b.tx_bytes >= a.tx_bytes, dev
        assert b.rx_packets >= a.rx_packets and b.tx_packets >= a.tx_packets, dev
    for dev in common & set(ps):
        assert r0.interfaces[dev].rx_bytes <= ps[dev].bytes_recv <= r1.interfaces[dev].rx_bytes, dev
        assert r0.interfaces[dev].tx_packets <= ps[dev].packets_sent <= r1.interfaces[dev].tx_packets, dev


def test_memory_used_and_available_within_total():
    r = MemorySource(PROC).collect()
    assert r.total > 0
    assert 0 <= r.available <= r.total
    assert 0 <= r.used <= r.total
    assert r.free <= r.total and r.cached <= r.total and r.swap_free <= r.swap_total
    assert r.total == psutil.virtual_memory().total  # both read MemTotal


def test_pressure_totals_never_decrease_or_unavailable_with_reason():
    src = PressureSource(PROC)
    if not os.path.isdir(os.path.join(PROC, "pressure")):
        with pytest.raises(SourceUnavailable, match="pressure"):
            src.collect()
        return
    r0 = src.collect()
    r1 = src.collect()
    for res, kinds in r0.resources.items():
        for kind, line in kinds.items():
            assert r1.resources[res][kind].total_seconds >= line.total_seconds, (res, kind)
            assert 0 <= line.avg10 <= 1 and 0 <= line.avg300 <= 1
