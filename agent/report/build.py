"""Job reports from Prometheus: a fixed set of batched queries (agent/report/fetch.py), then pure arithmetic
per job: the runs and links that say which series count (runs.py), each job's figures (figures.py), its notes
(notes.py), put together here into the document (docs/report.md) that render.py prints.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

from . import series as S
from .fetch import Fetched, _fetch, _fetch_identity, _report_grid, _skew
from .fetch import _grid_end, _step_of  # noqa: F401  (imported from here by tests/report)
from ..phases.definitions import NOT_TRAINING
from .figures import _gpu_numbers, _host_numbers, _job_cgroup_numbers, _train_job_report, _vanished
from .model import (DEFAULT_LOOKBACK_S, EXIT_CLOCK_SKEW, EXIT_COUNTER_RESET, EXIT_NO_PHASES, EXIT_NODE_VANISHED,
                    EXIT_RUNNING, EXIT_UNKNOWN, Condition, Request, _iso, _mean, _r, _ratio, _sum, share_base)
from .notes import _grafana, _notes, _run_notes
from .prom import Prometheus
from .runs import _link, _merge_runs, _train_job_windows

Window = Tuple[float, float]


def _picked_runs(f: Fetched, slurm: Optional[str], tjs: List[str], gpu_windows: Dict[Tuple[str, str], Window],
                 cg_windows: Optional[Dict[str, Window]], conds: List[Condition]):
    """The runs reported of the training jobs: (their reports, earlier runs, notes on runs); the runs'
    remarks that are conditions go to ``conds``."""
    # a Slurm job's training jobs: on each node, the run that began by the Slurm job's end
    held = list((gpu_windows or {}).values()) + list((cg_windows or {}).values())
    before = max(b for _, b in held) + f.step if slurm and held else None
    picked = {tj: _train_job_windows(f, tj, before) for tj in tjs}
    windows = {tj: w[0] for tj, w in picked.items() if w[0]}
    tj_reports = [_train_job_report(f, tj, w) for tj, w in sorted(windows.items())]
    earlier = _merge_runs([e for tj in windows for e in picked[tj][1]])
    run_notes = []
    for tj in windows:
        for kind, text in picked[tj][2]:
            if kind == "note":
                run_notes.append(text)
            else:
                conds.append(Condition(EXIT_CLOCK_SKEW, kind, text))
    return tj_reports, earlier, run_notes


def _node_conditions(f: Fetched, inst: str, gone: List[Window], conds: List[Condition]) -> None:
    for x, y in gone:
        conds.append(Condition(EXIT_NODE_VANISHED, "node_vanished",
                               f"node {inst} did not answer from {_iso(x)} to {_iso(y)} ({y - x:.0f} s): its "
                               f"numbers miss that time"))
    off = f.skew.get(inst)
    if off is not None:
        conds.append(Condition(EXIT_CLOCK_SKEW, "clock_skew",
                               f"node {inst}'s samples are stamped {off[0]:.1f} s ahead of Prometheus' clock: "
                               f"its times do not line up with the other nodes' (check NTP/chrony there)"))


def _per_node(f: Fetched, nodes: List[str], gpus: List[dict], tj_reports: List[dict],
              gpu_windows: Dict[Tuple[str, str], Window], cg_windows: Dict[str, Window], start: float, end: float,
              conds: List[Condition]):
    """Each node's figures and host counters: (per-node entries, host numbers by node)."""
    per_node = []
    hosts = {}
    for inst in nodes:
        ng = [g for g in gpus if g["node"] == inst]
        b_s = sum(g["busy_seconds"] or 0 for g in ng)
        s_s = sum(g["sampled_seconds"] or 0 for g in ng)
        hosts[inst] = _host_numbers(f, inst, start, end)
        entry = {"node": inst, "gpus": len(ng), "gpu_busy_ratio": _r(_ratio(b_s, s_s)),
                 "cpu_busy_seconds": hosts[inst]["cpu_busy_seconds"], "memory_peak_bytes": hosts[inst]["memory_peak_bytes"]}
        steps = [p for t in tj_reports for p in t["per_node"] if p["node"] == inst and p["step_seconds_mean"]]
        entry["step_seconds_mean"] = max([p["step_seconds_mean"] for p in steps]) if steps else None
        mine = [(a, b) for (i, _), (a, b) in gpu_windows.items() if i == inst] + \
            [(p["start"], p["end"]) for t in tj_reports for p in t["per_node"] if p["node"] == inst] + \
            [w for i, w in cg_windows.items() if i == inst]
        gone = _vanished(f, inst, min(a for a, _ in mine), max(b for _, b in mine)) if mine else []
        entry["missing_seconds"] = round(sum(y - x for x, y in gone), 3)
        per_node.append(entry)
        _node_conditions(f, inst, gone, conds)
    return per_node, hosts


