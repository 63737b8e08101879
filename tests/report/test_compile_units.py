"""The report leaves ``compile`` out of the input-bound share (docs/phases.md): hand-made counters, truth by hand.

A training job "kf" on one node, every counter from 0 at t = 0 on a 10 s grid over 100 s: data_wait 0.6 s and
compute 0.3 s per second of wall time inside its steps (1 step per second), and one compile of 30 s between
its first steps (the counter moves from 0 to 30 between t = 0 and t = 10, then stays).  Its input share is
60 / (60 + 30) = 2/3: the compile is in the phase seconds the report lists (30 s) and in no share; counted,
the share would read 60 / 120 = 1/2.
"""
from __future__ import annotations

import pytest

from agent.report import render
from agent.report.build import Fetched, Request, _assemble

GRID = [float(t) for t in range(0, 101, 10)]


def lin(rate):
    return [(t, rate * t) for t in GRID]


def fetched():
    f = Fetched(GRID[0], GRID[-1], 10.0, GRID)
    f.jinfo[("n-a", "kf")] = [(t, 1.0) for t in GRID]
    f.up["n-a"] = [(t, 1.0) for t in GRID]
    for phase, series in (("data_wait", lin(0.6)), ("compute", lin(0.3)),
                          ("compile", [(t, 0.0 if t == 0 else 30.0) for t in GRID])):
        f.job[("teye_job_phase_seconds_total", "n-a", "kf", phase, "", "")] = series
    f.job[("teye_job_steps_total", "n-a", "kf", "", "", "")] = lin(1.0)
    f.job[("teye_job_step_seconds_sum", "n-a", "kf", "", "", "")] = lin(0.9)
    f.job[("teye_job_step_seconds_count", "n-a", "kf", "", "", "")] = lin(1.0)
    f.index()
    return f


def test_compile_is_listed_and_in_no_share():
    job = _assemble(fetched(), Request(train_jobs=["kf"]), 200.0, None, ["kf"], {}, "", False)
    (tj,) = job["train_job_details"]
    for d in (job, tj):   # the report's job (pooled over its training jobs) and the training job itself
        assert d["phase_seconds"] == {"compile": 30.0, "compute": 30.0, "data_wait": 60.0}
        assert d["input_bound_ratio"] == pytest.approx(2 / 3, abs=1e-6)
    assert tj["step_seconds_mean"] == pytest.approx(0.9)
    text = render.text({"jobs": [job], "unknown_jobs": []})
    assert "Input-bound share: 67 %" in text
    # the bars are shares of the step time too: data_wait 2/3; compile 30 s against 90 s of steps, between them
    assert "data_wait        [|||||||||||||||||||||||||||             ]   67 %  60.0 s," in text
    assert "compile          [|||||||||||||                           ]   33 %  30.0 s, between steps," in text


def test_eval_is_beside_training_and_in_no_share():
    """One definition (issue 47): a job "ev" that evaluates between its steps, 0.6 s data_wait and 0.3 s
    compute per second inside its steps (0.9 s of steps a second: teye_job_step_seconds_sum) and 0.5 s of eval
    a second between them (a validation pass every epoch).  Its input share is the agent's, 0.6 / 0.9 = 2/3;
    with eval in the denominator it would read 0.6 / 1.4 = 43 %.  Its mean step and samples/s are of the
    training steps' time: 0.9 s per step, 32 samples over 0.9 s."""
    f = Fetched(GRID[0], GRID[-1], 10.0, GRID)
    f.jinfo[("n-a", "ev")] = [(t, 1.0) for t in GRID]
    f.up["n-a"] = [(t, 1.0) for t in GRID]
    for phase, rate in (("data_wait", 0.6), ("compute", 0.3), ("eval", 0.5)):
        f.job[("teye_job_phase_seconds_total", "n-a", "ev", phase, "", "")] = lin(rate)
    f.job[("teye_job_steps_total", "n-a", "ev", "", "", "")] = lin(1.0)
    f.job[("teye_job_samples_total", "n-a", "ev", "", "", "")] = lin(32.0)
    f.job[("teye_job_step_seconds_sum", "n-a", "ev", "", "", "")] = lin(0.9)
    f.job[("teye_job_step_seconds_count", "n-a", "ev", "", "", "")] = lin(1.0)
    f.index()
    job = _assemble(f, Request(train_jobs=["ev"]), 200.0, None, ["ev"], {}, "", False)
    (tj,) = job["train_job_details"]
    for d in (job, tj):
        assert d["phase_seconds"] == {"compute": 30.0, "data_wait": 60.0, "eval": 50.0}
        assert d["input_bound_ratio"] == pytest.approx(2 / 3, abs=1e-6)
        assert d["step_seconds"] == pytest.approx(90.0)
    assert tj["step_seconds_mean"] == pytest.approx(0.9)
    assert tj["samples_per_second"] == pytest.approx(32 / 0.9, rel=1e-3)
    text = render.text({"jobs": [job], "unknown_jobs": []})
    assert "Input-bound share: 67 %" in text
    assert "eval             [||||||||||||||||||||||                  ]   56 %  50.0 s, beside training," in text
