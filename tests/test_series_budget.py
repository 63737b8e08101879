"""The series budget in docs/operations.md against the exposition of the fixture node, the replay and jobs."""
from __future__ import annotations

import collections
import itertools
import os

import pytest

from agent import config as config_mod
from agent.context import AgentContext
from agent.daemon import build_sources
from agent.sampler import Sampler
from agent.sources.network import NetworkSource
from agent.sources.qdisc import TC_H_ROOT, QdiscSource
from tests.sources.test_qdisc import DONE, _qdisc
from exporters.render import Exposition
from tests.conftest import DATA, PROCFS, SYSFS, parse_exposition
from tests.gpu.conftest import TRACE_8GPU
from tests.test_render import NET_PROCFS, Fixed, jobs_reading

QDISCS = _qdisc(2, "tbf", rate=2_500_000) + _qdisc(2, "pfifo", parent=0x80020001) + _qdisc(3, "mq") + \
    _qdisc(1, "noqueue", parent=TC_H_ROOT) + DONE   # a shaped eth0, ib0 unshaped, loopback (ifindex 1) left out
CGROUPS = os.path.join(DATA, "cgroups", "v2_slurm")   # two Slurm jobs, one with every file (PSI too)
DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "operations.md")

# Every label teye exports and what bounds its values (the table in docs/operations.md).
BOUNDED_LABELS = ("collector", "version", "cpu", "mode", "device", "port", "state", "board_id", "firmware_version",
                  "hca_type", "mountpoint", "export", "protocol", "transport", "event", "operation", "procedure",
                  "error", "resource", "kind", "window", "gpu", "uuid", "name", "pci_bus_id", "driver_version",
                  "reason", "type", "cause", "xid", "pid", "user", "slurm_job", "pod_uid", "train_job", "uid", "phase",
                  "result", "le", "precision", "width", "socket", "root_bus", "pmu", "source", "namespace", "pod", "qos",
                  "container", "rank", "fstype", "operstate", "duplex", "address",
                  "sysname", "release", "machine", "nodename", "domainname", "id", "id_like", "pretty_name",
                  "version_id", "version_codename", "file", "chip", "chip_name", "sensor",
                  "zone", "controller", "csrow",
                  # issue 49
                  "major", "minor", "path", "wwn", "model", "serial", "revision", "build_id", "image_id",
                  "image_version", "variant", "variant_id", "time_zone", "clocksource", "ip", "queue", "master",
                  # issue 45
                  "tip", "key", "value")


def gpu_budget(g: int, buckets: int, processes: int, xids: int) -> int:
    """docs/operations.md: G x (46 + B) + 3 per GPU process + 1 per (GPU, XID code) seen (GPM, no retired pages;
    the replay predates issue 40's memory temperature, PCIe replay, codec and graphics-engine series)."""
    return g * (46 + buckets) + 3 * processes + xids


def job_budget(j: int, input_bound: int = 0) -> int:
    """docs/operations.md: 26 + 38 per job (jobs that report steps on no sampled GPU, 4 phases, no configuration,
    an advice of one tip: a client's), +3 per input-bound job."""
    return 26 + 38 * j + 3 * input_bound


def node(n_jobs: int):
    """Fixture node + 8-GPU replay on a clock that advances 1 s per reading, n_jobs jobs; read twice."""
    t = itertools.count(10**12, 10**9)
    ctx = AgentContext(clock=lambda: next(t))
    cfg = config_mod.load(None, {"procfs": PROCFS, "sysfs": SYSFS, "gpu": {"replay": TRACE_8GPU},
                                 "cgroupfs": CGROUPS})
    cfg["collectors"]["phases"]["enabled"] = False
    srcs = build_sources(cfg, ctx)
    srcs["network"] = (NetworkSource(NET_PROCFS), 1.0)
    srcs["qdisc"] = (QdiscSource(dump_fn=lambda: QDISCS, name_fn={2: "eth0", 3: "ib0"}.get), 5.0)
    srcs["phases"] = (Fixed("phases", jobs_reading(n_jobs)), 1.0)
    sampler = Sampler(srcs)
    for _ in range(2):  # GPM ratios need two samples
        for name in sampler.names:
            sampler.read_once(name)
    body = Exposition(lambda: sampler.snapshot).render("", "")[0].decode()
    return cfg, sampler, parse_exposition(body)


