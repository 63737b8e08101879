"""`teye profile -- CMD`: verdict, input-bound ratio against the injected ground truth, PNG, exit status."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from agent.profile import idle_gaps, render_overview
from agent.context import UtilSample

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A training loop with injected sleeps; it writes its own ground truth, timed with perf_counter apart
# from the timestamps the reporter sends: the wait is timed inside the data_wait phase, around the
# sleep, and the whole is the loop's wall time from its first phase to its last step.  (Timing the
# wait around the `with` block counted the reporter's own work when the phase ends as input wait: on
# the first record it starts its flush thread, which takes 3-8 ms on a loaded 2-core machine, about
# one point of this 0.6 s run; teye rightly leaves it out of data_wait.)
SCRIPT = """
import json, sys, time
from workloads.phases import Reporter
wait_s, compute_s, steps, out, status = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
compile_s = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0   # once, after the first step (a retrace)
rep = Reporter(train_job="injected")
waited, t0, compiled = 0.0, None, 0.0
for i in range(steps):
    with rep.phase("data_wait"):
        w0 = time.perf_counter()
        t0 = w0 if t0 is None else t0   # the first step starts at its first phase
        time.sleep(wait_s)
        waited += time.perf_counter() - w0
    if i == 1 and compile_s:
        c0 = time.perf_counter()
        with rep.phase("compile"):
            time.sleep(compile_s)
        compiled = time.perf_counter() - c0
    with rep.phase("compute"):
        time.sleep(compute_s)
    rep.step(samples=32)
json.dump({"input_bound_ratio": waited / (time.perf_counter() - t0 - compiled), "compile_s": compiled},
          open(out, "w"))