def _slowest(per_node: List[dict]) -> Optional[str]:
    """The node with the longest mean step (exact), not a bucket; else the one whose GPUs were least busy."""
    slowest = None
    if len(per_node) > 1:
        with_steps = [p for p in per_node if p["step_seconds_mean"]]
        if with_steps:     # the longest mean step (exact), not a bucket
            slowest = max(with_steps, key=lambda p: p["step_seconds_mean"])["node"]
        else:
            cands = [p for p in per_node if p["gpu_busy_ratio"] is not None]
            slowest = min(cands, key=lambda p: p["gpu_busy_ratio"])["node"] if cands else None
    return slowest


def _cgroups(f: Fetched, nodes: List[str], slurm: Optional[str], start: float, end: float,
             per_node: List[dict]) -> Dict[str, dict]:
    """The Slurm job's own cgroup on each node where its agent saw it (also into the per-node entries)."""
    cg = {}
    for inst in nodes if slurm else ():
        x = _job_cgroup_numbers(f, inst, slurm, start, end)
        if x is not None:
            cg[inst] = x
            per_node[nodes.index(inst)]["job_cpu_seconds"] = x["cpu_seconds"]
            per_node[nodes.index(inst)]["job_memory_peak_bytes"] = x["memory_peak_bytes"]
    return cg


def _gpu_totals(gpus: List[dict]) -> dict:
    """The job's GPUs together: busy share, memory peak, idle gaps, energy."""
    busy = [g["busy_seconds"] for g in gpus if g["busy_seconds"] is not None]
    sampled = [g["sampled_seconds"] for g in gpus if g["sampled_seconds"] is not None]
    energy = [g["energy_joules"] for g in gpus if g["energy_joules"] is not None]
    gaps_n = [g["idle_gaps"] for g in gpus if g["idle_gaps"] is not None]
    gaps_s = [g["idle_gap_seconds"] for g in gpus if g["idle_gap_seconds"] is not None]
    mem_peaks = [g["memory_peak_bytes"] for g in gpus if g["memory_peak_bytes"] is not None]
    return {
        "gpu_busy_ratio": _r(_ratio(sum(busy), sum(sampled))) if sampled else None,
        "gpu_memory_peak_bytes": max(mem_peaks) if mem_peaks else None,
        "idle_gaps": {"count": sum(gaps_n), "seconds": _r(sum(gaps_s)),
                      "mean_seconds": _r(sum(gaps_s) / sum(gaps_n)) if sum(gaps_n) else None} if gaps_n else None,
        "gpu_energy_joules": _r(sum(energy), 3) if energy else None,
        "gpu_energy_kwh": _r(sum(energy) / 3.6e6, 6) if energy else None,
    }


