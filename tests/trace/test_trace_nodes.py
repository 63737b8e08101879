"""`teye trace --train-job` across nodes (issue 46): a real DDP job (gloo, CPU, tests/trace/ddp_traced_job.py,
unmodified) with one rank on each of two "nodes", network namespaces of the test's own joined by a veth pair,
each node with its own agent socket and its own request directory (as each node has its own /tmp).  The
command runs once per node with the same --id, the second 0.3 s after the first (a loop over the nodes):
both ranks start at the same step, agreed through the job's own store (torchrun's rendezvous store).
Oracle: the profiler's own timestamps of each rank's traced steps (in lockstep, the same steps start together)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests import netns
from tests.client.helpers import LiveAgent, base_env
from tests.trace.helpers import socket_dir
from tests.procs import REPO, free_port

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not __import__("importlib").util.find_spec("torch"),
                                 reason="the torch extra (./dev.sh test installs it)")]
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_traced_job.py")
STEPS, SLEEP_MS, TRACED = 150, 20, 4
JOB = "ddp_traced_job"


@pytest.mark.measures("the ranks' traced steps' start times, a fraction of a step apart")
def test_ranks_on_two_nodes_trace_the_same_steps_when_each_nodes_command_runs_apart(tmp_path):
    why = netns.available()
    if why:
        pytest.skip(why)
    with socket_dir("teye-tn") as d, netns.veth_pair("trn", subnet=219) as pair:
        _two_nodes(tmp_path, d, pair)


def _two_nodes(tmp_path, sockdir, pair):
    ready = tmp_path / "ready"
    port = free_port()
    agents, jobs, envs = [], [], []
    try:
        for i in range(2):
            os.makedirs(os.path.join(sockdir, "ab"[i]))
            agents.append(LiveAgent(os.path.join(sockdir, "ab"[i])))
            envs.append(base_env(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=pair.dev[i],
                                 TEYE_TRACE_REQUESTS=str(tmp_path / f"requests-{'ab'[i]}")))
        for i in range(2):
            jobs.append(subprocess.Popen(netns.in_ns(pair.ns[i], [
                sys.executable, "-m", "agent", "run", "--socket", agents[i].path, "--", sys.executable, "-m",
                "torch.distributed.run", "--nnodes", "2", "--node_rank", str(i), "--nproc_per_node", "1",
                "--master_addr", pair.addr[0], "--master_port", str(port), SCRIPT, str(STEPS), str(SLEEP_MS),
                str(ready)]), env=envs[i], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        deadline = time.monotonic() + 120
        while not ready.exists() and all(j.poll() is None for j in jobs) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), [j.communicate()[1][-2000:] for j in jobs if j.poll() is not None]
        clis = []
        for i in range(2):
            clis.append(subprocess.Popen([sys.executable, "-m", "agent", "trace", "--train-job", JOB, "--id", "both-1",
                                          "--steps", str(TRACED), "--output", str(tmp_path / f"traces-{'ab'[i]}"),
                                          "--json"], env=envs[i], cwd=REPO, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True))
            time.sleep(0.3)                          # the loop over the nodes reaches node b later
        answers = [c.communicate(timeout=180) for c in clis]
        outs = [j.communicate(timeout=180) for j in jobs]
    finally:
        for j in jobs:
            if j.poll() is None:
                j.kill()
        for a in agents:
            a.close()
    for j, (out, err) in zip(jobs, outs):
        assert j.returncode == 0, err[-3000:]
    for c, (out, err) in zip(clis, answers):
        assert c.returncode == 0, out[-3000:] + err[-3000:]
    res = [json.loads(out) for out, _ in answers]
    own = {o["rank"]: o for out, _ in outs for o in map(json.loads, out.splitlines())}
    assert [r["id"] for r in res] == ["both-1", "both-1"]
    procs = {}
    for i, r in enumerate(res):
        [p] = r["processes"]
        assert p["state"] == "done" and p["rank"] == i, p
        procs[i] = p
    # the same first step on both nodes, although node b's request started 0.3 s (about 10 steps) later
    first = procs[0]["first_step"]
    assert procs[1]["first_step"] == first and 5 < first < STEPS - TRACED, procs
    starts = [res[i]["processes"][0].get("start_step") for i in range(2)]
    print(f"\nfirst traced step {first} on both nodes (start steps {starts})")
    for i, r in enumerate(res):
        [t] = r["summary"]["traces"]
        assert t["overall"]["steps"] == TRACED and t["rank"] == i
    # the same steps of the job by the profiler's own clock (independent of teye's step count): in lockstep,
    # each traced step of rank 0 starts when rank 1's of the same number does, well within half a step (one
    # step apart they would be a whole step apart)
    w = [_windows(procs[i]["trace"]) for i in range(2)]
    step_us = sorted(d for _, d in w[0])[TRACED // 2]
    apart = [abs(a[0] - b[0]) for a, b in zip(*w)]
    print("traced steps' starts apart (ms):", [round(x / 1e3, 1) for x in apart], "step", round(step_us / 1e3, 1))
    assert len(w[0]) == len(w[1]) == TRACED and max(apart) < step_us / 2, (apart, step_us)


def _windows(path):
    """(start, duration) in microseconds since the epoch of each ProfilerStep#N span on the host, in order."""
    with open(path) as f:
        doc = json.load(f)
    base = doc.get("baseTimeNanoseconds", 0) / 1e3
    return sorted((base + e["ts"], e["dur"]) for e in doc["traceEvents"] if e.get("ph") == "X"
                  and str(e.get("name")).startswith("ProfilerStep#") and e.get("cat") != "gpu_user_annotation")