sys.exit(status)
"""

def _profile(tmp_path, name, *args, config=None):
    out = tmp_path / name
    truth = tmp_path / f"{name}-truth.json"
    conf = []
    if config is not None:
        (tmp_path / "teye.yaml").write_text(config)
        conf = ["--config", str(tmp_path / "teye.yaml")]
    p = subprocess.run([sys.executable, "-m", "agent", "profile", "--output", str(out), *conf, "--",
                        sys.executable, "-c", SCRIPT, *[str(a) for a in args[:3]], str(truth),
                        *[str(a) for a in args[3:]]],
                       capture_output=True, text=True, cwd=REPO, timeout=120,
                       env={**os.environ, "PYTHONPATH": REPO})
    summary = json.loads((out / "summary.json").read_text())
    return p, summary, json.loads(truth.read_text()), out


@pytest.mark.measures("teye profile's shares against the loop's own perf_counter")
def test_input_bound_command(tmp_path):
    # GPU collector off, so the device rows say none on any machine (on a GPU node too)
    p, summary, truth, out = _profile(tmp_path, "slow-input", 0.03, 0.01, 15, 3,
                                      config="collectors:\n  gpu: {enabled: false}\n")
    assert p.returncode == 3 and summary["exit_status"] == 3  # the command's exit status
    (job,) = summary["jobs"]
    assert job["train_job"] == "injected" and job["steps"] == 15 and job["samples"] == 480
    assert job["input_bound_ratio"] == pytest.approx(truth["input_bound_ratio"], abs=0.005)  # a 2-point bias fails
    assert job["verdict"]["kind"] == "input" and "prefetch" in job["verdict"]["recommendation"]
    assert job["step_time_breakdown"]["data_wait"]["ms_per_step"] == pytest.approx(30, rel=0.3)
    assert summary["gpus"] == [] and summary["gpu_note"] == "gpu collector disabled in the configuration"
    assert "devices: none" in p.stdout and "verdict: INPUT" in p.stdout and "input-bound:" in p.stdout
    # no GPU samples, no GPU figures: null in JSON, n/a in text (never "idle by phase: data_wait 0.00 s")
    assert job["gpu_idle_ratio"] is None and job["gpu_idle_seconds_by_phase"] is None
    assert "GPU idle: n/a (no GPU samples for this job)" in p.stdout and "idle by phase" not in p.stdout
    if importlib.util.find_spec("matplotlib"):
        png = (out / "timeline.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
        assert summary["timeline_png"] == "timeline.png"
        # a CPU-only job: no device idle drawn (its phases leave 75 % of each step without device work)
        import matplotlib.image as mpimg
        import numpy as np
        from agent.profile import IDLE_COLOR, PHASE_COLORS
        img = (mpimg.imread(str(out / "timeline.png"))[..., :3] * 255).round().astype(int)
        near = lambda c: int((np.abs(img - [int(c[i:i + 2], 16) for i in (1, 3, 5)]).sum(axis=2) <= 60).sum())  # noqa: E731
        assert near(IDLE_COLOR) == 0 and near(PHASE_COLORS["compute"]) > 100
    else:
        assert summary["timeline_png"] is None and "matplotlib" in summary["timeline_note"]


@pytest.mark.measures("teye profile's shares against the loop's own perf_counter")
def test_compile_inside_a_step_is_apart_and_in_no_share(tmp_path):
    """A client that sends a compile phase inside a step (the Reporter's own layout): listed on its own line,
    left out of the step-time breakdown and of the input-bound share (the loop's clock, its compile taken out)."""
    p, summary, truth, out = _profile(tmp_path, "compiled", 0.03, 0.01, 15, 0, 0.3,
                                      config="collectors:\n  gpu: {enabled: false}\n")
    assert p.returncode == 0, p.stderr[-2000:]
    (job,) = summary["jobs"]
    assert job["steps"] == 15 and "compile" not in job["step_time_breakdown"]
    assert job["compile_seconds"] == pytest.approx(truth["compile_s"], abs=0.005)
    assert job["input_bound_ratio"] == pytest.approx(truth["input_bound_ratio"], abs=0.005)   # 0.75, 0.45 counted
    assert job["step_time_breakdown"]["data_wait"]["share"] == pytest.approx(truth["input_bound_ratio"], abs=0.005)
    text = p.stdout
    assert f"compile: {job['compile_seconds']:.2f} s tracing and compiling step functions, between steps" in text


@pytest.mark.measures("teye profile's shares against the loop's own perf_counter")
def test_compute_bound_command(tmp_path):
    p, summary, truth, _ = _profile(tmp_path, "fast-input", 0.0005, 0.02, 15, 0)
    assert p.returncode == 0
    (job,) = summary["jobs"]
    assert job["input_bound_ratio"] == pytest.approx(truth["input_bound_ratio"], abs=0.005)  # a 2-point bias fails
    assert job["input_bound_ratio"] < 0.1 and job["verdict"]["kind"] == "compute"


def test_usage_errors(tmp_path):
    p = subprocess.run([sys.executable, "-m", "agent", "profile", "--output", str(tmp_path), "--"],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert p.returncode == 2 and "no command given" in p.stderr
    p = subprocess.run([sys.executable, "-m", "agent", "profile", "--output", str(tmp_path), "--",
                        "/nonexistent/cmd"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert p.returncode == 127 and "command not found" in p.stderr


def test_idle_gaps_and_overview_rendering():
    ms = 1_000_000
    samples = [UtilSample(0, 100 * ms, 0.0), UtilSample(100 * ms, 200 * ms, 0.0), UtilSample(200 * ms, 300 * ms, 0.9),
               UtilSample(300 * ms, 350 * ms, 0.0), UtilSample(400 * ms, 500 * ms, 0.0)]
    assert idle_gaps(samples, 0.0, 0) == [{"start_s": 0.0, "duration_s": 0.2}, {"start_s": 0.4, "duration_s": 0.1},
                                          {"start_s": 0.3, "duration_s": 0.05}]
    text = render_overview({"command": ["train"], "exit_status": 0, "duration_s": 1.0, "output_dir": "d",
                            "host": {"cpus": 2, "cpu_busy_ratio": 0.5}, "gpu_note": "",
                            "gpus": [{"gpu": "0", "busy_ratio": 0.6, "idle_ratio": 0.4,
                                      "longest_idle_gaps": idle_gaps(samples, 0.0, 0)}],
                            "jobs": [], "timeline_png": None, "timeline_note": "matplotlib is not installed"})
    assert "GPU 0: busy 60 %, idle 40 %; longest idle gaps: 0.20 s at +0.0 s" in text
    assert "no phase messages arrived" in text
