"""The report's straggler and scaling efficiency from hand-made rank series (docs/phases.md, issue 37).

A data-parallel job "dp" on two nodes, four ranks (0, 1 on n-a; 2, 3 on n-b), every counter from 0 at
t = 0 and linear on a 10 s grid, so each share below is a rate over a rate.  Per second of wall time each
rank makes 1 s of step time in 0.5 steps (2 s per step).  Truth by hand:

* rank 2: compute 0.9, communication 0.05, data_wait 0.05 s per s: communication share 0.05, 1.8 s of
  compute per step;
* ranks 0, 1, 3: compute 0.5, communication 0.4 (0.8 s per step), data_wait 0.05, host 0.05 (own wait 0.1);
* rank 9 on n-b (a parameter server): 1 s of communication per s and no step: no candidate, no share;
* no own wait reaches 0.2, the spread of the communication shares is 0.4 - 0.05 = 0.35 >= 0.2: rank 2 is
  the straggler (rule communication); the others' mean share 0.4; scaling efficiency
  1 - (0.05 + 3 x 0.4) / 4 = 0.6875.
"""
from __future__ import annotations

import pytest

from agent.report import render
from agent.report.build import Fetched, Request, _assemble

GRID = [float(t) for t in range(0, 101, 10)]
PLACE = {0: "n-a", 1: "n-a", 2: "n-b", 3: "n-b", 9: "n-b"}
STRAGGLER = {"compute": 0.9, "communication": 0.05, "data_wait": 0.05}
WAITER = {"compute": 0.5, "communication": 0.4, "data_wait": 0.05, "host": 0.05}


def lin(rate):
    return [(t, rate * t) for t in GRID]


def fetched(ranks, steps=True, verdicts=None):
    """``ranks``: rank -> {phase: seconds per second}; each rank that is not 9 steps (1 s/s, 0.5 steps/s)."""
    f = Fetched(GRID[0], GRID[-1], 10.0, GRID)
    for inst in ("n-a", "n-b"):
        f.jinfo[(inst, "dp")] = [(t, 1.0) for t in GRID]
        f.up[inst] = [(t, 1.0) for t in GRID]
        f.job[("teye_job_phase_seconds_total", inst, "dp", "compute", "", "")] = lin(1.0)
        f.job[("teye_job_steps_total", inst, "dp", "", "", "")] = lin(0.5)
        f.job[("teye_job_step_seconds_sum", inst, "dp", "", "", "")] = lin(1.0)
        f.job[("teye_job_step_seconds_count", inst, "dp", "", "", "")] = lin(0.5)
    for rank, phases in ranks.items():
        inst = PLACE[rank]
        f.rank[("teye_job_rank_step_seconds_total", inst, "dp", str(rank), "")] = lin(0.0 if rank == 9 else 1.0)
        if steps:
            f.rank[("teye_job_rank_steps_total", inst, "dp", str(rank), "")] = lin(0.0 if rank == 9 else 0.5)
        for phase, rate in phases.items():
            f.rank[("teye_job_rank_phase_seconds_total", inst, "dp", str(rank), phase)] = lin(rate)
    for (inst, kind) in (verdicts or {}).items():
        f.verdict[("teye_job_bottleneck", inst, "dp", kind)] = [(t, 1.0) for t in GRID]
    f.index()
    return f


def report(f):
    job = _assemble(f, Request(train_jobs=["dp"]), 200.0, None, ["dp"], {}, "", False)
    doc = {"jobs": [job], "unknown_jobs": []}
    return job, render.text(doc), render.text(doc, md=True)


def compute_straggler_job():
    return {0: WAITER, 1: WAITER, 2: STRAGGLER, 3: WAITER, 9: {"communication": 1.0}}


