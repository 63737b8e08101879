"""Every alert carries a runbook_url to its own section of docs/runbooks.md (issue 49): in both modes' rule
files and in every PrometheusRule object deploy/kubernetes/ ships; each section says what the alert means,
how to confirm it and what to do, and names an alert that exists."""
from __future__ import annotations

import glob
import os
import re

import yaml

from tests.procs import REPO

PROM = os.path.join(REPO, "deploy", "prometheus")
RUNBOOKS = os.path.join(REPO, "docs", "runbooks.md")
BASE = "https://github.com/teye-project/teye/blob/main/docs/runbooks.md#"
PARTS = ("**Meaning**", "**Confirm**", "**Action**")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation but - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def sections(path=RUNBOOKS):
    """{anchor: (heading, body)} for every level-2 heading."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    out = {}
    for m in re.finditer(r"^## ([^\n]+)\n(.*?)(?=^## |\Z)", text, re.M | re.S):
        anchor = github_anchor(m.group(1))
        assert anchor not in out, f"two sections with anchor {anchor}"
        out[anchor] = (m.group(1).strip(), m.group(2))
    return out


def rule_groups():
    """(where, groups) for every rule file of both modes and every PrometheusRule object shipped for Kubernetes."""
    out = []
    for path in sorted(glob.glob(os.path.join(PROM, "rules", "*.yml")) +
                       glob.glob(os.path.join(PROM, "rules-node-exporter", "*.yml"))):
        with open(path, encoding="utf-8") as fh:
            out.append((os.path.relpath(path, REPO), yaml.safe_load(fh)["groups"]))
    for path in sorted(glob.glob(os.path.join(REPO, "deploy", "kubernetes", "**", "*.yaml"), recursive=True)):
        with open(path, encoding="utf-8") as fh:
            for doc in yaml.safe_load_all(fh):
                if doc and doc.get("kind") == "PrometheusRule" and "groups" in doc.get("spec", {}):
                    out.append((f"{os.path.relpath(path, REPO)}:{doc['metadata']['name']}", doc["spec"]["groups"]))
    return out


def alerts_missing_a_runbook(groups_by_file, secs):
    """[(where, alert, what is wrong)] for every alert whose runbook_url does not lead to its own section."""
    bad = []
    for where, groups in groups_by_file:
        for g in groups:
            for r in g["rules"]:
                if "alert" not in r:
                    continue
                url = (r.get("annotations") or {}).get("runbook_url")
                if not url:
                    bad.append((where, r["alert"], "no runbook_url"))
                elif not url.startswith(BASE):
                    bad.append((where, r["alert"], f"runbook_url {url} is not under {BASE}"))
                elif url[len(BASE):] not in secs:
                    bad.append((where, r["alert"], f"no section #{url[len(BASE):]} in docs/runbooks.md"))
                elif secs[url[len(BASE):]][0] != r["alert"]:
                    bad.append((where, r["alert"], f"#{url[len(BASE):]} is the section of another alert"))
    return bad


def test_every_alert_of_every_rule_file_has_a_runbook_url_to_its_own_section():
    groups = rule_groups()
    wheres = {w.split(":")[0] for w, _ in groups}
    # both modes' files and the Kubernetes objects are all read
    assert {"deploy/prometheus/rules/teye-alerts.yml", "deploy/prometheus/rules/teye-host.yml",
            "deploy/prometheus/rules-node-exporter/teye-host.yml",
            "deploy/kubernetes/prometheusrule.yaml"} <= wheres, wheres
    n = sum(1 for _, gs in groups for g in gs for r in g["rules"] if "alert" in r)
    assert n >= 100, n
    assert alerts_missing_a_runbook(groups, sections()) == []


def test_the_check_finds_an_alert_without_a_runbook_a_wrong_anchor_and_another_alerts_section():
    secs = sections()
    rule = {"alert": "TeyeGPULost", "expr": "teye_gpu_up == 0", "annotations": {}}
    wrong = dict(rule, annotations={"runbook_url": BASE + "teyegpulostt"})
    other = dict(rule, annotations={"runbook_url": BASE + "teyeagentdown"})
    elsewhere = dict(rule, annotations={"runbook_url": "https://runbooks.example/teyegpulost"})
    good = dict(rule, annotations={"runbook_url": BASE + "teyegpulost"})
    bad = alerts_missing_a_runbook([("x", [{"rules": [rule, wrong, other, elsewhere, good]}])], secs)
    assert [b[2].split(" ")[0] for b in bad] == ["no", "no", "#teyeagentdown", "runbook_url"], bad


def test_each_section_says_what_it_means_how_to_confirm_and_what_to_do():
    names = {r["alert"] for _, gs in rule_groups() for g in gs for r in g["rules"] if "alert" in r}
    secs = sections()
    alert_sections = {h: body for h, body in secs.values() if h.startswith("Teye")}
    # one section per alert, none for an alert that does not exist
    assert set(alert_sections) == names, (names ^ set(alert_sections))
    for heading, body in alert_sections.items():
        at = [body.find(p) for p in PARTS]
        assert all(i >= 0 for i in at) and at == sorted(at), (heading, "needs Meaning, Confirm, Action in order")
        for i, p in enumerate(PARTS):   # each part says something
            end = at[i + 1] if i + 1 < len(at) else len(body)
            assert len(body[at[i] + len(p):end].strip(" :\n-")) >= 20, (heading, p)


def test_github_anchors():
    assert github_anchor("TeyeGPULost") == "teyegpulost"
    assert github_anchor("Host: memory, CPU and disks") == "host-memory-cpu-and-disks"
