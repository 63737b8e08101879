"""The job table's message path in C (apply, agent/phases/_fast_table.c) against JobTable._apply.

Two tables get the same generated history (messages from several jobs, processes and users,
with repeated, overlapping, straddling and late phases, steps, GPU processes, CUDA_VISIBLE_DEVICES
lists, full queues, and the sampler's attribution and expiry in between); one applies each message
with _apply, the other with the C code.  Every field of the resulting state must be equal, value
and type: the views, the rings, the open phases, the queues waiting for GPU samples, the recorded
intervals, the counters, and the calls made to the input probe.
"""
from __future__ import annotations

import errno
import os
import socket
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.context import AgentContext
from agent.phases import attribution, fast, jobs
from agent.phases.jobs import JobTable
from agent.phases import protocol
from agent.phases.procstat import InputProbe
from agent.phases.protocol import PHASES, Message, encode
from tests.phases.helpers import MS, S, phases_cfg, require_fast
from tests.phases.test_protocol import BAD

require_fast(skip=lambda why: pytest.skip(why, allow_module_level=True))

NOW0 = 100_000 * S
GPU_PID = 11                                   # holds GPUs 0 and 1 (NVML's process list)


class Probe:
    """Stands in for procstat.InputProbe: records track() calls; no /proc samples, so waits resolve as gone."""

    def __init__(self):
        self.calls = []

    def track(self, pid, uid, now_ns):
        self.calls.append((pid, uid, now_ns))

    def samples(self, pid):
        return [], f"pid {pid} is not sampled here", True


def make_table(record: int, probe: bool, max_pending: int) -> JobTable:
    ctx = AgentContext(clock=lambda: NOW0, wall_clock=lambda: 1.8e9)
    ctx.gpu_pids[GPU_PID] = frozenset({"0", "1"})
    table = JobTable(phases_cfg(max_pending_intervals=max_pending, window_seconds=60.0, max_jobs=4,
                                max_jobs_per_user=3, job_expiry_seconds=30.0),
                     ctx, own_uid=0, record_intervals=record, probe=Probe() if probe else None,
                     alive=lambda pid: pid % 2 == 0)   # 13's jobs end when silent: a new run, through both paths
    return table


def ring_state(r):
    return (r.width, r.idx, r.phase, r.in_step, r.step_ns, r.steps, r.idle, r.obs, r.step_idle, r.step_obs,
            r.kind_idle, r.step_attr, r.cur_b, r.cur_i, [tuple(getattr(w, f) for f in w.__slots__) for w in r.wait])


def typed(x):
    """x with the type of every leaf, so that 1 == 1.0 or a tuple == a Pending cannot pass unnoticed."""
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [typed(v) for v in x])
    if isinstance(x, dict):
        return ("dict", [(typed(k), typed(v)) for k, v in x.items()])
    return (type(x).__name__, x)


def state(table: JobTable):
    out = []
    for key, j in [*table._jobs.items(), *((("ended", k), j) for k, j in table._ended.items())]:
        out.append((key, j.label, j.user, j.uid, j.first_pid, j.pids, j.created_ns, j.last_ns, j.phase_s, j.steps,
                    j.samples, j.hist, j.hist_sum, j.gpu_idle, list(j.pending), j.pending.maxlen,
                    j.open, list(j.waits), j.wait_problem,
                    ring_state(j.ring)))
    return typed((out, table.results, table.attributed, list(table.recorded or ()), table._labels,
                  table._per_uid, table.probe.calls if table.probe else None))


# -- generated histories --------------------------------------------------------------------------

# phase names as the decoders hand them over, and equal strings built at run time (not the same object)
NAMES = st.sampled_from(PHASES) | st.sampled_from(PHASES).map(lambda p: "".join(list(p)))


