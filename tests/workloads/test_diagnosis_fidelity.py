"""teye's verdict against the TensorFlow profiler and the wall clock on the same real runs (issue 13).

Each run is ``teye profile -- python -m workloads.train ... --profile-dir``: the reference
training loop with teye's phase reporter, the TensorFlow profiler tracing the steps after
the warm-up (the warm-up is reported to teye as another job, so all three look at the same
steps), and xprof's input-pipeline analyzer read headless.  Oracles: the wall clock and the
profiler's conclusion.  The wall clock is the loop's own ``perf_counter`` right around ``next()``
and at each step's end (``results["loop_clock"]``), read apart from the PhaseTimer timestamps that
are sent to teye: the PhaseTimer's own ``input_wait_fraction`` is computed from the very numbers
teye receives, so it would agree with teye whatever teye did with them.
Short runs (batch 16, 3 + 10 steps) keep each under ~15 s on a small CPU.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.tf

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# teye's share and the loop's clock differ only by the few microseconds between a PhaseTimer
# timestamp and the perf_counter next to it (and teye's rounding to 1e-4), over steps of 50 ms and
# more: half a point leaves room for that and fails a 2-point bias in teye_job_input_bound_ratio.
WALL_TOLERANCE = 0.005


def _loop_share(res) -> float:
    loop = res["loop_clock"]
    assert loop["steps"] == 10 and loop["wall_s"] > 0, loop
    return loop["input_wait_fraction"]


def _profiled_run(tmp_path, name, *train_args):
    out = tmp_path / name
    argv = [sys.executable, "-m", "agent", "profile", "--output", str(out), "--",
            sys.executable, "-m", "workloads.train", "--model", "simple_cnn", "--batch-size", "16",
            "--steps", "13", "--warmup-steps", "3", "--synthetic-samples", "512", "--no-progress",
            "--train-job", "j", "--results", str(out / "results.json"), "--profile-dir", str(out / "tb"),
            *train_args]
    p = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=240,
                       env={**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads((out / "summary.json").read_text())
    job = next(j for j in summary["jobs"] if j["train_job"] == "j")
    assert job["steps"] == 10                       # exactly the profiled steps
    return job, json.loads((out / "results.json").read_text())


@pytest.mark.parametrize("name, args, input_bound", [
    ("naive-20ms", ["--pipeline", "naive", "--io-latency-ms", "20"], True),
    # 64 reads in flight: twice the samples/s the model consumes (16 sit at the 20 % threshold on 2 cores)
    ("tfdata-20ms-64reads", ["--pipeline", "tfdata", "--io-latency-ms", "20", "--read-parallelism", "64"], False),
    ("tfdata-100ms-4reads", ["--pipeline", "tfdata", "--io-latency-ms", "100", "--read-parallelism", "4"], True),
])
@pytest.mark.measures("the verdict against the loop's own perf_counter (loop_clock) and the TensorFlow profiler")
def test_teye_agrees_with_the_tf_profiler_and_the_wall_clock(tmp_path, name, args, input_bound):
    pytest.importorskip("tensorflow")
    pytest.importorskip("xprof")
    from workloads.tfprofile import says_input_bound
    job, res = _profiled_run(tmp_path, name, *args)
    prof = res["tf_profiler"]
    assert "error" not in prof, prof
    teye_share = job["input_bound_ratio"]
    wall = _loop_share(res)
    assert abs(teye_share - wall) <= WALL_TOLERANCE, (teye_share, wall)
    assert abs(teye_share - prof["percent"] / 100) <= 0.05, (teye_share, prof)
    assert says_input_bound(prof) is input_bound, prof["text"]
    assert (job["verdict"]["kind"] == "input") is input_bound, job["verdict"]
    if input_bound:   # reads delayed by sleeping: the process waits with idle CPUs and no storage I/O, so
        #               teye does not claim storage (no bytes read, no I/O pressure): the cause is unknown
        assert job["verdict"]["cause"] == "unknown", job["verdict"]["evidence"]
        assert "idle CPUs and no storage I/O" in job["verdict"]["evidence"]
        expected = "All Others" if "naive" in name else "waiting for input"
        assert expected in prof["text"]


@pytest.mark.parametrize("name, args", [
    ("naive-decode", ["--pipeline", "naive", "--decode-cost-ms", "5"]),
    ("tfdata-decode", ["--pipeline", "tfdata", "--decode-cost-ms", "10"]),
])
@pytest.mark.measures("the verdict against the loop's own perf_counter (loop_clock) and the TensorFlow profiler")
def test_cpu_bound_input_is_named_host_cpu(tmp_path, name, args):
    pytest.importorskip("tensorflow")
    pytest.importorskip("xprof")
    from workloads.tfprofile import says_input_bound
    job, res = _profiled_run(tmp_path, name, *args)
    assert res["decode_cost_ms"] > 0
    prof = res["tf_profiler"]
    assert "error" not in prof, prof
    # No 5-point check against the profiler here: a py_function decoder holds the GIL, and the time the
    # loop's next() then waits for the GIL is input wait to teye but not in the profiler's GetNext time
    # (benchmarks/verdicts.py measured up to 6 points apart); the verdicts must still agree.
    assert abs(job["input_bound_ratio"] - _loop_share(res)) <= WALL_TOLERANCE, \
        (job["input_bound_ratio"], res["loop_clock"])
    assert says_input_bound(prof), prof["text"]
    assert job["verdict"]["kind"] == "input" and job["verdict"]["cause"] == "host_cpu", job["verdict"]["evidence"]
    assert job["input_wait"]["cpu_ratio"] >= 0.5
    assert "num_parallel_calls" in job["verdict"]["recommendation"]


def test_parse_conclusion_classes():
    from workloads.tfprofile import ProfilerUnavailable, parse_conclusion, says_input_bound
    c = parse_conclusion("Your program is POTENTIALLY input-bound because 96.4% of the total step time sampled is "
                         "spent on 'All Others' time (which could be due to I/O or Python execution or both).")
    assert (c["class"], c["percent"], says_input_bound(c)) == ("POTENTIALLY", 96.4, True)
    c = parse_conclusion("Your program is NOT input-bound because only 3.1% of the total step time sampled is "
                         "waiting for input. Therefore, you should focus on reducing other time.")
    assert (c["class"], c["percent"], says_input_bound(c)) == ("NOT", 3.1, False)
    c = parse_conclusion("Your program COULD be input-bound because 12.0% of the total step time ...")
    assert (c["class"], says_input_bound(c)) == ("COULD", False)
    # the analyzer says POTENTIALLY even for a few percent of All Others time (seen with cache())
    c = parse_conclusion("Your program is POTENTIALLY input-bound because 3.7% of the total step time sampled is "
                         "spent on 'All Others' time (which could be due to I/O or Python execution or both).")
    assert says_input_bound(c) is False and says_input_bound(c, threshold=0.03) is True
    with pytest.raises(ProfilerUnavailable, match="unrecognized"):
        parse_conclusion("No step marker observed")