def _training_side(tj_reports: List[dict]) -> dict:
    """The training-job side, pooled over the linked training jobs."""
    phases: Dict[str, float] = defaultdict(float)
    idle: Dict[str, float] = defaultdict(float)
    votes: Dict[str, float] = defaultdict(float)
    for t in tj_reports:
        for p, v in t["phase_seconds"].items():
            phases[p] += v or 0
        for p, v in (t["gpu_idle_seconds_by_phase"] or {}).items():
            idle[p] += v or 0
        for k, s in t["verdict_shares"].items():
            votes[k] += s * (t["steps"] or 1)
    steps_s = _sum([t.get("step_seconds") for t in tj_reports])
    total = share_base(phases, steps_s)
    nv = sum(votes.values())
    main = max(tj_reports, key=lambda t: t["steps"] or 0)
    stragglers = [t["straggler"] for t in tj_reports if t["straggler"]]
    straggler = max(stragglers, key=lambda s: s["own_wait_ratio"]) if stragglers else None
    return {
        "phase_seconds": {p: _r(v) for p, v in sorted(phases.items())},
        "step_seconds": _r(total) if total else None,
        "gpu_idle_seconds_by_phase": ({p: _r(v) for p, v in sorted(idle.items())}
                                      if any(t["gpu_idle_seconds_by_phase"] is not None for t in tj_reports)
                                      else None),
        "input_bound_ratio": (straggler["input_bound_ratio"] if straggler is not None
                              else _r(phases.get("data_wait", 0.0) / total)
                              if total and any(p not in NOT_TRAINING for p in phases) else None),
        "straggler": straggler,
        "scaling_efficiency": main["scaling_efficiency"],
        "verdict": main["verdict"], "verdict_shares": {k: round(v / nv, 4) for k, v in votes.items()} if nv else {},
        "input_cause": main["input_cause"], "input_cause_shares": main["input_cause_shares"],
        "source": main["source"], "source_text": main["source_text"], "config": main["config"],
        "traces": sorted((d for t in tj_reports for d in t["traces"]), key=lambda d: (d["seen_at"], d["node"])),
        "steps": sum(t["steps"] or 0 for t in tj_reports),
        "samples": _sum([t["samples"] for t in tj_reports]),   # None: no job counted samples (steps only)
        "step_seconds_mean": main["step_seconds_mean"], "step_seconds_p50_bounds": main["step_seconds_p50_bounds"],
        "step_seconds_p95_bounds": main["step_seconds_p95_bounds"],
        "samples_per_second": main["samples_per_second"],
        "train_job_details": [{k: v for k, v in t.items() if not k.startswith("_")} for t in tj_reports],
        "phases_omitted": None,
    }


def _no_training_side() -> dict:
    """The training-job side of a job no training job reported phases for."""
    return {"phase_seconds": None, "step_seconds": None, "gpu_idle_seconds_by_phase": None, "input_bound_ratio": None,
            "straggler": None, "scaling_efficiency": None,
            "verdict": None, "verdict_shares": {}, "input_cause": None, "input_cause_shares": {},
            "source": None, "source_text": None, "config": {}, "traces": [],
            "steps": None, "samples": None, "step_seconds_mean": None, "step_seconds_p50_bounds": None,
            "step_seconds_p95_bounds": None,
            "samples_per_second": None, "train_job_details": [],
            "phases_omitted": "no training job reported phases on this job's GPUs (not instrumented: "
                              "see docs/phases.md, or run it under `teye run`)"}


def _process_cpu(tj_reports: List[dict]) -> Tuple[Optional[float], Optional[float]]:
    """(CPU seconds, CPUs) of the training jobs' processes over their nodes (teye_job_cpu_seconds_total and
    teye_job_cpus); the CPUs of a node are the most any of its training jobs may use (two jobs of one Slurm
    job share them); (None, None) where no agent exported them."""
    used, cpus = [], {}
    for t in tj_reports:
        for p in t.get("per_node") or ():
            if p.get("job_process_cpu_seconds") is not None:
                used.append(p["job_process_cpu_seconds"])
            if p.get("job_process_cpus"):
                cpus[p["node"]] = max(cpus.get(p["node"], 0), p["job_process_cpus"])
    return (_r(sum(used), 3) if used else None), (sum(cpus.values()) if cpus else None)


