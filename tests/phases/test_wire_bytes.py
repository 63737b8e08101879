"""The fast paths of the phase protocol keep the wire bytes, the accounting and the client's delivery unchanged."""
from __future__ import annotations

import json
import os
import socket

from agent.phases.jobs import STEP_BUCKETS, JobTable
from agent.phases.protocol import encode
from tests.phases.helpers import MS, S, ctx_with_clock, phases_cfg
from workloads.phases import Reporter, _encode


def test_client_datagram_is_json_dumps_byte_for_byte():
    t = 123_456_789_012
    phases = [["data_wait", t - 3 * MS, t - 2 * MS], ["compute", t - 2 * MS, t], ['h\u00f6st "x"\n\ud800', 5, 6]]
    steps = [[t - 3 * MS, t, 32], [0, 0, 0]]
    for job, ph, st, cvd, dropped in (("resnet50-bs64", phases, steps, None, 0), ("j", [], [], "0,GPU-1", 7),
                                      ("a.b:c@d+e=f", phases[:1], [], "", 0)):
        obj = {"v": 1, "job": job, "phases": ph, "steps": st}
        if cvd is not None:
            obj["cvd"] = cvd
        if dropped:
            obj["dropped"] = dropped
        assert _encode(job, ph, st, cvd, dropped) == json.dumps(obj, separators=(",", ":")).encode()


def test_step_histogram_and_window_slots_as_before():
    ctx, clock = ctx_with_clock(1000 * S)
    table = JobTable(phases_cfg(), ctx, own_uid=0)
    now = clock.t
    # step lengths on and just above bucket bounds, all ending now; one step ending 40 s ago (an
    # older ring slot, inside the 60 s window) and one ending 70 s ago (outside the window)
    lengths = [0.005, 0.0051, 0.01, 1.0, 59.9, 61.0, 0.0]
    # (in the order a client sends them: a step closes the phases that ended within it)
    steps = [(now - 75 * S, now - 70 * S, 1), (now - 50 * S, now - 40 * S, 1)] + \
        [(now - int(d * S), now, 1) for d in lengths]
    assert table.handle(encode("h", [("compute", now - 40 * S - 3 * S, now - 40 * S)], steps), 1, 0) == "accepted"
    (view,), *_ = table.views(now)
    counts = [c for _, c in view.step_hist.buckets]
    want = [sum(1 for s, e, _ in steps if (e - s) / S <= le) for le in STEP_BUCKETS] + [len(steps)]
    assert counts == want
    ev = view.evidence
    assert ev.steps == len(steps) - 1 and ev.phase_seconds == {"compute": 3.0}
    assert view.steps == len(steps)


def _bind(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(2)
    return s


def test_client_reconnects_when_the_agent_restarts_or_appears(tmp_path):
    path = str(tmp_path / "phases.sock")
    rep = Reporter(train_job="r", socket_path=path, flush_ms=0)  # every record is a datagram
    rep.record_phase("compute", 10, 20)
    rep.step(samples=1, start_ns=10, end_ns=20)  # no agent yet: dropped and counted
    assert (rep.sent, rep.dropped, rep.dropped_messages) == (0, 2, 2)
    first = _bind(path)
    rep.step(samples=2, start_ns=20, end_ns=30)
    assert json.loads(first.recv(65536))["steps"] == [[20, 30, 2]]
    first.close()  # the agent restarts: a new socket at the same path
    os.unlink(path)
    second = _bind(path)
    rep.step(samples=3, start_ns=30, end_ns=40)
    msg = json.loads(second.recv(65536))
    assert msg["steps"] == [[30, 40, 3]] and msg["dropped"] == 2
    assert (rep.sent, rep.dropped_messages) == (2, 2)
    rep.close()
    second.close()
