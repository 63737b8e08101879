"""Second tier on real software: teye agent -> Prometheus in agent mode -> central Prometheus.

The shipped deploy/prometheus/prometheus-agent.yml and prometheus-central.yml are run by
Debian's prometheus (agent mode: ``--enable-feature=agent``; central:
``--web.enable-remote-write-receiver``), with only the addresses, intervals and paths
changed for a test.  A real `teye agent` replays the synthetic 8-GPU trace.  The central
server must hold the agent's series, compute the recording rules over them and fire an
alert, every one carrying the rack server's external labels (cluster, rack).
"""
from __future__ import annotations

import json
import os
import urllib.error

import pytest
import yaml

from tests.conftest import parse_exposition
from tests.procs import REPO, Agent, Prometheus

pytestmark = pytest.mark.e2e

PROM = os.path.join(REPO, "deploy", "prometheus")
TRACE = os.path.join(REPO, "tests", "data", "gpu", "synthetic-8gpu.jsonl")
CLUSTER, RACK = "e2e-cluster", "rack-07"
GPU5_BUSY = 0.9   # tests/data/gpu/make_synthetic_trace.py: 90 ms busy / 10 ms idle, no gap the ring sees
EXTERNAL = {"cluster": CLUSTER, "rack": RACK}


def shipped(name: str) -> dict:
    with open(os.path.join(PROM, name), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def central_config() -> str:
    cfg = shipped("prometheus-central.yml")
    cfg["global"].update(evaluation_interval="1s", scrape_interval="1s")
    cfg["rule_files"] = [os.path.join(PROM, f) for f in cfg["rule_files"]]
    cfg.pop("alerting")          # no Alertmanager here: the ALERTS series is the evidence
    cfg["scrape_configs"] = []
    return yaml.safe_dump(cfg)


def agent_config(target: str, central_url: str) -> str:
    cfg = shipped("prometheus-agent.yml")
    cfg["global"].update(scrape_interval="1s", scrape_timeout="1s", external_labels=dict(EXTERNAL))
    (job,) = cfg["scrape_configs"]
    job.pop("file_sd_configs")
    job["static_configs"] = [{"targets": [target]}]
    (rw,) = cfg["remote_write"]
    rw["url"] = central_url + "/api/v1/write"
    rw["queue_config"]["batch_send_deadline"] = "1s"
    return yaml.safe_dump(cfg)


@pytest.fixture(scope="module")
def tier(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tier")
    agent = Agent(["--gpu-replay", TRACE], log_path=str(tmp / "agent.log"))
    try:
        os.makedirs(tmp / "central")
        central = Prometheus(str(tmp / "central"), config=central_config(),
                             args=["--web.enable-remote-write-receiver"])
        try:
            os.makedirs(tmp / "rack")
            rack = Prometheus(str(tmp / "rack"), config=agent_config(f"127.0.0.1:{agent.port}", central.url),
                              args=["--enable-feature=agent"])
            try:
                yield agent, rack, central
            finally:
                rack.stop()
        finally:
            central.stop()
    finally:
        assert agent.stop() == 0


def test_the_rack_server_runs_in_agent_mode(tier):
    _, rack, _ = tier
    # Agent mode has no query engine (nor rules): the API says so instead of answering.
    with pytest.raises(urllib.error.HTTPError) as e:
        rack.query("up")
    assert e.value.code == 422
    assert json.loads(e.value.read())["error"] == "unavailable with Prometheus Agent"


def test_series_arrive_with_cluster_and_rack(tier):
    agent, _, central = tier
    instance = "127.0.0.1"   # the shipped relabelling drops the port
    up = central.wait_for('up{job="teye"} == 1', timeout=40)
    assert [r["metric"] for r in up] == [{"__name__": "up", "job": "teye", "instance": instance, **EXTERNAL}]
    central.wait_for("teye_gpu_memory_total_bytes", timeout=20)
    served = {labels: v for (name, labels), v in parse_exposition(agent.metrics()).items()
              if name == "teye_gpu_memory_total_bytes"}
    got = {}
    for r in central.query("teye_gpu_memory_total_bytes"):
        m = dict(r["metric"])
        assert (m.pop("__name__"), m.pop("job"), m.pop("instance"), m.pop("cluster"), m.pop("rack")) == \
            ("teye_gpu_memory_total_bytes", "teye", instance, CLUSTER, RACK)
        got[tuple(sorted(m.items()))] = float(r["value"][1])
    assert len(got) == 8 and got == served


def test_recording_rules_keep_cluster_and_rack(tier):
    agent, _, central = tier
    instance = "127.0.0.1"   # the shipped relabelling drops the port
    labels = {"job": "teye", "instance": instance, **EXTERNAL}
    # Busy share needs two samples of the busy counters in the 5 m window, and the sampled counter must have
    # moved between them: two scrapes that found the same counters (an agent a loaded machine held back for a
    # second) give 0/0, NaN, which `count` counts but no comparison passes (CI, stop 56).
    central.wait_for('count(teye:gpu_utilization:ratio5m >= 0) == 8', timeout=40)
    util = {r["metric"]["gpu"]: r for r in central.query("teye:gpu_utilization:ratio5m")}
    assert sorted(util) == [str(g) for g in range(8)]
    for r in util.values():
        assert {k: v for k, v in r["metric"].items() if k not in ("__name__", "gpu")} == labels
    assert abs(float(util["5"]["value"][1]) - GPU5_BUSY) < 0.02, util["5"]
    # The fleet aggregate is per cluster.
    fleet = central.wait_for('teye:fleet_gpus:count{cluster!=""}', timeout=20)
    assert [(r["metric"], r["value"][1]) for r in fleet] == \
        [({"__name__": "teye:fleet_gpus:count", "cluster": CLUSTER}, "8")]


def test_an_alert_fires_with_cluster_and_rack(tier):
    agent, _, central = tier
    # The trace has XID 13 on GPU 2 two seconds in; TeyeGPUXidError has no `for:`.
    fired = central.wait_for('ALERTS{alertname="TeyeGPUXidError", alertstate="firing", xid="13"}', timeout=40)
    assert [r["metric"] for r in fired] == [{
        "__name__": "ALERTS", "alertname": "TeyeGPUXidError", "alertstate": "firing", "severity": "critical",
        "job": "teye", "instance": "127.0.0.1", "gpu": "2", "xid": "13", **EXTERNAL}]
