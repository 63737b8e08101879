"""One definition of every figure (issue 47): one unmodified PyTorch job that evaluates while it trains, read
through every view teye has: the live agent's gauge, the recording rule on a real Prometheus scraping that
agent, `teye report` over that Prometheus (all of one run, within 3 points of each other and of the script's
clock; the rule, a rate() ratio, to Prometheus' own arithmetic on the counters it scraped, which are within 3
points: _rules_and_scraped), and `teye profile` of the same script (a run of its own: within 3 points of that
run's clock).

Oracle: the script's own perf_counter clock of its training steps (tests/client/torch_eval.py: from asking
for a batch to the end of optimizer.step()) and of its input wait, and its own step and sample counts.
Evaluation (a validation pass every 40 steps and one at exit, 12-20 % of the run) is beside training: any
view that takes it into the input-bound share reads 10+ points low (the report did, before issue 47).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.client.helpers import base_env, last_json, teye_run
from tests.conftest import PROCFS, parse_exposition
from tests.phases.helpers import shared_tmpdir
from tests.procs import REPO, Agent, Prometheus, prometheus_binary

pytest.importorskip("torch")
pytestmark = [pytest.mark.e2e,
              pytest.mark.measures("the input share in every view against the loop's own perf_counter")]

SCRIPT = os.path.join(REPO, "tests", "client", "torch_eval.py")
ARGS = ["400", "40"]          # 400 training steps, a validation pass every 40 and one at exit
RULES = [os.path.join(REPO, "deploy", "prometheus", "rules", f) for f in ("teye-thresholds.yml", "teye-recording.yml")]
OTHERS = ("memory", "disk", "network", "infiniband", "nfs", "nfsd", "pressure", "gpu")
JOB = "truth-withval"
ENV = base_env(OMP_NUM_THREADS="1")   # one torch thread: on a shared 2-core machine more only thrash


def prometheus_rate(prom, selector: str, at: float, window_s: float = 300.0) -> float:
    """rate(selector[5m]) of one counter at time ``at``, from its raw samples by Prometheus 2's own arithmetic
    (promql extrapolatedRate): the increase over the samples in the window, extrapolated to the window's start
    and end where they lie within 1.1 average intervals of the first and last sample (to the counter's zero
    point first, where that comes sooner), else by half an average interval, over the window's length."""
    (series,) = prom.api("query", query=f"{selector}[{int(window_s)}s]", time=f"{at:.3f}")["result"]
    pts = [(float(t), float(v)) for t, v in series["values"]]
    assert len(pts) >= 2, pts
    inc, last = pts[-1][1] - pts[0][1], 0.0
    for _, v in pts:
        if v < last:
            inc += last                          # a counter reset
        last = v
    sampled = pts[-1][0] - pts[0][0]
    avg = sampled / (len(pts) - 1)
    to_start, to_end = pts[0][0] - (at - window_s), at - pts[-1][0]
    if inc > 0 and pts[0][1] >= 0:
        to_start = min(to_start, sampled * pts[0][1] / inc)
    span = sampled + sum(d if d < 1.1 * avg else avg / 2 for d in (to_start, to_end))
    return inc * span / sampled / window_s


