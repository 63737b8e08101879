"""The job table: credentials-based naming, limits, expiry, the sliding window, and the exported series."""
from __future__ import annotations

import pwd

import pytest
from prometheus_client import generate_latest

from agent.phases.jobs import JobTable
from agent.phases.protocol import encode
from agent.phases.source import PhasesReading
from agent.sampler import Sampler
from exporters.prometheus import make_registry
from tests.conftest import parse_exposition
from tests.phases.helpers import MS, S, ctx_with_clock, phases_cfg

NOBODY = pwd.getpwnam("nobody").pw_uid


def _step(t, wait_ms, compute_ms, samples=32):
    """One step's phases and step record starting at t; returns (phases, steps, end)."""
    a = t + wait_ms * MS
    b = a + compute_ms * MS
    return [("data_wait", t, a), ("compute", a, b)], [(t, b, samples)], b


class _Src:
    """Hands a fixed reading to the sampler, to see the table through the real exporter."""

    name = "phases"

    def __init__(self, reading):
        self.reading = reading

    def collect(self):
        return self.reading


def _exposition(table, now):
    views, results, attributed, pending = table.views(now)
    sampler = Sampler({"phases": (_Src(PhasesReading(views, results, attributed, pending)), 1.0)})
    sampler.read_once("phases")
    return parse_exposition(generate_latest(make_registry(lambda: sampler.snapshot)).decode())


def _get(values, name, **labels):
    return values[(name, tuple(sorted(labels.items())))]


def test_metrics_of_one_job_through_the_exporter():
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(), ctx, own_uid=0)
    t = clock.t - 10 * S
    for _ in range(10):
        phases, steps, t = _step(t, 60, 40)
        assert table.handle(encode("resnet", phases, steps, dropped=3), 321, 0) == "accepted"
    table.handle(encode("resnet", [("eval", t, t + 200 * MS), ("sleepy", t + 200 * MS, t + 300 * MS)]), 322, 0)
    m = _exposition(table, clock.t)
    assert _get(m, "teye_job_phase_seconds_total", train_job="resnet", phase="data_wait") == pytest.approx(0.6)
    assert _get(m, "teye_job_phase_seconds_total", train_job="resnet", phase="compute") == pytest.approx(0.4)
    assert _get(m, "teye_job_phase_seconds_total", train_job="resnet", phase="eval") == pytest.approx(0.2)
    assert _get(m, "teye_job_phase_seconds_total", train_job="resnet", phase="other") == pytest.approx(0.1)
    assert _get(m, "teye_job_steps_total", train_job="resnet") == 10
    assert _get(m, "teye_job_samples_total", train_job="resnet") == 320
    assert _get(m, "teye_job_input_bound_ratio", train_job="resnet") == pytest.approx(0.6)
    assert _get(m, "teye_job_bottleneck", train_job="resnet", kind="input") == 1
    assert sum(_get(m, "teye_job_bottleneck", train_job="resnet", kind=k)
               for k in ("input", "host", "communication", "compute", "idle")) == 1
    assert _get(m, "teye_job_step_seconds_bucket", train_job="resnet", le="0.1") == 10
    assert _get(m, "teye_job_step_seconds_bucket", train_job="resnet", le="0.05") == 0
    assert _get(m, "teye_job_step_seconds_sum", train_job="resnet") == pytest.approx(1.0)
    assert _get(m, "teye_job_info", train_job="resnet", user="root", uid="0", pid="321", source="client",
                namespace="", pod="") == 1
    assert _get(m, "teye_job_processes", train_job="resnet") == 2
    assert _get(m, "teye_job_client_dropped_total", train_job="resnet") == 3
    assert _get(m, "teye_phase_messages_total", result="accepted") == 11
    assert _get(m, "teye_phase_jobs") == 1
    assert not any(k[0].startswith("teye_job") and ("job", "resnet") in k[1] for k in m)


def test_another_uid_cannot_add_to_or_squat_on_a_trusted_job():
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(), ctx, own_uid=0)
    t = clock.t - S
    phases, steps, _ = _step(t, 10, 10)
    # nobody comes first, claiming root's job name; then root's own job reports
    assert table.handle(encode("resnet", phases * 5, steps * 5), 900, NOBODY) == "accepted"
    assert table.handle(encode("resnet", phases, steps), 100, 0) == "accepted"
    views = {v.train_job: v for v in table.views(clock.t)[0]}
    assert set(views) == {"resnet", "nobody/resnet"}
    assert views["resnet"].steps == 1 and views["resnet"].uid == 0
    assert views["nobody/resnet"].steps == 5 and views["nobody/resnet"].user == "nobody"


def test_trusted_uids_from_config_keep_their_names():
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(trusted_uids=[NOBODY]), ctx, own_uid=0)
    table.handle(encode("a", [("compute", clock.t - 10, clock.t)]), 5, NOBODY)
    table.handle(encode("a", [("compute", clock.t - 10, clock.t)]), 6, 0)  # same name, other trusted uid
    assert sorted(v.train_job for v in table.views(clock.t)[0]) == ["a", "root/a"]


