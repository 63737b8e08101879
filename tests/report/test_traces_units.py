"""The traces a job took on request (issue 46) in its report: each id, the node and when it was first the
node's latest, from teye_job_trace_info.  Hand-made series on a
10 s grid over 100 s; truth by hand."""
from __future__ import annotations

from agent.report.build import Fetched, Request, _assemble
from agent.report.render import _job_lines

GRID = [float(t) for t in range(0, 101, 10)]


def test_the_traces_in_the_jobs_window_are_listed_in_time_order_with_the_latest_named():
    f = Fetched(GRID[0], GRID[-1], 10.0, GRID)
    for node in ("n-a", "n-b"):
        f.jinfo[(node, "tj")] = [(t, 1.0) for t in GRID]
        f.up[node] = [(t, 1.0) for t in GRID]
        f.job[("teye_job_steps_total", node, "tj", "", "", "")] = [(t, t) for t in GRID]
        f.job[("teye_job_phase_seconds_total", node, "tj", "compute", "", "")] = [(t, t) for t in GRID]
        f.job[("teye_job_running", node, "tj", "", "", "")] = [(t, 1.0) for t in GRID]
    f.verdict[("teye_job_trace_info", "n-a", "tj", "t1")] = [(t, 1.0) for t in GRID if 30 <= t < 70]
    f.verdict[("teye_job_trace_info", "n-a", "tj", "t2")] = [(t, 1.0) for t in GRID if t >= 70]
    f.verdict[("teye_job_trace_info", "n-b", "tj", "t2")] = [(t, 1.0) for t in GRID if t >= 80]
    f.index()
    job = _assemble(f, Request(train_jobs=["tj"]), 200.0, None, ["tj"], {}, "", False)
    assert job["traces"] == [{"id": "t1", "node": "n-a", "seen_at": 30.0}, {"id": "t2", "node": "n-a", "seen_at": 70.0},
                             {"id": "t2", "node": "n-b", "seen_at": 80.0}]
    out = "\n".join(_job_lines(job, False))
    assert "Traces: 2 taken on request; the latest t2 on n-a, n-b (files <output>/<train_job>.t2." in out