def _rules_and_scraped(prom, job):
    """The job's input-bound and mean-step-time rules (held to Prometheus' own arithmetic on the counters it
    scraped) and those counters' latest values: (rule input-bound share, {counter: value}).

    The rules are rate() ratios, and rate() on a run this short (5-10 s) is not the run's own figure: the first
    scrape that sees the job holds up to a second of it, which Prometheus adds back only where the counter's
    zero point lies within 1.1 scrape intervals of that sample, each counter on its own (a run whose first
    second waited longer than the rest crosses it for data_wait and not for the step time: a clean run, x27 of
    stop 62, read 0.739 for a share of 0.817).  So the rules are held to the counters Prometheus scraped, by its
    arithmetic, and those counters to the script's clock."""
    def latest(expr):   # (value, the time of the sample: an instant query's own time is the query's)
        (v,) = prom.query(expr)
        (t,) = prom.query(f"timestamp({expr})")
        return float(v["value"][1]), float(t["value"][1])
    rule, at = latest(f'teye:job_input_bound:ratio5m{{train_job="{job}"}}')
    mean_rule, at_mean = latest(f'teye:job_step_seconds:mean5m{{train_job="{job}"}}')
    assert at_mean == at   # (one rule group: one evaluation time)

    def sel(name, **lab):
        return name + "{" + ",".join(f'{k}="{v}"' for k, v in {"train_job": job, **lab}.items()) + "}"
    dw = prometheus_rate(prom, sel("teye_job_phase_seconds_total", phase="data_wait"), at)
    ss = prometheus_rate(prom, sel("teye_job_step_seconds_sum"), at)
    assert rule == pytest.approx(dw / ss, rel=1e-6), (rule, dw, ss)
    assert mean_rule == pytest.approx(ss / prometheus_rate(prom, sel("teye_job_steps_total"), at), rel=1e-6)
    scraped = {n: float(prom.query(sel(n, **lab))[0]["value"][1]) for n, lab in (
        ("teye_job_phase_seconds_total", {"phase": "data_wait"}), ("teye_job_step_seconds_sum", {}),
        ("teye_job_steps_total", {}))}
    return rule, scraped


def _value(m, name, **labels):
    return m.get((name, tuple(sorted(labels.items()))))


def _served(agent, job, steps):
    """What the agent serves once it has counted the job's every step (at most 20 s on)."""
    deadline = time.monotonic() + 20
    while True:
        served = parse_exposition(agent.metrics())
        if (_value(served, "teye_job_steps_total", train_job=job) or 0) >= steps or time.monotonic() > deadline:
            return served
        time.sleep(0.3)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    if not prometheus_binary():
        pytest.skip("prometheus not installed (./dev.sh test installs it)")
    tmp_path = tmp_path_factory.mktemp("truth")
    d = shared_tmpdir()
    conf = tmp_path / "teye.yaml"
    conf.write_text("collectors:\n" + "".join(f"  {c}: {{enabled: false}}\n" for c in OTHERS))
    sock = os.path.join(d, "phases.sock")
    agent = Agent(["--config", str(conf), "--procfs", PROCFS, "--phase-socket", sock],
                  log_path=str(tmp_path / "agent.log"))
    prom = Prometheus(str(tmp_path), [f"127.0.0.1:{agent.port}"], rule_files=RULES)
    yield agent, prom, sock
    prom.stop()
    assert agent.stop() == 0
    shutil.rmtree(d, ignore_errors=True)


