"""`teye trace --train-job` end to end (issue 46): a real 2-rank DDP job (gloo, CPU) under `teye run`, unmodified,
traced from the command line while it trains.  Oracle: each rank's own perf_counter split of its steps
(tests/trace/ddp_traced_job.py), and the job run again without a trace (its losses)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.client.helpers import LiveAgent, base_env, teye_run
from tests.trace.helpers import socket_dir
from tests.procs import REPO, free_port

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not __import__("importlib").util.find_spec("torch"),
                                 reason="the torch extra (./dev.sh test installs it)")]
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_traced_job.py")
STEPS, SLEEP_MS, TRACED = 120, 20, 5


def _job(agent, ready, env):
    return [sys.executable, "-m", "agent", "run", "--socket", agent.path, "--", sys.executable, "-m",
            "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()), SCRIPT, str(STEPS),
            str(SLEEP_MS), str(ready)]


@pytest.mark.measures("the traced steps' data-wait share against the ranks' own perf_counter")
def test_both_ranks_trace_the_same_steps_on_request_and_the_job_is_unchanged(tmp_path):
    with socket_dir("teye-tr") as d:
        _both_ranks(tmp_path, d)


def _both_ranks(tmp_path, sockdir):
    ready, out, reqs = tmp_path / "ready", tmp_path / "traces", tmp_path / "requests"
    env = base_env(OMP_NUM_THREADS="1", TEYE_TRACE_REQUESTS=str(reqs))
    os.makedirs(os.path.join(sockdir, "a"))
    agent = LiveAgent(os.path.join(sockdir, "a"))
    try:
        job = subprocess.Popen(_job(agent, ready, env), env=env, cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while not ready.exists() and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), job.communicate()[1][-3000:]
        cli = subprocess.run([sys.executable, "-m", "agent", "trace", "--train-job", "ddp_traced_job", "--steps",
                              str(TRACED), "--output", str(out), "--json"], env=env, cwd=REPO, capture_output=True,
                             text=True, timeout=180)
        stdout, stderr = job.communicate(timeout=180)
        jobs = agent.jobs()
        points = {(p.spec.name, p.labels): p.value for p in agent.src.collect(force=True).points()}
    finally:
        agent.close()
    assert job.returncode == 0, stderr[-3000:]
    assert cli.returncode == 0, cli.stdout[-3000:] + cli.stderr[-3000:]
    res = json.loads(cli.stdout)
    own = {o["rank"]: o for o in map(json.loads, stdout.splitlines())}
    procs = {p["rank"]: p for p in res["processes"]}
    assert sorted(procs) == [0, 1] and all(p["state"] == "done" for p in procs.values())
    first = procs[0]["first_step"]
    assert res["same_first_step"] and procs[1]["first_step"] == first and 5 < first < STEPS - TRACED
    # one trace per rank, each holding exactly the steps asked, named by job, request, node and rank
    summ = {t["rank"]: t for t in res["summary"]["traces"]}
    assert sorted(summ) == [0, 1] and not res["summary"]["errors"]
    for r, t in summ.items():
        assert t["overall"]["steps"] == TRACED and len(t["steps"]) == TRACED
        assert os.path.basename(procs[r]["trace"]) == f"ddp_traced_job.{res['id']}.{procs[r]['node']}.rank{r}.pt.trace.json"
        assert os.stat(procs[r]["trace"]).st_mode & 0o777 == 0o600
        # the data-wait share of the traced steps, against the rank's own clock over the same steps.  The
        # last traced step is longer by the job's clock than by the trace: the profiler's stop, collecting what
        # it recorded, runs at its end, after its ProfilerStep span closed (10 ms here, 15 under CI's load: 5
        # points of a five-step share), so the share is compared over the steps before it, and the last step
        # only in that the job's clock holds the trace's span and more
        rows = [row for row in own[r]["rows"] if first <= row[0] < first + TRACED]
        steps = sorted(t["steps"], key=lambda x: x["step"])
        before = steps[:-1]
        seen = sum(x["host"]["data_wait"] * x["duration_s"] for x in before) / sum(x["duration_s"] for x in before)
        truth = sum(row[1] for row in rows[:-1]) / sum(row[2] for row in rows[:-1])
        print(f"rank {r}: steps {first}..{first + TRACED - 1}, trace {seen:.3f} (all {TRACED}: "
              f"{t['overall']['host']['data_wait']:.3f}), own clock {truth:.3f}, step "
              f"{t['overall']['step_time_s']['mean'] * 1e3:.1f} ms against {1e3 * sum(row[2] for row in rows) / TRACED:.1f} ms")
        print("  each step, trace", [round(x["duration_s"] * 1e3, 1) for x in steps], "ms, own clock",
              [round(row[2] * 1e3, 1) for row in rows])
        assert seen == pytest.approx(truth, abs=0.05)
        assert rows[-1][2] > steps[-1]["duration_s"] - 0.002
    assert sum(r[1] for r in own[0]["rows"]) / sum(r[2] for r in own[0]["rows"]) > 0.4   # (its input is slow)
    # the summary kept beside the traces; the requests directory left empty
    assert res["summary_file"] == os.path.join(str(out), f"ddp_traced_job.{res['id']}.summary.json")
    assert os.path.exists(res["summary_file"]) and os.listdir(reqs) == []
    # steps kept counting through the trace; the agent knows the trace by its id, from both ranks
    assert jobs["ddp_traced_job"].steps == STEPS
    tv = jobs["ddp_traced_job"].trace
    assert (tv.id, tv.steps, tv.first_step, tv.done, tv.failed) == (res["id"], TRACED, first, 2, 0)
    assert points[("teye_job_trace_info", ("ddp_traced_job", res["id"]))] == 1
    assert points[("teye_job_trace_processes_total", ("ddp_traced_job", "done"))] == 2
    assert points[("teye_job_trace_steps", ("ddp_traced_job",))] == TRACED
    assert abs(points[("teye_job_trace_last_timestamp_seconds", ("ddp_traced_job",))] - time.time()) < 120
    # the losses are the job's without a trace, bit for bit
    bare_ready = tmp_path / "ready2"
    agent2 = LiveAgent(os.path.join(sockdir))
    try:
        bare = teye_run(_job(agent2, bare_ready, env)[7:], socket_path=agent2.path, env=env, timeout=180)
    finally:
        agent2.close()
    assert bare.returncode == 0, bare.stderr[-3000:]
    assert {o["rank"]: o["loss"] for o in map(json.loads, bare.stdout.splitlines())} == \
        {r: o["loss"] for r, o in own.items()}
