"""workloads.train arguments and data errors: exit 2, a message naming the problem, no results
(all found before TensorFlow is imported, so no TensorFlow needed here)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.workloads.test_data import write_dataset
from workloads import train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "workloads.train", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=env)


def test_bad_model_exits_2_naming_the_choices(tmp_path):
    res = tmp_path / "r.json"
    p = run_cli("--model", "vgg16", "--results", str(res))
    assert p.returncode == 2
    assert "invalid choice: 'vgg16'" in p.stderr
    assert "simple_cnn" in p.stderr and "resnet50" in p.stderr and "facenet" in p.stderr
    assert not res.exists()


@pytest.mark.parametrize("argv,message", [
    (["--pipeline", "fast"], "choose from 'naive', 'tfdata'"),
    (["--mixed-precision", "float16"], "choose from 'float32', 'mixed_float16', 'mixed_bfloat16'"),
    (["--distribute", "horovod"], "choose from 'none', 'mirrored', 'multiworker'"),
    (["--gpu-thread-mode", "private"], "choose from 'global', 'gpu_private', 'gpu_shared'"),
    (["--batch-size", "0"], "expected a positive integer, got 0"),
    (["--io-latency-ms", "-1"], "expected a finite number >= 0"),
    (["--steps", "3", "--epochs", "1"], "not allowed with argument"),
    (["--gpu-thread-count", "2"], "--gpu-thread-count needs --gpu-thread-mode"),
    (["--pipeline", "naive", "--cache"], "--cache applies to --pipeline tfdata only"),
])
def test_bad_knobs_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        train.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_defaults():
    a = train.parse_args(["--model", "resnet50", "--batch-size", "32"])
    assert a.train_job == "resnet50-bs32" and a.steps == 50 and a.learning_rate == 1e-4
    assert a.pipeline == "tfdata" and a.mixed_precision == "float32" and a.distribute == "none"
    assert train.parse_args(["--train-job", "exp1"]).train_job == "exp1"
    sink = train.make_sink(a)   # the phase reporter (or None): the PhaseTimer sink contract
    assert sink is None or (callable(sink.record_phase) and callable(sink.step))


def test_missing_batch_exits_2_naming_the_file_without_results(tmp_path, capsys):
    write_dataset(str(tmp_path))
    os.remove(tmp_path / "data_batch_4")
    res = tmp_path / "out.json"
    assert train.main(["--data-dir", str(tmp_path), "--results", str(res), "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "data_batch_4") in err and "missing" in err
    assert not res.exists()


def test_corrupt_batch_exits_2_from_the_command_line(tmp_path):
    write_dataset(str(tmp_path))
    (tmp_path / "test_batch").write_bytes(b"\x80\x02garbage")
    res = tmp_path / "out.json"
    p = run_cli("--data-dir", str(tmp_path), "--results", str(res), "--steps", "2")
    assert p.returncode == 2
    assert f"{tmp_path / 'test_batch'}: corrupt CIFAR-10 batch" in p.stderr
    assert not res.exists()
    assert p.stdout == ""


def test_multiworker_needs_a_valid_tf_config(capsys, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert train.main(["--distribute", "multiworker", "--steps", "2"]) == 2
    assert "needs TF_CONFIG" in capsys.readouterr().err
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}')
    assert train.main(["--distribute", "multiworker", "--steps", "2"]) == 2
    assert "task index 3 is outside the 1 workers" in capsys.readouterr().err
    monkeypatch.setenv("TF_CONFIG", "{not json")
    assert train.main(["--distribute", "multiworker", "--steps", "2"]) == 2
    assert "TF_CONFIG is not a valid cluster spec" in capsys.readouterr().err


def test_tf_config_cluster_parsing():
    cfg = {"cluster": {"worker": ["h:1", "h:2", "h:3"]}, "task": {"type": "worker", "index": 2}}
    assert train.tf_config_cluster({"TF_CONFIG": json.dumps(cfg)}) == (3, 2)


def test_gpu_thread_env_is_exported(monkeypatch):
    # setenv first so monkeypatch restores (removes) what configure_threads exports below
    for var in ("TF_GPU_THREAD_MODE", "TF_GPU_THREAD_COUNT"):
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    args = train.parse_args(["--gpu-thread-mode", "gpu_private", "--gpu-thread-count", "4"])
    msgs = []
    train.configure_threads(args, msgs.append)
    assert os.environ["TF_GPU_THREAD_MODE"] == "gpu_private" and os.environ["TF_GPU_THREAD_COUNT"] == "4"
    if "tensorflow" in sys.modules:          # too late in this process: say so
        assert msgs and "fresh process" in msgs[0]
    else:
        assert msgs == []


def test_results_path_per_worker():
    assert train._results_path("r-{worker}.json", True, 1) == "r-1.json"
    assert train._results_path("r.json", True, 0) == "r.json"
    assert train._results_path("r.json", True, 2) == "r.json.worker2"
    assert train._results_path("r.json", False, 0) == "r.json"
