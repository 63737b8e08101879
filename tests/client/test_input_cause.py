"""The input cause of real PyTorch jobs whose DataLoader worker (a child process) does the input work:
the agent's probe reads the real /proc of the job and its worker (agent.phases.procstat)."""
from __future__ import annotations

import os
import sys

import pytest

from tests.client.helpers import HERE, last_json, teye_run

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e

SCRIPT = os.path.join(HERE, "torch_cause.py")


@pytest.fixture(scope="module")
def datafile(tmp_path_factory):
    # Storage itself is judged on fixture trees (tests/phases/test_cause.py): this VM's disk reads at
    # 2 GB/s from the host's cache, so a job reading past the page cache spends as much CPU as I/O time.
    path = tmp_path_factory.mktemp("cause") / "shard.bin"
    path.write_bytes(os.urandom(4 << 20))
    return str(path)


@pytest.mark.parametrize("mode, cause, says", [
    # the worker burns a core while the training process sleeps in next(): the worker's CPU names it
    ("burn", "host_cpu", "threads are busy while it waits"),
    # nothing reads and nothing computes: no evidence of storage, so no storage advice
    ("sleep", "unknown", "idle CPUs and no storage I/O"),
])
def test_the_input_cause_comes_from_the_whole_input_pipeline(agent, datafile, mode, cause, says):
    run = teye_run([sys.executable, SCRIPT, mode, "150", datafile], socket_path=agent.path, job=f"cause-{mode}")
    assert run.returncode == 0, run.stderr
    own = last_json(run.stdout)
    assert own["wait_share"] > 0.3, own         # the job is input-bound by its own clock
    j = agent.jobs()[f"cause-{mode}"]
    v = j.verdict
    assert v.kind == "input" and v.cause == cause, v.evidence
    assert says in v.evidence, v.evidence
    # zero-code phases from a torch DataLoader: the advice is PyTorch's (issue 29, item 4), not tf.data's
    assert j.evidence.source == "torch" and "phases from zero-code: torch DataLoader" in v.evidence
    assert "DataLoader" in v.recommendation and "num_workers" in v.recommendation, v.recommendation
    assert "tf.data" not in v.recommendation and "AUTOTUNE" not in v.recommendation, v.recommendation
    w = j.evidence.input_wait
    if mode == "burn":   # about one core (the worker) per second of wait, not the waiting process's few %
        assert w.cpu_ratio > 0.5, v.evidence
    else:
        assert w.cpu_ratio < 0.5 and w.read_bytes / w.wait_s < 1e6, v.evidence