def test_the_rank_that_exchanges_least_is_the_compute_straggler_and_the_efficiency_is_over_all_ranks():
    job, text, md = report(fetched(compute_straggler_job()))
    st = job["straggler"]
    assert (st["rank"], st["node"], st["rule"], st["verdict"], st["ranks"], st["cause"]) == \
        (2, "n-b", "communication", "compute", 4, None)
    assert st["communication_ratio"] == pytest.approx(0.05)
    assert st["waiting_communication_ratio"] == pytest.approx(0.4)
    assert st["compute_seconds_per_step"] == pytest.approx(1.8)
    assert st["waiting_communication_seconds_per_step"] == pytest.approx(0.8)
    assert st["input_bound_ratio"] == pytest.approx(0.05) and st["own_wait_ratio"] == pytest.approx(0.05)
    assert job["scaling_efficiency"] == pytest.approx(0.6875)
    (detail,) = job["train_job_details"]
    assert detail["scaling_efficiency"] == pytest.approx(0.6875) and detail["straggler"] == st
    for out in (text, md):
        assert ("Straggler: rank 2 on n-b computes 1.80 s per step; the job's other 3 ranks wait 800 ms of it in "
                "gradient exchange (communication 5 % of its step, 40 % of theirs)") in out, out
        assert "Scaling efficiency: 69 % (31 % of step time in the exchange)" in out, out


def test_without_per_rank_step_counts_the_straggler_line_gives_the_shares_only():
    job, text, _ = report(fetched(compute_straggler_job(), steps=False))
    st = job["straggler"]
    assert st["rank"] == 2 and st["compute_seconds_per_step"] is None
    assert st["waiting_communication_seconds_per_step"] is None
    assert ("Straggler: rank 2 on n-b computes longest; the job's other 3 ranks wait for it in gradient exchange "
            "(communication 5 % of its step, 40 % of theirs)") in text, text


def test_an_own_wait_that_reaches_the_threshold_wins_over_the_communication_spread():
    ranks = compute_straggler_job()
    ranks[3] = dict(WAITER, data_wait=0.2)      # own wait 0.2 + 0.05 = 0.25: over the threshold
    job, text, _ = report(fetched(ranks, verdicts={"n-a": "compute", "n-b": "input"}))
    st = job["straggler"]
    assert (st["rank"], st["node"], st["rule"], st["verdict"]) == (3, "n-b", "own_wait", "input")
    assert st["own_wait_ratio"] == pytest.approx(0.25) and st["input_bound_ratio"] == pytest.approx(0.2)
    assert st["communication_ratio"] == pytest.approx(0.4)
    assert "waiting_communication_ratio" not in st
    assert job["scaling_efficiency"] == pytest.approx(0.6875)
    assert ("Straggler: rank 3 on n-b waits 25 % of its step on its own input and host work (input 20 %); the "
            "job's other 3 ranks wait for it") in text, text


def test_ranks_that_exchange_alike_name_the_largest_own_wait():
    ranks = compute_straggler_job()
    ranks[2] = dict(STRAGGLER, communication=0.25)     # spread 0.4 - 0.25 = 0.15 < 0.2
    job, text, _ = report(fetched(ranks))
    st = job["straggler"]
    # ranks 0, 1 and 3 wait 0.1 each, rank 2 0.05: the lowest of the largest
    assert (st["rank"], st["node"], st["rule"]) == (0, "n-a", "own_wait")
    assert st["own_wait_ratio"] == pytest.approx(0.1)
    assert job["scaling_efficiency"] == pytest.approx(1 - (0.25 + 3 * 0.4) / 4)   # 0.6375
    assert "Scaling efficiency: 64 % (36 % of step time in the exchange)" in text, text


def test_ranks_that_report_no_communication_scale_fully_and_a_job_without_ranks_has_no_efficiency():
    job, text, _ = report(fetched({0: {"data_wait": 0.05}, 2: {"data_wait": 0.05}}))
    assert job["scaling_efficiency"] == 1.0 and job["straggler"]["rule"] == "own_wait"
    assert "Scaling efficiency: 100 % (0 % of step time in the exchange)" in text
    job, text, _ = report(fetched({}))
    assert job["scaling_efficiency"] is None and job["straggler"] is None
    assert "Scaling efficiency" not in text and "Straggler" not in text
