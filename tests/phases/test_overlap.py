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
    w = (t, t + 8 * MS, 4, 32, 6 * MS, [["data_wait", 86_400 * S, 5 * MS], ["x", 6 * MS, 0], ["y", 6 * MS, 0]], [4])
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


# -- windows of fast steps (version 2): a process's windows merged with its earlier windows ----------------------
# A window is [start, end, steps, samples, step_ns, [[phase, ns, in_step_ns], ...], [steps per bucket]]; the
# oracles below are the windows' own figures, written out by hand, and for random windows a sweep over every
# boundary that finds what of each window's span the earlier ones left uncovered.

WIN_STEPS, WIN_SAMPLES = 4, 32


def _win(a, length=8 * MS, steps=WIN_STEPS, samples=WIN_SAMPLES, step_ns=6 * MS, dw=2 * MS, cp=4 * MS):
    """A window of 4 steps of 1.5 ms (bucket 0.005 s) starting at a: data_wait 2 ms, compute 4 ms."""
    return (a, a + length, steps, samples, step_ns, [["data_wait", dw, dw // 2], ["compute", cp, cp]], [steps])


def _figures(table, clock, job="j"):
    got, view = _phases(table, clock, job)
    return {"data_wait": got.get("data_wait", 0.0), "compute": got.get("compute", 0.0), "steps": view.steps,
            "samples": view.samples, "step_s": view.step_hist.sum, "hist": view.step_hist.buckets[0][1]}


def _want(f):
    """One window's figures (_win's defaults) times f."""
    return {"data_wait": pytest.approx(0.002 * f, abs=1e-12), "compute": pytest.approx(0.004 * f, abs=1e-12),
            "steps": WIN_STEPS * f, "samples": WIN_SAMPLES * f, "step_s": pytest.approx(0.006 * f, abs=1e-12),
            "hist": WIN_STEPS * f}


def test_1000_copies_of_one_window_add_exactly_one_window():
    table, ctx, clock = _table(attribution_max_delay_seconds=60.0)
    t = clock.t - 5 * S
    ctx.gpu_pids[10] = frozenset({"0"})
    ctx.timeline.add("0", t - S, t + S, 0.25)   # one sample around the window: idle = 0.75 x its phase's time
    w = _win(t)
    for _ in range(10):   # in ten datagrams of 100 copies each
        assert table.handle(encode("j", sums=[w] * 100, rank=0, world=1), 10, 0) == "accepted"
    table.attribute(clock.t, force=True)
    assert _figures(table, clock) == _want(1)
    view = _phases(table, clock)[1]
    (rank,) = view.ranks
    assert rank.steps == WIN_STEPS and dict(rank.phase_seconds)["data_wait"] == pytest.approx(0.002, abs=1e-12)
    # the window's sums: its in-step data_wait (1 ms) over its steps' time (6 ms), once
    assert view.evidence.phase_seconds["data_wait"] == pytest.approx(0.001, abs=1e-12)
    assert view.input_bound_ratio == pytest.approx(1 / 6, rel=1e-9)
    idle = {p: s for g, p, s in view.gpu_idle_seconds if g == "0"}
    assert idle["data_wait"] == pytest.approx(0.75 * 0.002, abs=1e-9)
    assert idle["compute"] == pytest.approx(0.75 * 0.004, abs=1e-9)


@pytest.mark.parametrize("order", ["in order", "reversed"])
def test_two_windows_overlapping_by_half_add_one_and_a_half_windows(order):
    table, _, clock = _table()
    t = clock.t - 5 * S
    ws = [_win(t), _win(t + 4 * MS)]   # 8 ms each, the second from the first's middle: 12 ms of span in all
    for w in (ws if order == "in order" else ws[::-1]):
        assert table.handle(encode("j", sums=[w]), 10, 0) == "accepted"
    assert _figures(table, clock) == _want(1.5)


def test_windows_of_two_processes_are_never_merged():
    table, _, clock = _table()
    t = clock.t - 5 * S
    for pid, rank in ((10, 0), (11, 1)):
        for _ in range(3):
            table.handle(encode("ddp", sums=[_win(t)], rank=rank, world=2), pid, 0)
    got, view = _phases(table, clock, "ddp")
    assert got["data_wait"] == pytest.approx(0.004, abs=1e-12)   # each process's own 2 ms once
    assert [r.steps for r in view.ranks] == [WIN_STEPS, WIN_STEPS]
    assert view.samples == 2 * WIN_SAMPLES
    # (the job's global steps count a step when its first rank makes it: 4)
    assert view.steps == WIN_STEPS


def test_a_window_overlapping_the_last_by_a_microsecond_loses_no_step():
    """Its steps and samples in proportion, rounded to the nearest: all of them here; its phases' time in
    proportion, rounded down."""
    table, _, clock = _table()
    t = clock.t - 5 * S
    table.handle(encode("j", sums=[_win(t), _win(t + 8 * MS - 1000)]), 10, 0)
    fig = _figures(table, clock)
    assert (fig["steps"], fig["samples"], fig["hist"]) == (2 * WIN_STEPS, 2 * WIN_SAMPLES, 2 * WIN_STEPS)
    share = (8 * MS - 1000) / (8 * MS)
    assert fig["data_wait"] == pytest.approx(0.002 * (1 + share), abs=1e-12)
    assert fig["step_s"] == pytest.approx(0.006 * (1 + share), abs=1e-12)


def test_a_window_and_an_interval_of_one_process_are_not_merged_with_each_other():
    """The documented rule: a window is merged with the process's earlier windows, an interval with its earlier
    intervals of that phase, never one with the other (a window does not say where in its span its phases
    lie; the client sends a step either way, never both).  A phase's counter of one process thus grows by at
    most its wall time from intervals plus its wall time from windows."""
    table, _, clock = _table()
    t = clock.t - 5 * S
    for _ in range(3):   # each kind three times, interleaved, in one datagram and in separate ones
        table.handle(encode("j", [("data_wait", t, t + 8 * MS)], sums=[_win(t)]), 10, 0)
        table.handle(encode("j", sums=[_win(t)]), 10, 0)
        table.handle(encode("j", [("data_wait", t, t + 8 * MS)]), 10, 0)
    got = _phases(table, clock)[0]
    assert got["data_wait"] == pytest.approx(0.008 + 0.002, abs=1e-12)


def test_a_reversed_window_is_rejected_and_counts_nothing():
    table, _, clock = _table()
    t = clock.t - 5 * S
    assert table.handle(encode("j", sums=[_win(t)]), 10, 0) == "accepted"
    bad = (t + 8 * MS, t, 4, 32, 6 * MS, [["data_wait", 2 * MS, MS]], [4])
    assert table.handle(encode("j", sums=[bad]), 10, 0) == "bad_interval"
    assert _figures(table, clock) == _want(1)


def test_a_window_of_no_span_counts_its_steps_once_and_no_time():
    """Its phases are held at its span (0) by the decoder, its steps' time here; its copies add nothing.  (One
    step: a window of no span holds no more, issue 48.)"""
    table, _, clock = _table()
    t = clock.t - 5 * S
    w = (t, t, 1, 8, 3 * MS, [["data_wait", 2 * MS, MS]], [1])
    for _ in range(5):
        assert table.handle(encode("j", sums=[w, w]), 10, 0) == "accepted"
    got, view = _phases(table, clock)
    assert (view.steps, view.samples, view.step_hist.sum) == (1, 8, 0.0)
    assert got.get("data_wait", 0.0) == 0.0


def test_a_windows_phase_above_its_span_is_held_there_and_its_copies_add_nothing():
    table, _, clock = _table()
    t = clock.t - 5 * S
    w = _win(t, dw=86_400 * S, cp=9 * MS, step_ns=20 * MS)   # a day of data_wait, 9 ms of compute, 20 ms of
    for _ in range(4):                                        # steps (4 of 5 ms): all in 8 ms of span
        assert table.handle(encode("j", sums=[w] * 3), 10, 0) == "accepted"
    got, view = _phases(table, clock)
    assert got["data_wait"] == pytest.approx(0.008, abs=1e-12) and got["compute"] == pytest.approx(0.008, abs=1e-12)
    assert view.steps == WIN_STEPS and view.step_hist.sum == pytest.approx(0.008, abs=1e-12)


def test_window_memory_is_bounded_and_a_copy_of_a_forgotten_window_adds_nothing():
    table, _, clock = _table()
    t = clock.t - 100 * S
    for k in range(1000):   # disjoint windows: one span each
        table.handle(encode("j", sums=[_win(t + k * 10 * MS)]), 10, 0)
    (job,) = table._jobs.values()
    (covers,) = job.cover.values()
    assert len(covers[jobs.WINDOWS].ends) == COVER_SPANS
    assert all(c is None for c in covers[:jobs.WINDOWS])   # no interval was sent
    before = _figures(table, clock)
    assert before == _want(1000)
    table.handle(encode("j", sums=[_win(t)]), 10, 0)   # long forgotten: counted as covered
    assert _figures(table, clock) == before


def _uncovered(span, earlier):
    """ns of span = (a, b) that no span in earlier covers, by a sweep over every boundary."""
    a, b = span
    cuts = sorted({a, b} | {x for x, _ in earlier if a < x < b} | {y for _, y in earlier if a < y < b})
    return sum(hi - lo for lo, hi in zip(cuts, cuts[1:]) if not any(x <= lo and hi <= y for x, y in earlier))


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_random_overlapping_windows_count_their_uncovered_share_and_never_more_than_time(seed):
    rng = random.Random(seed)
    table, _, clock = _table()
    t = clock.t - 5 * S
    sent, want_dw, want_steps = [], 0, 0
    for _ in range(60):   # 3-10 ms windows within 40 ms: at most 13 disjoint spans, all remembered
        a = t + rng.randrange(0, 30_000) * 1000
        length = rng.randrange(3_000, 10_001) * 1000
        n = rng.randrange(1, 9)
        dw = rng.randrange(0, length + 1)
        # n steps of at most 5 ms (their bucket): at most n x 5 ms of step time (issue 48)
        w = (a, a + length, n, 8 * n, rng.randrange(0, min(length, n * 5 * MS) + 1), [["data_wait", dw, 0]], [n])
        if sent and rng.random() < 0.3:
            w = rng.choice(sent)   # a copy of an earlier one
        new = _uncovered((w[0], w[1]), [(x[0], x[1]) for x in sent])
        span = w[1] - w[0]
        want_dw += w[5][0][1] * new // span
        want_steps += (2 * w[2] * new + span) // (2 * span)
        sent.append(w)
        assert table.handle(encode("j", sums=[w]), 10, 0) == "accepted"
    got, view = _phases(table, clock)
    assert got["data_wait"] == pytest.approx(want_dw / S, abs=1e-12)
    assert view.steps == want_steps
    union = _uncovered((t - S, t + S), []) - _uncovered((t - S, t + S), [(x[0], x[1]) for x in sent])
    assert got["data_wait"] <= union / S + 1e-12 and view.step_hist.sum <= union / S + 1e-12
    assert sum(x[5][0][1] for x in sent) / S > union / S   # the raw sum would have run faster than time
