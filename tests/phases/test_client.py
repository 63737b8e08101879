"""The stdlib client: what it sends, and that it never blocks or raises (no agent, bad path, full buffer)."""
from __future__ import annotations

import json
import os
import socket
import time

import pytest

from agent.context import AgentContext
from agent.phases.protocol import decode
from agent.phases.source import PhaseSource
from tests.phases.helpers import MS, phases_cfg
from workloads.phases import Reporter, default_socket_path


def test_one_datagram_per_step_with_the_documented_schema(listener, monkeypatch):
    path, s = listener
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    rep = Reporter(train_job="resnet50-bs64", socket_path=path, flush_ms=60000, max_batch=4)
    t0 = time.monotonic_ns()
    with rep.phase("data_wait"):
        time.sleep(0.002)
    with rep.phase("compute"):
        time.sleep(0.001)
    rep.record_phase("communication", t0, t0 + 5)
    rep.step(samples=64)
    obj = json.loads(s.recv(65536))
    assert obj["v"] == 1 and obj["job"] == "resnet50-bs64" and obj["cvd"] == "2,3"
    (w, ws, we), (c, cs, ce), (m, ms, me) = obj["phases"]
    assert (w, c, m) == ("data_wait", "compute", "communication")
    assert we - ws >= 2 * MS and ce - cs >= 1 * MS and cs >= we and (ms, me) == (t0, t0 + 5)
    ((ss, se, n),) = obj["steps"]
    assert n == 64 and ss == t0 and se >= ce  # the first step starts at the first phase
    assert decode(json.dumps(obj).encode(), time.monotonic_ns()).job == "resnet50-bs64"  # the agent accepts it
    with rep.phase("compute"):
        pass
    rep.step(samples=64)
    rep.flush()
    (ss2, _, _), = json.loads(s.recv(65536))["steps"]
    assert ss2 == se  # the next step starts where the previous ended
    assert rep.sent == 2 and rep.dropped == 0


def test_batching_without_steps_and_flush_on_close(listener):
    path, s = listener
    rep = Reporter(train_job="j", socket_path=path, max_batch=10)
    t = time.monotonic_ns()
    for i in range(25):
        rep.record_phase("compute", t + i, t + i + 1)
    assert len(json.loads(s.recv(65536))["phases"]) == 10
    assert len(json.loads(s.recv(65536))["phases"]) == 10
    rep.close()
    assert len(json.loads(s.recv(65536))["phases"]) == 5


@pytest.mark.measures("the loop's own perf_counter bounds the time its sends took")
def test_no_agent_bad_path_and_bad_arguments_never_raise_and_are_counted(sockdir):
    for path in (os.path.join(sockdir, "nobody-here.sock"), "/nonexistent/dir/x.sock",
                 os.path.join(sockdir, "x" * 200), sockdir):
        rep = Reporter(train_job="j", socket_path=path, max_batch=2, sum_steps=False)   # a datagram per step
        start = time.perf_counter()
        for _ in range(100):
            with rep.phase("compute"):
                pass
            rep.step(samples=1)
        assert time.perf_counter() - start < 1.0
        assert rep.sent == 0 and rep.dropped_messages == 100 and rep.dropped == 200, path
    rep = Reporter(train_job="j", socket_path=os.path.join(sockdir, "x.sock"))
    rep.record_phase("compute", "soon", None)
    rep.record_phase("compute", 10, 5)
    rep.step(samples="many")
    assert rep.dropped == 3


def test_exceptions_inside_a_phase_propagate_and_the_phase_is_recorded(listener):
    path, s = listener
    rep = Reporter(train_job="j", socket_path=path)
    with pytest.raises(KeyError):
        with rep.phase("data_wait"):
            raise KeyError("end of data")
    rep.flush()
    assert json.loads(s.recv(65536))["phases"][0][0] == "data_wait"


