"""The node_exporter mode's generated files and the series-name map (issue 40), without running exporters.

tests/e2e/test_node_exporter_mode.py checks the map against a real node_exporter and the report's queries
against a real Prometheus; here: the generated rule files, tests and config are what the generator writes,
promtool passes them, every shipped expression that reads a host family has node_exporter's in the mode, and the
configuration turns the covered collectors off.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from agent import config as config_mod
from agent.hostseries import COVERED, DERIVED, RENAMES, SAMPLED_NOT_EXPORTED, either, families_read, \
    to_node_exporter
from tests.procs import REPO

PROM = os.path.join(REPO, "deploy", "prometheus")
GEN = os.path.join(PROM, "generate.py")
MAPPED = set(RENAMES) | set(DERIVED)


def promtool(*args):
    exe = shutil.which("promtool")
    assert exe, "promtool missing: apt-get install prometheus (the test command installs it)"
    return subprocess.run([exe, *args], cwd=PROM, capture_output=True, text=True, timeout=120)


def test_the_generated_files_are_what_the_generator_writes():
    res = subprocess.run([sys.executable, GEN, "--check"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_check_mode_detects_a_stale_file(tmp_path):
    shutil.copytree(PROM, tmp_path / "prometheus")
    (tmp_path / "agent").symlink_to(os.path.join(REPO, "agent"))
    stale = tmp_path / "prometheus" / "rules-node-exporter" / "teye-host.yml"
    stale.write_text(stale.read_text().replace("node_filesystem_readonly", "teye_filesystem_readonly"))
    # the generator finds the repository two levels up: give the copy its own
    (tmp_path / "deploy").mkdir()
    os.rename(tmp_path / "prometheus", tmp_path / "deploy" / "prometheus")
    res = subprocess.run([sys.executable, str(tmp_path / "deploy" / "prometheus" / "generate.py"), "--check"],
                         capture_output=True, text=True)
    assert res.returncode == 1 and "rules-node-exporter/teye-host.yml" in res.stderr, res.stderr


def test_promtool_passes_the_rules_config_and_tests_of_the_mode():
    rules = sorted(glob.glob(os.path.join(PROM, "rules-node-exporter", "*.yml")))
    tests = sorted(glob.glob(os.path.join(PROM, "tests-node-exporter", "*.yml")))
    assert {os.path.basename(r) for r in rules} == {"teye-host.yml", "teye-recording.yml"}
    assert {os.path.basename(t) for t in tests} >= {"teye-host.test.yml", "teye-node-sizes.test.yml"}
    for args in (("check", "rules", *rules), ("check", "config", "prometheus-node-exporter.yml"),
                 ("test", "rules", *tests)):
        res = promtool(*args)
        assert res.returncode == 0, (args, res.stdout + res.stderr)


def test_the_mode_rules_read_node_exporter_and_keep_every_alert():
    for name in ("teye-host.yml", "teye-recording.yml"):
        with open(os.path.join(PROM, "rules", name)) as fh:
            orig = [r for g in yaml.safe_load(fh)["groups"] for r in g["rules"]]
        with open(os.path.join(PROM, "rules-node-exporter", name)) as fh:
            mode = [r for g in yaml.safe_load(fh)["groups"] for r in g["rules"]]
        assert [(r.get("alert"), r.get("record"), r.get("for")) for r in orig] == \
            [(r.get("alert"), r.get("record"), r.get("for")) for r in mode]
        for a, b in zip(orig, mode):
            assert not families_read(b["expr"]) & MAPPED, b
            assert b["expr"] == to_node_exporter(a["expr"])
    with open(os.path.join(PROM, "rules-node-exporter", "teye-host.yml")) as fh:
        text = fh.read()
    assert "increase(node_vmstat_oom_kill[5m]) > 0" in text
    with open(os.path.join(PROM, "prometheus-node-exporter.yml")) as fh:
        cfg = yaml.safe_load(fh)
    assert "rules-node-exporter/teye-host.yml" in cfg["rule_files"]
    assert "rules/teye-host.yml" not in cfg["rule_files"]
    assert "rules/teye-alerts.yml" in cfg["rule_files"]
    node = [s for s in cfg["scrape_configs"] if s["job_name"] == "node"]
    teye = [s for s in cfg["scrape_configs"] if s["job_name"] == "teye"]
    assert node and node[0]["relabel_configs"] == teye[0]["relabel_configs"]   # the same instance for a node
    # each job scrapes its own exporter only: no target file is read by both (the example files of each)
    files = {}
    for job in (node[0], teye[0]):
        files[job["job_name"]] = {f for sd in job["file_sd_configs"] for pat in sd["files"]
                                  for f in glob.glob(os.path.join(PROM, pat))}
    assert files["node"] and files["teye"] and not files["node"] & files["teye"], files


def _host_families():
    """Families of the collectors the mode covers, by where each is declared (docs/metrics.md's source)."""
    from agent import metrics as metrics_mod
    from agent.catalog import load_all
    from agent.sources import FACTORIES
    load_all()
    files = {FACTORIES[c].split(":")[0].replace(".", "/") + ".py" for c in COVERED + SAMPLED_NOT_EXPORTED}
    return {n for n, s in metrics_mod.registered().items() if s.source_file in files}


def test_every_shipped_expression_reading_a_host_family_has_node_exporters_in_the_mode():
    host = _host_families()
    assert {"teye_cpu_seconds_total", "teye_filesystem_avail_bytes", "teye_network_carrier"} <= host
    # rules: the mode's files read none; every family the originals read is mapped
    for path in glob.glob(os.path.join(PROM, "rules", "*.yml")):
        with open(path) as fh:
            for g in yaml.safe_load(fh)["groups"]:
                for r in g["rules"]:
                    assert families_read(r["expr"]) & host <= MAPPED, (path, r)
    # dashboards: every target that reads a host family reads node_exporter's where teye's is absent
    n = 0
    for path in glob.glob(os.path.join(REPO, "dashboards", "json", "*.json")):
        with open(path) as fh:
            dash = json.load(fh)
        for p in dash["panels"]:
            for t in p.get("targets", []):
                read = families_read(t.get("expr", "")) & host
                if read:
                    n += 1
                    assert read <= MAPPED, (path, p["title"], read)
                    assert ") or on (" in t["expr"] and "node_" in t["expr"], (path, p["title"], t["expr"])
    assert n >= 5


def test_to_node_exporter_rewrites_selectors_ranges_and_nothing_else():
    assert to_node_exporter('rate(teye_disk_read_bytes_total{instance="a"}[5m])') == \
        'rate(node_disk_read_bytes_total{instance="a"}[5m])'
    # a derived family under a range: a subquery; its matchers on each operand
    assert to_node_exporter('max_over_time(teye_memory_used_bytes{instance="a"}[1m])') == \
        'max_over_time((node_memory_MemTotal_bytes{instance="a"} - node_memory_MemAvailable_bytes{instance="a"})[1m:])'
    assert to_node_exporter("teye_cpus") == 'count without (cpu, mode) (node_cpu_seconds_total{mode="idle"})'
    # GPU families, recording rules and families that only share a prefix are left alone
    same = 'teye_gpu_up + teye:disk_read_request_size_bytes:mean5m + teye_cpu_seconds_total_x + xteye_load1'
    assert to_node_exporter(same) == same
    assert either("sum(teye_gpu_up)") == "sum(teye_gpu_up)"
    assert either("sum by (instance) (teye_load1)") == \
        "(sum by (instance) (teye_load1)) or on (instance) (sum by (instance) (node_load1))"


def _load(tmp_path, text):
    p = tmp_path / "teye.yml"
    p.write_text(text)
    explicit = set()
    return config_mod.load(str(p), None, explicit), explicit


def test_the_mode_turns_off_the_covered_collectors_unless_one_is_turned_on_explicitly(tmp_path):
    cfg, _ = _load(tmp_path, "")
    assert all(cfg["collectors"][c]["enabled"] for c in COVERED)
    assert config_mod.hidden_collectors(cfg) == frozenset()
    cfg, explicit = _load(tmp_path, "host:\n  node_exporter: true\ncollectors:\n  hwmon:\n    enabled: true\n")
    off = {c for c, v in cfg["collectors"].items() if not v["enabled"]}
    assert off == (set(COVERED) - {"hwmon"}) | {"nfsd", "systemd"}   # off by default in both exporters
    assert explicit == {"hwmon"}
    assert all(cfg["collectors"][c]["enabled"] for c in SAMPLED_NOT_EXPORTED + ("qdisc", "infiniband", "gpu"))
    assert config_mod.hidden_collectors(cfg) == frozenset(SAMPLED_NOT_EXPORTED)
    with pytest.raises(config_mod.ConfigError, match="host.node_exporter"):
        _load(tmp_path, "host:\n  node_exporter: maybe\n")