def test_one_job_reads_the_same_in_every_view(stack, tmp_path):
    agent, prom, sock = stack
    prom.wait_for("up == 1", timeout=30)   # (its first scrape comes ~6 s after its start: let it see the job run)
    run = teye_run([sys.executable, SCRIPT, *ARGS], socket_path=sock, job=JOB, timeout=300, env=ENV)
    assert run.returncode == 0, run.stderr
    own = last_json(run.stdout)
    truth = own["wait_share"]                     # training only, by the script's own clock
    assert own["eval_s"] > 0.1 * (own["eval_s"] + own["train_s"]), own   # evaluation that would dilute it
    assert truth > 0.5, own

    # the agent's gauge, once it has every step (its window, 60 s, holds the whole run)
    served = _served(agent, JOB, own["steps"])
    gauge = _value(served, "teye_job_input_bound_ratio", train_job=JOB)
    assert _value(served, "teye_job_steps_total", train_job=JOB) == own["steps"]
    assert _value(served, "teye_job_samples_total", train_job=JOB) == own["samples"]
    served_at = time.time()
    # Prometheus has scraped what the agent served after the job's end, and evaluated the rules on it
    prom.wait_for(f'timestamp(teye_job_steps_total{{train_job="{JOB}"}}) > {served_at}', timeout=30)
    prom.wait_for(f'timestamp(teye:job_input_bound:ratio5m{{train_job="{JOB}"}}) > {served_at}', timeout=30)
    rule, scraped = _rules_and_scraped(prom, JOB)

    rep = subprocess.run([sys.executable, "-m", "agent", "report", "--prometheus", prom.url, "--train-job", JOB,
                          "--format", "json", "--since", "10m"], capture_output=True, text=True, timeout=120,
                         cwd=REPO, env=ENV)
    assert rep.stdout.strip(), (rep.returncode, rep.stderr)
    doc = json.loads(rep.stdout)
    (j,) = doc["jobs"]
    (tj,) = j["train_job_details"]

    out = tmp_path / "profile"
    prof = subprocess.run([sys.executable, "-m", "agent", "profile", "--output", str(out), "--procfs", PROCFS, "--",
                           sys.executable, SCRIPT, *ARGS], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=ENV)
    assert prof.returncode == 0, prof.stderr
    # the script's own line, before the profile's overview
    own_p = json.loads(next(ln for ln in prof.stdout.splitlines() if ln.startswith('{"steps"')))
    summary = json.loads((out / "summary.json").read_text())
    (pj,) = summary["jobs"]

    # the agent, Prometheus and the report read the run under `teye run`; `teye profile` runs the script again
    # with an agent of its own (another run, another pace on a loaded machine): it is held to that run's clock
    shares = {"script": truth, "agent": gauge,
              "scraped": scraped["teye_job_phase_seconds_total"] / scraped["teye_job_step_seconds_sum"],
              "report": j["input_bound_ratio"], "report_train_job": tj["input_bound_ratio"]}
    print("shares", shares, "own", own, "report", {k: j[k] for k in ("verdict", "steps", "samples",
          "step_seconds_mean", "samples_per_second", "phase_seconds")}, "profile", pj["input_bound_ratio"],
          own_p["wait_share"], "rule", rule)
    for name, v in shares.items():
        assert v is not None, name
        assert abs(v - truth) <= 0.03, (name, shares)
    assert abs(pj["input_bound_ratio"] - own_p["wait_share"]) <= 0.03, (pj, own_p)
    # eval is beside training in the report, never in its share
    assert j["phase_seconds"]["eval"] == pytest.approx(own["eval_s"], rel=0.15), (j["phase_seconds"], own)
    # steps, samples, mean step time and samples/s: one definition (the training steps' wall time)
    assert j["steps"] == own["steps"] and j["samples"] == own["samples"], j
    assert pj["steps"] == own_p["steps"] and pj["samples"] == own_p["samples"], pj
    mean = own["train_s"] / own["steps"]
    for name, v in (("report", j["step_seconds_mean"]),
                    ("scraped", scraped["teye_job_step_seconds_sum"] / scraped["teye_job_steps_total"]),
                    ("profile", pj["mean_step_seconds"] * own["train_s"] / own_p["train_s"])):
        assert v == pytest.approx(mean, rel=0.05), (name, v, mean)
    assert j["samples_per_second"] == pytest.approx(own["samples"] / own["train_s"], rel=0.05), j
    assert pj["samples_per_second"] == pytest.approx(own_p["samples"] / own_p["train_s"], rel=0.05), pj
    # the verdict over the run: the same in every view (input-bound by the script's clock)
    bottleneck = [dict(lab)["kind"] for (n, lab), v in served.items()
                  if n == "teye_job_bottleneck" and v == 1 and dict(lab).get("train_job") == JOB]
    assert bottleneck == ["input"], bottleneck
    assert j["verdict"] == "input" and pj["verdict"]["kind"] == "input", (j["verdict"], pj["verdict"])