def _cpu_memory_io(f: Fetched, req: Request, hosts: Dict[str, dict], cg: Dict[str, dict], seen: float,
                   job_end: float, tj_reports: Sequence[dict] = (), active: float = 0.0) -> dict:
    """The job's CPU, memory and I/O: its own cgroup where its nodes' agents saw it; else the CPU of its
    processes (teye_job_cpu_seconds_total); the whole nodes' counters otherwise (marked so).  ``active``: the
    time the job stepped by its own clocks (the run's length, where that is longer than the grid saw)."""
    cpu_busy = sum(h["cpu_busy_seconds"] or 0 for h in hosts.values())
    node_cpus = sum(h["cpus"] or 0 for h in hosts.values())
    span = seen + f.step    # CPU time is differenced from the scrape before the start, as every counter
    # the job's CPU time is all of its run's: over at least the time it stepped, which a loaded Prometheus's
    # late scrapes can leave longer than the grid saw (a loaded run, stop 65: 1.53 CPU s of a run that stepped
    # 4.25 s on 2 cores read as 19 % of 4.0 s, above what its own run_seconds gave: 18 %)
    job_span = max(span, active)
    job_cpu = _sum([x["cpu_seconds"] for x in cg.values()])
    cg_cpus = _sum([x["cpus"] for x in cg.values()])
    alloc = req.cpus or (cg_cpus if cg else None)
    # the job's own CPU time (its cgroup) as a share of what it was given; never the whole nodes' busy time
    # presented as the job's (issue 47): without a cgroup of the job, its processes' CPU time as a share of the
    # CPUs they may run on (or the cores asked for); without either, no efficiency, only the nodes' busy share,
    # labelled as the nodes'.  A run shorter than a scrape interval moved no counter it can be
    # measured by: neither figure (null, not 0 %).
    short = seen < f.step
    used = job_cpu if cg else None
    source = "job_cgroup" if cg else "node"
    if not cg:   # outside Slurm (or an agent without the jobs collector): the job's own processes
        p_used, p_cpus = _process_cpu(list(tj_reports))
        if p_used is not None:
            used, job_cpu, source = p_used, p_used, "job_processes"
            alloc = req.cpus or p_cpus
    # a cgroup that vanished before the job's end (issue 47: stated, not wrong): its counters stop there,
    # so CPU time over the whole run would read low; the efficiency is null and the report says until when
    gone = {i: x["seen_until"] for i, x in cg.items()
            if x.get("seen_until") is not None and x["seen_until"] < job_end - f.step - 1e-6}
    if gone:
        used = None
    out = {"cpu": {"allocated_cores": alloc, "node_cpus": node_cpus or None,
                   "source": source,
                   "job_seconds": job_cpu, "cgroup_cpus": cg_cpus,
                   "node_busy_seconds": _r(cpu_busy, 3),
                   "efficiency": (_r(used / (alloc * job_span), 4) if alloc and span > 0 and used is not None
                                  and not short else None),
                   "node_busy_ratio": (_r(cpu_busy / (node_cpus * span), 4) if node_cpus and span > 0
                                       and not short else None),
                   "short_run": short,
                   # node -> when the job's cgroup was last seen, for cgroups that vanished before its end
                   "cgroup_vanished": {i: _iso(t) for i, t in sorted(gone.items())} or None,
                   "cycles_per_instruction": _r(_mean([h["cycles_per_instruction"] for h in hosts.values()]), 4),
                   "memory_bandwidth_bytes_per_second": _r(_sum([h["memory_bandwidth_bytes_per_second"]
                                                                for h in hosts.values()]), 1)}}
    if cg:
        out["memory"] = {"peak_bytes": _sum([x["memory_peak_bytes"] for x in cg.values()]), "source": "job_cgroup",
                         "requested_bytes": req.mem_bytes or _sum([x["memory_limit_bytes"] for x in cg.values()]),
                         "limit_bytes": _sum([x["memory_limit_bytes"] for x in cg.values()]),
                         "node_peak_bytes": _sum([h["memory_peak_bytes"] for h in hosts.values()])}
        out["io"] = {"read_bytes": _sum([x["read_bytes"] for x in cg.values()]),
                     "written_bytes": _sum([x["written_bytes"] for x in cg.values()]), "source": "job_cgroup"}
    else:
        mem_peak = _sum([h["memory_peak_bytes"] for h in hosts.values()])
        out["memory"] = {"peak_bytes": mem_peak, "requested_bytes": req.mem_bytes, "source": "node",
                         "limit_bytes": None, "node_peak_bytes": mem_peak}
        out["io"] = None
    return out


