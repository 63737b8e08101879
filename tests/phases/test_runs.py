"""One run per run (issue 29, item 5): a job name whose processes have all exited and that has been
silent, reused by new processes, starts a new run; the ended run stays exported unchanged until it
expires or gives way.  Which processes run is the test's to say (``alive``), at the narrowest boundary;
process_alive itself is checked on real processes, a zombie among them.  Every test runs on the C
job-table path and on _apply, its specification."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from agent.phases.jobs import RUN_END_SILENCE_NS, JobTable, process_alive
from agent.phases.protocol import encode
from tests.phases.helpers import MS, NOBODY, S, ctx_with_clock, phases_cfg


class Processes:
    def __init__(self):
        self.running = set()

    def __call__(self, pid: int) -> bool:
        return pid in self.running


def _table(**cfg):
    ctx, clock = ctx_with_clock()
    ctx.wall_clock = lambda: 1.7e9 + clock.t / 1e9
    procs = Processes()
    return JobTable(phases_cfg(**cfg), ctx, own_uid=0, alive=procs), clock, procs


def _steps(table, clock, pid, n, samples, name="j"):
    """n steps of 30 ms data_wait + 70 ms compute from pid, each sent when it ends."""
    for _ in range(n):
        t = clock.t
        clock.t += 100 * MS
        msg = encode(name, [("data_wait", t, t + 30 * MS), ("compute", t + 30 * MS, clock.t)],
                     [(t, clock.t, samples)])
        assert table.handle(msg, pid, 0) == "accepted"


def _view(table, clock, name="j"):
    views = [v for v in table.views(clock.t)[0] if v.train_job == name]
    assert len(views) <= 1, views   # one run of a name exported at a time
    return views[0] if views else None


def test_a_name_reused_after_its_processes_exited_starts_a_new_run():
    table, clock, procs = _table()
    procs.running = {101, 102}
    _steps(table, clock, 101, 10, 32)
    _steps(table, clock, 102, 5, 32)
    first = _view(table, clock)
    assert (first.pid, first.processes, first.steps, first.samples, first.ended) == (101, 2, 15, 480, False)
    procs.running = {102}
    clock.t += 60 * S
    assert not _view(table, clock).ended            # one process still runs: the run goes on, however silent
    procs.running = set()
    clock.t += RUN_END_SILENCE_NS
    ended = _view(table, clock)
    assert ended.ended and (ended.steps, ended.samples, ended.start_time) == (15, 480, first.start_time)
    clock.t += 20 * S
    procs.running = {201}
    _steps(table, clock, 201, 4, 16)
    new = _view(table, clock)
    assert (new.pid, new.processes, new.steps, new.samples, new.ended) == (201, 1, 4, 64, False)
    assert dict(new.phase_seconds)["compute"] == pytest.approx(4 * 0.07)
    assert new.start_time == pytest.approx(first.start_time + 60 + 2 + 20 + 1.5, abs=0.01)
    assert new.train_job == first.train_job == "j"


def test_a_late_datagram_of_the_ended_run_reopens_it():
    """Queued before its process exited, read after the run ended: it belongs to that run."""
    table, clock, procs = _table()
    procs.running = {101}
    _steps(table, clock, 101, 3, 8)
    procs.running = set()
    clock.t += RUN_END_SILENCE_NS
    assert _view(table, clock).ended
    _steps(table, clock, 101, 1, 8)
    v = _view(table, clock)
    assert (v.pid, v.steps, v.samples, v.processes) == (101, 4, 32, 1)


def test_a_ranked_run_reopened_keeps_its_ranks():
    """A rank's datagrams take the Python path (per-rank sums): an ended run lets its pids go (the compiled
    receive loop comes back for the other jobs), and a late datagram that reopens it brings them back, so
    that rank's sums go on (on the compiled path, the reopening datagram itself counts for the job only)."""
    table, clock, procs = _table()
    procs.running = {101}
    t = clock.t
    msg = encode("r", [("compute", t, t + 50 * MS)], [(t, t + 50 * MS, 8)], rank=3, world=4)
    assert table.handle(msg, 101, 0) == "accepted" and 101 in table.rank_pids
    procs.running = set()
    clock.t += RUN_END_SILENCE_NS
    assert _view(table, clock, "r").ended and 101 not in table.rank_pids
    for _ in range(2):
        t = clock.t
        clock.t += 50 * MS
        assert table.handle(encode("r", [("compute", t, clock.t)], [(t, clock.t, 8)]), 101, 0) == "accepted"
        assert 101 in table.rank_pids
    v = _view(table, clock, "r")
    (rank,) = v.ranks
    assert (v.ended, v.steps, v.samples) == (False, 3, 24) and rank.rank == 3 and rank.steps >= 2


