"""workloads.launch pieces without TensorFlow: TF_CONFIG, ports, argument handling, the scaling report."""
from __future__ import annotations

import json
import socket

from workloads import launch, train


def test_tf_config_is_what_the_trainer_reads():
    ports = launch.free_ports(3)
    assert len(set(ports)) == 3
    for i in range(3):
        cfg = json.loads(launch.tf_config(ports, i))
        assert cfg["cluster"]["worker"] == [f"127.0.0.1:{p}" for p in ports]
        assert train.tf_config_cluster({"TF_CONFIG": launch.tf_config(ports, i)}) == (3, i)


def test_free_ports_can_be_bound():
    for p in launch.free_ports(2):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", p))
        s.close()


def test_launcher_owns_distribute_and_results():
    args = ["--model", "simple_cnn", "--distribute", "none", "--results=x.json", "--steps", "3", "--results", "y"]
    assert launch._strip(args, {"--distribute", "--results"}) == ["--model", "simple_cnn", "--steps", "3"]


def _job(rates, shas, ok=True):
    return {"ok": ok, "workers": len(rates), "returncodes": [0] * len(rates),
            "results": [{"samples_per_s": r, "weights_sha256": s} for r, s in zip(rates, shas)]}


def test_scaling_report_efficiency_and_weight_check():
    rep = launch.scaling_report(_job([100.0], ["a"]), _job([80.0, 70.0], ["b", "b"]))
    assert rep["job_samples_per_s"] == 150.0 and rep["single_worker_samples_per_s"] == 100.0
    assert rep["speedup"] == 1.5 and rep["scaling_efficiency"] == 0.75
    assert rep["weights_identical"] is True
    rep = launch.scaling_report(None, _job([80.0, 70.0], ["b", "c"]))
    assert rep["weights_identical"] is False and rep["scaling_efficiency"] is None


def test_bad_launcher_arguments_exit_2(capsys):
    import pytest
    with pytest.raises(SystemExit) as e:
        launch.main(["--workers", "0", "--", "--steps", "2"])
    assert e.value.code == 2 and "--workers must be >= 1" in capsys.readouterr().err
