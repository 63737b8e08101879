"""`teye report` of a training job name that ran twice (issue 29, "one run per run"): a real Prometheus
holding a history written here with known values (promtool's OpenMetrics backfill, one sample a second,
as a 1 s scrape would store), where the agent exports ``teye_job_start_time_seconds`` and restarts the
job's counters at each new run.

Oracles: the runs' own definition below (steps, samples, phase seconds, start and end), the scripted GPU
busy shares, and PromQL evaluated by Prometheus on the stored series (histogram_quantile of the run's
buckets).  A second Prometheus holds the same history cut before the second run began: "before the new
run existed".
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import List, Optional

import pytest

from tests.procs import REPO, Prometheus, prometheus_binary

pytestmark = pytest.mark.e2e

T0 = (int(time.time()) // 60) * 60 - 1800     # the history begins 30 min ago: whole seconds, a sample each
END = 110                                     # the history's last sample (seconds after T0)
LE = (0.025, 0.05, 0.1, 0.25, math.inf)


@dataclass
class Run:
    start: float        # seconds after T0 (its first message): the gauge's value is T0 + start
    steps: int
    dt: float           # seconds per step: step i ends at start + i * dt
    per_step: int       # samples per step
    wait: float         # data_wait share of a step
    busy: float         # GPU busy share while it runs
    verdict: str
    gauge: Optional[float] = None   # the gauge's value when not T0 + start (a node clock that stepped back)
    pid: int = 100
    restart: Optional[float] = None  # the agent restarts then (down for that second's scrape), under the job

    @property
    def end(self):
        return self.start + self.steps * self.dt

    def done(self, t):
        """Steps finished by time t (seconds after T0)."""
        return max(0, min(self.steps, int(math.floor((t - self.start) / self.dt + 1e-9))))

    def truth(self):
        n = self.steps
        return {"steps": n, "samples": n * self.per_step, "samples_per_second": self.per_step / self.dt,
                "data_wait": n * self.dt * self.wait, "compute": n * self.dt * (1 - self.wait),
                "run_seconds": self.end - self.start}


R1 = Run(10.3, 300, 0.1, 32, 0.7, 0.6, "input", pid=100)     # 30 s, 320 samples/s, input bound, GPU 60 %
R2 = Run(60.7, 600, 0.05, 64, 0.1, 0.2, "compute", pid=200)  # 30 s, 1280 samples/s, 20 s pause before it
BLINK = Run(59.2, 2, 0.1, 64, 0.1, 0.2, "compute", pid=150)   # one sample (at 60): inside one step of 5 s


def _series(lines, inst, name, runs: List[Run], gauge=True, gpu=True, upto=END, agent_down=None):
    """The samples a 1 s scrape of an agent would store for one job on one node; the job's series exist
    from the first scrape after its first message, and its counters restart at each run.  ``agent_down``
    (from, to): the agent is down then (no sample, up 0) and comes back with nothing of the runs before
    (its GPU counters from zero)."""
    L = {k: [] for k in ("up", "busy", "sampled", "info", "start", "procs", "steps", "samples", "sum", "count", "dw",
                         "cp",
                         "idw", "icp", "vin", "vcp") + tuple(f"b{le}" for le in LE)}
    busy = 0.0
    j = f'instance="{inst}",job="teye"'
    tj = f'{j},train_job="{name}"'
    for t in range(0, upto + 1):
        now = [r for r in runs if r.start <= t and not (agent_down and r.start < agent_down[0] <= t)]
        r = now[-1] if now else None
        down = r is not None and r.restart is not None and t == int(r.restart)
        down = down or bool(agent_down and agent_down[0] <= t <= agent_down[1])
        L["up"].append(f"up{{{j}}} {0 if down else 1} {T0 + t}")
        if down:
            if agent_down:
                busy = 0.0
            continue
        if gpu:
            busy += r.busy if (r and r.start < t <= r.end + 1e-9) else 0.0
            since = agent_down[1] + 1 if agent_down and t > agent_down[1] else 0
            L["sampled"].append(f'teye_gpu_sampled_seconds_total{{{j},gpu="0"}} {t - since} {T0 + t}')
            L["busy"].append(f'teye_gpu_busy_seconds_total{{{j},gpu="0"}} {busy:.6f} {T0 + t}')
        if r is None:
            continue
        n = r.done(t)
        ts = T0 + t
        gv = r.gauge if r.gauge is not None else T0 + r.start
        if r.restart is not None and t > r.restart:    # the new agent's first message from the job: 0.4 s later
            n -= r.done(r.restart + 0.4)
            gv = T0 + r.restart + 0.4
        L["info"].append(f'teye_job_info{{{tj},user="alice",uid="1000",pid="{r.pid}",source="client"}} 1 {ts}')
        if gauge:
            L["start"].append(f"teye_job_start_time_seconds{{{tj}}} {gv:.3f} {ts}")
        L["procs"].append(f"teye_job_processes{{{tj}}} 1 {ts}")
        L["steps"].append(f"teye_job_steps_total{{{tj}}} {n} {ts}")
        L["samples"].append(f"teye_job_samples_total{{{tj}}} {n * r.per_step} {ts}")
        L["sum"].append(f"teye_job_step_seconds_sum{{{tj}}} {n * r.dt:.6f} {ts}")
        L["count"].append(f"teye_job_step_seconds_count{{{tj}}} {n} {ts}")
        for le in LE:
            L[f"b{le}"].append(f'teye_job_step_seconds_bucket{{{tj},le="{"+Inf" if le == math.inf else le}"}} '
                               f"{n if r.dt <= le else 0} {ts}")
        L["dw"].append(f'teye_job_phase_seconds_total{{{tj},phase="data_wait"}} {n * r.dt * r.wait:.6f} {ts}')
        L["cp"].append(f'teye_job_phase_seconds_total{{{tj},phase="compute"}} {n * r.dt * (1 - r.wait):.6f} {ts}')
        if gpu:
            L["idw"].append(f'teye_job_gpu_idle_seconds_total{{{tj},phase="data_wait",gpu="0"}} '
                            f"{n * r.dt * r.wait:.6f} {ts}")
            L["icp"].append(f'teye_job_gpu_idle_seconds_total{{{tj},phase="compute",gpu="0"}} '
                            f"{n * r.dt * (1 - r.wait) * (1 - r.busy):.6f} {ts}")
        L["vin"].append(f'teye_job_bottleneck{{{tj},kind="input"}} {int(r.verdict == "input")} {ts}')
        L["vcp"].append(f'teye_job_bottleneck{{{tj},kind="compute"}} {int(r.verdict == "compute")} {ts}')
    for v in L.values():
        lines.extend(v)


# The job: 256 steps whose own clock says 27.94 s (109 ms each on average), the first 60 ms and the others
# 109.33 ms: 255 of 256 in the 100-250 ms bucket, where an interpolated p50 read 175 ms.
MEAN_START = 20.3
MEAN_STEPS = [0.06] + [(27.94 - 0.06) / 255] * 255
# A run shorter than a scrape interval: 8 steps of 0.1 s from 40.05 s to 40.85 s, all seen by the scrape at 41 s.
SHORT_START, SHORT_STEPS = 40.05, [0.1] * 8


def _steps_series(lines, inst, name, start, durations, upto=END):
    """A job with the given step durations (its own clock), one process, a 1 s scrape; data_wait 40 % of each."""
    j = f'instance="{inst}",job="teye"'
    tj = f'{j},train_job="{name}"'
    ends = [start + sum(durations[:i + 1]) for i in range(len(durations))]
    out = {}
    for t in range(0, upto + 1):
        out.setdefault("up", []).append(f"up{{{j}}} 1 {T0 + t}")
        if t < start:
            continue
        done = [d for d, e in zip(durations, ends) if e <= t + 1e-9]
        ts = T0 + t
        rows = {"info": f'teye_job_info{{{tj},user="alice",uid="1000",pid="400",source="client"}} 1',
                "start": f"teye_job_start_time_seconds{{{tj}}} {T0 + start:.3f}",
                "procs": f"teye_job_processes{{{tj}}} 1", "steps": f"teye_job_steps_total{{{tj}}} {len(done)}",
                "samples": f"teye_job_samples_total{{{tj}}} {32 * len(done)}",
                "sum": f"teye_job_step_seconds_sum{{{tj}}} {sum(done)!r}",
                "count": f"teye_job_step_seconds_count{{{tj}}} {len(done)}",
                "dw": f'teye_job_phase_seconds_total{{{tj},phase="data_wait"}} {0.4 * sum(done)!r}',
                "cp": f'teye_job_phase_seconds_total{{{tj},phase="compute"}} {0.6 * sum(done)!r}',
                "vin": f'teye_job_bottleneck{{{tj},kind="input"}} 1'}
        for le in LE:
            rows[f"b{le}"] = (f'teye_job_step_seconds_bucket{{{tj},le="{"+Inf" if le == math.inf else le}"}} '
                              f"{sum(1 for d in done if d <= le)}")
        for k, v in rows.items():
            out.setdefault(k, []).append(f"{v} {ts}")
    for v in out.values():
        lines.extend(v)


def gpu_idle_truth(r: Run):
    return {"data_wait": r.steps * r.dt * r.wait, "compute": r.steps * r.dt * (1 - r.wait) * (1 - r.busy)}


def _history(cut_before_second_run=False) -> str:
    upto = int(math.floor(R2.start)) if cut_before_second_run else END
    lines: List[str] = []
    two = [R1, R2]
    _series(lines, "rerun-a:9400", "rerun", two, upto=upto)
    _series(lines, "legacy-a:9400", "legacy", two, gauge=False, upto=upto)        # an older agent
    _series(lines, "mixed-a:9400", "mixed", two, upto=upto)
    _series(lines, "mixed-b:9400", "mixed", [R2], gauge=False, upto=upto)       # no gauge on this node
    back = Run(**{**R2.__dict__, "gauge": T0 + R1.start - 100.0})                  # its clock stepped back
    _series(lines, "back-a:9400", "back", [R1, back], upto=upto)
    _series(lines, "blink-a:9400", "blink", [R1, BLINK, R2], upto=upto)
    _series(lines, "restart-a:9400", "restart", [Run(**{**R1.__dict__, "restart": 25.0})], upto=upto)
    _series(lines, "moved-a:9400", "moved", [R1], upto=upto)     # the first run on one node, the second on
    _series(lines, "moved-b:9400", "moved", [R2], upto=upto)     # another: the first node ran an earlier run only
    _steps_series(lines, "mean-a:9400", "mean109", MEAN_START, MEAN_STEPS, upto=upto)
    # the job ran twice, the agent restarted between the runs (down from 45 to 47 s; the new agent knows
    # nothing of the first run: its series end at 44 s, the second run's begin with it)
    _series(lines, "twice-a:9400", "twice", [R1, R2], upto=upto, agent_down=(45, 47))
    _steps_series(lines, "short-a:9400", "short", SHORT_START, SHORT_STEPS, upto=upto)
    # OpenMetrics wants each series' samples together, in time order
    lines.sort(key=lambda x: (x.rsplit(" ", 2)[0].split("{")[0], x.rsplit(" ", 2)[0], float(x.rsplit(" ", 1)[1])))
    return "\n".join(lines) + "\n# EOF\n"


def _prometheus(tmp, text) -> Prometheus:
    os.makedirs(tmp, exist_ok=True)
    om = os.path.join(tmp, "history.om")
    with open(om, "w") as fh:
        fh.write(text)
    p = subprocess.run([shutil.which("promtool"), "tsdb", "create-blocks-from", "openmetrics", om,
                        os.path.join(tmp, "data")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return Prometheus(tmp, [])


@pytest.fixture(scope="module")
def proms(tmp_path_factory):
    if not prometheus_binary() or not shutil.which("promtool"):
        pytest.skip("prometheus not installed (./dev.sh test installs it)")
    tmp = tmp_path_factory.mktemp("runs")
    both = _prometheus(str(tmp / "both"), _history())
    before = _prometheus(str(tmp / "before"), _history(cut_before_second_run=True))
    try:
        yield {"both": both, "before": before}
    finally:
        both.stop()
        before.stop()


def report(prom, *args):
    p = subprocess.run([sys.executable, "-m", "agent", "report", "--prometheus", prom.url, "--format", "json",
                        *args], capture_output=True, text=True, timeout=60, cwd=REPO)
    return p.returncode, json.loads(p.stdout), p.stderr


def promql(prom, expr, at):
    return [float(r["value"][1]) for r in prom.api("query", query=expr, time=f"{at:.3f}")["result"]]


def assert_run(j, r: Run, step):
    """The report's numbers are this run's, and only this run's."""
    t = r.truth()
    assert j["steps"] == t["steps"] and j["samples"] == t["samples"]
    assert j["samples_per_second"] == pytest.approx(t["samples_per_second"], rel=1e-6)
    assert j["phase_seconds"]["data_wait"] == pytest.approx(t["data_wait"], abs=1e-5)
    assert j["phase_seconds"]["compute"] == pytest.approx(t["compute"], abs=1e-5)
    for p, v in gpu_idle_truth(r).items():
        assert j["gpu_idle_seconds_by_phase"][p] == pytest.approx(v, abs=1e-5), p
    # GPU busy over the run's window only: the other run and the pause (0 %) do not count, except the idle
    # grid steps at each edge of the window (GPU counters are differenced from the step before its start)
    d = r.end - r.start
    assert r.busy * d / (d + 3 * step) - 1e-3 <= j["gpu_busy_ratio"] <= r.busy + 1e-3
    assert j["verdict"] == r.verdict and j["verdict_shares"][r.verdict] == 1.0
    # timed as before runs existed: from the first grid point at which its counters moved (the scrape after
    # its first step, whole seconds here) to the first grid point after its last step
    first_step = math.ceil(r.start + r.dt - 1e-9)
    assert T0 + first_step - 1e-3 <= j["start"] <= T0 + first_step + step
    assert T0 + r.end - 1e-3 <= j["end"] <= T0 + r.end + 2 * step
    assert t["run_seconds"] - step <= j["run_seconds"] <= t["run_seconds"] + 2 * step


