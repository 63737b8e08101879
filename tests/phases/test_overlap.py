"""Counters that never run faster than time (issue 39): a process's overlapping intervals of one phase are merged
before they are added to teye_job_phase_seconds_total, its rank's counter, the window and the GPU idle; two
processes' intervals are not merged with each other.  Oracles: hand-computed unions, and an independent sweep over
every boundary (tests.phases.helpers' style) that counts a phase once per segment whatever covers it."""
from __future__ import annotations

import random

import pytest

from agent.context import UtilSample
from agent.phases import jobs
from agent.phases.jobs import COVER_SPANS, JobTable
from agent.phases.protocol import decode_python, encode
from tests.phases.helpers import MS, S, ctx_with_clock, phases_cfg, random_samples


def _table(**cfg):
    ctx, clock = ctx_with_clock()
    return JobTable(phases_cfg(**cfg), ctx, own_uid=0), ctx, clock


def _phases(table, clock, job="j"):
    (view,) = [v for v in table.views(clock.t)[0] if v.train_job == job]
    return dict(view.phase_seconds), view


def test_1000_copies_of_one_interval_add_exactly_its_length():
    table, _, clock = _table()
    t = clock.t - 5 * S
    iv = ("data_wait", t, t + S)
    for _ in range(10):   # in ten datagrams of 100 copies each
        assert table.handle(encode("j", [iv] * 100), 10, 0) == "accepted"
    got, view = _phases(table, clock)
    assert got["data_wait"] == 1.0
    assert view.evidence.phase_seconds == {"data_wait": 1.0}   # the window's sums too (no steps: its phases)


@pytest.mark.parametrize("order", ["in order", "reversed"])
def test_two_overlapping_intervals_add_their_union(order):
    table, _, clock = _table()
    t = clock.t - 10 * S
    ivs = [("compute", t, t + 2 * S), ("compute", t + S, t + 3 * S)]
    for iv in (ivs if order == "in order" else ivs[::-1]):
        table.handle(encode("j", [iv]), 10, 0)
    assert _phases(table, clock)[0]["compute"] == 3.0


def test_an_interval_over_earlier_ones_adds_only_the_gaps_between_them():
    table, _, clock = _table()
    t = clock.t - 10 * S
    table.handle(encode("j", [("host", t, t + S), ("host", t + 2 * S, t + 3 * S), ("host", t + 5 * S, t + 6 * S)]),
                 10, 0)
    table.handle(encode("j", [("host", t + 500 * MS, t + 5500 * MS)]), 10, 0)   # fills [1, 2) and [3, 5)
    table.handle(encode("j", [("host", t, t + 6 * S)]), 10, 0)                  # nothing new
    assert _phases(table, clock)[0]["host"] == 6.0


def test_two_processes_of_one_job_are_not_merged_with_each_other():
    """Each process's own wall time: a job's counter may exceed wall time by its number of processes."""
    table, _, clock = _table()
    t = clock.t - 5 * S
    for pid, rank in ((10, 0), (11, 1)):
        for _ in range(3):
            table.handle(encode("ddp", [("data_wait", t, t + S)], rank=rank, world=2), pid, 0)
    got, view = _phases(table, clock, "ddp")
    assert got["data_wait"] == 2.0
    assert [dict(r.phase_seconds)["data_wait"] for r in view.ranks] == [1.0, 1.0]


def test_different_phases_of_one_process_are_not_merged():
    table, _, clock = _table()
    t = clock.t - 5 * S
    table.handle(encode("j", [("compute", t, t + S), ("communication", t, t + S)] * 2), 10, 0)
    got = _phases(table, clock)[0]
    assert got["compute"] == 1.0 and got["communication"] == 1.0


def test_memory_is_bounded_and_a_copy_of_a_forgotten_interval_adds_nothing():
    table, _, clock = _table()
    t = clock.t - 100 * S
    for k in range(1000):   # disjoint intervals: one span each
        table.handle(encode("j", [("data_wait", t + k * 10 * MS, t + k * 10 * MS + 5 * MS)]), 10, 0)
    (job,) = table._jobs.values()
    (covers,) = job.cover.values()
    assert len(covers[jobs.DATA_WAIT].ends) == COVER_SPANS
    before = _phases(table, clock)[0]["data_wait"]
    assert before == pytest.approx(5.0)
    # the first interval again, long forgotten: counted as covered (never more than time), not again
    table.handle(encode("j", [("data_wait", t, t + 5 * MS)]), 10, 0)
    assert _phases(table, clock)[0]["data_wait"] == before


