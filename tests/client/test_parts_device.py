"""The step's parts where CUDA is in use, and their transport (issue 45), without a GPU: a fake ``torch.cuda``
at the narrowest boundary (its Event with record/query/elapsed_time, its memory statistics), scripted by a
device timeline the test owns; the parts and memory as the agent decodes them from the datagrams sent."""
from __future__ import annotations

import json
import socket
import types

import pytest

from agent.phases.protocol import Limits, decode
from teye_client import _torch
from teye_client._common import Session
from teye_client.reporter import QUOTED, Reporter

MS = 10**6
C = QUOTED["compute"]


class FakeCuda:
    """torch.cuda as the door uses it: events recorded on 'the current stream' at the device time the test
    sets (``at``), passed once the test moves ``done`` beyond them; no synchronize (calling one fails)."""

    def __init__(self):
        self.at = 0.0          # device time (ms) the next recorded event gets
        self.done = -1.0       # the device has passed every event up to this time
        self.made = 0
        self.alloc, self.reserved, self.peak = 100, 200, 150
        self.calls = []
        cuda = self

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing
                cuda.made += 1
                self.t = None

            def record(self, stream=None):
                self.t = cuda.at

            def query(self):
                return self.t is not None and self.t <= cuda.done

            def elapsed_time(self, end):
                assert self.query() and end.query(), "elapsed_time on an event the device has not passed"
                return end.t - self.t

        self.Event = Event

    def max_memory_allocated(self):
        self.calls.append("max")
        return self.peak

    def reset_peak_memory_stats(self):
        self.calls.append("reset")
        self.peak = self.alloc

    def memory_allocated(self):
        return self.alloc

    def memory_reserved(self):
        return self.reserved


def _pair(dev, cuda, kind, a_ms, b_ms):
    cuda.at = a_ms
    e0 = dev.record()
    cuda.at = b_ms
    dev.pair(kind, e0, dev.record())


def test_pairs_are_read_once_the_device_passed_them_in_stream_order_without_synchronising():
    cuda = FakeCuda()
    dev = _torch.Device(cuda)
    _pair(dev, cuda, _torch.FORWARD, 0.0, 3.0)
    _pair(dev, cuda, _torch.BACKWARD, 3.0, 8.5)
    _pair(dev, cuda, _torch.OPTIMIZER, 8.5, 9.0)
    assert dev.ready() is None                      # the device has passed none yet
    cuda.done = 8.5                                 # forward and backward done, optimizer not
    assert dev.ready() == [3 * MS, 5_500_000, 0, 0]
    assert dev.ready() is None                      # each pair read once
    cuda.done = 100.0
    assert dev.ready() == [0, 0, 500_000, 0]
    assert not hasattr(cuda, "synchronize")
    made = cuda.made
    _pair(dev, cuda, _torch.H2D, 10.0, 10.25)       # events come back from the pool: none made
    assert cuda.made == made


def test_a_device_far_behind_keeps_a_bounded_queue():
    cuda = FakeCuda()
    dev = _torch.Device(cuda)
    for k in range(dev.MAX_PENDING + 10):
        _pair(dev, cuda, _torch.FORWARD, float(k), k + 0.5)
    assert len(dev.pending) <= dev.MAX_PENDING and dev.lost == dev.MAX_PENDING // 2


class _Rep:
    def __init__(self):
        self.steps = []
        self.mem = []

    def record_step(self, phases, start, end, samples, parts=None):
        self.steps.append((tuple(phases), start, end, samples, parts))

    def note_memory(self, a, r, p):
        self.mem.append((a, r, p))


