"""Counters that stay possible (issue 48): a sum window's steps are bounded by its span (MIN_STEP_NS each), its
samples by MAX_SUMMED_STEP_SAMPLES a step, its bucket counts must agree with the step time it claims; a window
that breaks one is refused whole and counted as ``impossible``.  Oracles: the rules written out by hand at the
last valid and first invalid value of each, and for random windows the exported histogram checked against
what any set of real steps could give (each bucket's steps between its bounds)."""
from __future__ import annotations

import random

import pytest

from agent.phases.jobs import JobTable
from agent.phases.protocol import (MAX_SUMMED_STEP_SAMPLES, MIN_STEP_NS, RESOLUTION_NS, STEP_BUCKETS, decode,
                                   encode)
from tests.phases.helpers import MS, S, ctx_with_clock, phases_cfg

EDGE = 5 * MS   # the first bucket's bound


def _table():
    ctx, clock = ctx_with_clock()
    return JobTable(phases_cfg(), ctx, own_uid=0), clock


def _view(table, clock, job="j"):
    views = [v for v in table.views(clock.t)[0] if v.train_job == job]
    return views[0] if views else None


def _w(a, span, steps, samples, step_ns, hist):
    return (a, a + span, steps, samples, step_ns, [["compute", min(step_ns, span), min(step_ns, span)]], hist)


def test_the_issues_windows_are_refused_and_counted():
    table, clock = _table()
    t = clock.t - 5 * S
    billion = _w(t, 10 * MS, 10**9, 10**9, 0, [10**9])          # 10^9 steps of 0 ns, 10^18 samples asked
    assert table.handle(encode("j", sums=[billion]), 10, 0) == "impossible"
    inf = _w(t, 10 * MS, 2, 16, 10 * MS, [0] * 13 + [2])           # two steps over 60 s in 10 ms
    assert table.handle(encode("j", sums=[inf]), 10, 0) == "impossible"
    zeros = [_w(t + k, 0, 10**9, 0, 0, [10**9]) for k in range(1000)]
    for half in (zeros[:500], zeros[500:]):                         # (two datagrams: 64 KiB each at most)
        assert table.handle(encode("j", sums=half), 10, 0) == "impossible"
    assert table.results["impossible"] == 4 and table.results["accepted"] == 0
    assert _view(table, clock) is None                              # no job made of them


def test_zero_span_windows_a_nanosecond_apart_add_one_step_per_microsecond_at_most():
    """1,000 windows of no span at consecutive nanoseconds, one step each (each alone possible): they cover
    1,000 + 999 ns of the process's time, so at most 2 steps count; the rule's exact answer is 1 (each later
    one adds 1 ns of 1,000, rounded to no step)."""
    table, clock = _table()
    t = clock.t - 5 * S
    zeros = [_w(t + k, 0, 1, 8, 0, [1]) for k in range(1000)]
    for half in (zeros[:500], zeros[500:]):
        assert table.handle(encode("j", sums=half), 10, 0) == "accepted"
    v = _view(table, clock)
    assert (v.steps, v.samples) == (1, 8)
    assert v.steps <= (999 + MIN_STEP_NS) // MIN_STEP_NS


