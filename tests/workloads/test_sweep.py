"""Sweeps: OOM recorded and the batch stops growing; matrix combinations; CSV/PNG; the
per-point runner's exit-status mapping (no TensorFlow: training is faked at the process boundary)."""
from __future__ import annotations

import csv
import sys

import pytest

from workloads import sweep, train
from workloads.sweep import STATUS_FAILED, STATUS_OK, STATUS_OOM, Point


def fake_results(bs, rate):
    return {"samples_per_s": rate, "step_time_p50_s": bs / rate, "step_time_p95_s": 1.1 * bs / rate,
            "input_wait_fraction": 0.1, "device_kind": "gpu", "device_name": "Fake GPU"}


class FakeTrain:
    """Stands in for one `workloads.train` process: OOM from `oom_at` upward."""

    def __init__(self, oom_at=64):
        self.oom_at = oom_at
        self.calls = []

    def __call__(self, argv):
        args = train.parse_args(argv)              # every point's argv is a valid training command
        self.calls.append(args)
        if args.batch_size >= self.oom_at:
            return STATUS_OOM, {}, "out of memory with batch size %d" % args.batch_size
        return STATUS_OK, fake_results(args.batch_size, 100.0 * args.batch_size ** 0.5), ""


def test_batch_sweep_records_oom_and_stops_growing(tmp_path):
    fake = FakeTrain(oom_at=64)
    pts = sweep.batch_sweep("resnet50", start=8, cap=4096, steps=5, extra=["--io-latency-ms", "2"], runner=fake)
    assert [p.batch_size for p in pts] == [8, 16, 32, 64]              # 128+ never tried
    assert [p.status for p in pts] == [STATUS_OK] * 3 + [STATUS_OOM]
    assert [a.batch_size for a in fake.calls] == [8, 16, 32, 64]
    assert all(a.model == "resnet50" and a.steps == 5 and a.io_latency_ms == 2.0 for a in fake.calls)
    path = tmp_path / "b.csv"
    sweep.write_csv(str(path), pts)
    rows = list(csv.DictReader(open(path)))
    assert [r["status"] for r in rows] == ["ok", "ok", "ok", "oom"]
    assert float(rows[1]["samples_per_s"]) == pytest.approx(400.0)
    assert rows[3]["samples_per_s"] == "" and "out of memory" in rows[3]["detail"]


def test_batch_sweep_reaches_the_cap():
    pts = sweep.batch_sweep("simple_cnn", start=8, cap=40, runner=FakeTrain(oom_at=10 ** 9))
    assert [p.batch_size for p in pts] == [8, 16, 32] and all(p.status == STATUS_OK for p in pts)
    with pytest.raises(ValueError):
        sweep.batch_sweep("simple_cnn", start=64, cap=8, runner=FakeTrain())


def test_matrix_is_thread_mode_x_precision_x_pipeline():
    fake = FakeTrain(oom_at=10 ** 9)
    pts = sweep.matrix_sweep("simple_cnn", 256, steps=4, runner=fake)
    combos = {(a.gpu_thread_mode or "global", a.mixed_precision, a.pipeline) for a in fake.calls}
    assert len(pts) == 8 and combos == {(t, p, q) for t in ("global", "gpu_private")
                                        for p in ("float32", "mixed_float16") for q in ("naive", "tfdata")}
    assert all(a.batch_size == 256 for a in fake.calls)


def test_plots_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    pts = sweep.batch_sweep("simple_cnn", start=8, cap=64, runner=FakeTrain(oom_at=32))
    sweep.plot_batch(str(tmp_path / "b.png"), pts)
    m = sweep.matrix_sweep("simple_cnn", 8, runner=FakeTrain(oom_at=10 ** 9))
    m[0].status, m[0].results = STATUS_OOM, {}
    sweep.plot_matrix(str(tmp_path / "m.png"), m)
    for name in ("b.png", "m.png"):
        raw = (tmp_path / name).read_bytes()
        assert raw[:8] == b"\x89PNG\r\n\x1a\n" and len(raw) > 5000


def _fake_cmd(code):
    return [sys.executable, "-c", code]


WRITE_RESULTS = ("import sys, json; p = sys.argv[sys.argv.index('--results') + 1]; "
                 "json.dump({'samples_per_s': 12.5, 'argv': sys.argv[1:]}, open(p, 'w'))")


def test_run_train_maps_exit_status_to_point_status():
    st, res, _ = sweep.run_train(["--batch-size", "8"], cmd=_fake_cmd(WRITE_RESULTS))
    assert st == STATUS_OK and res["samples_per_s"] == 12.5 and res["argv"][:2] == ["--batch-size", "8"]
    oom = "print('out of memory with batch size 8'); raise SystemExit(3)"
    st, res, detail = sweep.run_train([], cmd=_fake_cmd(oom))
    assert (st, res) == (STATUS_OOM, {}) and "out of memory" in detail
    st, _, detail = sweep.run_train([], cmd=_fake_cmd("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"))
    assert st == STATUS_OOM                                  # the kernel's OOM killer
    st, _, detail = sweep.run_train([], cmd=_fake_cmd("print('boom'); raise SystemExit(1)"))
    assert st == STATUS_FAILED and detail == "exit 1: boom"
    st, _, detail = sweep.run_train([], cmd=_fake_cmd("pass"))   # exit 0 but no results: not a result
    assert st == STATUS_FAILED and "no results file" in detail


def test_point_argv_round_trips_through_the_training_parser():
    p = Point("facenet", 32, pipeline="naive", gpu_thread_mode="gpu_private", mixed_precision="mixed_bfloat16")
    a = train.parse_args(p.argv(7, ["--xla"]))
    assert (a.model, a.batch_size, a.steps, a.pipeline, a.gpu_thread_mode, a.mixed_precision, a.xla) == \
        ("facenet", 32, 7, "naive", "gpu_private", "mixed_bfloat16", True)


def test_cli_writes_csvs(tmp_path, monkeypatch):
    fake = FakeTrain(oom_at=16)
    monkeypatch.setattr(sweep, "run_train", lambda argv, log=None: fake(argv))
    rc = sweep.main(["--mode", "both", "--out", str(tmp_path), "--no-plots", "--precisions", "float32",
                     "--thread-modes", "global", "--matrix-batch", "8"])
    assert rc == 0
    rows = list(csv.DictReader(open(tmp_path / "batch_sweep.csv")))
    assert [(r["batch_size"], r["status"]) for r in rows] == [("8", "ok"), ("16", "oom")]
    rows = list(csv.DictReader(open(tmp_path / "matrix.csv")))
    assert sorted(r["pipeline"] for r in rows) == ["naive", "tfdata"]
    with pytest.raises(SystemExit) as e:
        sweep.main(["--model", "alexnet"])
    assert e.value.code == 2
