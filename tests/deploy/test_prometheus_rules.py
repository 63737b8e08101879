"""Prometheus config, recording and alert rules: promtool clean, every alert unit-tested both ways."""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess

import yaml

from tests.deploy.rulefiles import RULE_FILES, load_rules
from tests.procs import REPO

PROM = os.path.join(REPO, "deploy", "prometheus")
TEST_FILES = sorted(glob.glob(os.path.join(PROM, "tests", "*.yml")))
ALERTMANAGER = os.path.join(REPO, "deploy", "alertmanager", "alertmanager.yml")
SEVERITIES = {"critical", "warning", "info"}


def promtool(*args, cwd=PROM):
    exe = shutil.which("promtool")
    assert exe, "promtool missing: apt-get install prometheus (the test command installs it)"
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def rules():
    return load_rules()


def alerts():
    return [r for r in rules() if "alert" in r]


def test_promtool_check_rules_is_clean():
    res = promtool("check", "rules", *RULE_FILES)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("SUCCESS") == len(RULE_FILES)
    assert "WARNING" not in (res.stdout + res.stderr).upper()
    total = sum(int(n) for n in re.findall(r"SUCCESS: (\d+) rules found", res.stdout))
    assert total == len(rules())


def test_promtool_check_config_is_clean():
    res = promtool("check", "config", "prometheus.yml")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS: prometheus.yml is valid prometheus config file syntax" in res.stdout
    # every rule file is loaded, and the nodes come from file_sd
    with open(os.path.join(PROM, "prometheus.yml"), encoding="utf-8") as fh:
        cfg = yaml.safe_load(fh)
    assert sorted(os.path.join(PROM, f) for f in cfg["rule_files"]) == RULE_FILES
    teye = [j for j in cfg["scrape_configs"] if j["job_name"] == "teye"][0]
    assert teye["file_sd_configs"][0]["files"] == ["targets/*.yml"]
    with open(os.path.join(PROM, "targets", "teye-nodes.yml"), encoding="utf-8") as fh:
        assert all(t.endswith(":9835") for group in yaml.safe_load(fh) for t in group["targets"])


def test_promtool_unit_tests_pass():
    res = promtool("test", "rules", *TEST_FILES)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("SUCCESS") == len(TEST_FILES)


def test_every_alert_has_severity_summary_description():
    # node-mixin's way: one alert name may have a warning and a critical rule (thresholds apart), never two of one
    # severity (Alertmanager's inhibit rule mutes the warning while the critical fires)
    keys = [(a["alert"], a["labels"]["severity"]) for a in alerts()]
    assert len(keys) == len(set(keys))
    assert len(keys) >= 15
    for a in alerts():
        assert a["labels"]["severity"] in SEVERITIES, a["alert"]
        assert a["annotations"]["summary"].strip() and a["annotations"]["description"].strip(), a["alert"]


def test_every_alert_has_a_firing_and_a_quiet_test_case():
    firing, quiet = {}, set()
    for path in TEST_FILES:
        with open(path, encoding="utf-8") as fh:
            for case in yaml.safe_load(fh)["tests"]:
                for t in case.get("alert_rule_test") or []:
                    if t.get("exp_alerts"):
                        for e in t["exp_alerts"]:
                            key = (t["alertname"], e["exp_labels"].get("severity"))
                            firing.setdefault(key, []).append(e)
                    else:
                        quiet.add(t["alertname"])
    # each rule (a name may have a warning and a critical one) fires in some case, with its own severity
    by_key = {(a["alert"], a["labels"]["severity"]): a for a in alerts()}
    for (name, severity), rule in by_key.items():
        assert (name, severity) in firing, f"{name} ({severity}) has no test case where it fires"
        assert name in quiet, f"{name} has no test case where it must not fire"
        for e in firing[(name, severity)]:
            # expected labels include the rule's own labels; annotations are checked in full
            assert {k: v for k, v in e["exp_labels"].items() if k in rule["labels"]} == rule["labels"], name
            assert set(e["exp_annotations"]) == set(rule["annotations"]), name