LIVE_MESSAGE_AGE_S = 30.0   # phases.stall_seconds' default: a job silent longer is not said to run


def _running_said(f: Fetched, tjs: List[str]) -> Optional[bool]:
    """Whether the training jobs run at the report's end, from what their agents said then: a node whose
    ``teye_job_running`` is 1 at the grid's last point with its last message younger than
    max(LIVE_MESSAGE_AGE_S, two grid steps) (issue 47: the state from the job's last message age, not from
    counters that an agent's restart makes move); None where no agent exports either series (an older one)."""
    if not f.grid or not tjs:
        return None
    last = f.grid[-1]
    seen, live = False, False
    bound = max(LIVE_MESSAGE_AGE_S, 2 * f.step)
    for name in tjs:
        for inst, _ in f.jinfo_by.get(name, []):
            rows = {m: pts for m, _, _, _, pts in f.job_by.get((inst, name), [])
                    if m in ("teye_job_running", "teye_job_last_message_age_seconds")}
            if "teye_job_running" not in rows:
                continue
            seen = True
            at = lambda pts: next((v for t, v in pts if abs(t - last) < 1e-6), None)  # noqa: E731
            run, age = at(rows["teye_job_running"]), at(rows.get("teye_job_last_message_age_seconds", []))
            if run == 1 and (age is None or age <= bound):
                live = True
    return live if seen else None


def _credited_gpus(tj_reports: List[dict], gpu_windows: Dict[Tuple[str, str], Window]) -> None:
    """A training job not under Slurm: the GPUs it was credited idle time on, over its time (into
    ``gpu_windows``)."""
    for tr in tj_reports:
        for g in tr["gpus"]:
            a, b = tr["start"], tr["end"]
            old = gpu_windows.get((g["node"], g["gpu"]))
            gpu_windows[(g["node"], g["gpu"])] = (min(a, old[0]), max(b, old[1])) if old else (a, b)


