"""Two local CPU workers (MultiWorkerMirroredStrategy via workloads.launch) end with identical weights."""
from __future__ import annotations

import json
import math
import os
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