GENWRAP = os.path.join(REPO, "tests", "client", "torch_genwrap.py")
GEN_ARGS = ["900", "get_batch"]   # nanoGPT-style get_batch(): 8 ms of data work on the training thread a step


def test_data_work_on_the_training_thread_reads_the_same_in_every_view(stack, tmp_path):
    """The loop's own data work (no DataLoader: placed by the forward's start, torch-forward) in every view: the
    agent's gauge, the counters Prometheus scraped (its rule held to its arithmetic on them), the report and
    `teye profile` within 3 points of the script's clock, and input in each (it was `compute` or steps-only
    before issue 47)."""
    agent, prom, sock = stack
    job = "truth-getbatch"
    prom.wait_for("up == 1", timeout=30)
    run = teye_run([sys.executable, GENWRAP, *GEN_ARGS], socket_path=sock, job=job, timeout=300, env=ENV)
    assert run.returncode == 0, run.stderr
    own = last_json(run.stdout)
    assert own["data_share"] > 0.5, own
    served = _served(agent, job, own["steps"])
    assert _value(served, "teye_job_steps_total", train_job=job) == own["steps"]
    gauge = _value(served, "teye_job_input_bound_ratio", train_job=job)
    served_at = time.time()
    # (a scrape after the agent served every step: the rule's evaluation after served_at may still read the scrape
    # before it, and the report then counted 876 of 900 steps, x17)
    prom.wait_for(f'timestamp(teye_job_steps_total{{train_job="{job}"}}) > {served_at}', timeout=30)
    prom.wait_for(f'timestamp(teye:job_input_bound:ratio5m{{train_job="{job}"}}) > {served_at}', timeout=30)
    rule, scraped = _rules_and_scraped(prom, job)
    rep = subprocess.run([sys.executable, "-m", "agent", "report", "--prometheus", prom.url, "--train-job", job,
                          "--format", "json", "--since", "10m"], capture_output=True, text=True, timeout=120,
                         cwd=REPO, env=ENV)
    assert rep.stdout.strip(), (rep.returncode, rep.stderr)
    (j,) = json.loads(rep.stdout)["jobs"]
    out = tmp_path / "profile"
    prof = subprocess.run([sys.executable, "-m", "agent", "profile", "--output", str(out), "--procfs", PROCFS, "--",
                           sys.executable, GENWRAP, *GEN_ARGS], capture_output=True, text=True, timeout=300,
                          cwd=REPO, env=ENV)
    assert prof.returncode == 0, prof.stderr
    own_p = json.loads(next(ln for ln in prof.stdout.splitlines() if ln.startswith('{"steps"')))
    (pj,) = json.loads((out / "summary.json").read_text())["jobs"]
    shares = {"agent": gauge, "scraped": scraped["teye_job_phase_seconds_total"] / scraped["teye_job_step_seconds_sum"],
              "report": j["input_bound_ratio"]}
    print("script", own["data_share"], "views", shares, "rule", rule, "profile", pj["input_bound_ratio"], "its run",
          own_p["data_share"], "verdicts", j["verdict"], pj["verdict"]["kind"])
    for name, v in shares.items():
        assert v is not None and abs(v - own["data_share"]) <= 0.03, (name, shares, own)
    assert abs(pj["input_bound_ratio"] - own_p["data_share"]) <= 0.03, (pj["input_bound_ratio"], own_p)
    assert j["steps"] == own["steps"] and pj["steps"] == own_p["steps"]
    assert j["step_seconds_mean"] == pytest.approx(own["step_s"] / own["steps"], rel=0.05), j
    bottleneck = [dict(lab)["kind"] for (n, lab), v in served.items()
                  if n == "teye_job_bottleneck" and v == 1 and dict(lab).get("train_job") == job]
    assert bottleneck == ["input"] and j["verdict"] == "input" and pj["verdict"]["kind"] == "input", (
        bottleneck, j["verdict"], pj["verdict"])
