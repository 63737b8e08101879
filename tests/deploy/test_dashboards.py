"""The dashboards as code: committed JSON is what the code generates, and every panel is complete."""
from __future__ import annotations

import os
import re

import pytest

from dashboards.common import iter_panels
from dashboards.generate import JSON_DIR, MODULES, main as generate_main, render_all, stale
from dashboards.push import load_dashboards

VARIABLES = {"teye-cluster.json": {"datasource", "cluster", "node", "gpu", "train_job"},
             "teye-node.json": {"datasource", "cluster", "node", "gpu"},
             "teye-job.json": {"datasource", "cluster", "node", "gpu", "train_job"}}


@pytest.fixture(scope="module")
def dashboards():
    return dict(zip(MODULES, load_dashboards()))


def exprs(d):
    return [t["expr"] for p in iter_panels(d) for t in p.get("targets") or []]


def test_committed_json_is_what_the_code_generates():
    generated = render_all()
    for name, text in generated.items():
        with open(os.path.join(JSON_DIR, name), encoding="utf-8") as fh:
            assert fh.read() == text, f"dashboards/json/{name} is stale: run python -m dashboards.generate"
    assert sorted(os.listdir(JSON_DIR)) == sorted(generated)
    assert stale() == []


def test_check_mode_detects_a_stale_file(tmp_path, capsys):
    assert generate_main(["--output", str(tmp_path)]) == 0
    assert generate_main(["--check", "--output", str(tmp_path)]) == 0
    path = tmp_path / "teye-node.json"
    path.write_text(path.read_text().replace("CPU by mode", "CPU"))
    assert generate_main(["--check", "--output", str(tmp_path)]) == 1
    assert "stale dashboard JSON: teye-node.json" in capsys.readouterr().err


