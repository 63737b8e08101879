"""TensorFlow traces (issue 46): teye_client/_tftrace.py's conversion of the profiler's XSpace to a Chrome trace,
the summary's reading of it, and the profile's life in the Tracer (a profiler that raises, files kept, the
private directory removed, the byte bound on both files).

Oracles: an XSpace built here with TensorFlow's own protobuf class, whose events are placed by hand (so each
share below is computed from those numbers, not from the code under test); the Tracer's files on disk."""
from __future__ import annotations

import json
import os
import time

import pytest

from agent.trace import summary as S
from teye_client import _trace, _tftrace
from tests.trace.test_request import make_dirs

pytestmark = pytest.mark.skipif(not __import__("importlib").util.find_spec("tensorflow"),
                                reason="the tensorflow extra (./dev.sh test installs it)")
MS = 10**9   # picoseconds in a millisecond


def _space():
    """A host plane as the profiler writes one: the training thread with three marked steps of 100 ms (the
    marker from one step function's return to the next's), in each a wait for a tf.data element (the eager op,
    and its kernel nested in it) of 30, 50 and 10 ms starting at the step's start, then the step function's
    call of 40 ms starting 5 ms after the wait; an inter-op thread running the function's ops (20 ms inside
    each call); a tf.data thread producing during the whole of each step (never the step's own); and a device
    plane, not converted."""
    cls = _tftrace.xplane_class()
    space = cls()
    env = space.planes.add(id=1, name="Task Environment")
    env.stat_metadata[1].id, env.stat_metadata[1].name = 1, "profile_start_time"
    env.stats.add(metadata_id=1, uint64_value=1_700_000_000_000_000_000)
    host = space.planes.add(id=0, name="/host:CPU")
    names = ["ProfilerStep", "EagerLocalExecute: IteratorGetNext", "IteratorGetNextOp::DoCompute", "train_step",
             "sequential/dense/MatMul:MatMul", "Iterator::Root::Map"]
    for i, n in enumerate(names, 1):
        host.event_metadata[i].id, host.event_metadata[i].name = i, n
    for i, n in enumerate(["step_num", "_r", "eager_op", "IteratorGetNext"], 1):
        host.stat_metadata[i].id, host.stat_metadata[i].name = i, n
    main = host.lines.add(id=11, name="python", timestamp_ns=1000)
    inter = host.lines.add(id=12, name="tf_Compute/12", timestamp_ns=1000)
    data = host.lines.add(id=13, name="tf_data_iterator_resource/13", timestamp_ns=1000)
    for k, wait in enumerate((30, 50, 10)):
        t0 = (10 + 100 * k) * MS
        e = main.events.add(metadata_id=1, offset_ps=t0, duration_ps=100 * MS)
        e.stats.add(metadata_id=1, int64_value=k + 1)
        e.stats.add(metadata_id=2, int64_value=1)
        e = main.events.add(metadata_id=2, offset_ps=t0, duration_ps=wait * MS)
        e.stats.add(metadata_id=3, ref_value=4)
        main.events.add(metadata_id=3, offset_ps=t0 + MS, duration_ps=(wait - 2) * MS)
        main.events.add(metadata_id=4, offset_ps=t0 + (wait + 5) * MS, duration_ps=40 * MS)
        inter.events.add(metadata_id=5, offset_ps=t0 + (wait + 10) * MS, duration_ps=20 * MS)
        data.events.add(metadata_id=6, offset_ps=t0, duration_ps=100 * MS)
    gpu = space.planes.add(id=2, name="/device:GPU:0")
    gpu.lines.add(id=1, name="Stream #1").events.add(metadata_id=1, offset_ps=0, duration_ps=MS)
    return space


def test_the_conversion_keeps_every_host_event_and_marks_the_steps():
    doc = _tftrace.to_chrome(_space())
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == 3 * 6
    steps = sorted((e["name"], e["ts"], e["dur"], e["args"]) for e in xs if e["name"].startswith("ProfilerStep"))
    assert steps == [(f"ProfilerStep#{k + 1}", 1.0 + (10 + 100 * k) * 1000.0, 100_000.0, {"step_num": k + 1, "_r": 1})
                     for k in range(3)]
    wait = [e for e in xs if e["name"] == "EagerLocalExecute: IteratorGetNext"]
    assert [e["args"] for e in wait] == [{"eager_op": "IteratorGetNext"}] * 3     # (a ref_value, by name)
    assert {e["cat"] for e in xs if e["name"] == "Iterator::Root::Map"} == {"tf_data"}
    threads = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads == {"python", "tf_Compute/12", "tf_data_iterator_resource/13"}
    assert doc["baseTimeNanoseconds"] == 1_700_000_000_000_000_000
    assert doc["teye"] == {"framework": "tensorflow", "device_planes_not_converted": ["/device:GPU:0"]}


def test_the_summary_of_a_converted_trace_splits_each_step_as_placed():
    """Per step of 100 ms: the wait (30, 50, 10 ms) is data; the step function's call (40 ms) and the op inside
    it on another thread (20 ms, inside the call) compute; the tf.data thread's production is neither; the
    rest (the 5 ms before the call, and after it) a host gap."""
    res = S.summarize(_tftrace.to_chrome(_space()), "x.tf.trace.json")
    assert [r["step"] for r in res["steps"]] == [1, 2, 3]
    for r, wait in zip(res["steps"], (30, 50, 10)):
        assert r["duration_s"] == pytest.approx(0.1)
        assert r["host"]["data_wait"] == pytest.approx(wait / 100)
        assert r["host"]["compute"] == pytest.approx(0.4)
        assert r["host"]["gap"] == pytest.approx((60 - wait) / 100)
    assert res["overall"]["host"]["data_wait"] == pytest.approx(0.3)
    assert res["device_traced"] is False
    top = {o["name"]: o for o in res["top_ops"]}
    assert top["train_step"]["self_s"] == pytest.approx(0.12) and top["train_step"]["calls"] == 3
    assert "Iterator::Root::Map" not in top