def test_the_latest_run_is_reported_and_the_earlier_one_named(proms):
    rc, doc, err = report(proms["both"], "--train-job", "rerun")
    assert rc == 0, err
    (j,) = doc["jobs"]
    step = doc["step_seconds"]
    assert step == 1.0 and j["state"] == "finished" and j["conditions"] == [] and j["complete"]
    assert_run(j, R2, step)
    (tj,) = j["train_job_details"]
    assert tj["run_start"] == {"rerun-a:9400": T0 + R2.start}
    # step time: the run's mean is Prometheus' own _sum / _count at its end, exactly; its quantiles are the
    # bucket its 50 ms steps fall in (25-50 ms: every step is exactly 50 ms, the bucket's upper bound)
    (mean,) = promql(proms["both"], 'teye_job_step_seconds_sum{train_job="rerun"} / '
                     'teye_job_step_seconds_count{train_job="rerun"}', T0 + R2.end + 2)
    assert j["step_seconds_mean"] == mean and mean == pytest.approx(R2.dt, rel=1e-9)
    assert j["step_seconds_p50_bounds"] == j["step_seconds_p95_bounds"] == [0.025, 0.05]
    # the first run: named, with the --until that reports it
    (e,) = j["earlier_runs"]
    assert e["nodes"] == ["rerun-a:9400"] and e["run_start"] == pytest.approx(T0 + R1.start, abs=1e-3)
    assert T0 + R1.start <= e["start"] <= T0 + R1.start + 2 * step
    assert T0 + R1.end - 1e-3 <= e["end"] <= T0 + R1.end + 2 * step   # the sample after its last step
    assert e["end"] <= e["until"] < T0 + R2.start + step
    assert any(n.startswith("Earlier run(s) of the same name") and f"--until {e['until']:.3f}" in n
               for n in j["notes"]), j["notes"]


