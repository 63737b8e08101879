"""The phases collector's idle pace (issue 49's idle cost): with no job and nothing received, a read hands out
the same reading again, so the collector asks the sampler for IDLE_PACE_S between reads, on the slots of that
slower grid (shared with the host collectors of that interval: one wake-up for them all); the receiver's first
round after an idle read (a message, a connection made without one) brings the next read back to the configured
interval's next slot.  The oracle of each timing is the test's own clock around its own send."""
from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from agent.context import AgentContext
from agent.phases import receiver, source as phases_source
from agent.phases.source import PhaseSource
from agent.sampler import Sampler
from teye_client import reporter
from tests.phases.helpers import phases_cfg, wait_for

CONFIGURED = 0.1   # the collector's configured interval in these tests
IDLE = 1.0         # its idle pace here (5 s in the agent)


class Reads:
    """Wraps a source's collect(): the monotonic time of each read and its reading."""

    def __init__(self, src):
        self.times, self.readings = [], []
        self._collect = src.collect
        self.cond = threading.Condition()
        src.collect = self

    def __call__(self, *a, **kw):
        r = self._collect(*a, **kw)
        with self.cond:
            self.times.append(time.monotonic())
            self.readings.append(r)
            self.cond.notify_all()
        return r

    def wait_next(self, timeout=5.0) -> int:
        """Wait for the read after the ones so far; its index."""
        with self.cond:
            n = len(self.times)
            assert self.cond.wait_for(lambda: len(self.times) > n, timeout)
            return n


class Pacer:
    """A source read at CONFIGURED for its first ``busy_reads`` reads and while ``busy``, else at IDLE."""
    name = "pacer"

    def __init__(self, busy_reads: int):
        self.busy_reads = busy_reads
        self.busy = False
        self.hurry = None
        self.reads = Reads(self)

    def collect(self):
        return None

    def next_interval_s(self, configured: float) -> float:
        return configured if self.busy or len(self.reads.times) < self.busy_reads else IDLE

    def set_hurry(self, hurry) -> None:
        self.hurry = hurry


class Plain:
    name = "plain"

    def __init__(self):
        self.reads = Reads(self)

    def collect(self):
        return None


def test_a_source_slower_while_idle_shares_the_slower_grids_ticks_and_is_hurried_back():
    pacer, plain = Pacer(busy_reads=2), Plain()
    s = Sampler({"pacer": (pacer, CONFIGURED), "plain": (plain, IDLE)})
    s.start()
    try:
        assert pacer.hurry is not None   # the sampler handed the source its hurry
        assert wait_for(lambda: len(pacer.reads.times) >= 5, 10.0)
        # its first two reads at the configured 0.1 s (the start's and one more), then on the idle grid: each
        # idle read within a few ms of one of the plain source's (which is read every IDLE s from the start)
        idle_reads = pacer.reads.times[2:5]
        for t in idle_reads:
            assert min(abs(t - p) for p in plain.reads.times) < 0.05, (idle_reads, plain.reads.times)
        assert idle_reads[2] - idle_reads[0] > 1.5 * IDLE   # (not a read at every one of the plain's ticks' neighbours)
        # hurried right after an idle read: read again at the configured interval's next slot, not IDLE later
        pacer.reads.wait_next()
        pacer.busy = True
        asked = time.monotonic()
        pacer.hurry()
        n = pacer.reads.wait_next()
        assert pacer.reads.times[n] - asked < 0.5   # (the idle slot was about IDLE on)
        # and, busy, it keeps the configured interval
        for _ in range(3):
            pacer.reads.wait_next()
        gaps = [b - a for a, b in zip(pacer.reads.times[-4:], pacer.reads.times[-3:])]
        assert max(gaps) < IDLE / 2, gaps
    finally:
        s.stop()


@pytest.fixture
def paced(sockdir, monkeypatch):
    """A PhaseSource read by a real sampler every CONFIGURED s, idle pace IDLE s: (source, its Reads, path)."""
    monkeypatch.setattr(phases_source, "IDLE_PACE_S", IDLE)
    path = os.path.join(sockdir, "p.sock")
    src = PhaseSource(phases_cfg(), AgentContext(), socket_path=path)
    reads = Reads(src)
    s = Sampler({"phases": (src, CONFIGURED)})
    s.start()
    try:
        yield src, reads, path
    finally:
        s.stop()
        src.close()


def _idle_spell(reads, seconds=2.5):
    n0 = len(reads.times)
    time.sleep(seconds)
    return len(reads.times) - n0


