"""The node_exporter mode (issue 40) on this machine: a real node_exporter, a real Prometheus, teye beside them.

Debian's prometheus-node-exporter is the oracle for the series-name map (agent/hostseries.py): it reads the same
kernel with its own code.  Three exporters run at once: node_exporter, a teye agent in the mode
(``host.node_exporter: true``) and a teye agent with the defaults.  A real Prometheus scrapes node_exporter and
the agent in the mode under one instance (``ne-node``, as ``prometheus-node-exporter.yml`` relabels both to the
host name), the default agent under another (``teye-node``), with the generated rule files of the mode loaded.

* the agent in the mode exports no family of the collectors node_exporter covers, and keeps sampling those the
  communication cause reads (their ``teye_collector_up`` 1);
* every name the map gives exists in node_exporter with the label sets and values teye's family has (counters
  and moving gauges within the tolerances stated below), and each derived expression gives teye's value;
* the report's host queries return the CPUs, the memory total and the memory used this machine has (read here
  from /proc directly) for the node in the mode as for the default one;
* each node dashboard panel that reads a host family has data for both nodes; every rule of the mode is
  healthy under Prometheus.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time

import pytest
import yaml

from agent import metrics as metrics_mod
from agent.catalog import load_all
from agent.hostseries import COVERED, DERIVED, RENAMES, SAMPLED_NOT_EXPORTED
from tests.e2e.node_tolerances import ABSENT_HERE_IN_NODE_EXPORTER, bracket, left_out, tolerance
from agent.report import build as report_build
from agent.report.prom import Prometheus as ReportProm
from agent.sources import FACTORIES
from tests.conftest import parse_exposition
from tests.procs import REPO, Agent, Prometheus, free_port, http_get, wait_http

NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(NODE_EXPORTER is None, reason="Debian's prometheus-node-exporter (./dev.sh test "
                                                                "installs it)")]
PROM_DIR = os.path.join(REPO, "deploy", "prometheus")
FAST = "".join(f"  {c}:\n    interval_seconds: 1.0\n" for c in ("filesystem", "netstat", "vmstat", "loadavg",
                                                                   "timex", "netclass", "edac", "hwmon"))


def covered_families() -> set:
    """Families of the collectors the mode turns off or hides, from where each family is declared."""
    load_all()
    files = {FACTORIES[c].split(":")[0].replace(".", "/") + ".py" for c in COVERED + SAMPLED_NOT_EXPORTED}
    return {n for n, s in metrics_mod.registered().items() if s.source_file in files}


def mode_rule_files() -> list:
    with open(os.path.join(PROM_DIR, "prometheus-node-exporter.yml"), encoding="utf-8") as fh:
        return [os.path.join(PROM_DIR, r) for r in yaml.safe_load(fh)["rule_files"]]


def _job(name, target, instance):
    return f"""  - job_name: {name}
    static_configs:
      - targets: ["{target}"]
    relabel_configs:
      - target_label: instance
        replacement: {instance}
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nemode")
    (tmp / "mode.yml").write_text("host:\n  node_exporter: true\ncollectors:\n" + FAST)
    (tmp / "default.yml").write_text("collectors:\n" + FAST)
    port = free_port()
    ne = subprocess.Popen([NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{port}"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    mode = default = prom = None
    try:
        wait_http(f"http://127.0.0.1:{port}/metrics", proc=ne)
        mode = Agent(["--config", str(tmp / "mode.yml")], log_path=str(tmp / "mode.log"))
        default = Agent(["--config", str(tmp / "default.yml")])
        rules = "".join(f"\n  - {r}" for r in mode_rule_files())
        cfg = (f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:{rules}\nscrape_configs:\n"
               + _job("teye", f"127.0.0.1:{mode.port}", "ne-node")
               + _job("node", f"127.0.0.1:{port}", "ne-node")
               + _job("teye-default", f"127.0.0.1:{default.port}", "teye-node"))
        prom = Prometheus(str(tmp), config=cfg)
        prom.wait_for('count_over_time(up{instance="ne-node",job="node"}[1m]) >= 4', timeout=60)
        prom.wait_for('count_over_time(teye_build_info{instance="teye-node"}[1m]) >= 4', timeout=60)
        yield {"ne": f"http://127.0.0.1:{port}/metrics", "mode": mode, "default": default, "prom": prom,
               "tmp": tmp}
    finally:
        for p in (prom, mode, default):
            if p:
                p.stop()
        ne.terminate()
        ne.wait(10)


def test_the_mode_exports_no_family_node_exporter_covers_and_keeps_sampling_the_network(stack):
    fams = {n for n, _ in parse_exposition(stack["mode"].metrics())}
    dflt = {n for n, _ in parse_exposition(stack["default"].metrics())}
    covered = covered_families()
    assert covered & dflt, "the default agent exports the covered families (else this test proves nothing)"
    assert fams & covered == set()
    series = parse_exposition(stack["mode"].metrics())
    up = {dict(lbl)["collector"]: v for (n, lbl), v in series.items() if n == "teye_collector_up"}
    assert all(up.get(c) == 1.0 for c in SAMPLED_NOT_EXPORTED), up   # sampled, for the communication cause
    assert not set(COVERED) & set(up), up                             # off, so no failure either
    assert "teye_network_qdisc_bytes_total" in fams                    # qdisc stays (off in node_exporter)
    log = (stack["tmp"] / "mode.log").read_text()
    assert "disabled in the configuration: cpu, memory" in log, log


def _rel_close(a: float, b: float, rel: float, abs_: float) -> bool:
    return abs(a - b) <= max(abs_, rel * max(abs(a), abs(b)))


# values that move between the reads, and how far apart the two exporters may see them (read up to ~1 s apart;
# teye samples in the background, node_exporter at scrape time; Buffers moved 18 MiB between two reads while the
# parallel pass's neighbours wrote their trees, stop 59)
TOLERANCE = {
    "teye_memory_available_bytes": (0.02, 64 << 20), "teye_memory_free_bytes": (0.02, 64 << 20),
    "teye_memory_cached_bytes": (0.02, 64 << 20), "teye_memory_buffers_bytes": (0.02, 64 << 20),
    "teye_filesystem_free_bytes": (0.0, 1 << 30), "teye_filesystem_avail_bytes": (0.0, 1 << 30),
    "teye_filesystem_files_free": (0.0, 100000),
    "teye_load1": (0.0, 0.5), "teye_load5": (0.0, 0.5), "teye_load15": (0.0, 0.5),
    "teye_timex_offset_seconds": (0.0, 0.01), "teye_timex_maxerror_seconds": (0.0, 1.0),
}


def test_every_name_in_the_map_is_node_exporters_with_teyes_labels_and_values(stack):
    n1, t, n2 = bracket(lambda: http_get(stack["ne"]), stack["default"].metrics, parse_exposition)
    checked = 0
    for teye_name, ne_name in RENAMES.items():
        # loopback: teye has it, Debian's node_exporter leaves it out of netdev (teye's dashboards and rules do too)
        tv = {lbl: v for (n, lbl), v in t.items() if n == teye_name and not left_out(lbl)}
        if not tv or teye_name in ABSENT_HERE_IN_NODE_EXPORTER:
            continue   # this machine has none (no EDAC controller, ...), or node_exporter 1.5 has not: nothing to compare
        a = {lbl: v for (n, lbl), v in n1.items() if n == ne_name}
        b = {lbl: v for (n, lbl), v in n2.items() if n == ne_name}
        assert a, f"{ne_name} (map of {teye_name}) is not a node_exporter family here"
        if teye_name.startswith("teye_filesystem_"):
            # mount points come and go on this shared machine (network namespaces, sandboxes) and node_exporter
            # reads pid 1's mounts: compare those both have, the root filesystem among them
            assert ("mountpoint", "/") in {x for lbl in set(tv) & set(a) for x in lbl}, teye_name
            tv = {lbl: v for lbl, v in tv.items() if lbl in a}
        assert set(tv) <= set(a), (teye_name, set(tv) - set(a))
        for lbl, v in tv.items():
            lo, hi = min(a[lbl], b.get(lbl, a[lbl])), max(a[lbl], b.get(lbl, a[lbl]))
            if teye_name.endswith("_total"):   # counters: between the two reads, less 5 % (teye's is up to 1 s old)
                ok = lo * 0.95 - 1 <= v <= hi + 1
            else:
                rel, abs_ = TOLERANCE.get(teye_name, (0.0, tolerance(teye_name)))   # issue 49's families
                ok = _rel_close(v, lo, rel, abs_) or _rel_close(v, hi, rel, abs_) or lo <= v <= hi
            assert ok, (teye_name, dict(lbl), v, lo, hi)
            checked += 1
    assert checked >= 20, checked


def _one(prom, expr):
    res = prom.query(expr)
    assert len(res) == 1, (expr, res)
    return float(res[0]["value"][1])


def test_each_derived_expression_gives_teyes_value(stack):
    prom = stack["prom"]
    for teye_name, expr in DERIVED.items():
        ne = expr.format(m0='instance="ne-node"', m=',instance="ne-node"')
        if not prom.query(f'{teye_name}{{instance="teye-node"}}'):   # none here (no md array)
            assert not prom.query(f"{ne} > 0"), (teye_name, ne)
            continue
        # per-device families summed over the devices both see (teye's disk.exclude leaves zram out)
        sel = 'instance="teye-node",device!~"z?ram[0-9]+"'
        mine = _one(prom, f'sum({teye_name}{{{sel}}})')
        theirs = _one(prom, f'sum({expr.format(m0=sel.replace("teye-node", "ne-node"), m="," + sel.replace("teye-node", "ne-node"))})')
        # memory used moves by tens of MiB between the two reads while three exporters and Prometheus start
        assert _rel_close(mine, theirs, 0.02, 256 << 20), (teye_name, mine, theirs)


def _meminfo():
    out = {}
    with open("/proc/meminfo") as fh:
        for line in fh:
            k, v = line.split(":")
            out[k] = float(v.split()[0]) * 1024
    return out


def test_the_reports_host_queries_read_node_exporter_in_the_mode(stack):
    prom = stack["prom"]
    prom.wait_for('count_over_time(node_memory_MemTotal_bytes{instance="ne-node"}[1m]) >= 14', timeout=60)
    t1 = time.time()
    t0 = t1 - 20
    f = report_build._fetch(ReportProm(prom.url), ["ne-node", "teye-node"], t0, t1, 2.0)
    with open("/proc/stat") as fh:
        cpus = sum(1 for line in fh if re.match(r"cpu\d+ ", line))
    mem = _meminfo()
    for inst in ("ne-node", "teye-node"):
        last = {q: f.host[(q, inst)][-1][1] for q in ("cpu_busy", "cpus", "mem_peak", "mem_total")
                if (q, inst) in f.host}
        assert set(last) == {"cpu_busy", "cpus", "mem_peak", "mem_total"}, (inst, last)
        assert last["cpus"] == cpus, (inst, last)
        assert last["mem_total"] == mem["MemTotal"], (inst, last)
        # the peak over the last step: at most the total, at least what is used now, give or take what the
        # other processes on this shared machine free or take within a few seconds
        used = mem["MemTotal"] - mem["MemAvailable"]
        assert used - (1 << 30) <= last["mem_peak"] <= mem["MemTotal"], (inst, last["mem_peak"], used)
    # both branches read the same kernel at the same grid points: the same peaks, give or take the churn of the
    # other sessions on this shared machine between scrapes a second or more apart under load
    ne_peak, te_peak = dict(f.host[("mem_peak", "ne-node")]), dict(f.host[("mem_peak", "teye-node")])
    common = set(ne_peak) & set(te_peak)
    assert len(common) >= 5, (ne_peak, te_peak)
    assert all(abs(ne_peak[t] - te_peak[t]) <= max(0.25 * te_peak[t], 1 << 30) for t in common), \
        (ne_peak, te_peak)
    # the two nodes are one machine: the same busy CPU seconds, up to the scrapes' offset (5 s of every CPU:
    # scrapes a second apart, later under load)
    ne_busy, te_busy = f.host[("cpu_busy", "ne-node")][-1][1], f.host[("cpu_busy", "teye-node")][-1][1]
    assert abs(ne_busy - te_busy) <= 5 * cpus, (ne_busy, te_busy)


def test_node_dashboard_host_panels_have_data_in_both_modes(stack):
    prom = stack["prom"]
    with open(os.path.join(REPO, "dashboards", "json", "teye-node.json"), encoding="utf-8") as fh:
        dash = json.load(fh)
    covered = covered_families()
    exprs = [tg["expr"] for p in dash["panels"] for tg in p.get("targets", [])
             if any(re.search(rf"\b{c}\b", tg.get("expr", "")) for c in covered)]
    assert len(exprs) >= 5, exprs
    for e in exprs:
        for node in ("ne-node", "teye-node"):
            q = e.replace("$node", node).replace("$__rate_interval", "30s").replace("$cluster", ".*")
            assert prom.query(q), (node, q)


def test_every_rule_of_the_mode_is_healthy_under_prometheus(stack):
    prom = stack["prom"]
    time.sleep(2)
    groups = prom.api("rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) >= 40
    # "unknown": a group with a long interval not evaluated yet; "err" is what must not be
    bad = [(r["name"], r.get("lastError")) for r in rules if r.get("health") == "err" or r.get("lastError")]
    assert sum(r.get("health") == "ok" for r in rules) >= 40
    assert bad == []
    # an alert of the mode reads node_exporter's series: the OOM-kill alert's input exists for the mode's node
    assert prom.query('node_vmstat_oom_kill{instance="ne-node"}')
