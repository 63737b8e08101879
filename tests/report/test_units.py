"""The report's pure parts: counter arithmetic, quantiles, the bounded summary, the HTTP client config."""
from __future__ import annotations

import base64
import json
import math

import pytest

from agent.report import render, series as S
from agent.report.prom import HttpConfig, HttpConfigError


def test_increase_is_exact_and_sums_across_resets():
    pts = [(0, 10.0), (1, 12.0), (2, 15.0), (3, 1.0), (4, 4.0), (5, 4.0)]
    assert S.increase(pts, 0, 5) == (2 + 3 + 1 + 3 + 0, 1)        # the reset adds what came after it
    assert S.increase(pts, 1, 2) == (3.0, 0)
    assert S.increase(pts, 10, 20) == (None, 0)
    # a series that starts inside the window was created there: it counts from zero
    assert S.increase([(3, 2.0), (4, 5.0)], 0, 5) == (5.0, 0)


def test_first_last_change_and_gaps():
    pts = [(0, 1.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, 3.0), (5, 3.0)]
    assert S.first_last_change(pts, 0, 5) == (2, 3)
    assert S.gaps([0, 1, 2, 3, 4, 5], [0, 1, 4, 5], 0, 5, 1.0) == [(1, 4)]
    assert S.gaps([0, 1, 2, 3], [0, 1], 0, 3, 1.0) == [(1, 3)]


def test_bucket_bounds_are_the_bucket_the_quantile_falls_in():
    # 10 observations: 4 <= 0.1, 6 more <= 0.5: p50 (rank 5) lies in (0.1, 0.5]; nothing finer is known
    b = [(0.1, 4.0), (0.5, 10.0), (math.inf, 10.0)]
    assert S.bucket_bounds(0.5, b) == (0.1, 0.5)
    assert S.bucket_bounds(0.2, b) == (0.0, 0.1) and S.bucket_bounds(0.4, b) == (0.0, 0.1)   # rank 4: the bound
    assert S.bucket_bounds(0.41, b) == (0.1, 0.5)
    assert S.bucket_bounds(0.5, [(0.1, 0.0), (math.inf, 0.0)]) is None
    assert S.bucket_bounds(0.99, [(0.1, 1.0), (math.inf, 5.0)]) == (0.1, math.inf)   # above the last bound
    # the job: 255 of 256 steps in (0.1, 0.25], one in (0.05, 0.1]: p50 and p95 in (0.1, 0.25]
    le = [(0.005, 0), (0.01, 0), (0.025, 0), (0.05, 0), (0.1, 1), (0.25, 256), (0.5, 256), (math.inf, 256)]
    assert S.bucket_bounds(0.5, le) == S.bucket_bounds(0.95, le) == (0.1, 0.25)
    assert S.bucket_bounds(0.001, le) == (0.05, 0.1)


def test_increase_is_one_subtraction_per_stretch():
    """A created series' increase is its last value, bit for bit (no sum of per-step differences): the
    mean step _sum/_count is then the very float PromQL gives."""
    vals = [0.1 * k + 0.0137 * k * k for k in range(1, 200)]
    pts = [(float(t), v) for t, v in enumerate(vals, start=10)]
    assert S.increase(pts, 0, 1000)[0] == vals[-1]
    assert S.increase(pts, 10, 1000)[0] == vals[-1] - vals[0]
    # a running sum of per-step differences is not that float: (0.2 - 0.1) + (0.9 - 0.2) = 0.7999999999999999
    assert S.increase([(0, 0.1), (1, 0.2), (2, 0.9)], 0, 2) == (0.9 - 0.1, 0) and 0.9 - 0.1 == 0.8


def test_step_figures_in_text_and_summary():
    assert render._step_ms(27.94 / 256) == "109 ms" and render._step_ms(0.0266) == "26.6 ms"
    assert render._step_ms(2.4134) == "2.41 s" and render._step_ms(None) == "n/a"
    assert render._bucket([0.1, 0.25]) == "100-250 ms" and render._bucket([0.0, 0.005]) == "0-5 ms"
    assert render._bucket([1.0, 2.5]) == "1-2.5 s" and render._bucket([60.0, None]) == "> 60 s"
    assert render._bucket(None) == "n/a"