def test_device_parts_are_capped_at_the_steps_compute_and_the_rest_carried():
    cuda = FakeCuda()
    s = Session()
    s.device = _torch.Device(cuda)
    rep = _Rep()
    _pair(s.device, cuda, _torch.FORWARD, 0.0, 6.0)
    _pair(s.device, cuda, _torch.BACKWARD, 6.0, 16.0)
    cuda.done = 16.0
    # a step whose compute on the host is 10 ms: 16 ms of device parts do not fit, 6 wait for the next step
    s._record(rep, (C, 0, 4 * MS, QUOTED["data_wait"], 4 * MS, 5 * MS, C, 5 * MS, 11 * MS), 0, 11 * MS, 8, None)
    assert rep.steps[-1][4] == [6 * MS, 4 * MS, 0, 0] and s.pcarry == 6 * MS
    _pair(s.device, cuda, _torch.OPTIMIZER, 16.0, 18.0)
    cuda.done = 18.0
    s._record(rep, (C, 11 * MS, 31 * MS), 11 * MS, 31 * MS, 8, None)   # 20 ms of compute: 2 + 6 carried fit
    assert rep.steps[-1][4] == [0, 0, 2 * MS, 0] and s.pcarry == 0
    assert sum(rep.steps[-1][4]) <= 20 * MS
    s._record(rep, (C, 31 * MS, 40 * MS), 31 * MS, 40 * MS, 8, None)  # nothing passed since: no parts
    assert rep.steps[-1][4] is None


def test_host_parts_are_their_intervals_inside_compute_never_counted_twice():
    s = Session()
    rep = _Rep()
    phases = (C, 0, 10 * MS, QUOTED["data_wait"], 10 * MS, 12 * MS, C, 12 * MS, 30 * MS)
    spans = [(_torch.FORWARD, 1 * MS, 11 * MS),      # 1 ms of it in the input wait: not compute
             (_torch.H2D, 13 * MS, 15 * MS),
             (_torch.BACKWARD, 14 * MS, 20 * MS),    # overlaps the copy (another thread's): counted once
             (_torch.OPTIMIZER, 25 * MS, 35 * MS)]   # past the step's end: only its compute
    s._record(rep, phases, 0, 30 * MS, 8, spans)
    assert rep.steps[-1][4] == [9 * MS, 5 * MS, 5 * MS, 2 * MS]
    assert sum(rep.steps[-1][4]) <= 28 * MS


def test_memory_is_read_each_step_the_peak_reset_and_cuda_absent_leaves_the_host_clock(monkeypatch):
    cuda = FakeCuda()
    dev = _torch.Device(cuda)
    rep = _Rep()
    cuda.peak = 900
    dev.memory_at_step(rep)
    assert rep.mem == [(100, 200, 900)] and cuda.calls == ["max", "reset"]
    dev.memory_at_step(rep)
    assert rep.mem[-1] == (100, 200, 100)       # the next step's peak starts from what is allocated
    # CUDA absent or not initialised: no device, the host clock times the parts
    s = _torch.session
    monkeypatch.setattr(s, "device", None, raising=False)
    for fake in (types.SimpleNamespace(), types.SimpleNamespace(is_initialized=lambda: False)):
        monkeypatch.setitem(__import__("sys").modules, "torch.cuda", fake)
        _torch.end_optimizer_part()
        assert s.device is None
    monkeypatch.setitem(__import__("sys").modules, "torch.cuda", types.SimpleNamespace(
        is_initialized=lambda: True, Event=cuda.Event, max_memory_allocated=cuda.max_memory_allocated,
        reset_peak_memory_stats=cuda.reset_peak_memory_stats, memory_allocated=cuda.memory_allocated,
        memory_reserved=cuda.memory_reserved))
    _torch.end_optimizer_part()
    assert isinstance(s.device, _torch.Device)


def _drain(sock):
    out = []
    sock.settimeout(0.5)
    try:
        while True:
            out.append(sock.recv(65536))
    except socket.timeout:
        return out


