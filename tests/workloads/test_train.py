"""The training command end to end in-process (TensorFlow on the CPU, tiny runs)."""
from __future__ import annotations

import json
import math

import pytest

tf = pytest.importorskip("tensorflow")

from tests.workloads.test_data import write_dataset  # noqa: E402
from workloads import train  # noqa: E402
from workloads.timing import PhaseTimer  # noqa: E402
from tests.workloads.sinks import RecordingSink  # noqa: E402

pytestmark = pytest.mark.tf

TINY = ["--synthetic-samples", "256", "--no-progress"]




def run(tmp_path, *argv, timer=None):
    res = tmp_path / "results.json"
    rc = train.main([*argv, *TINY, "--results", str(res)], timer=timer)
    return rc, (json.loads(res.read_text()) if res.exists() else None)


def test_results_record_every_knob_and_the_summary(tmp_path, capsys):
    sink = RecordingSink()
    rc, r = run(tmp_path, "--model", "simple_cnn", "--batch-size", "16", "--steps", "6", "--pipeline", "naive",
                "--io-latency-ms", "1", "--train-job", "t1", timer=PhaseTimer(sink=sink))
    assert rc == 0
    out = capsys.readouterr()
    assert len(out.out.strip().splitlines()) == 1                       # one summary line
    assert "samples/s" in out.out and "input wait" in out.out and "synthetic" in out.out
    assert "synthetic CIFAR-shaped data" in out.err
    for key, want in {"model": "simple_cnn", "batch_size": 16, "global_batch_size": 16, "steps": 6,
                      "pipeline": "naive", "cache": False, "io_latency_ms": 1.0, "gpu_thread_mode": "global",
                      "mixed_precision": "float32", "xla": False, "distribute": "none", "workers": 1,
                      "device_kind": "cpu", "data": "synthetic", "train_job": "t1", "measured_steps": 5,
                      "warmup_steps": 1, "samples": 80}.items():
        assert r[key] == want, key
    assert r["samples_per_s"] > 0 and 0 <= r["input_wait_fraction"] <= 1
    assert 0 < r["step_time_p50_s"] <= r["step_time_p95_s"]
    assert math.isfinite(r["loss_first"]) and math.isfinite(r["loss_last"])
    assert r["weights_sha256"] != r["initial_weights_sha256"]
    # the sink saw every phase of every step, in loop order, and each step's samples
    assert [p[0] for p in sink.phases] == ["data_wait", "compute", "host"] * 6
    assert [s[2] for s in sink.steps] == [16] * 6
    assert all(a[1] == b[0] for a, b in zip(sink.steps, sink.steps[1:]))   # contiguous steps
    # the record's statistics are the sink's intervals, summed (warm-up step left out)
    wait = sum(e - s for n, s, e in sink.phases[3:] if n == "data_wait") / 1e9
    wall = (sink.steps[-1][1] - sink.steps[0][1]) / 1e9
    assert r["input_wait_fraction"] == pytest.approx(wait / wall, rel=1e-6)
    assert r["samples_per_s"] == pytest.approx(80 / wall, rel=1e-6)


@pytest.mark.measures("input-wait fractions and rates of two loops by their own clocks")
def test_naive_pipeline_is_clearly_more_input_bound_than_tfdata(tmp_path):
    """The studies' effect on any machine: with a 20 ms per-read latency the naive generator
    spends most of the wall time waiting for input; tf.data's parallel reads and prefetch hide it."""
    common = ["--model", "simple_cnn", "--batch-size", "8", "--steps", "10", "--warmup-steps", "2",
              "--io-latency-ms", "20"]
    rc1, naive = run(tmp_path, *common, "--pipeline", "naive")
    rc2, fast = run(tmp_path, *common, "--pipeline", "tfdata")
    assert rc1 == rc2 == 0
    # naive: 8 serial reads of >= 20 ms per step, so input wait dominates
    assert naive["input_wait_fraction"] > 0.7
    assert naive["phase_seconds"]["data_wait"] >= 8 * 0.020 * 8 * 0.99
    assert fast["input_wait_fraction"] < naive["input_wait_fraction"] - 0.3
    assert fast["samples_per_s"] > naive["samples_per_s"]


def test_out_of_memory_exits_3_without_results(tmp_path, monkeypatch, capsys):
    def oom(self, batch):
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[4096,32,30,30]")

    monkeypatch.setattr(train.Trainer, "step", oom)
    rc, r = run(tmp_path, "--batch-size", "8", "--steps", "2")
    assert rc == train.EXIT_OOM and r is None
    assert "out of memory with batch size 8" in capsys.readouterr().err


def test_non_finite_loss_fails_without_results(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(train.Trainer, "step", lambda self, batch: float("nan"))
    rc, r = run(tmp_path, "--batch-size", "8", "--steps", "3")
    assert rc == train.EXIT_FAILED and r is None
    assert "loss became nan at step 1" in capsys.readouterr().err


@pytest.mark.parametrize("knobs,check", [
    (["--mixed-precision", "mixed_float16"], {"mixed_precision": "mixed_float16"}),
    (["--mixed-precision", "mixed_bfloat16", "--model", "facenet"], {"mixed_precision": "mixed_bfloat16"}),
    (["--xla"], {"xla": True}),
    (["--distribute", "mirrored", "--pipeline", "naive"], {"distribute": "mirrored", "replicas": 1}),
    (["--distribute", "mirrored", "--cache"], {"distribute": "mirrored", "cache": True}),
])
def test_optimization_knobs_train(tmp_path, knobs, check):
    rc, r = run(tmp_path, "--batch-size", "8", "--steps", "3", *knobs)
    assert rc == 0
    for k, v in check.items():
        assert r[k] == v
    assert math.isfinite(r["loss_last"]) and r["weights_sha256"] != r["initial_weights_sha256"]
    assert tf.keras.mixed_precision.global_policy().name == "float32"   # the policy is restored


def test_epochs_on_cifar_files(tmp_path):
    d = tmp_path / "cifar"
    d.mkdir()
    write_dataset(str(d), sizes=(8, 8, 8, 8, 8))
    rc, r = run(tmp_path, "--data-dir", str(d), "--batch-size", "10", "--epochs", "2")
    assert rc == 0
    assert r["data"] == "cifar10" and r["train_samples"] == 40
    assert r["steps"] == 8                                   # 2 epochs x 40 // 10