def test_the_grid_ends_on_a_multiple_of_the_step_whatever_the_time_of_the_call():
    from agent.report.build import _grid_end
    # three calls 1.3 s apart, the job's end found at different times: the same grid end
    assert {_grid_end(t, t + 5, 1.0, False) for t in (1000.2, 1000.7, 1001.0)} == {1001.0}
    assert _grid_end(1003.2, 1003.2, 5.0, False) == 1005.0          # now: the multiple after (no later data)
    assert _grid_end(1003.2, 1003.2, 5.0, True) == 1000.0           # past an --until given: the one before
    assert _grid_end(1000.0, 1000.0, 5.0, True) == 1000.0           # an --until on the grid stays


def test_the_step_is_the_scrape_interval_in_whole_seconds_whatever_its_jitter():
    from agent.report.build import _step_of
    assert {_step_of(x) for x in (0.999, 1.0, 1.0004, 1.001, 1.2)} == {1.0}
    assert {_step_of(x) for x in (14.98, 15.0, 15.02)} == {15.0}
    assert _step_of(None) == 1.0 and _step_of(0.25) == 1.0


def _doc(notes=30, tj=20):
    j = {"slurm_job": "4242", "train_jobs": [f"train-job-with-a-long-name-{i}" for i in range(tj)],
         "state": "finished", "nodes": ["gpu-node-0001", "gpu-node-0002"], "run_seconds": 3600.4,
         "gpu_busy_ratio": 0.61234, "input_bound_ratio": 0.4, "verdict": "input", "input_cause": "storage",
         "gpu_energy_joules": 1.5e6, "gpu_memory_peak_bytes": 64e9, "step_seconds_mean": 0.10914,
         "samples_per_second": 900.4, "slowest_node": "gpu-node-0002", "exit_status": 0,
         "notes": [f"Note number {i}: something long to say about the job " * 2 for i in range(notes)]}
    return {"jobs": [j], "exit_status": 0}


@pytest.mark.parametrize("limit", [2000, 400, 200, 120, 60, 20])
def test_summary_is_bounded_and_always_parses(limit):
    out = render.summary(_doc(), limit)
    assert len(out.encode()) <= limit
    s = json.loads(out)
    assert s["v"] == 1
    if limit >= 120:
        assert s["job"] == "4242" and s["vd"] == "input"
    if limit < 2000:
        assert s.get("t") == 1
    full = json.loads(render.summary(_doc(notes=1, tj=1), 2000))
    assert "t" not in full and full["gb"] == 61.2 and full["sm"] == 109.1 and full["tj"] == ["train-job-with-a-long-name-0"]


def test_http_config_basic_auth_bearer_and_errors(tmp_path):
    (tmp_path / "pw").write_text("s3cret\n")
    cfg = tmp_path / "c.yml"
    cfg.write_text("basic_auth:\n  username: alice\n  password_file: pw\n")        # relative to the file
    h = HttpConfig.load(str(cfg))
    assert h.authorization == "Basic " + base64.b64encode(b"alice:s3cret").decode() and h.ssl_context is None
    (tmp_path / "tok").write_text("abc\n")
    cfg.write_text("bearer_token_file: tok\n")
    assert HttpConfig.load(str(cfg)).authorization == "Bearer abc"
    cfg.write_text("authorization:\n  credentials: xyz\n")
    assert HttpConfig.load(str(cfg)).authorization == "Bearer xyz"
    cfg.write_text("tls_config:\n  insecure_skip_verify: true\n  server_name: prom.example\n")
    h = HttpConfig.load(str(cfg))
    assert h.ssl_context is not None and h.server_name == "prom.example" and not h.ssl_context.check_hostname
    for text, msg in (("basic_auth:\n  username: a\n  password_file: missing\n", "cannot read"),
                      ("tls_config:\n  ca_file: nope.pem\n", "tls_config"),
                      ("- a list\n", "mapping"), ("basic_auth: {password: x}\n", "needs a username"),
                      (":\n  - [", "not valid YAML")):
        cfg.write_text(text)
        with pytest.raises(HttpConfigError, match=msg):
            HttpConfig.load(str(cfg))


def test_a_series_created_inside_the_window_moves_when_it_appears():
    assert S.first_last_change([(2, 5.0), (3, 5.0), (4, 6.0)], 0, 5) == (2, 4)