def test_thresholds_live_in_one_file():
    """Alerts compare against teye:threshold:* series; each is recorded once, in teye-thresholds.yml."""
    with open(os.path.join(PROM, "rules", "teye-thresholds.yml"), encoding="utf-8") as fh:
        threshold_rules = [r for g in yaml.safe_load(fh)["groups"] for r in g["rules"]]
    recorded = [r["record"] for r in threshold_rules]
    assert len(recorded) == len(set(recorded))
    for r in threshold_rules:
        assert r["record"].startswith("teye:threshold:") and re.fullmatch(r"vector\([0-9.]+\)", r["expr"]), r
    used = set()
    for a in alerts():
        used |= set(re.findall(r"teye:threshold:\w+", a["expr"]))
    assert used == set(recorded)
    # no other rule file records a threshold
    others = [r for r in rules() if "record" in r and r["record"].startswith("teye:threshold:")]
    assert len(others) == len(recorded)
    # the GPU utilization alerts use the bands, not literal percentages
    for name in ("TeyeGPUAllocatedWasted", "TeyeGPUAllocatedUtilizationRed", "TeyeGPUAllocatedUtilizationLow",
                 "TeyeJobInputBound", "TeyeGPUFrequentIdleGaps", "TeyeGPUThermalThrottling",
                 "TeyeNFSSlowOperations"):
        expr = [a for a in alerts() if a["alert"] == name][0]["expr"]
        assert "teye:threshold:" in expr and not re.search(r"[<>]=?\s*0\.\d", expr), name


def test_changing_a_threshold_is_caught_by_the_unit_tests(tmp_path):
    """The promtool tests are an oracle: moving the red band from 15 % to 5 % must break them."""
    shutil.copytree(PROM, tmp_path / "prometheus")
    path = tmp_path / "prometheus" / "rules" / "teye-thresholds.yml"
    text = path.read_text()
    assert "expr: vector(0.15)" in text
    path.write_text(text.replace("expr: vector(0.15)", "expr: vector(0.05)"))
    res = promtool("test", "rules", "tests/teye-gpu-utilization.test.yml", cwd=str(tmp_path / "prometheus"))
    assert res.returncode != 0
    assert "TeyeGPUAllocatedUtilizationRed" in res.stdout + res.stderr


def test_alertmanager_routes_every_severity():
    with open(ALERTMANAGER, encoding="utf-8") as fh:
        cfg = yaml.safe_load(fh)
    receivers = {r["name"] for r in cfg["receivers"]}
    routed = {}
    for route in cfg["route"]["routes"]:
        m = re.fullmatch(r'severity\s*=\s*"(\w+)"', route["matchers"][0])
        assert m and route["receiver"] in receivers
        routed[m.group(1)] = route["receiver"]
    assert set(routed) == SEVERITIES
    assert routed == {"critical": "oncall-pager", "warning": "cluster-team", "info": "low-priority"}
    assert {a["labels"]["severity"] for a in alerts()} <= set(routed)


def test_amtool_accepts_the_config_and_routes_by_severity():
    exe = shutil.which("amtool")
    assert exe, "amtool missing: install Debian's prometheus-alertmanager package (./dev.sh test does)"
    res = subprocess.run([exe, "check-config", ALERTMANAGER], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout + res.stderr
    for severity, receiver in (("critical", "oncall-pager"), ("warning", "cluster-team"), ("info", "low-priority")):
        res = subprocess.run([exe, "config", "routes", "test", f"--config.file={ALERTMANAGER}",
                              f"severity={severity}", "alertname=TeyeGPULost"],
                             capture_output=True, text=True, timeout=60)
        assert res.stdout.strip() == receiver, (severity, res.stdout, res.stderr)