@st.composite
def message(draw, now):
    base = now - draw(st.sampled_from([0, 0, 0, 1 * S, 3 * S, 25 * S, 70 * S]))  # some records fall in old slots
    span = st.integers(0, 4 * S)

    def interval():
        # ends on a coarse grid give shared and off-by-one boundaries between phases and steps
        a = base - (draw(span) if draw(st.booleans()) else draw(st.integers(0, 40)) * S // 10 + draw(st.integers(-1, 1)))
        return a, a + max(0, draw(st.sampled_from([0, 1, 7, S // 10, S // 3, S, 3 * S])) + draw(st.integers(-1, 1)))

    if draw(st.booleans()):
        phases = tuple((draw(NAMES), *interval()) for _ in range(draw(st.integers(0, 5))))
        steps = tuple((*interval(), draw(st.integers(0, 10**9))) for _ in range(draw(st.integers(0, 3))))
    else:
        # on purpose: pieces that touch (the next starts where the last ended), overlap, or miss by
        # 1 ns, often of the same phase or of phases of one kind, and a step whose ends sit on them
        a = base - draw(st.integers(0, 40)) * S // 10
        start, pieces = a, []
        for _ in range(draw(st.integers(1, 6))):
            b = a + draw(st.sampled_from([1, 7, S // 10, S // 3, S]))
            pieces.append((draw(st.sampled_from(["compute", "compute", "host", "data_wait", "communication"]) | NAMES),
                           a, b))
            a = b + draw(st.sampled_from([0, 0, 0, -1, 1, -7, -(S // 20)]))
        phases = tuple(pieces)
        ends = sorted({p[1] for p in pieces} | {p[2] for p in pieces})
        s0 = draw(st.sampled_from([start, ends[0], start - 1]))
        e0 = draw(st.sampled_from([ends[-1], ends[len(ends) // 2], ends[-1] + 1]))
        steps = ((s0, max(s0, e0), draw(st.integers(0, 64))),) if draw(st.integers(0, 3)) else ()
    return Message(job=draw(st.sampled_from(["a", "b", "c", "d", "e"])), phases=phases, steps=steps,
                   cvd=draw(st.sampled_from([(), ("0",), ("1", "0"), ("7",), ("GPU-x",)])),
                   dropped=draw(st.integers(0, 3)))


@st.composite
def history(draw):
    now = NOW0
    events = []
    for _ in range(draw(st.integers(1, 40))):
        now += draw(st.sampled_from([0, 1, S // 50, S // 2, 2 * S, 7 * S, 31 * S]))
        kind = draw(st.sampled_from(["msg"] * 8 + ["attribute", "views", "gpu_sample"]))
        if kind == "msg":
            pid = draw(st.sampled_from([GPU_PID, 12, 13, 14]))
            uid = draw(st.sampled_from([0, 0, 1000, 1001]))
            events.append(("msg", now, draw(message(now)), pid, uid))
        else:
            events.append((kind, now, draw(st.floats(0.0, 1.0)) if kind == "gpu_sample" else None))
    return events


def run(table: JobTable, events, use_c: bool):
    results = []
    for ev in events:
        kind, now = ev[0], ev[1]
        if kind == "msg":
            _, _, msg, pid, uid = ev
            if use_c:
                results.append(fast.module.apply(table, msg, pid, uid, now))
            else:
                results.append(table._apply(msg, pid, uid, now))
        elif kind == "attribute":
            table.attribute(now)
        elif kind == "views":
            table.views(now)
        else:  # GPU samples up to now, so that queued intervals become ready
            for gpu in ("0", "1"):
                until = table.ctx.timeline.covered_until(gpu)
                start = max(until, now - 10 * S)
                if now > start:
                    table.ctx.timeline.add(gpu, start, now, ev[2])
            table._known_gpus = frozenset(table.ctx.timeline.gpus())
    return results


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(events=history(), record=st.sampled_from([0, 50]), probe=st.booleans(), max_pending=st.sampled_from([3, 8, 4096]))
def test_generated_histories_leave_the_same_state(events, record, probe, max_pending):
    py, c = make_table(record, probe, max_pending), make_table(record, probe, max_pending)
    assert run(py, events, use_c=False) == run(c, events, use_c=True)
    assert state(c) == state(py)
    assert typed(c.views(events[-1][1] + S)) == typed(py.views(events[-1][1] + S))


def test_a_known_step_through_both_paths():
    """A hand-checked case: two phases (one repeated), a step closing them, a GPU process, a full queue."""
    t = NOW0
    msgs = [Message("j", (("data_wait", t - 10 * S // 10, t - 7 * S // 10), ("compute", t - 7 * S // 10, t - S // 10),
                          ("compute", t - 5 * S // 10, t - 2 * S // 10), ("host", t - S // 10, t + S // 10)),
                    ((t - S, t, 32),), ("0",), 2)]
    for use_c in (False, True):
        table = make_table(10, True, 6)
        r = run(table, [("msg", t, m, GPU_PID, 0) for m in msgs], use_c)
        assert r == ["accepted"]
        (job,) = table._jobs.values()
        # compute's two pieces merge into [t-0.7, t-0.1); host straddles the step's end and stays open
        assert job.ring.in_step[job.ring.cur_i][:4] == [3 * S // 10, 6 * S // 10, S // 10, 0]
        assert list(job.open[GPU_PID]) == [(2, t - S // 10, t + S // 10)]
        assert job.steps == 1 and job.samples == 32 and job.pids == {GPU_PID: 2}
        # 4 phases + 1 step + 3 merged in-step pieces (input, host with compute, all explained; no
        # communication) queued into 6 places: the oldest two phases were pushed out unattributed
        assert table.attributed["overflow"] == 2
        assert [p.key[0] for p in job.pending] == [1, 2, jobs.STEP, jobs.IN_STEP, jobs.IN_STEP + 2, jobs.IN_STEP + 3]
        assert job.pending[-1] == attribution.Pending((jobs.IN_STEP + 3, t), t - S, t, ("0", "1"))
        assert table.probe.calls == [(GPU_PID, 0, t)]
        assert [r[1] for r in table.recorded] == ["data_wait", "compute", "compute", "host", "step"]


def test_phases_ending_one_ns_either_side_of_the_step_end():
    """A phase ending 1 ns after its step is clipped to it and stays open for the next step; one
    ending at the step's end is closed."""
    t = NOW0
    msg = Message("j", (("compute", t - S, t + 1), ("host", t - 1, t)), ((t - S, t, 1),))
    for use_c in (False, True):
        table = make_table(0, False, 64)
        run(table, [("msg", t, msg, 12, 0)], use_c)
        (job,) = table._jobs.values()
        assert job.ring.in_step[job.ring.cur_i][1:3] == [S, 1]
        assert list(job.open[12]) == [(1, t - S, t + 1)]


def test_a_step_and_its_pieces_enter_the_queue_together():
    """Found by the generated histories: a step whose in-step pieces were still being queued when the
    step itself was pushed out left pieces without their step, and the verdict's evidence refused
    GPU idle by kind above the idle of the steps (views() raised).  Now a step and its pieces enter
    together, and a step whose pieces do not fit in the whole queue is not queued (overflow)."""
    t = NOW0
    waits = Message("a", (("data_wait", t - 1, t), ("data_wait", t - S // 10, t - S // 10 + 1)), ())
    steps = Message("a", (), ((t - S, t - S, 0), (t - S, t, 0), (t - S, t - S, 0)))
    events = [("gpu_sample", t, 0.0), ("msg", t, waits, GPU_PID, 0), ("msg", t, steps, GPU_PID, 0),
              ("attribute", t, None)]
    for use_c in (False, True):
        table = make_table(0, False, 3)
        run(table, events, use_c)
        (view,) = table.views(t)[0]
        ev = view.evidence
        # the long step (1 s, 2 data_wait pieces: a group of 5) did not fit; the empty steps were attributed
        assert ev.gpu_idle_by_kind == {"input": 0.0, "communication": 0.0, "host": 0.0, "explained": 0.0}
        assert ev.gpu_step_idle_seconds == 0.0
        # the first data_wait (pushed out by the last step) and the long step went unattributed
        assert table.attributed == {"complete": 3, "late": 0, "overflow": 2}


def test_open_phases_per_process_are_capped_through_both_paths():
    """A process that never closes its phases with a step keeps only the newest OPEN_PER_PID of them."""
    t = NOW0
    phases = tuple(("compute", t - S + n, t - S + n + 1) for n in range(jobs.OPEN_PER_PID + 3))
    events = [("msg", t, Message("j", phases[:60], ()), 12, 0), ("msg", t, Message("j", phases[60:], ()), 12, 0)]
    py, c = make_table(0, False, 64), make_table(0, False, 64)
    assert run(py, events, use_c=False) == run(c, events, use_c=True)
    assert state(c) == state(py)
    (job,) = c._jobs.values()
    assert job.open[12] == [(1, s, e) for _, s, e in phases[3:]]


def test_the_pid_limit_per_job_through_both_paths():
    """Past MAX_PIDS processes a job stops tracking new ones (no open phases, no dropped counts)."""
    t = NOW0
    events = [("msg", t + n, Message("j", (("compute", t - S, t),), ((t - S, t, 1),), (), n % 3), 100 + n, 0)
              for n in range(jobs.MAX_PIDS + 6)]
    py, c = make_table(0, True, 64), make_table(0, True, 64)
    assert run(py, events, use_c=False) == run(c, events, use_c=True)
    assert state(c) == state(py)
    (job,) = c._jobs.values()
    assert len(job.pids) == len(job.open) == jobs.MAX_PIDS and job.steps == jobs.MAX_PIDS + 6


def test_handle_uses_the_c_path_when_built():
    assert jobs._fast_apply is fast.module.apply


def test_bad_arguments_are_errors_not_crashes():
    table = make_table(0, False, 8)
    msg = Message("j", (("compute", NOW0 - S, NOW0),), ())
    with pytest.raises(TypeError):
        fast.module.apply(table, msg, 1, 0)
    with pytest.raises(TypeError):
        fast.module.apply(table, ("j", (), ()), 1, 0, NOW0)           # not a Message
    with pytest.raises(TypeError):
        fast.module.apply(table, msg, 1, 0, "now")
    with pytest.raises(KeyError):
        fast.module.apply(table, Message("j", (("nap", NOW0 - S, NOW0),), ()), 1, 0, NOW0)
    with pytest.raises(TypeError):
        fast.module.apply(table, Message("j", (("compute", NOW0),), ()), 1, 0, NOW0)
    with pytest.raises(AttributeError):
        fast.module.apply(object(), msg, 1, 0, NOW0)
    # the table still works after each of them
    assert fast.module.apply(table, msg, 1, 0, NOW0) == "accepted"


# -- handle_batch: receive bursts decoded, applied and counted in C ------------------------------

def cvd_text(cvd):
    return ",".join(cvd) if cvd else None


@st.composite
def datagram(draw):
    """(data, pid, uid): mostly valid messages, and every kind of datagram the C path must leave to handle()."""
    kind = draw(st.sampled_from(["valid"] * 6 + ["bad", "no_credentials", "too_large", "job_limit", "escaped"]))
    pid = draw(st.sampled_from([GPU_PID, 12, 13]))
    uid = draw(st.sampled_from([0, 1000]))
    if kind == "bad":
        return draw(st.sampled_from(BAD))[1], pid, uid
    m = draw(message(NOW0))
    cvd = draw(st.sampled_from([None, "0", "1,0", "7"]))
    job = m.job if kind != "job_limit" else draw(st.sampled_from(["f", "g", "h"]))  # past max_jobs=4 for a uid
    data = encode(job, m.phases, m.steps, cvd, m.dropped)
    if kind == "no_credentials":
        return data, None, None
    if kind == "too_large":
        return data + b" " * 70000, pid, uid
    if kind == "escaped":  # valid, but outside the C decoder's subset: decode_python takes it
        return data.replace(b'"job":"', b'"job":"\\u0061', 1), pid, uid
    return data, pid, uid


def python_handle(table, batch, monkeypatch):
    with monkeypatch.context() as mp:
        mp.setattr(protocol, "_fast_decode", None)
        mp.setattr(jobs, "_fast_apply", None)
        for data, pid, uid in batch:
            table.handle(data, pid, uid)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                  HealthCheck.function_scoped_fixture])
@given(bursts=st.lists(st.lists(datagram(), min_size=1, max_size=8), min_size=1, max_size=6))
def test_handle_batch_leaves_the_state_handle_leaves(bursts, monkeypatch):
    py, c = make_table(20, True, 16), make_table(20, True, 16)
    for burst in bursts:
        python_handle(py, burst, monkeypatch)
        c.handle_batch(list(burst))
    assert state(c) == state(py)
    assert typed(c.views(NOW0 + S)) == typed(py.views(NOW0 + S))


def test_handle_batch_stops_at_the_first_datagram_c_does_not_take(monkeypatch):
    """C applies datagrams in order up to the first it leaves to handle(), and says where it stopped."""
    t = NOW0
    good = encode("j", [("compute", t - S, t)], [(t - S, t, 8)])
    batch = [(good, 12, 0), (good, None, None), (b'{"v":1,"job":"j\\u0061"}', 12, 0), (b"{", 12, 0),
             (good + b" " * 70000, 12, 0)]
    table = make_table(0, False, 64)
    assert fast.module.handle_batch(table, batch, 0) == 1
    assert table.results["accepted"] == 1 and table._jobs[(0, "j")].steps == 1
    for start in range(1, len(batch)):
        assert fast.module.handle_batch(table, batch, start) == start  # each of the others is left
    assert fast.module.handle_batch(table, batch * 2, 5) == 6 and fast.module.handle_batch(table, batch, 5) == 5
    assert table.results["accepted"] == 2 and table._jobs[(0, "j")].steps == 2
    # the whole of it through handle_batch: each counted once, under its reason
    table = make_table(0, False, 64)
    table.handle_batch(list(batch))
    assert {k: v for k, v in table.results.items() if v} == {"accepted": 2, "no_credentials": 1, "not_json": 1,
                                                             "too_large": 1}


def test_handle_batch_bad_arguments_are_errors():
    table = make_table(0, False, 64)
    with pytest.raises(TypeError):
        fast.module.handle_batch(table, ((b"{}", 1, 0),), 0)           # not a list
    with pytest.raises(TypeError):
        fast.module.handle_batch(table, [(b"{}", 1)], 0)               # not (data, pid, uid)
    with pytest.raises(TypeError):
        fast.module.handle_batch(table, [])
    with pytest.raises(ValueError):
        fast.module.handle_batch(table, [], -1)
    assert fast.module.handle_batch(table, [], 0) == 0
    assert not table._lock.locked()


# -- serve: the receiver's loop in C (recvmmsg, then handler_take from the receive buffer) -------

MAX_BYTES = 4096


def serve_table(clock=lambda: NOW0) -> JobTable:
    ctx = AgentContext(clock=clock, wall_clock=lambda: 1.8e9)
    ctx.gpu_pids[GPU_PID] = frozenset({"0", "1"})
    return JobTable(phases_cfg(max_pending_intervals=16, window_seconds=60.0, max_jobs=4, max_jobs_per_user=3,
                               job_expiry_seconds=30.0, max_message_bytes=MAX_BYTES),
                    ctx, own_uid=0, record_intervals=20, probe=Probe())


@pytest.fixture
def pair():
    """(sender, receiver): a connected datagram pair; the receiver asks for SCM_CREDENTIALS and never blocks,
    so serve() returns once the queue is empty (or raises BlockingIOError if nothing was in it)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


def serve_all(table, sock, counts, budget=1000):
    """What Receiver._run does with serve(): each rest to handle_batch, until the queue is empty."""
    handled = 0
    while True:
        try:
            n, rest, error = fast.module.serve(table, sock.fileno(), MAX_BYTES + 1, budget, counts)
        except BlockingIOError:
            return handled
        assert error is None
        handled += n
        table.handle_batch(rest)


def wire(data):
    """The datagram as the socket carries it: larger ones stand for anything over max_message_bytes."""
    return data[:MAX_BYTES + 100] if len(data) > MAX_BYTES else data


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                 HealthCheck.function_scoped_fixture])
@given(bursts=st.lists(st.lists(st.one_of(datagram(), st.just((b"", 0, 0))), min_size=1, max_size=8),
                       min_size=1, max_size=5))
def test_serve_leaves_the_state_handle_leaves(bursts, pair, monkeypatch):
    """Bursts sent over a real socket: serve() plus handle_batch(rest) against handle() of each datagram."""
    tx, rx = pair
    py, c = serve_table(), serve_table()
    me = (os.getpid(), os.getuid())
    counts, sent = [0, 0], 0
    for burst in bursts:
        datas = [wire(d) for d, _, _ in burst]
        for d in datas:
            tx.send(d)
        sent += len(datas)
        serve_all(c, rx, counts)
        python_handle(py, [(d, *me) for d in datas], monkeypatch)
        assert counts[0] == sent
    assert state(c) == state(py)
    assert typed(c.views(NOW0 + S)) == typed(py.views(NOW0 + S))


def good(job="j", t=NOW0):
    return encode(job, [("compute", t - S, t)], [(t - S, t, 8)])


def test_serve_returns_the_rest_of_a_receive_from_the_first_datagram_it_leaves(pair):
    tx, rx = pair
    table = serve_table()
    for d in (good(), b"{", good(), b"", good()):
        tx.send(d)
    counts = [7, 3]
    n, rest, error = fast.module.serve(table, rx.fileno(), MAX_BYTES + 1, 100, counts)
    me = (os.getpid(), os.getuid())
    assert (n, rest, error) == (1, [(b"{", *me), (good(), *me), (b"", *me), (good(), *me)], None)
    assert counts == [12, 4] and table.results["accepted"] == 1 and table._jobs[(0, "j")].steps == 1
    assert not table._lock.locked()


def test_serve_stops_at_its_budget_and_leaves_the_queue_to_the_next_call(pair):
    tx, rx = pair
    table = serve_table()
    for _ in range(9):
        tx.send(good())
    counts = [0, 0]
    assert fast.module.serve(table, rx.fileno(), MAX_BYTES + 1, 4, counts) == (4, [], None)
    assert counts == [4, 1] and table._jobs[(0, "j")].steps == 4   # received no more than it could handle
    assert fast.module.serve(table, rx.fileno(), MAX_BYTES + 1, 100, counts) == (5, [], None)
    assert counts == [9, 2] and table._jobs[(0, "j")].steps == 9
    with pytest.raises(BlockingIOError):                              # nothing queued, nothing handled
        fast.module.serve(table, rx.fileno(), MAX_BYTES + 1, 100, counts)
    assert counts == [9, 2]


def test_an_oversized_datagram_is_left_to_handle_and_counted_too_large(pair):
    tx, rx = pair
    table = serve_table()
    tx.send(good() + b" " * MAX_BYTES)
    tx.send(good())
    counts = [0, 0]
    n, rest, error = fast.module.serve(table, rx.fileno(), MAX_BYTES + 1, 100, counts)
    assert n == 0 and len(rest) == 2 and len(rest[0][0]) == MAX_BYTES + 1 and error is None
    table.handle_batch(rest)
    assert {k: v for k, v in table.results.items() if v} == {"too_large": 1, "accepted": 1}


def test_a_datagram_whose_handling_raises_is_dropped_and_returned_as_the_error(pair):
    """The table's clock fails once (standing in for any bug under handler_take): that datagram is dropped,
    the error comes back as a value, the datagrams after it come back in rest and the lock is free."""
    calls = []

    def clock():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("clock broke")
        return NOW0

    tx, rx = pair
    table = serve_table(clock)
    for job in ("a", "b", "c", "d"):
        tx.send(good(job))
    counts = [0, 0]
    n, rest, error = fast.module.serve(table, rx.fileno(), MAX_BYTES + 1, 100, counts)
    assert n == 1 and [d for d, _, _ in rest] == [good("c"), good("d")] and counts == [4, 1]
    assert isinstance(error, RuntimeError) and str(error) == "clock broke" and error.__traceback__ is not None
    assert not table._lock.locked()
    table.handle_batch(rest)
    assert sorted(name for _, name in table._jobs) == ["a", "c", "d"]


def test_serve_holds_the_lock_for_a_burst_and_counts_it_when_it_lets_go(pair):
    """One lock hold per receive: the probe (called under the lock, as _apply calls it) sees the lock
    held and the burst not yet counted; once serve returns, all of it is counted and the lock is free."""
    tx, rx = pair
    table = serve_table()
    seen = []
    table.probe.track = lambda pid, uid, now: seen.append((table._lock.locked(), table.results["accepted"]))
    for job in ("a", "b", "c"):
        tx.send(encode(job, [("data_wait", NOW0 - S, NOW0 - MS)], [(NOW0 - S, NOW0, 8)]))
    assert fast.module.serve(table, rx.fileno(), MAX_BYTES + 1, 100, [0, 0]) == (3, [], None)
    assert seen == [(True, 0), (True, 0), (True, 0)]
    assert table.results["accepted"] == 3 and not table._lock.locked()


class _FlakyGpuPids(AgentContext):
    """An AgentContext whose gpu_pids raises on the first read (standing in for any failure to read it)."""

    reads = 0

    @property
    def gpu_pids(self):
        type(self).reads += 1
        if type(self).reads == 1:
            raise RuntimeError("gpu_pids unreadable")
        return self._gpu_pids

    @gpu_pids.setter
    def gpu_pids(self, value):
        self._gpu_pids = value


def test_a_table_that_fails_to_give_its_gpu_map_drops_one_datagram_and_frees_the_lock(pair):
    """The GPU maps are read when the lock is taken: if that fails, that datagram is dropped with the
    error, the lock is let go, and the rest of the receive comes back for the Python path."""
    tx, rx = pair
    table = serve_table()
    table.ctx = _FlakyGpuPids(clock=lambda: NOW0)
    for job in ("a", "b", "c"):
        tx.send(good(job))
    n, rest, error = fast.module.serve(table, rx.fileno(), MAX_BYTES + 1, 100, [0, 0])
    assert n == 0 and [d for d, _, _ in rest] == [good("b"), good("c")]
    assert isinstance(error, RuntimeError) and str(error) == "gpu_pids unreadable"
    assert not table._lock.locked() and table.results["accepted"] == 0
    table.handle_batch(rest)
    assert sorted(name for _, name in table._jobs) == ["b", "c"] and table.results["accepted"] == 2


def test_serve_bad_arguments_are_errors(pair):
    tx, rx = pair
    table = serve_table()
    fd = rx.fileno()
    with pytest.raises(TypeError):
        fast.module.serve(table, fd, MAX_BYTES + 1, 10, (0, 0))         # counts not a list
    with pytest.raises(TypeError):
        fast.module.serve(table, fd, MAX_BYTES + 1, 10, [0])            # not two items
    with pytest.raises(TypeError):
        fast.module.serve(table, fd, MAX_BYTES + 1, 10, [0, 0.0])       # not ints
    with pytest.raises(ValueError):
        fast.module.serve(table, fd, 0, 10, [0, 0])
    with pytest.raises(ValueError):
        fast.module.serve(table, fd, MAX_BYTES + 1, 0, [0, 0])
    for linger in (-1, 1_000_000):
        with pytest.raises(ValueError):
            fast.module.serve(table, fd, MAX_BYTES + 1, 10, [0, 0], linger)
    with pytest.raises(AttributeError):
        fast.module.serve(object(), fd, MAX_BYTES + 1, 10, [0, 0])      # not a job table
    tx.send(good())
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead_fd = dead.fileno()
    dead.close()
    with pytest.raises(OSError) as e:                                    # a closed descriptor: recvmmsg's errno
        fast.module.serve(table, dead_fd, MAX_BYTES + 1, 10, [0, 0])
    assert e.value.errno == errno.EBADF
    # none of it touched the table or the queue
    assert fast.module.serve(table, fd, MAX_BYTES + 1, 10, [0, 0]) == (1, [], None)
    assert table.results["accepted"] == 1 and not table._lock.locked()


def paced(tx, n, gap_s):
    def run():
        for i in range(n):
            tx.send(good())
            time.sleep(gap_s)
    t = threading.Thread(target=run)
    t.start()
    return t


def test_a_busy_socket_lingers_so_that_one_wake_up_takes_many_datagrams(pair):
    """30 datagrams 0.3 ms apart: after the second receive (busy) the loop pauses 20 ms each
    time, so the datagrams come in a few receives (the kernel queue holds 10; the sender waits)."""
    tx, rx = pair
    rx.setblocking(True)
    table = serve_table()
    sender = paced(tx, 30, 0.0003)
    counts = [0, 0]
    assert fast.module.serve(table, rx.fileno(), MAX_BYTES + 1, 30, counts, 20_000) == (30, [], None)
    sender.join()
    assert counts[0] == 30 and counts[1] <= 10 and table._jobs[(0, "j")].steps == 30


def test_an_idle_socket_never_lingers(pair):
    """Datagrams 30 ms apart are not a busy socket: each is its own receive, with no pause after it
    (a 0.5 s pause would make the three take more than a second)."""
    tx, rx = pair
    rx.setblocking(True)
    table = serve_table()
    sender = paced(tx, 3, 0.03)
    counts = [0, 0]
    t0 = time.monotonic()
    assert fast.module.serve(table, rx.fileno(), MAX_BYTES + 1, 3, counts, 500_000) == (3, [], None)
    took = time.monotonic() - t0
    sender.join()
    assert counts == [3, 3] and took < 0.5


# -- probe.track: the C path skips the call where InputProbe.track would return at once -----------

class CountingProbe(InputProbe):
    def __init__(self):
        super().__init__(reader=None)   # never started: track() only
        self.calls = 0

    def track(self, pid, uid, now_ns):
        self.calls += 1
        super().track(pid, uid, now_ns)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sends=st.lists(st.tuples(st.sampled_from([12, 13, 14]), st.sampled_from([0, 1000]),
                                st.one_of(st.integers(-2, 2), st.integers(0, 3 * InputProbe.RETRACK_NS // 2))),
                       min_size=1, max_size=30))
def test_the_probe_ends_in_the_same_state_whether_c_calls_track_or_not(sends, monkeypatch):
    """data_wait senders at gaps around RETRACK_NS, pids switching uid: the probe's tracked pids, their
    uids, last_ns and order are the same after the Python path (a call per message) and the C path."""
    tables = {}
    for path in ("python", "c"):
        with monkeypatch.context() as mp:
            if path == "python":
                mp.setattr(protocol, "_fast_decode", None)
                mp.setattr(jobs, "_fast_apply", None)
            probe = CountingProbe()
            table = JobTable(phases_cfg(max_jobs=16, max_jobs_per_user=16), AgentContext(clock=lambda: NOW0),
                             own_uid=0, probe=probe)
            now = NOW0
            for pid, uid, gap in sends:
                now += gap
                assert table.handle(encode("j", [("data_wait", now - 2 * MS, now - MS)], []), pid, uid, now) \
                    == "accepted"
            tables[path] = probe
    py, c = tables["python"], tables["c"]
    assert [(pid, t.uid, t.last_ns) for pid, t in c._pids.items()] == \
        [(pid, t.uid, t.last_ns) for pid, t in py._pids.items()]
    assert py.calls == len(sends) and c.calls <= py.calls


def test_c_calls_track_once_per_retrack_window():
    probe = CountingProbe()
    table = JobTable(phases_cfg(), AgentContext(clock=lambda: NOW0), own_uid=0, probe=probe)
    wait = lambda t: encode("j", [("data_wait", t - 2 * MS, t - MS)], [])  # noqa: E731
    for k, t in enumerate([NOW0, NOW0 + MS, NOW0 + InputProbe.RETRACK_NS - 1]):
        assert table.handle(wait(t), 12, 0, t) == "accepted"
    assert probe.calls == 1 and probe._pids[12].last_ns == NOW0
    assert table.handle(wait(NOW0 + InputProbe.RETRACK_NS), 12, 0, NOW0 + InputProbe.RETRACK_NS) == "accepted"
    assert probe.calls == 2 and probe._pids[12].last_ns == NOW0 + InputProbe.RETRACK_NS
    assert table.handle(wait(NOW0 + InputProbe.RETRACK_NS + 1), 12, 1000, NOW0 + InputProbe.RETRACK_NS + 1) \
        == "accepted"                                                        # another uid: always called
    assert probe.calls == 3 and probe._pids[12].uid == 1000
    back = NOW0 + InputProbe.RETRACK_NS                                      # the clock 1 ns behind last_ns
    assert table.handle(wait(back), 12, 1000, back) == "accepted"
    assert probe.calls == 4 and probe._pids[12].last_ns == back
    probe._pids[12].last_ns = "not an int"                                   # anything odd: track() decides
    with pytest.raises(TypeError):
        table.handle(wait(NOW0 + InputProbe.RETRACK_NS + 2), 12, 1000, NOW0 + InputProbe.RETRACK_NS + 2)
    assert probe.calls == 5 and not table._lock.locked()