def test_parts_and_memory_travel_with_their_steps_and_the_agent_reads_them(listener):
    path, sock = listener
    rep = Reporter(train_job="pt", socket_path=path, flush_ms=60000)
    t = __import__("time").monotonic_ns() - 10**9
    total = [0, 0, 0, 0]
    for k in range(50):
        a = t + k * 2 * MS
        parts = [k * 1000, 2000, 300, k % 2]
        rep.record_step((C, a, a + 2 * MS), a, a + 2 * MS, 4, parts)
        total = [x + y for x, y in zip(total, parts)]
        rep.note_memory(1000 + k, 5000, 7000 if k == 3 else 2000 + k)
    rep.flush(True)
    msgs = [decode(d, __import__("time").monotonic_ns(), Limits()) for d in _drain(sock)]
    assert len(msgs) == 1
    assert list(msgs[0].parts) == total and msgs[0].mem == (1049, 5000, 7000)   # the latest, the highest peak
    rep.record_step((C, t, t + MS), t, t + MS, 4)
    rep.flush(True)
    (raw,) = _drain(sock)
    assert "parts" not in json.loads(raw) and "mem" not in json.loads(raw)        # none since: none sent
    rep.close()


def test_only_the_outermost_part_counts_a_raising_one_too_and_a_process_with_its_own_reporter_none(monkeypatch):
    """_torch._outermost (the backward's wrapper) on plain functions: a part inside another (a forward inside a
    backward, a backward inside an optimizer's closure) is the outer one's; one that raises is recorded and
    passes the exception on, the depth back to 0; a process that reports its own phases records none."""
    s = Session()
    monkeypatch.setattr(_torch, "session", s)
    inner = _torch._outermost(_torch.FORWARD, lambda x: x + 1)
    outer = _torch._outermost(_torch.BACKWARD, lambda x: inner(x) * 2)
    assert outer(3) == 8
    assert [k for k, _a, _b in s.pspans] == [_torch.BACKWARD] and s.pdepth == 0

    def boom():
        raise ValueError("mid-way")
    with pytest.raises(ValueError, match="mid-way"):
        _torch._outermost(_torch.BACKWARD, boom)()
    assert [k for k, _a, _b in s.pspans] == [_torch.BACKWARD, _torch.BACKWARD] and s.pdepth == 0
    s.aside = True
    assert outer(1) == 4 and len(s.pspans) == 2


def test_an_event_that_fails_never_reaches_the_job_and_the_host_clock_takes_over():
    cuda = FakeCuda()
    s = Session()
    s.device = _torch.Device(cuda)

    def broken(self, stream=None):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    cuda.Event.record = broken
    s.pbegin(_torch.FORWARD)      # no exception into the forward
    s.pend()
    assert s.device is None and [k for k, _a, _b in s.pspans] == [_torch.FORWARD]


def test_a_finished_trace_travels_once_with_the_next_datagram(listener):
    """Issue 46: Reporter.note_trace (teye trace's job side, on a trace written or failed) rides on the next
    datagram, as the agent decodes it, and not on the one after."""
    path, sock = listener
    rep = Reporter(train_job="pt", socket_path=path, flush_ms=60000)
    t = __import__("time").monotonic_ns() - 10**9
    rep.note_trace(True, 36, 5, "20261129T071621-3da2c2")
    rep.record_step((C, t, t + MS), t, t + MS, 4)
    rep.flush(True)
    (msg,) = [decode(d, __import__("time").monotonic_ns(), Limits()) for d in _drain(sock)]
    assert msg.trace == (1, 36, 5, "20261129T071621-3da2c2")
    rep.note_trace(False, 0, 3, "x")
    rep.record_step((C, t + MS, t + 2 * MS), t + MS, t + 2 * MS, 4)
    rep.flush(True)
    (msg,) = [decode(d, __import__("time").monotonic_ns(), Limits()) for d in _drain(sock)]
    assert msg.trace == (2, 0, 3, "x")
    rep.record_step((C, t + 2 * MS, t + 3 * MS), t + 2 * MS, t + 3 * MS, 4)
    rep.flush(True)
    (raw,) = _drain(sock)
    assert "trace" not in json.loads(raw)
    rep.close()