def _assemble(f: Fetched, req: Request, now: float, slurm: Optional[str], tjs: List[str],
              gpu_windows: Dict[Tuple[str, str], Tuple[float, float]], user: str, until_given: bool,
              cg_windows: Optional[Dict[str, Tuple[float, float]]] = None, slurm_asked: bool = True) -> dict:
    conds: List[Condition] = []
    tj_reports, earlier, run_notes = _picked_runs(f, slurm, tjs, gpu_windows, cg_windows, conds)
    if not gpu_windows:   # a training job not under Slurm: the GPUs it was credited idle time on
        _credited_gpus(tj_reports, gpu_windows)
    cg_windows = cg_windows or {}
    spans = list(gpu_windows.values()) + [(t["start"], t["end"]) for t in tj_reports] + list(cg_windows.values())
    starts, ends = [a for a, _ in spans], [b for _, b in spans]
    start, end = min(starts), max(ends)
    nodes = sorted({i for i, _ in gpu_windows} | {n for t in tj_reports for n in t["nodes"]} | set(cg_windows))
    gpus = [_gpu_numbers(f, i, g, a, b) for (i, g), (a, b) in sorted(gpu_windows.items())]
    at_end = lambda b: bool(f.grid) and b >= f.grid[-1] - 0.5 * f.step   # noqa: E731
    running = at_end(end)
    said = _running_said(f, [t["train_job"] for t in tj_reports])
    if said is not None:   # the agents say whether it runs: its processes alive and its last message recent
        # a Slurm job also runs while a process of it still holds a GPU or its cgroup still exists at the end
        # (its training loop may have ended before its epilogue, a checkpoint's save): presence, not counters
        # (the report of a Slurm job: a training job asked for by name ran in it, and has ended where it says so)
        held = slurm_asked and bool(slurm) and any(
            at_end(b) for _, b in list(gpu_windows.values()) + list(cg_windows.values()))
        running = said or held
    state = "running" if running else "finished"
    if running:
        conds.append(Condition(EXIT_RUNNING, "running",
                               f"still running at {_iso(end)}: the report covers the job so far"))
    per_node, hosts = _per_node(f, nodes, gpus, tj_reports, gpu_windows, cg_windows, start, end, conds)
    slowest = _slowest(per_node)
    cg = _cgroups(f, nodes, slurm, start, end, per_node)
    resets = sum(g["_resets"] for g in gpus) + sum(t["_resets"] for t in tj_reports) + \
        sum(h["_resets"] for h in hosts.values()) + sum(x["_resets"] for x in cg.values())
    if resets:
        conds.append(Condition(EXIT_COUNTER_RESET, "counter_reset",
                               f"{resets} counter reset(s) during the job (an agent restarted): increases are summed "
                               f"across the restart; what happened between the last scrape before it and the "
                               f"restart is lost"))
    # a run's length: from the first to the last grid point at which its counters moved, and at least the time
    # it stepped (a run inside one scrape interval moved at one point only: 0 s on the grid)
    active = max([t["active_seconds"] or 0.0 for t in tj_reports] or [0.0])
    seen = end - start
    run = max(seen, active)
    short = bool(tj_reports) and seen < f.step
    job = {
        "slurm_job": slurm, "train_jobs": [t["train_job"] for t in tj_reports], "user": user,
        "state": state, "nodes": nodes, "start": round(start, 3), "end": round(end, 3),
        "start_time": _iso(start), "end_time": _iso(end), "run_seconds": round(run, 3), "short_run": short,
        "gpus": [{k: v for k, v in g.items() if not k.startswith("_")} for g in gpus],
        **_gpu_totals(gpus),
        "per_node": per_node, "slowest_node": slowest,
    }
    job.update(_training_side(tj_reports) if tj_reports else _no_training_side())
    if not tj_reports:
        conds.append(Condition(EXIT_NO_PHASES, "no_phases", "no phases reported: phase, verdict and step sections "
                                                            "omitted"))
    job.update(_cpu_memory_io(f, req, hosts, cg, seen, end, tj_reports, active))
    job["earlier_runs"] = earlier
    job["notes"] = _notes(job, req) + run_notes + _run_notes(job, earlier, short, run, active, f.step)
    job["grafana_url"] = _grafana(req, job)
    conds.sort(key=lambda c: c.code)
    job["conditions"] = [c.as_dict() for c in conds]
    job["complete"] = not conds or all(c.code in (EXIT_NO_PHASES,) for c in conds)
    job["exit_status"] = conds[0].code if conds else 0
    return job


def _holdings(f: Fetched):
    """(Slurm job -> (node, GPU) -> when its processes held it or it was allocated, Slurm job -> user,
    Slurm job -> node -> when its cgroup was seen)."""
    slurm_gpus: Dict[str, Dict[Tuple[str, str], Tuple[float, float]]] = defaultdict(dict)
    slurm_user: Dict[str, str] = {}
    for (inst, gpu, sj), pts in list(f.procs.items()) + list(f.alloc.items()):
        if not sj or not pts:
            continue
        a, b = S.present(pts)    # held by a process, or allocated (prolog) with or without one
        old = slurm_gpus[sj].get((inst, gpu))
        slurm_gpus[sj][(inst, gpu)] = (min(a, old[0]), max(b, old[1])) if old else (a, b)
        if f.proc_user.get((inst, gpu, sj)):
            slurm_user.setdefault(sj, f.proc_user[(inst, gpu, sj)])
    slurm_cg: Dict[str, Dict[str, Tuple[float, float]]] = defaultdict(dict)   # jobs seen by their cgroup
    for (q, inst, sj), pts in f.jobcg.items():
        if q == "job_cpu" and sj and pts:
            slurm_cg[sj][inst] = S.present(pts)
    return slurm_gpus, slurm_user, slurm_cg