def test_every_panel_has_a_unit_a_description_and_the_datasource_variable(dashboards):
    checked = 0
    for name, d in dashboards.items():
        for p in iter_panels(d):
            if p["type"] == "row":
                continue
            where = f"{name}: panel {p['title']!r}"
            assert p.get("description", "").strip(), where + " has no description"
            assert p["fieldConfig"]["defaults"].get("unit"), where + " has no unit"
            for t in p.get("targets") or []:
                assert t["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
                assert t["expr"].strip(), where
            checked += 1
    assert checked >= 45


def test_panel_ids_and_ref_ids_are_unique(dashboards):
    for name, d in dashboards.items():
        ids = [p["id"] for p in iter_panels(d)]
        assert ids == list(range(1, len(ids) + 1)), name
        for p in iter_panels(d):
            refs = [t["refId"] for t in p.get("targets") or []]
            assert len(refs) == len(set(refs)) and all(refs), (name, p["title"])


def test_template_variables(dashboards):
    for name, d in dashboards.items():
        vs = {v["name"]: v for v in d["templating"]["list"]}
        assert set(vs) == VARIABLES[name], name
        assert vs["datasource"]["type"] == "datasource" and vs["datasource"]["query"] == "prometheus"
        assert vs["gpu"]["query"] == 'label_values(teye_gpu_info{instance=~"$node"}, gpu)'
        if name == "teye-job.json":
            # the job first, then its nodes: "All" is the job's nodes (no allValue), not the whole fleet
            assert [v["name"] for v in d["templating"]["list"]][:4] == ["datasource", "cluster", "train_job", "node"]
            assert vs["train_job"]["query"] == 'label_values(teye_job_steps_total{cluster=~"$cluster"}, train_job)'
            assert vs["node"]["query"] == 'label_values(teye_job_steps_total{train_job="$train_job"}, instance)'
            assert vs["node"]["includeAll"] and "allValue" not in vs["node"]
        else:
            # node = instance label, of the clusters chosen
            assert vs["node"]["query"] == 'label_values(teye_build_info{cluster=~"$cluster"}, instance)'
            if "train_job" in vs:
                assert vs["train_job"]["query"] == 'label_values(teye_job_steps_total{instance=~"$node"}, train_job)'
        # every variable a query uses is defined on the dashboard
        used = set(re.findall(r"\$(\w+)", " ".join(exprs(d)))) - {"__rate_interval", "__range", "__range_s", "__interval"}
        assert used <= set(vs), (name, used - set(vs))
    assert dashboards["teye-node.json"]["templating"]["list"][2]["multi"] is False  # one node at a time
    for d in dashboards.values():   # kubernetes-mixin's cluster variable: All (.*) also matches no label at all
        c = {v["name"]: v for v in d["templating"]["list"]}["cluster"]
        assert c["query"] == "label_values(teye_build_info, cluster)" and c["includeAll"] and c["allValue"] == ".*"
        assert [v["name"] for v in d["templating"]["list"]][:2] == ["datasource", "cluster"]


def test_uids_titles_and_tags(dashboards):
    assert {d["uid"] for d in dashboards.values()} == {"teye-cluster", "teye-node", "teye-job"}
    for d in dashboards.values():
        assert d["title"].startswith("teye / ") and "teye" in d["tags"]
        assert "id" not in d   # Grafana assigns numeric ids; uids identify the dashboards


def _panel(d, title):
    matches = [p for p in iter_panels(d) if p["title"] == title]
    assert len(matches) == 1, title
    return matches[0]


def test_job_dashboard_puts_phases_and_gpu_busy_idle_on_one_time_axis(dashboards):
    d = dashboards["teye-job.json"]
    assert d["graphTooltip"] == 1  # shared crosshair across panels
    phases = _panel(d, "Step time by phase")
    busy = _panel(d, "GPU busy vs idle, idle split by phase")
    gaps = _panel(d, "Idle-gap length")
    for p in (phases, busy, gaps):
        assert p["gridPos"]["w"] == 24 and p["gridPos"]["x"] == 0   # same width => same time axis
    assert busy["gridPos"]["y"] == phases["gridPos"]["y"] + phases["gridPos"]["h"]   # directly below
    assert gaps["gridPos"]["y"] == busy["gridPos"]["y"] + busy["gridPos"]["h"]
    assert "teye_job_phase_seconds_total" in phases["targets"][0]["expr"]
    busy_exprs = [t["expr"] for t in busy["targets"]]
    assert "teye_gpu_busy_seconds_total" in busy_exprs[0]
    assert "teye_job_gpu_idle_seconds_total" in busy_exprs[1] and "by (phase)" in busy_exprs[1]
    assert busy["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    # idle-gap heatmap straight from the histogram buckets
    assert gaps["type"] == "heatmap" and gaps["options"]["calculate"] is False
    assert "teye_gpu_idle_gap_seconds_bucket" in gaps["targets"][0]["expr"]
    assert gaps["targets"][0]["format"] == "heatmap" and gaps["targets"][0]["legendFormat"] == "{{le}}"
    # the verdict comes from teye_job_bottleneck, and its recommendations are the agent's own
    verdict = _panel(d, "Verdict")
    assert verdict["targets"][0]["expr"].startswith("teye_job_bottleneck{")
    from agent.phases.verdict import RECOMMENDATIONS
    meaning = _panel(d, "What each verdict means")["options"]["content"]
    for kind, text in RECOMMENDATIONS.items():
        assert f"**{kind}**: {text}" in meaning
    # What to do: the agent's advice for this job (issue 45), each tip mapped to the sentence the agent's
    # advice holds: every sentence of agent.phases.advice.TIPS, in the advice's order
    from agent.phases.advice import TIPS, advise
    todo = _panel(d, "What to do")
    assert todo["type"] == "table" and "teye_job_advice_tip{" in todo["targets"][0]["expr"]
    (mapping,) = todo["fieldConfig"]["defaults"]["mappings"]
    tuned = advise("input", "host_cpu", "torch", ("", ""), {"loader.num_workers": "2", "loader.pin_memory": "true"}, 2)
    assert [mapping["options"][t]["text"] for t in tuned.tips] == [TIPS[t] for t in tuned.tips]
    assert set(TIPS) <= set(mapping["options"])
    assert "teye_job_config_info{" in _panel(d, "What the job is configured with")["targets"][0]["expr"]
    # job start / stop annotations
    names = [a["name"] for a in d["annotations"]["list"]]
    assert {"Job start", "Job stopped stepping", "Job events (epochs)"} <= set(names)


def test_dashboards_cover_the_issue_list(dashboards):
    cluster = " ".join(exprs(dashboards["teye-cluster.json"]))
    node = " ".join(exprs(dashboards["teye-node.json"]))
    job = " ".join(exprs(dashboards["teye-job.json"]))
    # cluster: utilization heatmap per node (per GPU on the node dashboard: 8,000 rows do not scale),
    # GPUs below threshold + holder, jobs by verdict, GPU-hours
    assert _panel(dashboards["teye-cluster.json"], "GPU utilization per node")["type"] == "heatmap"
    # (GPUs allocated: teye_gpu_process_info through its per-node record teye:node_gpus_allocated:count)
    for s in ("teye:gpu_train_job:info", "teye:threshold:gpu_low_utilization_ratio", "teye:node_gpus_allocated:count",
              "count by (kind) (teye_job_bottleneck", "increase(teye_gpu_busy_seconds_total"):
        assert s in cluster, s
    # node: host and every GPU signal asked for
    for m in ("teye_cpu_seconds_total", "teye_memory_used_bytes", "teye_disk_read_bytes_total",
              "teye_network_receive_bytes_total", "teye_infiniband_receive_bytes_total",
              "teye_nfs_client_read_bytes_total", "teye_nfsd_read_bytes_total", "teye_gpu_busy_seconds_total",
              "teye_gpu_sm_active_ratio", "teye_gpu_memory_used_bytes", "teye_gpu_power_watts",
              "teye_gpu_temperature_celsius", "teye_gpu_clock_event_active", "teye_gpu_pcie_receive_bytes_per_second",
              "teye_gpu_pcie_transmit_bytes_per_second", "teye_gpu_pcie_link_max_bytes_per_second"):
        assert m in node, m
    # job: samples/s, input-bound ratio
    for m in ("teye_job_samples_total", "teye_job_input_bound_ratio", "teye_job_steps_total"):
        assert m in job, m


def test_every_selector_of_every_query_matches_the_cluster_variable(dashboards):
    n = 0
    for d in dashboards.values():
        for e in exprs(d):
            for sel in re.findall(r"\{[^{}]*\}", e):
                assert sel.startswith('{cluster=~"$cluster"'), (d["uid"], e)
                n += 1
    assert n > 100


def _links(p):
    out = [(None, x["url"]) for x in (p.get("fieldConfig", {}).get("defaults", {}).get("links") or [])]
    for o in p.get("fieldConfig", {}).get("overrides") or []:
        for prop in o["properties"]:
            if prop["id"] == "links":
                out += [(o["matcher"]["options"], x["url"]) for x in prop["value"]]
    return out


def test_the_cluster_view_links_to_each_node_and_job_and_they_link_back(dashboards):
    uids = {d["uid"] for d in dashboards.values()}
    cluster = dashboards["teye-cluster.json"]
    links = [(p["title"], col, url) for p in iter_panels(cluster) for col, url in _links(p)]
    # a node's cell, and a node's row of the heatmap, open that node; a training job's cell opens the job
    assert ("GPU utilization per node", None,
            "/d/teye-node/?var-node=${__field.labels.instance}&${__url_time_range}&${datasource:queryparam}"
            "&${cluster:queryparam}") in links
    for title in ("Idle or low GPUs and their training jobs", "Training jobs"):
        cols = {col: url for t, col, url in links if t == title}
        assert cols["node"].startswith("/d/teye-node/?var-node=${__value.raw}&"), cols
        assert cols["train_job"].startswith("/d/teye-job/?var-train_job=${__value.raw}&"), cols
        # the table shows the columns the links are on (instance renamed node; train_job as the label)
        p = [p for p in iter_panels(cluster) if p["title"] == title and p["type"] == "table"][0]
        org = [t for t in p["transformations"] if t["id"] == "organize"][0]["options"]
        assert org["renameByName"].get("instance") == "node" and "train_job" not in org["excludeByName"]
    # the job view's per-node series open the node
    job = dashboards["teye-job.json"]
    assert any("var-node=${__field.labels.instance}" in url for p in iter_panels(job) for _, url in _links(p))
    # every link names a dashboard that exists and keeps the time range, data source and cluster
    for d in dashboards.values():
        for p in iter_panels(d):
            for _, url in _links(p):
                assert url.split("/")[2] in uids and "${__url_time_range}" in url and "${cluster:queryparam}" in url
    # and back: the node and job views link to the cluster view; every view has the teye dropdown
    for name, d in dashboards.items():
        titles = {x["title"]: x for x in d["links"]}
        assert titles["teye"]["type"] == "dashboards" and titles["teye"]["tags"] == ["teye"]
        assert titles["teye"]["includeVars"] and titles["teye"]["keepTime"]
        if name != "teye-cluster.json":
            assert titles["Cluster"]["url"].startswith("/d/teye-cluster/?${__url_time_range}"), titles


def test_links_are_in_bits_per_second(dashboards):
    node = dashboards["teye-node.json"]
    for title in ("Network throughput", "InfiniBand throughput"):
        p = _panel(node, title)
        assert p["fieldConfig"]["defaults"]["unit"] == "bps", title
        assert all(t["expr"].endswith(" * 8") for t in p["targets"]), title