def test_an_xspace_file_is_refused_with_where_its_conversion_is():
    with pytest.raises(S.TraceError, match=r"writes one beside it \(\.tf\.trace\.json"):
        S.load("/nonexistent/host.xplane.pb")


# -- the profile in the Tracer ----------------------------------------------------------------------------------

class FakeExperimental:
    """tf.profiler.experimental, as far as TfProfile uses it: start and stop write nothing, each Trace is
    remembered with its arguments and whether it stopped."""

    def __init__(self, start_error=None):
        self.start_error, self.started, self.stopped, self.marks = start_error, [], 0, []

    def start(self, logdir):
        if self.start_error:
            raise self.start_error
        self.started.append(logdir)

    def stop(self):
        self.stopped += 1
        space = _space()
        d = os.path.join(self.started[-1], "plugins", "profile", "2026_11_30_00_00_00")
        os.makedirs(d)
        with open(os.path.join(d, "node.xplane.pb"), "wb") as f:
            f.write(space.SerializeToString())

    def Trace(self, name, **kw):
        mark = FakeMark(name, kw)
        self.marks.append(mark)
        return mark


class FakeMark:
    def __init__(self, name, kw):
        self.name, self.kw, self.exited = name, kw, False

    def __exit__(self, *exc):
        self.exited = True


class FakeTf:
    def __init__(self, experimental):
        self.profiler = type("P", (), {"experimental": experimental})()


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    req, out = make_dirs(tmp_path)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(_tftrace.tempfile, "tempdir", str(tmp))
    monkeypatch.setattr(_trace, "CHECK_EVERY_NS", 0)
    monkeypatch.setattr(_trace, "START_MARGIN_S", 0)
    return req, out, str(tmp)


def _ask(d, out, **over):
    r = dict(id="r1", steps=3, output=out, start_after=time.time() - 1, expires=time.time() + 60, ranks=None)
    r.update(over)
    _trace._write_private(os.path.join(d, "job.json"), json.dumps(r).encode())


def _status(d):
    [name] = [n for n in os.listdir(d) if n.endswith(".status.json")]
    with open(os.path.join(d, name)) as f:
        return json.load(f)


def test_a_tensorflow_trace_keeps_the_xspace_beside_its_conversion_and_removes_its_private_directory(dirs):
    d, out, tmp = dirs
    exp = FakeExperimental()
    t = _trace.Tracer("job", 0, lambda steps: _tftrace.TfProfile(FakeTf(exp), steps), directory=d)
    _ask(d, out)
    for _ in range(30):
        t.tick()
    st = _status(d)
    stem = os.path.join(out, f"job.r1.{t.node}.rank0")
    assert st["state"] == "done" and st["trace"] == stem + ".tf.trace.json" and st["raw"] == [stem + ".xplane.pb"]
    assert sorted(os.listdir(out)) == ["job.r1.%s.rank0.%s" % (t.node, s) for s in ("tf.trace.json", "xplane.pb")]
    assert all(os.stat(os.path.join(out, n)).st_mode & 0o777 == 0o600 for n in os.listdir(out))
    assert os.listdir(tmp) == [] and exp.stopped == 1
    # each traced step marked once, numbered from 1, every marker closed
    assert [(m.name, m.kw, m.exited) for m in exp.marks] == [("ProfilerStep", {"step_num": n, "_r": 1}, True)
                                                             for n in (1, 2, 3)]
    with open(st["trace"]) as f:
        assert S.summarize(json.load(f))["overall"]["steps"] == 3


def test_a_profiler_already_running_in_the_job_fails_the_trace_and_leaves_nothing(dirs):
    d, out, tmp = dirs
    exp = FakeExperimental(start_error=RuntimeError("Another profiler is running."))
    t = _trace.Tracer("job", 0, lambda steps: _tftrace.TfProfile(FakeTf(exp), steps), directory=d)
    _ask(d, out)
    for _ in range(30):
        t.tick()                                     # (never raises into the loop)
    st = _status(d)
    assert st["state"] == "failed" and "Another profiler is running." in st["reason"]
    assert os.listdir(out) == [] and os.listdir(tmp) == [] and t.req is None


def test_the_byte_bound_counts_the_xspace_too_and_removes_both(dirs):
    d, out, tmp = dirs
    xspace = len(_space().SerializeToString())
    chrome = len(json.dumps(_tftrace.to_chrome(_space()), separators=(",", ":")))
    assert xspace < chrome
    exp = FakeExperimental()
    t = _trace.Tracer("job", 0, lambda steps: _tftrace.TfProfile(FakeTf(exp), steps), directory=d)
    _ask(d, out, max_bytes=chrome + xspace - 1)      # each file alone is within it, the two are not
    for _ in range(30):
        t.tick()
    st = _status(d)
    assert st["state"] == "failed" and f"over the request's bound of {chrome + xspace - 1}" in st["reason"]
    assert os.listdir(out) == [] and os.listdir(tmp) == []