def test_an_idle_phases_collector_is_read_at_its_idle_pace_and_at_once_when_a_job_speaks(paced):
    src, reads, path = paced
    assert _idle_spell(reads) <= seconds_at(IDLE, 2.5)     # not 25 reads at 0.1 s
    # a message right after an idle read: the next read comes at the configured interval, and holds the job
    reads.wait_next()
    rep = reporter.Reporter("pace", socket_path=path, flush_ms=0)
    sent = time.monotonic()
    rep.step(samples=4, start_ns=time.monotonic_ns() - 1_000_000, end_ns=time.monotonic_ns())
    assert wait_for(lambda: any(r.jobs for r in reads.readings), 5.0)
    first = next(i for i, r in enumerate(reads.readings) if r.jobs)
    assert reads.times[first] - sent < 0.5, reads.times[first] - sent   # not the idle slot, about 1 s on
    # with a job it is read at the configured interval
    for _ in range(5):
        reads.wait_next()
    gaps = [b - a for a, b in zip(reads.times[-5:], reads.times[-4:])]
    assert max(gaps) < IDLE / 2, gaps
    rep.close()


def test_a_connection_without_a_message_brings_an_idle_read_back_at_once(paced):
    src, reads, path = paced
    assert _idle_spell(reads, 1.5) <= seconds_at(IDLE, 1.5)
    reads.wait_next()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        made = time.monotonic()
        s.connect(path + receiver.SEQ_SUFFIX)
        assert wait_for(lambda: any(r.connections for r in reads.readings), 5.0)
        first = next(i for i, r in enumerate(reads.readings) if r.connections)
        assert reads.times[first] - made < 0.5, reads.times[first] - made
    finally:
        s.close()


def test_the_pace_asked_is_the_configured_one_once_anything_came_since_the_idle_read(sockdir, monkeypatch):
    """The receiver's hurry can miss a read in flight; the pace asked after it then says it."""
    monkeypatch.setattr(phases_source, "IDLE_PACE_S", IDLE)
    path = os.path.join(sockdir, "p.sock")
    src = PhaseSource(phases_cfg(), AgentContext(), socket_path=path)
    try:
        assert src.next_interval_s(CONFIGURED) == CONFIGURED   # never read: not known to be idle
        src.collect()
        assert src.next_interval_s(CONFIGURED) == IDLE
        assert src.next_interval_s(2 * IDLE) == 2 * IDLE        # never faster than configured
        got = src.receiver.received
        rep = reporter.Reporter("late", socket_path=path, flush_ms=0)
        rep.step(samples=1, start_ns=time.monotonic_ns() - 1_000_000, end_ns=time.monotonic_ns())
        assert wait_for(lambda: src.receiver.received > got or src.receiver.connections, 5.0)
        assert wait_for(lambda: src.next_interval_s(CONFIGURED) == CONFIGURED, 5.0)
        rep.close()
    finally:
        src.close()


def seconds_at(interval: float, seconds: float) -> int:
    """Reads a collector read every ``interval`` s makes in ``seconds`` at most (one more for the edge)."""
    return int(seconds / interval) + 1


def test_a_new_jobs_first_datagrams_are_credited_to_the_gpus_sampled_since_the_idle_read(sockdir, monkeypatch):
    """An idle table is read only every IDLE_PACE_S; the GPUs the agent began sampling after its last read are
    learned before a new job's first datagram is handled, so its data wait is credited with their idle time."""
    path = os.path.join(sockdir, "p.sock")
    ctx = AgentContext()
    src = PhaseSource(phases_cfg(), ctx, socket_path=path)
    try:
        src.collect()                                  # idle, no GPU sampled yet
        t0 = time.monotonic_ns()
        ctx.timeline.add("0", t0 - 1_000_000_000, t0 + 2_000_000_000, busy=0.0)   # then GPU 0, idle throughout
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
        rep = reporter.Reporter("gpu0", socket_path=path, flush_ms=0)
        wait_s = 0.2                                   # a data wait of 200 ms inside the GPU's idle sample
        rep.record_phase("data_wait", t0, t0 + int(wait_s * 1e9))
        rep.step(samples=4, start_ns=t0, end_ns=t0 + int(0.3e9))
        # (the table's own views: a collect() would learn the GPUs itself, before the datagram came)
        assert wait_for(lambda: any(j.steps for j in src.table.views(time.monotonic_ns())[0]), 5.0)
        (job,) = src.collect(force=True).jobs
        idle = sum(v for _gpu, phase, v in job.gpu_idle_seconds if phase == "data_wait")
        assert abs(idle - wait_s) < 0.01, job.gpu_idle_seconds
        rep.close()
    finally:
        src.close()