@pytest.mark.measures("the loop's own perf_counter bounds the time its sends took")
def test_full_socket_buffer_drops_without_blocking_and_reports_the_count(sockdir):
    path = os.path.join(sockdir, "slow.sock")
    agent = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    agent.bind(path)  # an agent that does not read (hung): its queue fills
    try:
        rep = Reporter(train_job="j", socket_path=path, max_batch=2, sum_steps=False)   # a datagram per step
        start = time.perf_counter()
        for _ in range(2000):
            with rep.phase("compute"):
                pass
            rep.step(samples=1)
        assert time.perf_counter() - start < 2.0
        time.sleep(0.5)
        # every record is sent, counted dropped, or still held for the flush thread's next try (refused records
        # go back into the buffer while it holds at most two batches, so a dropped datagram may hold more than
        # one step's two records, and up to two batches wait for room, besides the one the thread is trying)
        held = 2 * 2000 - rep.sent_records - rep.dropped
        assert rep.dropped_messages > 0 and 0 <= held <= 3 * 2 * rep.max_batch, (held, rep.sent_records, rep.dropped)
        assert rep.dropped >= 2 * rep.dropped_messages and rep.last_error == "BlockingIOError"
        agent.setblocking(False)
        while True:  # the agent catches up ...
            try:
                agent.recv(65536)
            except BlockingIOError:
                break
        agent.settimeout(1.0)
        with rep.phase("compute"):
            pass
        rep.step(samples=1)
        # ... and the next datagram tells it how many records this process lost
        assert json.loads(agent.recv(65536))["dropped"] == rep.dropped
    finally:
        agent.close()


@pytest.mark.measures("the loop's own perf_counter bounds the time its sends took")
def test_a_momentarily_full_queue_loses_nothing_and_never_blocks_the_loop(sockdir):
    """Another job floods the agent and its queue is full for a moment: the loop's own flush does not wait
    (its records go back into the buffer), the flush thread waits for room (at most 200 ms) and sends them."""
    path = os.path.join(sockdir, "busy.sock")
    agent = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    agent.bind(path)
    other = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    other.setblocking(False)
    flood = 0
    try:
        while True:   # the flooder fills the queue
            try:
                other.sendto(b"x", path)
                flood += 1
            except BlockingIOError:
                break
        # every step flushes on the loop's thread, as its intervals (steps the thread held back are not summed)
        rep = Reporter(train_job="j", socket_path=path, flush_ms=0, sum_steps=False)
        start = time.perf_counter()
        for _ in range(3):
            with rep.phase("compute"):
                pass
            rep.step(samples=1)
        assert time.perf_counter() - start < 0.05          # the loop never waited for room
        assert rep.dropped == 0 and rep.sent == 0
        time.sleep(0.05)
        got = []
        agent.settimeout(1.0)
        for _ in range(flood):                               # the agent reads again: room for the thread
            assert agent.recv(65536) == b"x"
        while sum(len(m["steps"]) for m in got) < 3:
            got.append(json.loads(agent.recv(65536)))
        assert [len(m["phases"]) for m in got] and sum(len(m["phases"]) for m in got) == 3
        deadline = time.monotonic() + 2   # the flush thread counts a datagram once its send() has returned,
        while rep.sent_records < 6 and time.monotonic() < deadline:   # which may be after the agent read it
            time.sleep(0.01)
        assert rep.dropped == 0 and rep.sent_records == 6
    finally:
        agent.close()
        other.close()


@pytest.mark.measures("phase seconds against the loop's sleeps (a loaded run read 0.057 s for 0.03 s)")
def test_round_trip_through_the_agent(sockdir):
    path = os.path.join(sockdir, "p.sock")
    src = PhaseSource(phases_cfg(), AgentContext(), socket_path=path)
    try:
        rep = Reporter(train_job="roundtrip", socket_path=path)
        for _ in range(5):
            with rep.phase("data_wait"):
                time.sleep(0.006)
            with rep.phase("compute"):
                time.sleep(0.002)
            rep.step(samples=8)
        deadline = time.monotonic() + 5
        while not (src.collect().jobs and src.collect().jobs[0].steps == 5) and time.monotonic() < deadline:
            time.sleep(0.01)  # batched: the last steps come with the next flush (100 ms)
        (job,) = src.collect().jobs
        assert job.train_job == "roundtrip" and job.steps == 5 and job.samples == 40
        assert dict(job.phase_seconds)["data_wait"] == pytest.approx(0.030, rel=0.5)
        assert 0.6 < job.input_bound_ratio < 0.8 and job.verdict.kind == "input"
    finally:
        src.close()


def test_socket_path_from_environment(monkeypatch, sockdir):
    monkeypatch.setenv("TEYE_PHASE_SOCKET", os.path.join(sockdir, "env.sock"))
    assert Reporter(train_job="j").socket_path == os.path.join(sockdir, "env.sock")
    monkeypatch.delenv("TEYE_PHASE_SOCKET")
    assert default_socket_path() == "/run/teye/phases.sock" or os.path.exists(default_socket_path())


def test_job_names_are_made_valid():
    assert Reporter(train_job="my job/v2").train_job == "my_job_v2"
    assert Reporter(train_job="_x").train_job == "j_x"
    assert Reporter(train_job="é" * 200).train_job.startswith("j_")