def per_prefix(series, prefix):
    return [(n, dict(lb)) for n, lb in series if n.startswith(prefix)]


@pytest.mark.parametrize("n_jobs", [0, 5])
def test_series_per_node_follow_the_documented_budget(n_jobs):
    cfg, sampler, series = node(n_jobs)
    collectors = len(sampler.names)
    n_cpu = len({lb["cpu"] for _, lb in per_prefix(series, "teye_cpu_seconds_total")})
    gpus = {lb["gpu"] for _, lb in per_prefix(series, "teye_gpu_up")}
    procs = {(lb["gpu"], lb["pid"]) for _, lb in per_prefix(series, "teye_gpu_process_info")}
    xids = {(lb["gpu"], lb["xid"]) for _, lb in per_prefix(series, "teye_gpu_xid_errors_total")}
    assert (n_cpu, len(gpus)) == (8, 8) and procs  # the fixture node and the replay

    assert len(per_prefix(series, "teye_collector_")) + len(per_prefix(series, "teye_build_info")) \
        == 1 + 5 * collectors
    host_cpu = ("teye_cpu", "teye_boot_time", "teye_context_switches", "teye_forks", "teye_interrupts",
                "teye_procs_")
    assert sum(len(per_prefix(series, p)) for p in host_cpu) == 7 + 10 * n_cpu
    buckets = len(cfg["gpu"]["idle_gap_buckets"])
    assert len(per_prefix(series, "teye_gpu_")) == gpu_budget(len(gpus), buckets, len(procs), len(xids))
    input_bound = {dict(lb)["train_job"] for (n, lb), v in series.items()
                   if n == "teye_job_bottleneck" and dict(lb)["kind"] == "input" and v == 1}
    assert len(input_bound) == n_jobs  # the test jobs wait 30 % of each step for input
    assert len(per_prefix(series, "teye_job_")) + len(per_prefix(series, "teye_phase_")) \
        == job_budget(n_jobs, len(input_bound))

    # per device or port: at most the documented series
    # network: /proc/net/dev's 16 and netclass's 20 per interface, and 2 node-wide (interfaces vanished, unreadable)
    per_entity = {"teye_disk_": ("device", 18, 0), "teye_network_": ("device", 16 + 20, 2)}
    for prefix, (label, most, node_wide) in per_entity.items():
        rows = [r for r in per_prefix(series, prefix) if not r[0].startswith("teye_network_qdisc_")]
        per_dev = [r for r in rows if label in r[1]]
        assert 0 < len(per_dev) <= most * len({lb[label] for _, lb in per_dev})
        assert len(rows) - len(per_dev) <= node_wide
    assert len(per_prefix(series, "teye_softnet_")) <= 3 * n_cpu
    md = per_prefix(series, "teye_md_")   # the fixture's 17 arrays
    assert len(md) == 11 * len({lb["device"] for _, lb in md}) == 11 * 17
    qd = per_prefix(series, "teye_network_qdisc_")   # 7 per interface's root qdisc, +1 for a tbf rate
    assert sorted({lb["device"] for _, lb in qd}) == ["eth0", "ib0"] and len(qd) == 7 * 2 + 1
    ib = per_prefix(series, "teye_infiniband_")
    ports = {(lb["device"], lb["port"]) for _, lb in ib if "port" in lb}
    hcas = {lb["device"] for _, lb in ib}
    assert ports and len(ib) <= 25 * len(ports) + len(hcas)
    assert len(per_prefix(series, "teye_memory_")) <= 57
    assert len(per_prefix(series, "teye_pressure_")) <= 24
    assert len(per_prefix(series, "teye_load")) == 5 and len(per_prefix(series, "teye_vmstat_")) <= 7
    assert len(per_prefix(series, "teye_filefd_")) + len(per_prefix(series, "teye_entropy_")) == 4
    assert len(per_prefix(series, "teye_timex_")) == 17 and len(per_prefix(series, "teye_time_zone_")) == 1
    mounts = {lb["mountpoint"] for _, lb in per_prefix(series, "teye_filesystem_") if "mountpoint" in lb}
    assert mounts and len(per_prefix(series, "teye_filesystem_")) <= 1 + 7 * len(mounts)
    cg = per_prefix(series, "teye_slurm_job_") + per_prefix(series, "teye_pod_") + per_prefix(series, "teye_jobs_")
    k = len({lb["slurm_job"] for _, lb in per_prefix(series, "teye_slurm_job_")})
    assert k == 2 and len(cg) <= 5 + 16 * k and len(per_prefix(series, "teye_slurm_job_")) > 16  # 16 + partial one

    labels = {k for _, lb in series for k, _ in lb}
    assert labels <= set(BOUNDED_LABELS), f"label(s) without a documented bound: {labels - set(BOUNDED_LABELS)}"