def test_a_silent_job_that_never_said_its_pid_never_ends():
    """pid 0: a sender in another pid namespace (the agent cannot see it): only expiry ends its job."""
    table, clock, procs = _table(job_expiry_seconds=300.0)
    _steps(table, clock, 0, 2, 8)
    clock.t += 299 * S
    assert not _view(table, clock).ended
    clock.t += 1 * S
    assert _view(table, clock) is None


def test_an_ended_run_stays_until_it_expires():
    table, clock, procs = _table(job_expiry_seconds=60.0)
    procs.running = {101}
    _steps(table, clock, 101, 2, 8)
    procs.running = set()
    clock.t += 59 * S
    assert _view(table, clock).ended and _view(table, clock).steps == 2
    clock.t += 1 * S
    assert _view(table, clock) is None and not table._ended and not table._per_uid


def test_ended_runs_give_way_to_a_new_job_at_the_limits():
    """An ended run never keeps a live job out for long: at max_jobs_per_user the user's oldest ended run
    goes, once it has been exported as ended for phases.ended_run_keep_seconds (and not a ns earlier)."""
    table, clock, procs = _table(max_jobs=8, max_jobs_per_user=2, ended_run_keep_seconds=30.0)
    procs.running = {1, 2}
    _steps(table, clock, 1, 1, 8, "a")
    _steps(table, clock, 2, 1, 8, "b")
    procs.running = {2}
    clock.t += RUN_END_SILENCE_NS
    table.views(clock.t)
    ended = clock.t                          # the sampler's pass that exports "a" as ended
    procs.running = {2, 3}
    c = lambda: encode("c", [("compute", clock.t - 10, clock.t)])  # noqa: E731
    assert table.handle(c(), 3, 0) == "job_limit"                   # uid 0 holds 2, "a" ended just now
    clock.t = ended + 30 * S - 1
    assert table.handle(c(), 3, 0) == "job_limit"
    assert [v.steps for v in table.views(clock.t)[0] if v.train_job == "a" and v.ended] == [1]
    clock.t = ended + 30 * S
    assert table.handle(c(), 3, 0) == "accepted"                    # exported 30 s: "a" gives way
    names = sorted((v.train_job, v.ended) for v in table.views(clock.t)[0])
    assert names == [("b", False), ("c", False)]
    t = clock.t
    assert table.handle(encode("d", [("compute", t - 10, t)]), 4, 0) == "job_limit"   # two live: full


def test_another_users_new_jobs_never_take_an_ended_run_before_its_keep_time():
    """Issue 36: new jobs of other users evicted a root job's ended run 1-2 s after it ended.  Now the
    ended run stays ended_run_keep_seconds; a flooding uid over its share loses its own jobs instead."""
    table, clock, procs = _table(max_jobs=4, max_jobs_per_user=4, ended_run_keep_seconds=30.0)
    procs.running = {1}
    _steps(table, clock, 1, 3, 8, "root-job")
    procs.running = set()
    clock.t += RUN_END_SILENCE_NS
    table.views(clock.t)
    ended = clock.t
    flood = lambda name, pid: table.handle(encode(name, [("compute", clock.t - 10, clock.t)]), pid, NOBODY)  # noqa
    procs.running = {50, 51, 52, 53, 54}
    assert [flood(f"f{i}", 50 + i) for i in range(5)] == ["accepted"] * 3 + ["job_limit"] * 2   # table full
    for step in range(29):                   # a second a new job of nobody, for 29 s: the run stays
        clock.t += S
        assert flood(f"g{step}", 60) == "job_limit"
        got = [v for v in table.views(clock.t)[0] if v.train_job == "root-job"]
        assert [(v.ended, v.steps, v.samples) for v in got] == [(True, 3, 24)]
    clock.t = ended + 30 * S
    assert flood("late", 61) == "accepted"   # the run has been exported for 30 s: it gives way now
    assert "root-job" not in [v.train_job for v in table.views(clock.t)[0]]


def test_process_alive_on_real_processes():
    assert process_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while process_alive(child.pid) and time.monotonic() < deadline:   # exited, not yet waited: a zombie
        time.sleep(0.02)
    assert not process_alive(child.pid)
    assert child.poll() == 0                                           # it was a zombie until now
    assert not process_alive(child.pid)
    assert process_alive(1)                                            # another user's (or init): it exists
