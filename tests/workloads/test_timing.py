"""PhaseTimer: exact phase/step bookkeeping with a fake clock, forwarding to a sink (no TensorFlow)."""
from __future__ import annotations

import json
import os
import socket
import sys

import pytest

from workloads.timing import PhaseTimer, percentile
from tests.workloads.sinks import RecordingSink


class FakeClock:
    def __init__(self, t=1_000_000_000):
        self.t = t

    def __call__(self):
        return self.t

    def advance(self, ns):
        self.t += ns




def run_loop(timer, clock, plan):
    """plan: per step a list of (phase, duration_ns) plus a gap after the phases."""
    for phases, gap in plan:
        for name, dur in phases:
            with timer.phase(name):
                clock.advance(dur)
        clock.advance(gap)
        timer.step(samples=8)


def test_phases_and_steps_recorded_and_forwarded_exactly():
    clock, sink = FakeClock(), RecordingSink()
    timer = PhaseTimer(sink=sink, clock=clock)
    t0 = clock.t
    plan = [([("data_wait", 30), ("compute", 50), ("host", 20)], 0),
            ([("data_wait", 10), ("compute", 60), ("host", 5)], 25)]
    run_loop(timer, clock, plan)
    assert sink.phases == [("data_wait", t0, t0 + 30), ("compute", t0 + 30, t0 + 80), ("host", t0 + 80, t0 + 100),
                           ("data_wait", t0 + 100, t0 + 110), ("compute", t0 + 110, t0 + 170),
                           ("host", t0 + 170, t0 + 175)]
    # steps are contiguous: the second starts where the first ended and includes the 25 ns gap
    assert sink.steps == [(t0, t0 + 100, 8), (t0 + 100, t0 + 200, 8)]
    assert [s.phases_ns for s in timer.steps] == [
        (("data_wait", 30), ("compute", 50), ("host", 20)), (("data_wait", 10), ("compute", 60), ("host", 5))]


def test_summary_statistics_against_hand_computed_values():
    clock = FakeClock()
    timer = PhaseTimer(clock=clock)
    ms = 1_000_000
    # warm-up step (slow, excluded), then steps of 10, 20, 30, 40 ms with 5, 0, 15, 0 ms of data wait
    plan = [([("data_wait", 500 * ms), ("compute", 500 * ms)], 0),
            ([("data_wait", 5 * ms), ("compute", 5 * ms)], 0),
            ([("compute", 20 * ms)], 0),
            ([("data_wait", 15 * ms), ("compute", 15 * ms)], 0),
            ([("compute", 30 * ms), ("host", 10 * ms)], 0)]
    run_loop(timer, clock, plan)
    s = timer.summary(warmup_steps=1)
    assert s.steps == 4 and s.warmup_steps == 1 and s.samples == 32
    assert s.wall_s == pytest.approx(0.100)
    assert s.samples_per_s == pytest.approx(320.0)
    assert s.step_time_p50_s == pytest.approx(0.025)         # median of 10, 20, 30, 40 ms
    assert s.step_time_p95_s == pytest.approx(0.0385)        # 30 + 0.85 * 10 ms (linear interpolation)
    assert s.input_wait_fraction == pytest.approx(0.20)      # 20 ms of 100 ms
    assert s.phase_seconds == pytest.approx({"data_wait": 0.020, "compute": 0.070, "host": 0.010})


def test_percentile_matches_numpy_linear_method():
    np = pytest.importorskip("numpy")
    xs = [0.3, 0.1, 0.7, 0.2, 0.9, 0.4]
    for q in (0, 5, 50, 95, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    with pytest.raises(ValueError):
        percentile(xs, 101)


def test_phase_kept_when_block_raises_and_bad_intervals_rejected():
    clock = FakeClock()
    timer = PhaseTimer(clock=clock)
    with pytest.raises(StopIteration):
        with timer.phase("data_wait"):
            clock.advance(7)
            raise StopIteration
    timer.step(samples=0)
    assert timer.steps[0].phases_ns == (("data_wait", 7),)
    with pytest.raises(ValueError, match="ends before it starts"):
        timer.record_phase("compute", 10, 5)
    with pytest.raises(ValueError, match="samples"):
        timer.step(samples=-1)


def test_restart_excludes_pauses_between_steps():
    clock = FakeClock()
    timer = PhaseTimer(clock=clock)
    run_loop(timer, clock, [([("compute", 100)], 0)])
    clock.advance(10_000)       # e.g. evaluation between epochs
    timer.restart()
    run_loop(timer, clock, [([("compute", 100)], 0)])
    assert [s.end_ns - s.start_ns for s in timer.steps] == [100, 100]


@pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="needs Unix sockets")
def test_forwarding_through_the_real_phase_reporter(tmp_path):
    """The sink contract with workloads.phases.Reporter: the datagram (docs/phases.md) carries
    exactly the intervals the timer recorded."""
    from workloads.phases import Reporter

    path = os.path.join(tmp_path, "p.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(path)
    srv.settimeout(5)
    try:
        rep = Reporter(train_job="wl-test", socket_path=path)
        timer = PhaseTimer(sink=rep)
        with timer.phase("data_wait"):
            pass
        with timer.phase("compute"):
            pass
        rec = timer.step(samples=16)
        rep.close()
        msg = json.loads(srv.recv(65536))
    finally:
        srv.close()
    assert msg["job"] == "wl-test"
    assert [p[0] for p in msg["phases"]] == ["data_wait", "compute"]
    assert msg["steps"] == [[rec.start_ns, rec.end_ns, 16]]
    assert msg["phases"][0][1] == rec.start_ns


def test_timing_and_data_import_without_tensorflow():
    import subprocess
    code = ("import sys; import workloads, workloads.timing, workloads.data, workloads.pipelines, "
            "workloads.train, workloads.sweep, workloads.launch, workloads.phases; "
            "sys.exit(1 if 'tensorflow' in sys.modules or 'keras' in sys.modules else 0)")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert subprocess.run([sys.executable, "-c", code], cwd=root).returncode == 0
