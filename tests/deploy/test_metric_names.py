"""Every metric and label the dashboards and rules use is one the agent declares (agent.metrics registry)."""
from __future__ import annotations

import glob
import os
import re

import pytest
import yaml

from agent.catalog import load_all
from agent.metrics import HISTOGRAM, registered
from dashboards.common import iter_panels
from dashboards.push import load_dashboards
from tests.deploy.rulefiles import rules_with_files
from tests.procs import REPO

SELECTOR = re.compile(r"\b(teye_[a-z0-9_]+)\{([^}]*)\}")
LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
NAME = re.compile(r"\bteye_[a-z0-9_]+\b(?!\*)")
RECORD = re.compile(r"\bteye:[a-z0-9_]+:[a-z0-9_]+\b")
# labels Prometheus attaches: its own, and the external label the shipped config sets (the dashboards' `cluster`
# variable selects on it; test_the_cluster_label_is_the_shipped_configs checks it is there)
PROMETHEUS_LABELS = {"job", "instance", "cluster"}


@pytest.fixture(scope="module")
def specs():
    load_all()
    return registered()


def spec_of(name, specs):
    if name in specs:
        return specs[name]
    for suffix in ("_bucket", "_sum", "_count"):
        base = name[: -len(suffix)]
        if name.endswith(suffix) and base in specs and specs[base].kind == HISTOGRAM:
            return specs[base]
    return None


def expressions():
    """(where, PromQL) for every dashboard query and every rule."""
    out = []
    for d in load_dashboards():
        for p in iter_panels(d):
            for t in p.get("targets") or []:
                out.append((f"{d['uid']}: {p['title']}", t["expr"]))
        for a in d["annotations"]["list"]:
            if a.get("expr"):
                out.append((f"{d['uid']}: annotation {a['name']}", a["expr"]))
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                out.append((f"{d['uid']}: variable {v['name']}", v["query"]))
    for path, r in rules_with_files():
        out.append((f"{os.path.basename(path)}: {r.get('alert') or r.get('record')}", r["expr"]))
    return out


def test_every_metric_used_is_declared(specs):
    unknown = [(where, n) for where, expr in expressions() for n in NAME.findall(expr) if not spec_of(n, specs)]
    assert not unknown, unknown


def test_the_cluster_label_is_the_shipped_configs():
    with open(os.path.join(REPO, "deploy", "prometheus", "prometheus.yml"), encoding="utf-8") as fh:
        assert "cluster" in yaml.safe_load(fh)["global"]["external_labels"]


def test_every_label_selected_is_declared(specs):
    bad = []
    for where, expr in expressions():
        for name, body in SELECTOR.findall(expr):
            spec = spec_of(name, specs)
            for label in LABEL.findall(body):
                allowed = set(spec.labels) | PROMETHEUS_LABELS | ({"le"} if name.endswith("_bucket") else set())
                if label not in allowed:
                    bad.append((where, name, label))
    assert not bad, bad


def test_every_recording_rule_used_is_recorded():
    with_rules = [e for w, e in expressions()]
    recorded = set()
    for path in glob.glob(os.path.join(REPO, "deploy", "prometheus", "rules", "*.yml")):
        with open(path, encoding="utf-8") as fh:
            recorded |= {r["record"] for g in yaml.safe_load(fh)["groups"] for r in g["rules"] if "record" in r}
    used = {n for e in with_rules for n in RECORD.findall(e)}
    assert used <= recorded, used - recorded


def test_contract_names_of_the_issues_are_used(specs):
    """The metric names fixed by the host, GPU and phase issues that the dashboards and alerts build on."""
    text = " ".join(e for _, e in expressions())
    contract = ["teye_cpu_seconds_total", "teye_memory_used_bytes", "teye_memory_cached_bytes",
                "teye_memory_buffers_bytes", "teye_disk_read_bytes_total", "teye_disk_written_bytes_total",
                "teye_network_receive_bytes_total", "teye_network_transmit_bytes_total",
                "teye_infiniband_receive_bytes_total", "teye_infiniband_transmit_bytes_total",
                "teye_infiniband_link_rate_bytes_per_second", "teye_nfs_client_read_bytes_total",
                "teye_nfs_client_write_bytes_total", "teye_nfsd_read_bytes_total", "teye_nfsd_write_bytes_total",
                "teye_collector_up", "teye_gpu_info", "teye_gpu_utilization_ratio", "teye_gpu_busy_seconds_total",
                "teye_gpu_sampled_seconds_total", "teye_gpu_idle_gap_seconds_bucket", "teye_gpu_sm_active_ratio",
                "teye_gpu_pcie_transmit_bytes_per_second", "teye_gpu_pcie_receive_bytes_per_second",
                "teye_gpu_pcie_link_max_bytes_per_second", "teye_gpu_memory_used_bytes", "teye_gpu_power_watts",
                "teye_gpu_temperature_celsius", "teye_gpu_clock_event_active", "teye_gpu_xid_errors_total",
                "teye_gpu_ecc_errors_total", "teye_gpu_process_info", "teye_job_phase_seconds_total",
                "teye_job_steps_total", "teye_job_samples_total", "teye_job_input_bound_ratio",
                "teye_job_gpu_idle_seconds_total", "teye_job_bottleneck"]
    for name in contract:
        assert spec_of(name, specs), f"{name} is not declared by the agent"
        assert re.search(rf"\b{name}\b", text), f"{name} is not used by any dashboard or rule"