def test_job_limits_and_expiry():
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(max_jobs=4, max_jobs_per_user=3, job_expiry_seconds=60.0), ctx, own_uid=0)
    msg = lambda name: encode(name, [("compute", clock.t - 10, clock.t)])  # noqa: E731
    assert [table.handle(msg(f"j{i}"), 1, 0) for i in range(4)] == ["accepted"] * 3 + ["job_limit"]
    assert table.handle(msg("x"), 2, NOBODY) == "accepted"         # the table is full now
    # uid 0 holds 3 of 4, two more than nobody: over its share, its least recently active job (j0) goes
    assert table.handle(msg("y"), 2, NOBODY) == "accepted"
    assert sorted(v.train_job for v in table.views(clock.t)[0]) == ["j1", "j2", "nobody/x", "nobody/y"]
    assert table.handle(msg("z"), 2, NOBODY) == "job_limit"        # 2 and 2: nobody is over its share
    assert table.handle(msg("j0"), 1, 0) == "job_limit"            # ... in either direction
    assert table.handle(msg("j1"), 1, 0) == "accepted"             # known jobs keep reporting
    clock.t += 30 * S
    table.handle(msg("j1"), 1, 0)
    clock.t += 31 * S                                              # j2, nobody/x and y are silent for 61 s
    assert sorted(v.train_job for v in table.views(clock.t)[0]) == ["j1"]
    assert table.handle(msg("z"), 2, NOBODY) == "accepted"         # room again
    assert dict(table.views(clock.t)[1])["job_limit"] == 3


def test_input_bound_ratio_is_over_the_sliding_window():
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(window_seconds=30.0), ctx, own_uid=0)
    t = clock.t
    for _ in range(100):  # 10 s of input-bound steps: 80 ms waiting, 20 ms computing
        clock.t = t
        phases, steps, t = _step(t, 80, 20)
        table.handle(encode("j", phases, steps), 1, 0)
    view = table.views(clock.t)[0][0]
    assert view.input_bound_ratio == pytest.approx(0.8) and view.verdict.kind == "input"
    for _ in range(300):  # then 30 s after a fix: 5 ms waiting, 95 ms computing
        clock.t = t
        phases, steps, t = _step(t, 5, 95)
        table.handle(encode("j", phases, steps), 1, 0)
    view = table.views(clock.t)[0][0]
    assert view.input_bound_ratio == pytest.approx(0.05, abs=0.01)  # the old steps left the window
    assert view.verdict.kind == "compute"
    assert dict(view.phase_seconds)["data_wait"] == pytest.approx(8.0 + 1.5)  # totals keep everything
    clock.t += 40 * S
    view = table.views(clock.t)[0][0]
    assert view.verdict.kind == "idle" and view.input_bound_ratio is None


def test_step_seconds_counters_leave_a_compile_inside_a_step_out():
    """One definition of step time (issue 47, agent/phases/definitions.py): a compile a client sends inside
    a step is out of teye_job_step_seconds_sum and teye_job_rank_step_seconds_total, as it is out of the
    shares, so every view that reads the counters (report, rules) has the agent's step time.  Truth by
    hand: 10 steps of 60 ms data_wait + 40 ms compute, the third with 300 ms of compile inside it (sent
    per step), and 4 more steps in a version-2 window of 8 ms with 2 ms of compile inside it."""
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(), ctx, own_uid=0)
    t = clock.t - 10 * S
    for i in range(10):
        phases, steps, end = _step(t, 60, 40)
        if i == 2:   # the step's compile: 300 ms between its wait and its compute
            a = t + 60 * MS
            phases = [("data_wait", t, a), ("compile", a, a + 300 * MS), ("compute", a + 300 * MS, end + 300 * MS)]
            end += 300 * MS
            steps = [(t, end, 32)]
        assert table.handle(encode("c", phases, steps, rank=0, world=1), 321, 0) == "accepted"
        t = end
    s, e = t, t + 8 * MS
    assert table.handle(encode("c", rank=0, world=1, sums=[(s, e, 4, 8, 8 * MS, (("data_wait", 4 * MS, 4 * MS),
                                                                    ("compile", 2 * MS, 2 * MS),
                                                                    ("compute", 2 * MS, 2 * MS)), (4,))]),
                        321, 0) == "accepted"
    m = _exposition(table, clock.t)
    assert _get(m, "teye_job_step_seconds_sum", train_job="c") == pytest.approx(1.0 + 0.006)
    assert _get(m, "teye_job_rank_step_seconds_total", train_job="c", rank="0") == pytest.approx(1.0 + 0.006)
    assert _get(m, "teye_job_phase_seconds_total", train_job="c", phase="compile") == pytest.approx(0.302)
    # the share the agent's gauge gives is the same data_wait over that time
    assert _get(m, "teye_job_input_bound_ratio", train_job="c") == pytest.approx(0.604 / 1.006)
    # the compiled step is a 100 ms step in the histogram, not a 400 ms one
    assert _get(m, "teye_job_step_seconds_bucket", train_job="c", le="0.25") == 14