def _job(busy, cpus=None, eff=None, peak=None, req=None, verdict=None, cause=None):
    gpus = [{"node": "n1", "gpu": str(i), "busy_ratio": b} for i, b in enumerate(busy)]
    total = sum(busy) / len(busy) if busy else None
    return {"gpus": gpus, "gpu_busy_ratio": total, "cpu": {"allocated_cores": cpus, "efficiency": eff},
            "memory": {"peak_bytes": peak, "requested_bytes": req}, "verdict": verdict, "input_cause": cause}


def test_jobstats_style_notes():
    from agent.report.build import Request, _notes
    n = _notes(_job([0.0, 0.001]), Request())
    assert len(n) == 1 and n[0].startswith("The job was allocated 2 GPU(s) and none of them was ever busy")
    n = _notes(_job([0.9, 0.0, 0.0, 0.0]), Request())
    assert n[0].startswith("3 of 4 allocated GPUs never busy: Only one GPU of 4 did work (GPU 0 on n1)")
    n = _notes(_job([0.9, 0.8, 0.0]), Request())
    assert n == ["1 of 3 allocated GPUs never busy (n1/GPU 2)."]
    n = _notes(_job([0.3]), Request())
    assert n == ["GPU busy 30 % of the job's time: the GPUs wait more than they work (see the verdict and idle "
                 "time by phase below)."]
    n = _notes(_job([0.9], cpus=16, eff=0.1, peak=2 * 2**30, req=64 * 2**30), Request())
    assert n[0].startswith("CPU cores mostly idle: 10 % of 16 allocated cores used")
    assert n[1].startswith("Memory requested far above use: peak 2.0 GiB of 64.0 GiB requested")
    assert "whole-node" not in n[0] + n[1]           # the job's own cgroup figures (or, here, unmarked)
    whole = _job([0.9], cpus=16, eff=0.1, peak=2 * 2**30, req=64 * 2**30)
    whole["cpu"]["source"] = whole["memory"]["source"] = "node"
    n = _notes(whole, Request())
    assert n[0].endswith("(whole-node figure: no cgroup of the job was seen, so other jobs on its nodes count too)")
    assert n[1].endswith("(whole-node figure: no cgroup of the job was seen, so other jobs on its nodes count too)")
    assert _notes(_job([0.9], cpus=1, eff=0.1, peak=30 * 2**30, req=64 * 2**30), Request()) == []
    n = _notes(_job([0.9], verdict="input", cause="storage"), Request())
    assert n[0].startswith("Verdict input (cause storage): The input pipeline waits for storage")


def test_host_counters_cpi_bandwidth_and_cpu_time_over_the_job():
    """Hand-made series on a 10 s grid: the job runs [100, 140]; counters since boot (never from zero)."""
    from agent.report.build import Fetched, _host_numbers
    grid = [float(t) for t in range(80, 161, 10)]
    f = Fetched(80.0, 160.0, 10.0, grid)
    lin = lambda base, rate: [(t, base + rate * (t - 80)) for t in grid]  # noqa: E731
    f.host[("cpu_busy", "n1")] = lin(5000.0, 3.0)            # 3 cores busy
    f.host[("cycles", "n1")] = lin(1e12, 6e9)
    f.host[("instructions", "n1")] = lin(5e11, 4e9)           # CPI 1.5 over the job
    f.host[("dram_bytes", "n1")] = lin(1e15, 2e10)           # 20 GB/s
    f.host[("cpus", "n1")] = [(t, 64.0) for t in grid]
    f.host[("mem_peak", "n1")] = [(t, 1e9 * (2 if 100 <= t <= 140 else 9)) for t in grid]
    h = _host_numbers(f, "n1", 100.0, 140.0)
    assert h["cpu_busy_seconds"] == pytest.approx(3.0 * 50)            # from one step before the start
    assert h["cycles_per_instruction"] == pytest.approx(1.5)
    assert h["memory_bandwidth_bytes_per_second"] == pytest.approx(2e10)
    assert h["cpus"] == 64.0 and h["memory_peak_bytes"] == 2e9 and h["_resets"] == 0


