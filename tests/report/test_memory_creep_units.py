"""`teye report` says a job's memory creep (issue 45) from hand-made series: a job "leaky" on one node whose
resident memory grows 3.2 MB a step at a step a second for 40 minutes (on a 15 s grid), and one "steady" whose
memory fills a cache once and stays.  Truth by hand: over the run's last 30 minutes the leak grew
3.2e6 x 1800 = 5.76 GB over 1800 steps; the cache is no creep."""
from __future__ import annotations

from agent.report import render
from agent.report.build import Fetched, Request, _assemble

GRID = [float(t) for t in range(0, 2401, 15)]


def fetched(name, memory):
    f = Fetched(GRID[0], GRID[-1], 15.0, GRID)
    f.jinfo[("n-a", name)] = [(t, 1.0) for t in GRID]
    f.up["n-a"] = [(t, 1.0) for t in GRID]
    f.job[("teye_job_phase_seconds_total", "n-a", name, "compute", "", "")] = [(t, t) for t in GRID]
    f.job[("teye_job_steps_total", "n-a", name, "", "", "")] = [(t, t) for t in GRID]
    f.memory[("n-a", name, "host_resident")] = [(t, memory(t)) for t in GRID]
    f.index()
    return f


def report(f, name):
    job = _assemble(f, Request(train_jobs=[name]), 3000.0, None, [name], {}, "", False)
    return job, render.text({"jobs": [job], "unknown_jobs": []})


def test_a_leak_is_said_with_its_growth_steps_and_per_step_figure():
    job, text = report(fetched("leaky", lambda t: 2e9 + 3.2e6 * t), "leaky")
    said = "on n-a, its processes' resident memory grew 5.8 GB over 1800 steps, 3.2 MB a step"
    assert job["train_job_details"][0]["memory_creep"] == said
    assert any(said in n and n.startswith("Memory creeps") for n in job["notes"])
    assert said in " ".join(text.split())   # (the text wraps its lines)


def test_a_cache_filled_once_is_not_creep():
    job, text = report(fetched("steady", lambda t: 2e9 + (8e8 if t > 1500 else 0)), "steady")
    assert job["train_job_details"][0]["memory_creep"] is None
    assert not any("Memory creeps" in n for n in job["notes"]) and "Memory creeps" not in text
