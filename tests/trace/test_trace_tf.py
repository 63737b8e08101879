"""`teye trace --train-job` on an unmodified TensorFlow custom loop under `teye run` (issue 46): the TensorFlow
profiler over the requested steps, each marked, its XSpace kept and converted to a Chrome trace that the
summary reads.  Oracle: the script's own perf_counter split of its steps (tests/trace/tf_traced_job.py), and
the job run again without a trace (its loss, bit for bit)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.client.helpers import LiveAgent, base_env, teye_run
from tests.trace.helpers import socket_dir
from tests.procs import REPO

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not __import__("importlib").util.find_spec("tensorflow"),
                                 reason="the tensorflow extra (./dev.sh test installs it)")]
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tf_traced_job.py")
STEPS, SLEEP_MS, TRACED = 100, 60, 5
JOB = "tf_traced_job"


def _job(agent, ready):
    return [sys.executable, "-m", "agent", "run", "--socket", agent.path, "--", sys.executable, SCRIPT, str(STEPS),
            str(SLEEP_MS), str(ready)]


@pytest.mark.measures("the traced steps' data-wait share against the script's own perf_counter")
def test_a_tensorflow_loop_is_traced_on_request_and_is_unchanged(tmp_path):
    with socket_dir("teye-tf") as d:
        _traced(tmp_path, d)


def _traced(tmp_path, sockdir):
    ready, out, reqs = tmp_path / "ready", tmp_path / "traces", tmp_path / "requests"
    tmp = tmp_path / "tmp"     # (the job's TMPDIR: where the profiler's private directory is made, then removed)
    tmp.mkdir()
    env = base_env(TEYE_TRACE_REQUESTS=str(reqs), TF_CPP_MIN_LOG_LEVEL="1", TMPDIR=str(tmp))
    os.makedirs(os.path.join(sockdir, "a"))
    agent = LiveAgent(os.path.join(sockdir, "a"))
    try:
        job = subprocess.Popen(_job(agent, ready), env=env, cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while not ready.exists() and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), job.communicate()[1][-3000:]
        cli = subprocess.run([sys.executable, "-m", "agent", "trace", "--train-job", JOB, "--steps", str(TRACED),
                              "--output", str(out), "--json"], env=env, cwd=REPO, capture_output=True, text=True,
                             timeout=180)
        stdout, stderr = job.communicate(timeout=180)
        jobs = agent.jobs()
    finally:
        agent.close()
    assert job.returncode == 0, stderr[-3000:]
    assert cli.returncode == 0, cli.stdout[-3000:] + cli.stderr[-3000:]
    res = json.loads(cli.stdout)
    own = json.loads(stdout)
    [proc] = res["processes"]
    assert proc["state"] == "done", proc
    first = proc["first_step"]
    assert 5 < first < STEPS - TRACED
    # the trace: TensorFlow's XSpace kept, and teye's Chrome conversion of it, both the job user's alone
    stem = os.path.join(str(out), f"{JOB}.{res['id']}.{proc['node']}.pid{proc['pid']}")
    assert proc["trace"] == stem + ".tf.trace.json" and proc["raw"] == [stem + ".xplane.pb"]
    for f in (proc["trace"], stem + ".xplane.pb"):
        assert os.stat(f).st_mode & 0o777 == 0o600 and os.stat(f).st_size > 1000
    print(f"\nsizes per traced step: XSpace {os.stat(stem + '.xplane.pb').st_size / TRACED / 1024:.0f} KiB, "
          f"Chrome trace {os.stat(proc['trace']).st_size / TRACED / 1024:.0f} KiB")
    assert sorted(os.listdir(out)) == sorted([os.path.basename(proc["trace"]), f"{JOB}.{res['id']}.summary.json",
                                              os.path.basename(stem) + ".xplane.pb"])
    assert [n for n in os.listdir(tmp) if n.startswith("teye-tf-trace.")] == []   # (autograph writes its own there)
    with open(proc["trace"]) as f:
        doc = json.load(f)
    marks = sorted(e["args"]["step_num"] for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
    assert marks == list(range(1, TRACED + 1))
    [t] = res["summary"]["traces"]
    assert not res["summary"]["errors"] and t["overall"]["steps"] == TRACED and len(t["steps"]) == TRACED
    assert t["device_traced"] is False and t["top_ops"]
    # the data-wait share against the script's clock over the same steps (the last one apart: the profiler's
    # stop runs after its marker closed, as in test_trace_ddp.py)
    rows = [row for row in own["rows"] if first <= row[0] < first + TRACED]
    steps = sorted(t["steps"], key=lambda x: x["step"])
    before = steps[:-1]
    seen = sum(x["host"]["data_wait"] * x["duration_s"] for x in before) / sum(x["duration_s"] for x in before)
    truth = sum(row[1] for row in rows[:-1]) / sum(row[2] for row in rows[:-1])
    print(f"steps {first}..{first + TRACED - 1}: trace {seen:.3f}, own clock {truth:.3f}; each step, trace",
          [round(x["duration_s"] * 1e3, 1) for x in steps], "ms, own clock", [round(r[2] * 1e3, 1) for r in rows])
    assert seen == pytest.approx(truth, abs=0.05)
    assert sum(x["duration_s"] for x in before) == pytest.approx(sum(r[2] for r in rows[:-1]), rel=0.1)
    assert truth > 0.2   # (its input is slow: 60 ms a batch against about 11 ms of compute on a quiet machine)
    # steps kept counting through the trace; the agent knows the trace
    assert jobs[JOB].steps == STEPS
    tv = jobs[JOB].trace
    assert (tv.id, tv.steps, tv.first_step, tv.done, tv.failed) == (res["id"], TRACED, first, 1, 0)
    # the loss is the job's without a trace, bit for bit
    agent2 = LiveAgent(sockdir)
    try:
        bare = teye_run(_job(agent2, tmp_path / "ready2")[7:], socket_path=agent2.path, env=env, timeout=180)
    finally:
        agent2.close()
    assert bare.returncode == 0, bare.stderr[-3000:]
    assert json.loads(bare.stdout)["loss"] == own["loss"]