def test_cpu_efficiency_uses_the_span_the_counter_was_differenced_over():
    from agent.report.build import Fetched, Request, _assemble
    grid = [float(t) for t in range(80, 181, 10)]
    f = Fetched(80.0, 180.0, 10.0, grid)
    f.host[("cpu_busy", "n1")] = [(t, 5000.0 + 3.0 * (t - 80)) for t in grid]     # 3 cores busy
    f.host[("cpus", "n1")] = [(t, 64.0) for t in grid]
    f.up["n1"] = [(t, 1.0) for t in grid]
    f.procs[("n1", "0", "7")] = [(t, 1.0) for t in grid if 100 <= t <= 140]
    j = _assemble(f, Request(cpus=4), 200.0, "7", [], {("n1", "0"): (100.0, 140.0)}, "u", False)
    assert j["run_seconds"] == 40.0 and j["state"] == "finished"
    # the node's 3 busy cores are the node's (every process's), never the job's: without a cgroup of the job
    # there is no efficiency (issue 47: "node CPU busy 98 %" was read as the job's); the node's share stays
    assert j["cpu"]["efficiency"] is None and j["cpu"]["node_busy_ratio"] == pytest.approx(3 / 64, abs=1e-4)
    assert [c["kind"] for c in j["conditions"]] == ["no_phases"]
    text = render.text({"jobs": [j], "unknown_jobs": []})
    assert "CPU efficiency   n/a: no cgroup of the job seen" in text, text
    assert "of 64 CPUs (the whole nodes, all their processes: not the job's)" in text, text
    # with the job's own cgroup: its CPU time (1.5 cores) over what it was given (4), over the same span
    f.jobcg[("job_cpu", "n1", "7")] = [(t, 1.5 * (t - 80)) for t in grid]
    f.jobcg[("job_cpus", "n1", "7")] = [(t, 4.0) for t in grid]
    j = _assemble(f, Request(), 200.0, "7", [], {("n1", "0"): (100.0, 140.0)}, "u", False)
    assert j["cpu"]["source"] == "job_cgroup" and j["cpu"]["allocated_cores"] == 4.0
    assert j["cpu"]["efficiency"] == pytest.approx(1.5 / 4, abs=1e-4), j["cpu"]
    assert j["cpu"]["node_busy_ratio"] == pytest.approx(3 / 64, abs=1e-4)


def test_a_run_shorter_than_a_scrape_has_no_cpu_share():
    """Bad input of issue 47: a 2 s job on a 10 s grid moved no CPU counter it can be measured by: its CPU
    shares are null and the text says why, never 0 %."""
    from agent.report.build import Fetched, Request, _assemble
    grid = [float(t) for t in range(80, 181, 10)]
    f = Fetched(80.0, 180.0, 10.0, grid)
    f.host[("cpu_busy", "n1")] = [(t, 5000.0 + 3.0 * (t - 80)) for t in grid]
    f.host[("cpus", "n1")] = [(t, 64.0) for t in grid]
    f.up["n1"] = [(t, 1.0) for t in grid]
    f.procs[("n1", "0", "7")] = [(t, 1.0) for t in grid if t == 120]
    j = _assemble(f, Request(cpus=4), 200.0, "7", [], {("n1", "0"): (120.0, 122.0)}, "u", False)
    assert j["cpu"]["efficiency"] is None and j["cpu"]["node_busy_ratio"] is None, j["cpu"]
    text = render.text({"jobs": [j], "unknown_jobs": []})
    assert "(the run is shorter than a scrape interval)" in text and " 0 %" not in text.split("node CPU busy")[1], text



def _said_job(running, age):
    """A training job "tj" whose counters move up to the grid's last point (as they seem to when an agent
    restarts under it: its counters begin again), with the agent's teye_job_running and last message age."""
    from agent.report.build import Fetched
    grid = [float(t) for t in range(0, 101, 10)]
    f = Fetched(0.0, 100.0, 10.0, grid)
    f.jinfo[("n1", "tj")] = [(t, 1.0) for t in grid]
    f.up["n1"] = [(t, 1.0) for t in grid]
    f.job[("teye_job_phase_seconds_total", "n1", "tj", "compute", "", "")] = [(t, 0.5 * t) for t in grid]
    f.job[("teye_job_steps_total", "n1", "tj", "", "", "")] = [(t, t) for t in grid]
    if running is not None:
        f.job[("teye_job_running", "n1", "tj", "", "", "")] = [(t, 1.0 if t < 90 else running) for t in grid]
        f.job[("teye_job_last_message_age_seconds", "n1", "tj", "", "", "")] = [(t, 0.5 if t < 90 else age)
                                                                                 for t in grid]
    f.index()
    return f