def test_text_says_which_run_and_how_to_report_the_earlier_one(proms):
    p = subprocess.run([sys.executable, "-m", "agent", "report", "--prometheus", proms["both"].url, "--train-job",
                        "rerun"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "Earlier runs: 1" in p.stdout and "teye report --train-job rerun --until" in p.stdout, p.stdout
    assert "counter_reset" not in p.stdout + p.stderr


def test_the_earlier_run_reported_with_until_is_unchanged(proms):
    """The issue's "the report of the old one is unchanged": the first run, asked for with --until its
    `until`, gives its own truth and the very document a report made before the second run existed gives."""
    _, doc, _ = report(proms["both"], "--train-job", "rerun")
    (e,) = doc["jobs"][0]["earlier_runs"]
    rc, after, err = report(proms["both"], "--train-job", "rerun", "--until", f"{e['until']:.3f}")
    assert rc == 0, err
    (j,) = after["jobs"]
    step = after["step_seconds"]
    assert_run(j, R1, step)
    assert j["earlier_runs"] == [] and j["conditions"] == [] and j["state"] == "finished"
    rc, before, err = report(proms["before"], "--train-job", "rerun", "--until", f"{e['until']:.3f}")
    assert rc == 0, err
    assert before["jobs"] == after["jobs"]
    # and a report made before the second run existed, to "now": the same counts (its grid ends elsewhere)
    rc, now, err = report(proms["before"], "--train-job", "rerun")
    assert rc == 0, err
    (k,) = now["jobs"]
    assert_run(k, R1, now["step_seconds"])
    for key in ("steps", "samples", "samples_per_second", "phase_seconds", "gpu_idle_seconds_by_phase",
                "step_seconds_mean", "step_seconds_p50_bounds", "verdict", "verdict_shares"):
        assert k[key] == j[key], key
    assert abs(k["start"] - j["start"]) <= 1.0 and abs(k["end"] - j["end"]) <= 1.0    # a step: other grids


def test_an_older_agent_without_the_gauge_is_reported_as_before(proms):
    """No teye_job_start_time_seconds: one span over both runs, the drop a counter reset, summed (as before
    runs existed)."""
    rc, doc, err = report(proms["both"], "--train-job", "legacy")
    assert rc == 10, err
    (j,) = doc["jobs"]
    assert [c["kind"] for c in j["conditions"]] == ["counter_reset"]
    assert j["steps"] == R1.steps + R2.steps and j["samples"] == R1.steps * 32 + R2.steps * 64
    assert j["samples_per_second"] == pytest.approx((R1.steps * 32 + R2.steps * 64) / (R1.steps * R1.dt +
                                                                                       R2.steps * R2.dt), rel=1e-6)
    assert j["earlier_runs"] == [] and j["train_job_details"][0]["run_start"] == {"legacy-a:9400": None}
    assert T0 + R1.start <= j["start"] <= T0 + R1.start + 2 and j["end"] >= T0 + R2.end


def test_a_node_without_the_gauge_beside_one_with_it(proms):
    rc, doc, err = report(proms["both"], "--train-job", "mixed")
    assert rc == 0, err
    (j,) = doc["jobs"]
    step = doc["step_seconds"]
    (tj,) = j["train_job_details"]
    assert tj["run_start"] == {"mixed-a:9400": T0 + R2.start, "mixed-b:9400": None}
    per = {p["node"]: p for p in tj["per_node"]}
    for node in ("mixed-a:9400", "mixed-b:9400"):     # each node: the second run's (b ran only that one)
        assert per[node]["steps"] == R2.steps and per[node]["samples"] == R2.steps * 64, node
        assert per[node]["samples_per_second"] == pytest.approx(1280.0, rel=1e-6), node
    assert j["samples_per_second"] == pytest.approx(2 * 1280.0, rel=1e-6)
    (e,) = j["earlier_runs"]
    assert e["nodes"] == ["mixed-a:9400"] and e["run_start"] == pytest.approx(T0 + R1.start, abs=1e-3)
    # b's series began with the second run: it starts at its first counted point
    assert T0 + R2.start - 1e-3 <= j["start"] <= T0 + R2.start + 2 * step


def test_a_start_time_that_goes_backwards(proms):
    """The second run's gauge says it began 100 s before the first: the node's clock stepped back.  The run
    Prometheus saw last is reported (its own numbers, no counter reset) and the oddity is a condition."""
    rc, doc, err = report(proms["both"], "--train-job", "back")
    assert rc == 9, err
    (j,) = doc["jobs"]
    assert [c["kind"] for c in j["conditions"]] == ["start_time_backwards"]
    assert "back-a:9400" in err and "clock stepped back" in err
    step = doc["step_seconds"]
    # its start: the gauge says 100 s before the first run; the report starts it after the first run's last
    # point instead (never inside the other run)
    assert_run(j, R2, step)
    (e,) = j["earlier_runs"]
    assert e["run_start"] == pytest.approx(T0 + R1.start, abs=1e-3)


def test_two_start_times_inside_one_step(proms):
    """A run that began and ended within one step of the report's grid (5 s here, 1 s samples): the next run
    counts from zero (its first grid point holds only its own counts), the drop is no counter reset, and
    the report says a run was too short to see."""
    # the report's grid is the multiples of its step (Unix time): a step with no multiple in [60, 61), the only
    # second that shows BLINK
    st = next(x for x in (7.0, 6.0, 9.0, 11.0, 13.0) if math.floor((T0 + 61 - 1e-6) / x) * x < T0 + 60 - 1e-6
              and T0 + R2.start + 2 * x < T0 + R2.end)
    rc, doc, err = report(proms["both"], "--train-job", "blink", "--step", f"{st:g}", "--until", f"{T0 + 112.5:.3f}")
    assert rc == 0, err
    assert doc["step_seconds"] == st
    (j,) = doc["jobs"]
    assert j["conditions"] == []
    assert_run(j, R2, st)
    assert any(n.startswith("1 run(s) of blink on blink-a:9400 began and ended within one step") for n in j["notes"])
    (e,) = j["earlier_runs"]
    assert e["run_start"] == pytest.approx(T0 + R1.start, abs=1e-3)
    # at the 1 s grid that run is seen: an earlier run of its own, between the two
    rc, doc, err = report(proms["both"], "--train-job", "blink", "--until", f"{T0 + 112.5:.3f}")
    assert rc == 0, err
    (j,) = doc["jobs"]
    assert_run(j, R2, 1.0)
    first, blink = j["earlier_runs"]
    assert first["run_start"] == pytest.approx(T0 + R1.start, abs=1e-3)
    assert blink["run_start"] == pytest.approx(T0 + BLINK.start, abs=1e-3) and blink["end"] < T0 + R2.start + 1.0
    assert not any("began and ended within one step" in n for n in j["notes"])


def test_an_agent_restart_under_a_running_job_is_no_new_run(proms):
    """The agent restarts 15 s into the run: it lost the job's state, so its next message starts a new start
    time, but the job's first process (teye_job_info{pid}) is the same on both sides: one run, whose
    counters reset, summed across the restart as before (the steps between the last scrape and the
    restart are lost), and the node's missing scrape said."""
    rc, doc, err = report(proms["both"], "--train-job", "restart")
    assert rc == 8, err
    (j,) = doc["jobs"]
    assert sorted(c["kind"] for c in j["conditions"]) == ["counter_reset", "node_vanished"]
    assert j["earlier_runs"] == []
    assert j["steps"] == R1.done(24) + R1.steps - R1.done(25.4)
    assert T0 + R1.start <= j["start"] <= T0 + R1.start + 2 and j["end"] >= T0 + R1.end
    assert j["train_job_details"][0]["run_start"] == {"restart-a:9400": T0 + R1.start}
    assert not any("began and ended within one step" in n for n in j["notes"]), j["notes"]


def test_a_node_that_ran_only_the_earlier_run_is_left_out(proms):
    rc, doc, err = report(proms["both"], "--train-job", "moved")
    assert rc == 0, err
    (j,) = doc["jobs"]
    assert j["nodes"] == ["moved-b:9400"] and j["conditions"] == []
    assert_run(j, R2, doc["step_seconds"])
    (e,) = j["earlier_runs"]
    assert e["nodes"] == ["moved-a:9400"] and e["run_start"] == pytest.approx(T0 + R1.start, abs=1e-3)
    # its --until stops before the second run shows on the other node: that report is the first run alone
    assert e["end"] <= e["until"] < T0 + R2.start + 1.0
    rc, doc, err = report(proms["both"], "--train-job", "moved", "--until", f"{e['until']:.3f}")
    assert rc == 0, err
    (k,) = doc["jobs"]
    assert k["nodes"] == ["moved-a:9400"] and k["earlier_runs"] == [] and k["state"] == "finished"
    assert_run(k, R1, doc["step_seconds"])


# ------------------------------------------------------------------------------------- step times, short runs
def test_the_109_ms_job_reads_109_ms_and_its_bucket(proms):
    """The issue's job: 256 steps, 27.94 s by its own clock.  The mean is the histogram's own _sum / _count
    exactly (PromQL's division of the stored samples), 109 ms to the script's clock; p50 and p95 are the
    bucket 100-250 ms, in JSON and in text, never an interpolated 175 ms."""
    rc, doc, err = report(proms["both"], "--train-job", "mean109")
    assert rc == 0, err
    (j,) = doc["jobs"]
    (mean,) = promql(proms["both"], 'teye_job_step_seconds_sum{train_job="mean109"} / '
                     'teye_job_step_seconds_count{train_job="mean109"}', T0 + END)
    assert j["step_seconds_mean"] == mean                             # bit for bit
    assert mean == pytest.approx(27.94 / 256, rel=1e-12) and j["steps"] == 256
    assert j["step_seconds_p50_bounds"] == j["step_seconds_p95_bounds"] == [0.1, 0.25]
    (tj,) = j["train_job_details"]
    assert tj["per_node"][0]["step_seconds_mean"] == mean and tj["per_node"][0]["step_seconds_p50_bounds"] == [0.1, 0.25]
    # what interpolation inside the bucket says, for the record: far from the script's 109 ms
    (interp,) = promql(proms["both"], 'histogram_quantile(0.5, teye_job_step_seconds_bucket{train_job="mean109"})',
                       T0 + END)
    assert interp > 0.17
    p = subprocess.run([sys.executable, "-m", "agent", "report", "--prometheus", proms["both"].url, "--train-job",
                        "mean109"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "Steps: 256, step time mean 109 ms, p50 100-250 ms, p95 100-250 ms" in p.stdout, p.stdout
    assert "175" not in p.stdout


def test_a_run_shorter_than_a_scrape_interval_has_its_step_time_and_says_short(proms):
    """8 steps of 0.1 s between two scrapes: its counters moved at one grid point only (0 s on the grid).
    Its run time is its steps' time (0.8 s by its own clock), and it says it is short; a long run does not."""
    rc, doc, err = report(proms["both"], "--train-job", "short")
    assert rc == 0, err
    (j,) = doc["jobs"]
    assert j["steps"] == 8 and j["start"] == j["end"] == T0 + 41
    assert j["run_seconds"] == pytest.approx(sum(SHORT_STEPS), abs=1e-6) and j["short_run"] is True
    assert any(n.startswith("Short run: its counters moved within one step") for n in j["notes"]), j["notes"]
    p = subprocess.run([sys.executable, "-m", "agent", "report", "--prometheus", proms["both"].url, "--train-job",
                        "short"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert "Run time: 00:00:01 (short: under one step of the report" in p.stdout, p.stdout
    rc, doc, err = report(proms["both"], "--train-job", "mean109")
    assert doc["jobs"][0]["short_run"] is False


def _figures(doc):
    """What must not change between calls: every job's run bounds and figures (not the call's own time)."""
    return [{k: v for k, v in j.items()} for j in doc["jobs"]], doc["step_seconds"]


def test_three_calls_a_scrape_interval_apart_give_the_same_runs(proms):
    """The issue's "a different run on every call": the same finished jobs, reported three times 1.1 s apart
    (the history's scrape interval is 1 s), give the same JSON: run bounds, lengths and every figure.  The
    names take turns, so that each one's calls are at least 1.1 s apart and the sleeps are shared."""
    names = ("rerun", "mean109", "short")
    got = {name: [] for name in names}
    for i in range(3):
        if i:
            time.sleep(1.1)
        for name in names:
            rc, doc, err = report(proms["both"], "--train-job", name)
            assert rc == 0, err
            got[name].append(_figures(doc))
    for name in names:
        assert got[name][0] == got[name][1] == got[name][2], name


def test_two_runs_with_an_agent_restart_between(proms):
    """Issue 39's bad input: a window in which the job ran twice with a restart of the agent between.  The
    latest run is reported with its own numbers (no counter reset: the drop of the GPU counters is before
    its window, and the new agent's job counters start with it), the first is named, and reported alone
    with its --until, also with its own numbers; the agent's absence between them concerns neither."""
    rc, doc, err = report(proms["both"], "--train-job", "twice")
    assert rc == 0, err
    (j,) = doc["jobs"]
    assert j["conditions"] == [] and j["state"] == "finished"
    assert_run(j, R2, doc["step_seconds"])
    (e,) = j["earlier_runs"]
    assert e["run_start"] == pytest.approx(T0 + R1.start, abs=1e-3) and e["end"] <= T0 + 45
    rc, doc, err = report(proms["both"], "--train-job", "twice", "--until", f"{e['until']:.3f}")
    assert rc == 0, err
    (k,) = doc["jobs"]
    assert k["conditions"] == [] and k["earlier_runs"] == []
    assert_run(k, R1, doc["step_seconds"])


# ---------------------------------------------------------------------------------------------- live scrapes
# The same two runs, shorter, exposed by a scripted target that a real Prometheus scrapes every second (so
# series that leave the exposition get staleness markers, as an agent's do), each run in its own Slurm job
# on the node's GPU 0: which run a Slurm job's report and a training job's report pick.

L1 = Run(1.2, 50, 0.1, 32, 0.7, 0.6, "input", pid=300)       # 5 s, 320 samples/s
L2 = Run(11.3, 100, 0.05, 64, 0.1, 0.2, "compute", pid=301)  # 5 s, 1280 samples/s, 5 s after the first ended
LIVE_END = 21.0


def _live_render(wall0):
    def render(el):
        r = ([x for x in (L1, L2) if x.start <= el] or [None])[-1]
        out = []
        if r is not None:
            n = r.done(el)
            tj = 'train_job="live"'
            out += [f'teye_job_info{{{tj},user="alice",uid="1000",pid="{r.pid}",source="client"}} 1',
                    f"teye_job_start_time_seconds{{{tj}}} {wall0 + r.start:.3f}",
                    f"teye_job_steps_total{{{tj}}} {n}", f"teye_job_samples_total{{{tj}}} {n * r.per_step}",
                    f"teye_job_step_seconds_sum{{{tj}}} {n * r.dt:.6f}", f"teye_job_processes{{{tj}}} 1",
                    f'teye_job_phase_seconds_total{{{tj},phase="data_wait"}} {n * r.dt * r.wait:.6f}',
                    f'teye_job_phase_seconds_total{{{tj},phase="compute"}} {n * r.dt * (1 - r.wait):.6f}',
                    f'teye_job_gpu_idle_seconds_total{{{tj},phase="data_wait",gpu="0"}} {n * r.dt * r.wait:.6f}',
                    f'teye_job_gpu_idle_seconds_total{{{tj},phase="compute",gpu="0"}} '
                    f"{n * r.dt * (1 - r.wait) * (1 - r.busy):.6f}",
                    f'teye_job_bottleneck{{{tj},kind="{r.verdict}"}} 1']
            if r.start - 0.2 <= el <= r.end + 0.5:     # its process holds GPU 0, in its own Slurm job
                out.append(f'teye_gpu_process_info{{gpu="0",pid="{r.pid}",user="alice",slurm_job="{r.pid}",'
                           f'pod_uid=""}} 1')
        busy = sum(x.busy * max(0.0, min(el, x.end) - x.start) for x in (L1, L2) if x.start <= el)
        out += [f'teye_gpu_busy_seconds_total{{gpu="0"}} {busy:.6f}', f'teye_gpu_sampled_seconds_total{{gpu="0"}} {el:.6f}']
        return ("\n".join(out) + "\n").encode()
    return render


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    if not prometheus_binary():
        pytest.skip("prometheus not installed (./dev.sh test installs it)")
    from tests.report.test_report_e2e import Scripted
    tmp = tmp_path_factory.mktemp("live")
    state = {}

    def render(el):
        if "r" not in state:     # its clock starts at Prometheus' first scrape
            state["wall0"] = time.time() - el
            state["r"] = _live_render(state["wall0"])
        return state["r"](el)
    target = Scripted(render)
    prom = None
    try:
        prom = Prometheus(str(tmp), [f"127.0.0.1:{target.port}"])
        prom.wait_for("up == 1", timeout=30)
        while "wall0" not in state or time.time() - state["wall0"] < LIVE_END:
            time.sleep(0.2)
        time.sleep(1.5)
        yield {"prom": prom, "wall0": state["wall0"], "node": f"127.0.0.1:{target.port}"}
    finally:
        if prom:
            prom.stop()
        target.stop()


def test_live_each_slurm_job_reports_its_own_run(live):
    w = live["wall0"]
    rc, doc, err = report(live["prom"], "--slurm-job", "300")
    assert rc == 0, err
    (j,) = doc["jobs"]
    assert j["train_jobs"] == ["live"] and j["steps"] == L1.steps and j["samples"] == L1.steps * 32
    assert j["samples_per_second"] == pytest.approx(320.0, rel=1e-6) and j["earlier_runs"] == []
    assert j["train_job_details"][0]["run_start"] == {live["node"]: pytest.approx(w + L1.start, abs=1e-3)}
    rc, doc, err = report(live["prom"], "--slurm-job", "301")
    assert rc == 0, err
    (j,) = doc["jobs"]
    assert j["train_jobs"] == ["live"] and j["steps"] == L2.steps and j["samples"] == L2.steps * 64
    assert j["samples_per_second"] == pytest.approx(1280.0, rel=1e-6) and j["conditions"] == []
    assert j["verdict"] == "compute" and j["verdict_shares"]["compute"] == 1.0
    (e,) = j["earlier_runs"]
    assert e["run_start"] == pytest.approx(w + L1.start, abs=1e-3)


def test_live_three_calls_a_scrape_interval_apart_give_the_same_runs(live):
    """A job that ended seconds ago on a target Prometheus still scrapes every second: three reports a scrape
    interval apart give the same runs and figures (the grid is the multiples of the step, whenever the call).
    The two reports take turns, so that each one's calls are at least 1 s apart and the sleeps are shared."""
    calls = (("--train-job", "live"), ("--slurm-job", "300"))
    got = {args: [] for args in calls}
    for i in range(3):
        if i:
            time.sleep(1.0)
        for args in calls:
            rc, doc, err = report(live["prom"], *args)
            assert rc == 0, err
            got[args].append(_figures(doc))
    for args in calls:
        assert got[args][0] == got[args][1] == got[args][2], args


def test_live_train_job_report_is_the_latest_run_in_its_slurm_job(live):
    w = live["wall0"]
    rc, doc, err = report(live["prom"], "--train-job", "live")
    assert rc == 0, err
    (j,) = doc["jobs"]
    step = doc["step_seconds"]
    assert j["slurm_job"] == "301" and j["conditions"] == [] and j["state"] == "finished"
    assert j["steps"] == L2.steps and j["samples_per_second"] == pytest.approx(1280.0, rel=1e-6)
    assert L2.end - L2.start - step <= j["run_seconds"] <= L2.end - L2.start + 2 * step
    assert w + L2.start - 1e-3 <= j["start"] <= w + L2.start + 2 * step
    (e,) = j["earlier_runs"]
    rc, doc, err = report(live["prom"], "--train-job", "live", "--until", f"{e['until']:.3f}")
    assert rc == 0, err
    (k,) = doc["jobs"]
    assert k["slurm_job"] == "300" and k["steps"] == L1.steps and k["earlier_runs"] == []
    assert k["samples_per_second"] == pytest.approx(320.0, rel=1e-6) and k["state"] == "finished"


# ------------------------------------------------------------------------------------------------ real agent
def test_real_agent_two_runs_of_one_name(tmp_path):
    """The whole path: a real agent (its own run detection, docs/phases.md) scraped by a real Prometheus while
    one loop runs twice under one name, the second after the first ended.  Oracle: each loop's own clock
    (samples per second of its step time, input share, start and end) and counts."""
    if not prometheus_binary():
        pytest.skip("prometheus not installed (./dev.sh test installs it)")
    from tests.conftest import PROCFS, parse_exposition
    from tests.phases.helpers import shared_tmpdir
    from tests.procs import Agent
    from tests.report.test_report_e2e import LOOP
    d = shared_tmpdir()
    conf = tmp_path / "teye.yaml"
    conf.write_text("collectors:\n" + "".join(f"  {c}: {{enabled: false}}\n" for c in (
        "memory", "disk", "network", "infiniband", "nfs", "nfsd", "pressure", "gpu", "pmu")))
    sock = os.path.join(d, "phases.sock")
    agent = Agent(["--config", str(conf), "--procfs", PROCFS, "--phase-socket", sock],
                  log_path=str(tmp_path / "agent.log"))
    prom = None
    try:
        prom = Prometheus(str(tmp_path), [f"127.0.0.1:{agent.port}"])
        prom.wait_for("up == 1", timeout=30)
        env = {**os.environ, "PYTHONPATH": REPO, "TEYE_PHASE_SOCKET": sock}

        def loop(*args):
            p = subprocess.run([sys.executable, "-c", LOOP, "again", *args], env=env, capture_output=True,
                               text=True, timeout=60, check=True)
            return json.loads(p.stdout)

        def running():
            m = parse_exposition(agent.metrics())
            return m.get(("teye_job_running", (("train_job", "again"),)))
        one = loop("60", "0.02", "0.01")          # input bound, ~1,070 samples/s
        deadline = time.monotonic() + 20
        while running() != 0 and time.monotonic() < deadline:     # the agent says the run ended
            time.sleep(0.3)
        assert running() == 0
        time.sleep(1.5)
        two = loop("80", "0.001", "0.01")         # ~2,900 samples/s
        prom.wait_for('teye_job_steps_total{train_job="again"} == 80', timeout=30)
        time.sleep(2.5)
        rc, doc, err = report(prom, "--train-job", "again")
        assert rc == 0, err
        (j,) = doc["jobs"]
        step = doc["step_seconds"]
        assert j["conditions"] == [] and j["state"] == "finished"
        assert j["steps"] == 80 and j["samples"] == two["samples"]
        assert j["samples_per_second"] == pytest.approx(two["samples"] / two["total"], rel=0.05)
        assert j["input_bound_ratio"] == pytest.approx(two["wait"] / two["total"], abs=0.03)
        assert abs(j["run_seconds"] - (two["end"] - two["start"])) <= 2 * step + 0.5
        (e,) = j["earlier_runs"]
        assert abs(e["run_start"] - one["start"]) <= 1.0 and e["end"] < two["start"] + step
        rc, doc, err = report(prom, "--train-job", "again", "--until", f"{e['until']:.3f}")
        assert rc == 0, err
        (k,) = doc["jobs"]
        assert k["conditions"] == [] and k["state"] == "finished" and k["earlier_runs"] == []
        assert k["steps"] == 60 and k["samples"] == one["samples"]
        assert k["samples_per_second"] == pytest.approx(one["samples"] / one["total"], rel=0.05)
        assert k["input_bound_ratio"] == pytest.approx(one["wait"] / one["total"], abs=0.03)
    finally:
        if prom:
            prom.stop()
        agent.stop()
        shutil.rmtree(d, ignore_errors=True)