def _train_job_alone(f: Fetched, req: Request, now: float, tj: str, slurm_gpus, slurm_cg, until_given: bool) -> dict:
    """The report of a training job asked for by name (or a user's not linked to a Slurm job reported)."""
    users = [f.jinfo_user.get((i, tj)) for i, _ in f.jinfo_by.get(tj, []) if f.jinfo_user.get((i, tj))]
    # the Slurm job its reported run ran in, if any: its GPUs' holder
    spans = {i: [(sp.a, sp.b)] for i, sp in _train_job_windows(f, tj)[0].items()}
    own = _link(f, slurm_gpus, {tj: spans}) if slurm_gpus else {}
    owner = next((sj for sj in sorted(own) if tj in own[sj]), None)
    rep = _assemble(f, req, now, owner, [tj], dict(slurm_gpus[owner]) if owner else {},
                    users[0] if users else "", until_given, dict(slurm_cg.get(owner, {})) if owner else {},
                    slurm_asked=False)
    rep["train_jobs"] = sorted(set(rep["train_jobs"]) | {tj}) if rep["train_jobs"] else [tj]
    return rep


def _jobs(prom: Prometheus, req: Request, now: float, nodes: List[str], grid, found_slurm, found_train) -> list:
    """Round 2 and every job's report."""
    t0, t1, step = grid
    f = _fetch(prom, nodes, t0, t1, step)
    f.index()
    f.skew = _skew(prom, nodes, now)
    slurm_gpus, slurm_user, slurm_cg = _holdings(f)
    wanted = list(req.slurm_jobs) if req.slurm_jobs else (sorted(found_slurm) if req.user else [])
    links = _link(f, {sj: slurm_gpus[sj] for sj in wanted if sj in slurm_gpus})
    until_given = req.until is not None
    jobs = []
    for sj in wanted:
        if sj not in slurm_gpus and sj not in slurm_cg:
            continue
        jobs.append(_assemble(f, req, now, sj, links.get(sj, []), dict(slurm_gpus.get(sj, {})),
                              slurm_user.get(sj, ""), until_given, dict(slurm_cg.get(sj, {}))))
    linked = {tj for v in links.values() for tj in v}
    tj_wanted = list(req.train_jobs) if req.train_jobs else \
        (sorted(found_train - linked) if req.user else [])
    for tj in tj_wanted:
        if tj not in found_train:
            continue
        jobs.append(_train_job_alone(f, req, now, tj, slurm_gpus, slurm_cg, until_given))
    return jobs


def build(prom: Prometheus, req: Request) -> dict:
    """The report document (docs/report.md) for the request; PrometheusError propagates."""
    now = prom.now()
    until = req.until if req.until is not None else now
    since = req.since if req.since is not None else until - DEFAULT_LOOKBACK_S
    if since >= until:
        raise ValueError(f"--since ({_iso(since)}) must be before --until ({_iso(until)})")
    slurm_r1, train_r1, s1, scrape = _fetch_identity(prom, req, since, until)
    found_slurm = {m.get("slurm_job") for m, pts in slurm_r1 if pts}
    found_train = {m.get("train_job") for m, pts in train_r1 if pts}
    unknown = [j for j in req.slurm_jobs if j not in found_slurm] + [j for j in req.train_jobs if j not in found_train]
    doc = {"version": 1, "prometheus": prom.url, "generated": round(now, 3), "generated_time": _iso(now),
           "since": round(since, 3), "until": round(until, 3), "jobs": [], "unknown_jobs": unknown}
    spans = [(pts[0][0], pts[-1][0]) for _, pts in slurm_r1 + train_r1 if pts]
    if spans:
        nodes = sorted({m.get("instance", "") for m, pts in slurm_r1 + train_r1 if pts})
        grid = _report_grid(prom, req, nodes, since, until, s1, scrape, spans)
        doc["jobs"] = _jobs(prom, req, now, nodes, grid, found_slurm, found_train)
        doc["step_seconds"] = grid[2]
    doc["queries"] = prom.queries
    codes = [j["exit_status"] for j in doc["jobs"] if j["exit_status"]]
    if unknown:
        codes.append(EXIT_UNKNOWN)
    doc["exit_status"] = min(codes) if codes else 0
    return doc