@pytest.mark.parametrize("running, age, state", [
    (0.0, 14.0, "finished"),     # issue 47: the job ended 14 s ago; the agent says so, whatever its counters did
    (1.0, 45.0, "finished"),     # its processes live on but it has been silent past the stall bound
    (1.0, 2.0, "running"),       # alive and talking
    (None, None, "running"),     # an agent that exports neither series: the counters' movement decides
])
def test_the_state_is_from_the_jobs_last_message_age(running, age, state):
    from agent.report.build import Request, _assemble
    j = _assemble(_said_job(running, age), Request(train_jobs=["tj"]), 200.0, None, ["tj"], {}, "", False)
    assert j["state"] == state, (j["state"], j["conditions"])
    assert ("running" in [c["kind"] for c in j["conditions"]]) == (state == "running")



def test_a_job_whose_cgroup_vanished_is_stated_not_wrong():
    """Bad input of issue 47: the job's cgroup on n1 is gone at t = 120 of a job that ran 100-160 (its
    counters stop there).  Its CPU time over the whole run would read 1.5 cores x 20 s / (4 x 70 s): low and
    wrong; the efficiency is null and the text says until when the cgroup was seen."""
    from agent.report.build import Fetched, Request, _assemble
    grid = [float(t) for t in range(80, 181, 10)]
    f = Fetched(80.0, 180.0, 10.0, grid)
    f.host[("cpu_busy", "n1")] = [(t, 5000.0 + 3.0 * (t - 80)) for t in grid]
    f.host[("cpus", "n1")] = [(t, 64.0) for t in grid]
    f.up["n1"] = [(t, 1.0) for t in grid]
    f.procs[("n1", "0", "7")] = [(t, 1.0) for t in grid if 100 <= t <= 160]
    f.jobcg[("job_cpu", "n1", "7")] = [(t, 1.5 * (t - 80)) for t in grid if t <= 120]
    f.jobcg[("job_cpus", "n1", "7")] = [(t, 4.0) for t in grid if t <= 120]
    j = _assemble(f, Request(), 200.0, "7", [], {("n1", "0"): (100.0, 160.0)}, "u", False)
    assert j["cpu"]["source"] == "job_cgroup" and j["cpu"]["efficiency"] is None, j["cpu"]
    assert j["cpu"]["cgroup_vanished"] == {"n1": "1970-01-01T00:02:00Z"}
    text = render.text({"jobs": [j], "unknown_jobs": []})
    assert "CPU efficiency   n/a: the job's cgroup vanished before its end (n1 last seen 1970-01-01T00:02:00Z)" in text
    # seen to the end: the efficiency is the job's own
    f.jobcg[("job_cpu", "n1", "7")] = [(t, 1.5 * (t - 80)) for t in grid]
    f.jobcg[("job_cpus", "n1", "7")] = [(t, 4.0) for t in grid]
    j = _assemble(f, Request(), 200.0, "7", [], {("n1", "0"): (100.0, 160.0)}, "u", False)
    assert j["cpu"]["cgroup_vanished"] is None and j["cpu"]["efficiency"] == pytest.approx(1.5 / 4, abs=1e-4)


def test_an_unknown_jobs_message_gives_its_bounds_as_dates_not_unix_seconds():
    """Issue 47: the report's body and --compare said "between 1795947776.0 and 1795951376.0"."""
    import time as _time
    from agent.report import compare as compare_mod
    from agent.report.render import text
    since, until = 1795947776.25, 1795951376.0
    want = [_time.strftime("%Y-%m-%dT%H:%M:%SZ", _time.gmtime(t)) for t in (since, until)]
    assert want == ["2026-11-29T10:22:56Z", "2026-11-29T11:22:56Z"]
    body = text({"jobs": [], "unknown_jobs": ["nosuch"], "since": since, "until": until})
    assert body == f"unknown job nosuch: Prometheus has no series for it between {want[0]} and {want[1]}\n"
    with pytest.raises(compare_mod.CompareError) as e:
        compare_mod.compare(None, None, "nosuch", "previous", {"jobs": [], "since": since, "until": until})
    assert str(e.value) == f"unknown job nosuch: no series in Prometheus between {want[0]} and {want[1]}"