def test_the_budget_page_lists_every_bounded_label_and_the_formulas():
    with open(DOC, encoding="utf-8") as fh:
        doc = fh.read()
    section = doc[doc.index("## Series budget per node"):]
    for label in BOUNDED_LABELS:
        assert f"`{label}`" in section, label
    for formula in ("7 + 10·N", "G·(46 + B)", "26 + 38·J", "1 + 5·C", "5 + 16·K"):
        assert formula in section, formula


def test_jobs_scale_linearly_and_nothing_else_moves():
    _, _, zero = node(0)
    _, _, ten = node(10)
    before = collections.Counter(n for n, _ in zero)
    after = collections.Counter(n for n, _ in ten)
    # Counter subtraction drops negative counts: compare every name both ways, so a series that
    # disappears when jobs arrive shows up as a negative change
    moved = {n: after[n] - before[n] for n in before.keys() | after.keys() if after[n] != before[n]}
    assert sorted(n for n in moved if not n.startswith("teye_job_")) == [], moved
    assert all(d > 0 for d in moved.values()), moved
    assert sum(moved.values()) == (38 + 3) * 10  # the test jobs are input-bound: 3 cause series each
    # and the series of everything but the jobs are the same series, label for label
    assert {k for k in zero if not k[0].startswith("teye_job_")} == {k for k in ten if not k[0].startswith("teye_job_")}


def test_ranks_of_a_data_parallel_job_follow_the_documented_budget():
    """docs/operations.md: 2 + 7 per rank (4 phases, step seconds, steps, input-bound ratio), labels bounded; rank 0
    waits on its input (the critical rank: the 2 are its gauge and the world size; even ranks have no such gauge)."""
    from agent.phases.jobs import JobTable
    from agent.phases.protocol import encode
    from agent.phases.source import PhasesReading
    from tests.phases.helpers import MS, S, ctx_with_clock, phases_cfg
    now = 1000 * S
    ctx, _ = ctx_with_clock(now)
    table = JobTable(phases_cfg(), ctx, own_uid=0)
    plain = JobTable(phases_cfg(), ctx, own_uid=0)
    for r in range(4):
        t = now - 2 * S
        for k in range(5):
            a, b = t + (70 if r == 0 else 30) * MS, t + 100 * MS
            for tbl, rank in ((table, r if k == 0 else None), (plain, None)):
                tbl.handle(encode("ddp", [("data_wait", t, a), ("compute", a, b)], [(t, b, 64)], rank=rank,
                                  world=8 if rank is not None else None), 4000 + r, 0)
            t = b
    ranked = collections.Counter(p.spec.name for p in PhasesReading(*table.views(now)).points())
    unranked = collections.Counter(p.spec.name for p in PhasesReading(*plain.views(now)).points())
    extra = ranked - unranked
    assert sum(extra.values()) == 2 + 7 * 4, extra
    assert extra["teye_job_rank_phase_seconds_total"] == 4 * 4
    labels = {k for p in PhasesReading(*table.views(now)).points() for k in p.spec.labels}
    assert labels <= set(BOUNDED_LABELS)