BOUNDARY = [
    # (what, window, result): the last valid value of each rule and the first invalid one
    ("steps = span / 1 us", (10 * MS, 10 * MS // MIN_STEP_NS, 0, 0, [10 * MS // MIN_STEP_NS]), "accepted"),
    ("steps = span / 1 us + 1", (10 * MS, 10 * MS // MIN_STEP_NS + 1, 0, 0, [10 * MS // MIN_STEP_NS + 1]), "impossible"),
    ("one step in no span", (0, 1, 0, 0, [1]), "accepted"),
    ("two steps in 1999 ns", (1999, 2, 0, 0, [2]), "impossible"),
    ("two steps in 2000 ns", (2000, 2, 0, 0, [2]), "accepted"),
    ("samples = 2^20 a step", (4 * MS, 4, 4 * MAX_SUMMED_STEP_SAMPLES, 4 * MS, [4]), "accepted"),
    ("samples = 2^20 a step + 1", (4 * MS, 4, 4 * MAX_SUMMED_STEP_SAMPLES + 1, 4 * MS, [4]), "impossible"),
    ("fast steps at 5 ms each", (10 * MS, 2, 16, 2 * EDGE, [2]), "accepted"),
    ("fast steps 1 ns over", (10 * MS, 2, 16, 2 * EDGE + 1, [2]), "impossible"),
    ("a slow step just over 5 ms", (10 * MS, 2, 16, EDGE + 1, [1, 1]), "accepted"),
    ("a slow step at 5 ms", (10 * MS, 2, 16, EDGE, [1, 1]), "impossible"),
    ("fast and slow at their most", (10 * MS, 2, 16, EDGE + RESOLUTION_NS - 1, [1, 1]), "accepted"),
    ("fast and slow 1 ns over", (10 * MS, 2, 16, EDGE + RESOLUTION_NS, [1, 1]), "impossible"),
    ("a slow step in 5 ms of span", (EDGE, 1, 8, EDGE + 1, [0, 1]), "impossible"),
    ("a slow step in 5 ms + 1 ns", (EDGE + 1, 1, 8, EDGE + 1, [0, 1]), "accepted"),
    ("trailing zero buckets", (10 * MS, 2, 16, 2 * MS, [2, 0, 0, 0]), "accepted"),
    ("a step in the third bucket", (10 * MS, 2, 16, 2 * MS, [1, 0, 1]), "impossible"),
    ("a step in +Inf", (10 * MS, 2, 16, 2 * MS, [1] + [0] * 12 + [1]), "impossible"),
]


@pytest.mark.parametrize("what, w, result", BOUNDARY, ids=[b[0] for b in BOUNDARY])
def test_each_rule_at_its_last_valid_and_first_invalid_value(what, w, result):
    table, clock = _table()
    t = clock.t - 5 * S
    span, steps, samples, step_ns, hist = w
    assert table.handle(encode("j", sums=[_w(t, span, steps, samples, step_ns, hist)]), 10, 0) == result
    assert table.results[result] == 1
    v = _view(table, clock)
    if result == "accepted":
        assert (v.steps, v.samples) == (steps, samples)
    else:
        assert v is None


def _consistent(h):
    """Whether a histogram (cumulative buckets, sum) could come from real steps: counts never decrease, and the
    sum lies between each bucket's steps at its lower bound and at its upper bound."""
    cum = [c for _, c in h.buckets]
    if any(b < a for a, b in zip(cum, cum[1:])):
        return False
    counts = [cum[0]] + [b - a for a, b in zip(cum, cum[1:])]
    bounds = (0.0,) + STEP_BUCKETS + (float("inf"),)
    lo = sum(c * bounds[i] for i, c in enumerate(counts))
    hi = sum(c * bounds[i + 1] for i, c in enumerate(counts) if c)
    return lo - 1e-9 <= h.sum <= hi + 1e-9


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_no_exported_histogram_is_inconsistent_whatever_windows_arrive(seed):
    """Random windows, overlapping and copied (so that parts of windows are counted), half of them breaking a
    rule: after each datagram the job's histogram is one real steps could give, and its count is its steps."""
    rng = random.Random(seed)
    table, clock = _table()
    t = clock.t - 5 * S
    results = {"accepted": 0, "impossible": 0, "bad_value": 0}   # (bad_value: step time over the resolution)
    sent = []
    for k in range(300):
        span = rng.choice([0, 1, 999, 1000, 2000, rng.randrange(0, RESOLUTION_NS + 1)])
        a = t + rng.randrange(0, 30 * MS)
        fast = rng.randrange(0, 6)
        slow = rng.randrange(0, 2)
        steps = max(1, fast + slow)
        if not fast + slow:
            fast = 1
        hist = [fast, slow]
        step_ns = fast * rng.randrange(0, EDGE + 1) + slow * rng.randrange(EDGE + 1, RESOLUTION_NS)
        if rng.random() < 0.5:   # break one rule, or none by chance
            rule = rng.randrange(4)
            if rule == 0:
                steps = fast = span // MIN_STEP_NS + 1 + rng.randrange(3)
                hist = [fast]
                slow = 0
            elif rule == 1:
                hist = hist + [0] * rng.randrange(0, 11) + [1]
                steps += 1
            elif rule == 2:
                step_ns = rng.randrange(0, 3 * RESOLUTION_NS)
            else:
                span = min(span, EDGE)
        w = (a, a + span, steps, 8 * steps, step_ns, [["compute", min(span, step_ns), 0]], hist)
        if sent and rng.random() < 0.3:
            w = rng.choice(sent)
        r = table.handle(encode("j", sums=[w]), 10, 0)
        assert r in results, r
        results[r] += 1
        if r == "accepted":
            sent.append(w)
        v = _view(table, clock)
        if v is not None:
            assert _consistent(v.step_hist), (k, w, v.step_hist)
            assert v.step_hist.count == v.steps
    # both kinds reached the comparison, in a useful share
    assert results["accepted"] >= 60 and results["impossible"] >= 30, results


def test_the_clients_own_windows_are_all_possible():
    """What teye_client sums (random step lengths below the resolution) is never refused: every window it makes,
    decoded by the agent, passes the rules."""
    from teye_client.reporter import Reporter
    rng = random.Random(7)
    for rate_us in (2, 5, 50, 900, 4_000, 6_000):   # (slower: one step a window, sent as intervals)
        rep = Reporter(train_job="j", socket_path="/nonexistent/teye-sec.sock", flush_ms=10**6, max_batch=10**6)
        t = 10**12
        for _ in range(400):
            d = max(MIN_STEP_NS, int(rate_us * 1000 * rng.uniform(0.5, 1.0)))
            rep.record_step(['"compute"', t, t + d // 2], t, t + d, 4)
            t += d
        with rep._lock:
            if rep._win is not None:
                rep._close_window()
            sums = list(rep._sums)
        assert sums, rate_us
        data = ('{"v":2,"job":"j","sums":[%s]}' % ",".join(sums)).encode()
        msg = decode(data, t + 1)
        assert sum(w.steps for w in msg.sums) >= 1


def test_part_of_a_slow_steps_window_keeps_its_buckets_possible():
    """Two windows of one step over 5 ms (5.5 ms of 6 ms), the second overlapping the first by half: it counts
    its step (half a step, rounded to the nearest) and half its time, 2.75 ms, which a step over 5 ms cannot
    take: that step counts in the first bucket, and the histogram stays one real steps could give."""
    table, clock = _table()
    t = clock.t - 5 * S
    a = (t, t + 6 * MS, 1, 8, 5500 * 1000, [["compute", 5 * MS, 5 * MS]], [0, 1])
    b = (t + 3 * MS, t + 9 * MS) + a[2:]
    for w in (a, b):
        assert table.handle(encode("j", sums=[w]), 10, 0) == "accepted"
    h = _view(table, clock).step_hist
    assert [c for _, c in h.buckets[:2]] == [1, 2] and h.count == 2
    assert h.sum == pytest.approx(0.00825, abs=1e-12)
    assert _consistent(h)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_windows_of_slow_steps_overlapping_at_random_keep_the_histogram_possible(seed):
    rng = random.Random(seed)
    table, clock = _table()
    t = clock.t - 5 * S
    for _ in range(200):
        span = rng.randrange(EDGE + 1, RESOLUTION_NS + 1)
        a = t + rng.randrange(0, 40 * MS)
        w = (a, a + span, 1, 8, rng.randrange(EDGE + 1, span + 1), [["compute", 0, 0]], [0, 1])
        assert table.handle(encode("j", sums=[w]), 10, 0) == "accepted"
        h = _view(table, clock).step_hist
        assert _consistent(h), (w, h)