def _reindex(f):
    for by in (f.job_by, f.verdict_by, f.jinfo_by, f.rank_by):
        by.clear()
    f.index()


def test_the_cpu_efficiency_spans_the_whole_run_where_the_job_stepped_longer_than_the_grid_saw():
    """A loaded Prometheus scrapes late: the job's counters moved over 90 s of the grid (100 s differenced
    from the scrape before) while its steps took 130 s by its own clocks (teye_job_step_seconds_sum).  Its
    processes' 75 CPU seconds are all of the run's: the efficiency is over the run's 130 s (its run_seconds),
    never over the shorter span the grid saw (a loaded suite run, stop 65: above what its run_seconds gave)."""
    from agent.report.build import Request, _assemble
    f = _said_job(0.0, 14.0)
    f.job[("teye_job_cpu_seconds_total", "n1", "tj", "", "", "")] = [(t, 2.0 + 0.75 * t) for t in f.grid]
    f.job[("teye_job_cpus", "n1", "tj", "", "", "")] = [(t, 2.0) for t in f.grid]
    f.job[("teye_job_step_seconds_sum", "n1", "tj", "", "", "")] = [(t, 1.3 * t) for t in f.grid]
    f.host[("cpus", "n1")] = [(t, 2.0) for t in f.grid]
    _reindex(f)
    j = _assemble(f, Request(train_jobs=["tj"]), 200.0, None, ["tj"], {}, "", False)
    assert (j["start"], j["end"], j["run_seconds"]) == (10.0, 100.0, 130.0), j
    assert j["cpu"]["job_seconds"] == 75.0 and j["cpu"]["allocated_cores"] == 2.0, j["cpu"]
    assert j["cpu"]["efficiency"] == pytest.approx(75.0 / (2 * 130), abs=1e-4), j["cpu"]


def test_a_job_outside_slurm_gets_its_processes_cpu_not_the_nodes():
    """Issue 47: a training job with no cgroup of its own (not under Slurm) is judged by its processes' CPU
    (teye_job_cpu_seconds_total, counted from each process's start, so from zero) over the CPUs they may run
    on (teye_job_cpus), never by the node's busy time, which here is another job's 1.9 cores of 2."""
    from agent.report.build import Request, _assemble
    f = _said_job(0.0, 14.0)
    f.job[("teye_job_cpu_seconds_total", "n1", "tj", "", "", "")] = [(t, 2.0 + 0.75 * t) for t in f.grid]
    f.job[("teye_job_cpus", "n1", "tj", "", "", "")] = [(t, 2.0) for t in f.grid]
    f.host[("cpu_busy", "n1")] = [(t, 9000.0 + 1.9 * t) for t in f.grid]
    f.host[("cpus", "n1")] = [(t, 2.0) for t in f.grid]
    _reindex(f)
    j = _assemble(f, Request(train_jobs=["tj"]), 200.0, None, ["tj"], {}, "", False)
    # its counters moved from 10 to 100 on a 10 s grid: differenced from the scrape before (0 s), 100 s, in
    # which its processes used 75 CPU seconds
    assert (j["start"], j["end"]) == (10.0, 100.0)
    assert j["cpu"]["source"] == "job_processes" and j["cpu"]["job_seconds"] == 75.0, j["cpu"]
    assert j["cpu"]["allocated_cores"] == 2.0
    assert j["cpu"]["efficiency"] == pytest.approx(75.0 / (2 * 100), abs=1e-4), j["cpu"]
    assert j["cpu"]["node_busy_ratio"] == pytest.approx(1.9 / 2, abs=1e-4)
    text = render.text({"jobs": [j], "unknown_jobs": []})
    assert "CPU efficiency   " in text and "of 2 CPUs they may run on (the job's processes" in text, text
    # from an agent without the series: no efficiency, as before
    for k in [k for k in f.job if k[0] in ("teye_job_cpu_seconds_total", "teye_job_cpus")]:
        del f.job[k]
    _reindex(f)
    j = _assemble(f, Request(train_jobs=["tj"]), 200.0, None, ["tj"], {}, "", False)
    assert j["cpu"]["source"] == "node" and j["cpu"]["efficiency"] is None
