"""`teye report --compare`'s pure parts (agent/report/compare.py): the spread, the noise rule, the per-interval
figures, the run picked, world sizes and the text.  Every expected value is computed by hand in the comments."""
from __future__ import annotations

import math

import pytest

from agent.report import compare as C
from agent.report.model import EXIT_UNKNOWN


def test_spread_is_the_sample_standard_deviation_and_needs_three_intervals():
    # mean 2, squared deviations 1 + 0 + 1 = 2, over n - 1 = 2: 1
    assert C.spread([1.0, 2.0, 3.0]) == pytest.approx(1.0)
    # mean 0.1, deviations +-0.02 twice: 4 * 4e-4 / 3 = 5.333e-4, sqrt = 0.023094
    assert C.spread([0.08, 0.12, 0.08, 0.12]) == pytest.approx(math.sqrt(16e-4 / 3))
    assert C.spread([1.0, 2.0]) is None and C.spread([]) is None


def test_a_change_beyond_noise_counts_and_one_inside_it_does_not():
    # spreads 3 ms and 4 ms: noise 2 * sqrt(9 + 16) = 10 ms
    big = C.judge(0.100, 0.050, 0.003, 0.004)
    assert big["change"] == pytest.approx(-0.050) and big["relative_change"] == pytest.approx(-0.5)
    assert big["noise"] == pytest.approx(0.010) and big["beyond_noise"] is True
    small = C.judge(0.100, 0.109, 0.003, 0.004)      # 9 ms < 10 ms: 9 % slower, yet noise
    assert small["relative_change"] == pytest.approx(0.09) and small["beyond_noise"] is False
    edge = C.judge(0.100, 0.111, 0.003, 0.004)       # 11 ms > 10 ms
    assert edge["beyond_noise"] is True


def test_the_band_is_never_narrower_than_its_floor():
    # CI, stop 61: one unchanged loop run twice, 25.5 ms steps, the latest run's spread 0.028 ms; they differed by
    # 0.073 ms (0.3 %), beyond the spreads' band.  Here spreads 0.028 and 0.030 ms: band
    # 2 * sqrt(0.028^2 + 0.030^2) = 0.082 ms, and two runs 0.3 ms (1.2 %) apart
    floor = C.MIN_RELATIVE_CHANGE * 0.0255                # 2 % of 25.5 ms: 0.51 ms
    same = C.judge(0.0255, 0.0258, 0.000028, 0.000030, floor)
    assert same["noise"] == pytest.approx(0.00051) and same["noise_floor"] == pytest.approx(0.00051)
    assert same["beyond_noise"] is False                  # 0.3 ms: beyond the spreads' band, inside the floor
    assert C.judge(0.0255, 0.0258, 0.000028, 0.000030)["beyond_noise"] is True   # (without the floor it counted)
    assert C.judge(0.0255, 0.0261, 0.000028, 0.000030, floor)["beyond_noise"] is True   # 0.6 ms > 0.51 ms
    # a wide spread is still the band: 2 * sqrt(9 + 16) = 10 ms over a 2 ms floor
    assert C.judge(0.100, 0.109, 0.003, 0.004, 0.002)["noise"] == pytest.approx(0.010)


def test_no_spread_or_no_figure_is_not_judged():
    assert C.judge(0.1, 0.2, None, 0.01)["beyond_noise"] is None
    j = C.judge(None, 0.2, 0.01, 0.01)
    assert j["change"] is None and j["beyond_noise"] is None


def _pts(**series):
    """(metric, phase) -> {t: v} from lists over t = 0, 1, 2, ..."""
    names = {"count": ("teye_job_step_seconds_count", ""), "sum": ("teye_job_step_seconds_sum", ""),
             "samples": ("teye_job_samples_total", ""), "dw": ("teye_job_phase_seconds_total", "data_wait"),
             "cp": ("teye_job_phase_seconds_total", "compute"), "cc": ("teye_job_phase_seconds_total", "compile")}
    return {names[k]: {float(t): v for t, v in enumerate(vals) if v is not None} for k, vals in series.items()}


