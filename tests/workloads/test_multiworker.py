"""Two local CPU workers (MultiWorkerMirroredStrategy via workloads.launch) end with identical weights."""
from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")

pytestmark = pytest.mark.tf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("pipeline", ["tfdata", "naive"])
def test_two_workers_identical_weights_after_training(tmp_path, pipeline):
    report = tmp_path / "report.json"
    p = subprocess.run(
        [sys.executable, "-m", "workloads.launch", "--workers", "2", "--no-baseline", "--out", str(tmp_path),
         "--report", str(report), "--timeout", "240", "--",
         "--model", "simple_cnn", "--batch-size", "8", "--steps", "3", "--synthetic-samples", "128",
         "--pipeline", pipeline],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    rep = json.loads(report.read_text())
    assert rep["ok"] and rep["weights_identical"]
    results = [json.loads((tmp_path / "multi" / f"worker-{i}.json").read_text()) for i in range(2)]
    assert [r["worker_index"] for r in results] == [0, 1]
    for r in results:
        assert r["workers"] == 2 and r["distribute"] == "multiworker" and r["global_batch_size"] == 16
        assert r["steps"] == 3 and math.isfinite(r["loss_last"])
        assert r["weights_sha256"] != r["initial_weights_sha256"]          # a step did change them
    assert results[0]["weights_sha256"] == results[1]["weights_sha256"]   # ... identically on both
    # the loss is the global average: both workers report the same values
    assert results[0]["loss_last"] == results[1]["loss_last"]
    assert "weights identical on all workers: yes" in p.stdout


def test_a_worker_whose_port_was_taken_is_started_again_on_new_ports(tmp_path, monkeypatch):
    """A port free_ports chose is taken (listening) before the worker binds it: TensorFlow's gRPC server
    cannot start and the worker exits 1 (CI: a 2-worker run failed so, its log lost).  The launcher starts
    the job again on new ports and it trains; the log of the first try says why."""
    from workloads import launch
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    real, calls = launch.free_ports, []

    def ports(n, host="127.0.0.1"):
        calls.append(n)
        return [busy.getsockname()[1]] if len(calls) == 1 else real(n, host)

    monkeypatch.setattr(launch, "free_ports", ports)
    said = []
    try:
        got = launch.run_workers(1, ["--model", "simple_cnn", "--batch-size", "8", "--steps", "2",
                                     "--synthetic-samples", "64", "--pipeline", "naive"],
                                 str(tmp_path), timeout_s=240, log=said.append)
    finally:
        busy.close()
    # the first try is this test's taken port; the next ones are free_ports' own, and a port it chose can be
    # taken before the worker binds it on a busy machine too (x17's parallel pass, three workers: a third try):
    # each try that failed was a port taken, said so, and the last one trained
    assert got["ok"] and got["tries"] >= 2 and got["returncodes"] == [0], (got, said)
    assert len(said) == got["tries"] - 1 and all("could not bind their port" in m for m in said), said


def test_a_worker_that_fails_otherwise_is_not_started_again_and_its_log_is_shown(tmp_path):
    """A worker that fails for its own reason (a model that does not exist) is not started again, and the
    launcher prints the end of its log, where the reason is."""
    p = subprocess.run(
        [sys.executable, "-m", "workloads.launch", "--workers", "1", "--no-baseline", "--out", str(tmp_path),
         "--timeout", "120", "--", "--model", "simple_cnn", "--batch-size", "8", "--steps", "2",
         "--synthetic-samples", "64", "--data-dir", str(tmp_path / "nowhere")],
        cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert p.returncode != 0
    assert "could not bind" not in p.stderr and "the end of worker 0's log" in p.stderr, p.stderr[-3000:]
    assert "nowhere" in p.stderr.split("the end of worker 0's log", 1)[1], p.stderr[-3000:]
