"""The second-tier configs (per-rack agent-mode Prometheus -> central Prometheus) are valid and consistent."""
from __future__ import annotations

import os

import yaml

from tests.deploy.rulefiles import RULE_FILES
from tests.deploy.test_prometheus_rules import PROM, promtool


def load(name: str) -> dict:
    with open(os.path.join(PROM, name), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def test_promtool_accepts_both_configs():
    res = promtool("check", "config", "prometheus-agent.yml", "prometheus-central.yml")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("is valid prometheus config file syntax") == 2


def test_rack_server_labels_and_scrapes_what_the_single_server_does():
    agent, single = load("prometheus-agent.yml"), load("prometheus.yml")
    assert set(agent["global"]["external_labels"]) == {"cluster", "rack"}
    # agent mode has no rule engine and no alerting: those keys would make it refuse to start
    assert not {"rule_files", "alerting"} & set(agent)
    teye = lambda cfg: [j for j in cfg["scrape_configs"] if j["job_name"] == "teye"][0]
    assert teye(agent)["file_sd_configs"] == teye(single)["file_sd_configs"]
    assert teye(agent)["relabel_configs"] == teye(single)["relabel_configs"]
    (rw,) = agent["remote_write"]
    assert rw["url"].endswith("/api/v1/write")


def test_central_server_evaluates_every_rule_file_and_scrapes_no_node():
    central = load("prometheus-central.yml")
    assert sorted(os.path.join(PROM, f) for f in central["rule_files"]) == RULE_FILES
    assert [j["job_name"] for j in central["scrape_configs"]] == ["prometheus"]