def test_intervals_are_each_scrape_intervals_own_figures():
    # t=0 holds the previous run's counters (a = 1): the interval 0 -> 1 is not this run's.
    # 1 -> 2: 10 steps in 1.0 s (0.1), 2 -> 3: 10 in 1.2 (0.12), 3 -> 4: none (a pause), 4 -> 5: 10 in 0.8 (0.08)
    pts = _pts(count=[500, 0, 10, 20, 20, 30], sum=[90, 0.0, 1.0, 2.2, 2.2, 3.0],
               samples=[999, 0, 320, 640, 640, 960],
               dw=[50, 0.0, 0.5, 1.1, 1.1, 1.3], cp=[40, 0.0, 0.5, 1.1, 1.1, 1.7], cc=[0, 0, 5.0, 5.0, 5.0, 5.0])
    iv = C.intervals(pts, 1.0, 5.0)
    assert iv["step_seconds"] == pytest.approx([0.1, 0.12, 0.08])
    assert iv["samples_per_step_second"] == pytest.approx([320 / 1.0, 320 / 1.2, 320 / 0.8])
    # data_wait over the phases but compile: 0.5/1.0, 0.6/1.2, 0.2/0.8
    assert iv["share.data_wait"] == pytest.approx([0.5, 0.5, 0.25])
    assert "share.compile" not in iv


def test_an_interval_with_only_the_runs_last_steps_is_an_edge_and_left_out():
    """x25's failure: a run of 40 ms steps, half waiting, scraped every second: its last datagram, one step whose
    data wait went in the datagram before, fell in an interval of its own.  That interval's share (0 data wait)
    made the run's spread 0.22 and hid a change of 40 points in the noise."""
    # 4 intervals of 25 steps (1.0 s, 0.5 s waiting), then one of 1 step (0.04 s, its data wait already sent)
    pts = _pts(count=[0, 25, 50, 75, 100, 101], sum=[0, 1.0, 2.0, 3.0, 4.0, 4.04],
               dw=[0, 0.5, 1.0, 1.5, 2.02, 2.02], cp=[0, 0.5, 1.0, 1.5, 2.0, 2.02])
    iv = C.intervals(pts, 0.0, 5.0)
    # the last interval, 0.04 s of steps against a median of 1.0 s, is left out: 0.04 < 0.5 * 1.0
    assert iv["step_seconds"] == pytest.approx([0.04, 0.04, 0.04, 0.04])
    # shares 0.5/1.0, 0.5/1.0, 0.5/1.0, 0.52/1.02 (the fourth held the tail step's early data wait)
    assert iv["share.data_wait"] == pytest.approx([0.5, 0.5, 0.5, 0.52 / 1.02])
    assert C.spread(iv["share.data_wait"]) < 0.01
    # an interval of half the median's step time still counts (a run slowed for a moment, not an edge)
    pts = _pts(count=[0, 25, 50, 63, 88], sum=[0, 1.0, 2.0, 2.5, 3.5])
    assert C.intervals(pts, 0.0, 4.0)["step_seconds"] == pytest.approx([0.04, 0.04, 0.5 / 13, 0.04])


def test_an_interval_where_a_counter_fell_is_left_out():
    pts = _pts(count=[0, 10, 20, 5, 15], sum=[0, 1.0, 2.0, 0.5, 1.5])   # an agent restart between 2 and 3
    assert C.intervals(pts, 0.0, 4.0)["step_seconds"] == pytest.approx([0.1, 0.1, 0.1])
    # a restart the step counters hide (they passed their old values by the next scrape: 20 -> 25 steps, 2.0 ->
    # 5.0 s, "0.6 s a step"), which the data_wait counter shows by falling (1.0 -> 0.4): the interval is out
    pts = _pts(count=[0, 10, 20, 25, 35], sum=[0, 1.0, 2.0, 5.0, 6.0], dw=[0, 0.5, 1.0, 0.4, 0.9],
               cp=[0, 0.5, 1.0, 2.5, 3.0])
    assert C.intervals(pts, 0.0, 4.0)["step_seconds"] == pytest.approx([0.1, 0.1, 0.1])


def _job(step, sps, dw, cp, verdict="input", busy=None, state="finished"):
    return {"step_seconds_mean": step, "samples_per_second": sps, "phase_seconds": {"data_wait": dw, "compute": cp},
            "gpu_busy_ratio": busy, "gpu_memory_peak_bytes": None, "memory": {"peak_bytes": 1 << 30},
            "verdict": verdict, "input_cause": None, "state": state}