def _union_s(ivs):
    """Total length of a union of intervals by a sweep over boundaries (independent of the code under test)."""
    cuts = sorted({a for a, _ in ivs} | {b for _, b in ivs})
    return sum(b - a for a, b in zip(cuts, cuts[1:]) if any(x <= a and b <= y for x, y in ivs)) / S


def _idle_once(samples, ivs):
    """GPU idle seconds of the union of ``ivs``: each elementary segment once, however many intervals cover it."""
    cuts = sorted({s.start_ns for s in samples} | {s.end_ns for s in samples} | {a for a, _ in ivs}
                  | {b for _, b in ivs})
    out = 0.0
    for a, b in zip(cuts, cuts[1:]):
        if not any(x <= a and b <= y for x, y in ivs):
            continue
        for smp in samples:
            if smp.start_ns <= a and b <= smp.end_ns:
                out += (1.0 - smp.busy) * (b - a) / S
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_gpu_idle_of_overlapping_intervals_is_the_idle_of_their_union(seed):
    rng = random.Random(seed)
    table, ctx, clock = _table(attribution_max_delay_seconds=60.0)
    t0, t1 = clock.t - 20 * S, clock.t - 15 * S
    samples = random_samples(rng, t0, t1, 167 * MS)
    for smp in samples:
        ctx.timeline.add("0", smp.start_ns, smp.end_ns, smp.busy)
    ctx.gpu_pids[10] = frozenset({"0"})
    want = {}
    sent = []
    for name in ("data_wait", "compute"):
        ivs = []
        for _ in range(40):   # overlapping, duplicated, in any order
            a = t0 + rng.randrange(0, 4800) * MS
            ivs.append((a, a + rng.randrange(1, 300) * MS))
        ivs += rng.sample(ivs, 10)
        sent += [(name, a, b) for a, b in ivs]
        want[name] = (_union_s(ivs), _idle_once(samples, ivs))
    rng.shuffle(sent)
    for k in range(0, len(sent), 7):
        assert table.handle(encode("j", sent[k:k + 7]), 10, 0) == "accepted"
    table.attribute(clock.t, force=True)
    got, view = _phases(table, clock)
    idle = {p: s for g, p, s in view.gpu_idle_seconds if g == "0"}
    for name, (union, idle_once) in want.items():
        assert got[name] == pytest.approx(union, abs=1e-9)
        assert idle[name] == pytest.approx(idle_once, abs=1e-9)
        # the raw sum would have counted the overlaps again
        assert sum(b - a for n, a, b in sent if n == name) / S > union + 0.1


def test_a_windows_phase_counts_at_most_its_span():
    """A sum record is not an interval: it is bounded by its own span, per phase (the decoder holds it there)."""
    table, _, clock = _table()
    t = clock.t - 5 * S
    # 8 ms of span claiming a day of data_wait (and, as two names normalised to "other", 2 x 6 ms)
    w = (t, t + 8 * MS, 4, 32, 6 * MS, [["data_wait", 86_400 * S, 5 * MS], ["x", 6 * MS, 0], ["y", 6 * MS, 0]], [0, 4])
    msg = decode_python(encode("j", sums=[w]), clock.t, table.limits)
    assert dict((n, (a, b)) for n, a, b in msg.sums[0].phases) == {"data_wait": (8 * MS, 5 * MS),
                                                                   "other": (8 * MS, 0)}
    assert table.handle(encode("j", sums=[w]), 10, 0) == "accepted"
    got = _phases(table, clock)[0]
    assert got["data_wait"] == pytest.approx(0.008) and got["other"] == pytest.approx(0.008)


def test_processes_beyond_the_tracked_64_share_one_set():
    """A job's counter of a phase stays within wall time x (tracked processes + 1)."""
    table, _, clock = _table()
    t = clock.t - 5 * S
    for pid in range(100, 100 + jobs.MAX_PIDS + 6):
        table.handle(encode("many", [("data_wait", t, t + S)]), pid, 0)
    assert _phases(table, clock, "many")[0]["data_wait"] == jobs.MAX_PIDS + 1