def test_figures_shares_and_world_sizes():
    iv = {"step_seconds": [0.1, 0.1, 0.1], "samples_per_step_second": [300.0, 320.0, 340.0],
          "share.data_wait": [0.5, 0.5, 0.5], "share.compute": [0.5, 0.5, 0.5]}
    a, b = _job(0.04, 800.0, 6.0, 6.0), _job(0.022, 1600.0, 1.0, 9.0, verdict="compute", busy=0.75)
    f = C.figures(a, b, iv, iv, 1, 1)
    assert f["share.data_wait"]["previous"] == pytest.approx(0.5)
    assert f["share.data_wait"]["latest"] == pytest.approx(0.1)
    assert f["share.data_wait"]["beyond_noise"] is True          # spread 0: the 1-point floor is the band
    assert f["share.data_wait"]["noise"] == pytest.approx(C.MIN_SHARE_CHANGE)
    # step time: spread 0, floor 2 % of 40 ms = 0.8 ms; samples/s: floor 2 % of 800 = 16
    assert f["step_seconds_mean"]["noise"] == pytest.approx(0.0008)
    flat = {**iv, "samples_per_step_second": [320.0] * 3}
    near = C.figures(a, _job(0.0405, 790.0, 6.05, 5.95), flat, flat, 1, 1)   # +0.5 ms, -10/s, +0.42 points
    assert near["samples_per_second"]["noise"] == pytest.approx(16.0)
    assert near["step_seconds_mean"]["beyond_noise"] is False
    assert near["samples_per_second"]["beyond_noise"] is False
    assert C.figures(a, _job(0.0405, 780.0, 6.0, 6.0), flat, flat, 1, 1)["samples_per_second"]["beyond_noise"]
    assert near["share.data_wait"]["change"] == pytest.approx(0.05 / 12)    # 6.05 / 12 - 0.5: 0.42 points
    assert near["share.data_wait"]["beyond_noise"] is False
    assert f["verdict"] == {"previous": "input", "latest": "compute", "changed": True}
    assert f["gpu_idle_ratio"]["previous"] is None and f["gpu_idle_ratio"]["latest"] == pytest.approx(0.25)
    # samples/s spread: the per-interval spread relative to its mean (20 / 320), times the figure
    assert f["samples_per_second"]["previous_spread"] == pytest.approx(800 * 20 / 320)
    # world sizes 2 then 4: samples/s per rank, 400 then 400: no change at all
    g = C.figures(a, b, iv, iv, 2, 4)
    assert "samples_per_second" not in g
    assert g["samples_per_second_per_rank"]["previous"] == pytest.approx(400.0)
    assert g["samples_per_second_per_rank"]["change"] == pytest.approx(0.0)
    assert g["samples_per_second_per_rank"]["beyond_noise"] is False


def test_world_size_is_the_launchers_else_the_processes():
    pts = {("teye_job_processes", ""): {1.0: 2.0, 2.0: 3.0}}
    assert C.world_size(pts, 1.0, 2.0) == 3
    pts[("teye_job_world_size", "")] = {1.0: 8.0, 2.0: 8.0, 9.0: 16.0}     # t=9: another run
    assert C.world_size(pts, 1.0, 2.0) == 8
    assert C.world_size({}, 1.0, 2.0) is None


RUNS = [{"start": 1000.0, "end": 2000.0, "run_start": 998.0, "start_time": "A"},
        {"start": 3000.0, "end": 4000.0, "run_start": 2999.5, "start_time": "B"}]


def test_pick_run_previous_n_back_and_by_time():
    assert C.pick_run(RUNS, "previous", 1.0)["start"] == 3000.0
    assert C.pick_run(RUNS, "1", 1.0)["start"] == 3000.0 and C.pick_run(RUNS, "2", 1.0)["start"] == 1000.0
    assert C.pick_run(RUNS, "1500", 1.0)["start"] == 1000.0       # a unix time (above 999) inside the first run
    assert C.pick_run(RUNS, "2998.7", 1.0)["start"] == 3000.0     # within 1 s of its start time
    assert C.pick_run(RUNS, "1970-01-01T00:25:00Z", 1.0)["start"] == 1000.0     # 1500 s, as ISO
    for bad in ("3", "2500", "never"):
        with pytest.raises(C.CompareError) as e:
            C.pick_run(RUNS, bad, 1.0)
        assert e.value.exit_status == EXIT_UNKNOWN and "\n" not in str(e.value)
    with pytest.raises(C.CompareError, match="only one run"):
        C.pick_run([], "previous", 1.0)


def test_text_says_no_change_beyond_noise_and_never_a_percentage_alone():
    figs = {"step_seconds_mean": C.judge(0.100, 0.103, 0.002, 0.002),     # noise 5.66 ms > 3 ms
            "share.data_wait": C.judge(0.5, 0.1, 0.01, 0.01)}
    run = {"start_time": "T0", "end_time": "T1", "steps": 10, "world_size": 1, "scrape_intervals": 5,
           "state": "finished"}
    doc = {"train_job": "j", "noise_sigmas": 2.0, "previous": run, "latest": {**run, "state": "running"},
           "figures": figs}
    out = C.text(doc)
    line = [x for x in out.splitlines() if "Step time" in x][0]
    assert "no change beyond noise (+3.0 %" in line
    line = [x for x in out.splitlines() if "data_wait" in x][0]
    assert "-40.0 points (beyond noise" in line
    assert "RUNNING" in out
