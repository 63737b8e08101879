"""Per-job figures from the fetched series: a training job's run (phases, steps, verdict, ranks), each GPU's,
each node's and each Slurm job cgroup's counters over a window."""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Dict, List, Optional, Tuple

from ..phases import definitions
from ..phases.memory import KINDS as MEMORY_KINDS, MemoryWatch
from ..phases.protocol import SOURCES
from ..phases.verdict import CAUSES, KINDS
from . import series as S
from .fetch import Fetched
from .model import _Acc, _r, _ratio, share_base
from .runs import Span


class _NodeCounts:
    """A training job's counters on one node over its span there."""

    def __init__(self):
        self.steps, self.samples, self.sum, self.count, self.phase = _Acc(), _Acc(), _Acc(), _Acc(), _Acc()
        self.buckets: Dict[float, _Acc] = defaultdict(_Acc)
        self.procs = 1.0
        self.cpu = _Acc()                  # its processes' CPU seconds (teye_job_cpu_seconds_total)
        self.cpus: Optional[float] = None  # the CPUs they may run on (teye_job_cpus)


def _node_counts(f: Fetched, name: str, inst: str, sp: Span, phase_s: Dict[str, _Acc], idle_s: Dict[str, _Acc],
                 gpus: set) -> _NodeCounts:
    """The job's counters on one node; its phase and GPU idle seconds (and the GPUs they were on) are added to
    the job's own sums, ``phase_s``, ``idle_s`` and ``gpus``."""
    a, b, lo = sp.a, sp.b, sp.lo
    n = _NodeCounts()
    for metric, phase, gpu, le, pts in f.job_by.get((inst, name), []):
        pts = sp.cut(pts)     # this run's points only: the drop at a run boundary is no reset
        if metric == "teye_job_phase_seconds_total":
            phase_s[phase].add(pts, lo, b)
            n.phase.add(pts, lo, b)
        elif metric == "teye_job_gpu_idle_seconds_total":
            idle_s[phase].add(pts, lo, b)
            gpus.add((inst, gpu))
        elif metric == "teye_job_steps_total":
            n.steps.add(pts, lo, b)
        elif metric == "teye_job_samples_total":
            n.samples.add(pts, lo, b)
        elif metric == "teye_job_step_seconds_sum":
            n.sum.add(pts, lo, b)
        elif metric == "teye_job_step_seconds_count":
            n.count.add(pts, lo, b)
        elif metric == "teye_job_step_seconds_bucket":
            n.buckets[float(le)].add(pts, lo, b)
        elif metric == "teye_job_processes":
            n.procs = max([v for _, v in S.window(pts, a, b)] or [1.0])
        elif metric == "teye_job_cpu_seconds_total":
            n.cpu.add(pts, lo, b)      # each process counts from its start: the series starts from zero
        elif metric == "teye_job_cpus":
            n.cpus = max([v for _, v in S.window(pts, a, b)] or [None], key=lambda x: x or 0)
    return n


def _pool(n: _NodeCounts, totals: Tuple[_Acc, _Acc, _Acc, _Acc], buckets: Dict[float, _Acc]) -> None:
    """Add one node's steps, samples, step-time sum and count and histogram buckets to the job's."""
    for acc, n_acc in zip(totals, (n.steps, n.samples, n.sum, n.count)):
        if n_acc.seen:
            acc.total += n_acc.total
            acc.seen = True
            acc.resets += n_acc.resets
    for le, acc in n.buckets.items():
        buckets[le].add([], 0, 0)
        if acc.seen:
            buckets[le].total += acc.total
            buckets[le].seen = True


def _node_entry(inst: str, sp: Span, n: _NodeCounts) -> dict:
    """The job's figures on one node."""
    hist = [(le, acc.total) for le, acc in n.buckets.items() if acc.seen]
    thr = definitions.samples_per_second(n.samples.value, n.sum.value)
    procs = n.procs
    return {"node": inst, "start": sp.a, "end": sp.b, "steps": n.steps.value, "samples": n.samples.value,
            "step_seconds_mean": _mean_step(n.sum, n.count),
            "step_seconds_p50_bounds": _bounds(0.5, hist),
            "samples_per_second": _r(thr * procs if thr is not None else None, 3),
            "processes": int(procs),
            # the job's processes' CPU there (issue 47: the job's own CPU outside Slurm); null from an older agent
            "job_process_cpu_seconds": _r(n.cpu.value, 3), "job_process_cpus": n.cpus,
            # the time it stepped there, at the least: its steps' wall time, else its phase time
            # per process (what a run shorter than the grid's step is timed by)
            "active_seconds": _r(n.sum.value if n.sum.value else
                                 (n.phase.value / procs if n.phase.value else None))}


def _votes(f: Fetched, name: str, spans: Dict[str, Span]):
    """The verdict over the job's life: one vote per node and grid step while it was active; (votes by kind,
    votes by input cause, each node's latest kind, each node's latest cause)."""
    windows = {inst: (sp.a, sp.b) for inst, sp in spans.items()}
    votes: Dict[str, int] = defaultdict(int)
    causes: Dict[str, int] = defaultdict(int)
    last_kind: Dict[str, Tuple[float, str]] = {}
    last_cause: Dict[str, Tuple[float, str]] = {}
    for inst, metric, what, pts in ((i, m, w, p) for i in windows for m, w, p in f.verdict_by.get((i, name), [])):
        a, b = windows[inst]
        if metric in ("teye_job_config_info", "teye_job_trace_info"):
            continue   # (_config, _traces)
        for t, _ in S.window(spans[inst].cut(pts), a, b):
            if metric == "teye_job_bottleneck":
                votes[what] += 1
                if t >= last_kind.get(inst, (-1.0, ""))[0]:
                    last_kind[inst] = (t, what)
            else:
                causes[what] += 1
                if t >= last_cause.get(inst, (-1.0, ""))[0]:
                    last_cause[inst] = (t, what)
    return votes, causes, last_kind, last_cause


def _config(f: Fetched, name: str, spans: Dict[str, Span]) -> Dict[str, str]:
    """What the job was configured with (teye_job_config_info, issue 45): per key, the value seen last in the
    job's window on any of its nodes."""
    seen: Dict[str, Tuple[float, str]] = {}
    for inst, sp in spans.items():
        for metric, what, pts in f.verdict_by.get((inst, name), []):
            if metric != "teye_job_config_info":
                continue
            key, _, value = what.partition("=")
            for t, _ in S.window(sp.cut(pts), sp.a, sp.b):
                if t >= seen.get(key, (-1.0, ""))[0]:
                    seen[key] = (t, value)
    return {k: v for k, (_, v) in sorted(seen.items())}


def _traces(f: Fetched, name: str, spans: Dict[str, Span]) -> List[dict]:
    """The traces taken on request in the job's window (teye_job_trace_info, issue 46): each id and node, with
    the first grid time it was the node's latest, in time order."""
    out = []
    for inst, sp in spans.items():
        for metric, trace_id, pts in f.verdict_by.get((inst, name), []):
            if metric != "teye_job_trace_info":
                continue
            seen = [t for t, _ in S.window(sp.cut(pts), sp.a, sp.b)]
            if seen:
                out.append({"id": trace_id, "node": inst, "seen_at": round(min(seen), 3)})
    return sorted(out, key=lambda d: (d["seen_at"], d["node"]))


def _train_job_report(f: Fetched, name: str, spans: Dict[str, Span]) -> dict:
    windows = {inst: (sp.a, sp.b) for inst, sp in spans.items()}
    phase_s: Dict[str, _Acc] = defaultdict(_Acc)
    idle_s: Dict[str, _Acc] = defaultdict(_Acc)
    steps, samples, step_sum, step_count = _Acc(), _Acc(), _Acc(), _Acc()
    buckets: Dict[float, _Acc] = defaultdict(_Acc)
    per_node: Dict[str, dict] = {}
    gpus = set()
    for inst, sp in spans.items():
        n = _node_counts(f, name, inst, sp, phase_s, idle_s, gpus)
        _pool(n, (steps, samples, step_sum, step_count), buckets)
        per_node[inst] = _node_entry(inst, sp, n)
    phases = {p: acc.value for p, acc in phase_s.items() if acc.value is not None}
    total = share_base(phases, step_sum.value)   # the training steps' time (agent.phases.definitions)
    idle = {p: acc.value for p, acc in idle_s.items() if acc.value is not None}
    hist = [(le, acc.total) for le, acc in buckets.items() if acc.seen]
    votes, causes, last_kind, last_cause = _votes(f, name, spans)
    n_votes = sum(votes.values())
    shares = {k: round(votes.get(k, 0) / n_votes, 4) for k in KINDS} if n_votes else {}
    last = None
    if last_kind:
        kinds = [k for _, k in last_kind.values()]
        last = max(sorted(set(kinds)), key=kinds.count)
    n_causes = sum(causes.values())
    cause = max(sorted(causes), key=lambda c: causes[c]) if causes else None
    seen = [f.jinfo_source[(i, name)] for i in windows if (i, name) in f.jinfo_source]
    source = max(seen)[1] if seen else "client"   # where its phases came from last: whose advice it gets
    thr = None
    if per_node:
        rates = [p["samples_per_second"] for p in per_node.values() if p["samples_per_second"] is not None]
        thr = sum(rates) if rates else None
    resets = sum(a.resets for a in list(phase_s.values()) + list(idle_s.values()) + [steps, samples])
    # no training phase at all (a steps-only source, or one whose only phase is eval): input not observed,
    # absent (null), never 0
    observed = any(p not in definitions.NOT_TRAINING for p in phases)
    ratio = _r(definitions.share(phases.get("data_wait", 0.0), total)) if observed else None
    rank_sums = _rank_sums(f, name, spans)
    straggler = _straggler(rank_sums, last_kind, last_cause)
    if straggler is not None:
        # a data-parallel job: its pace, verdict and cause are its critical rank's, over all its nodes; each
        # node counts the job's global steps, so the job made as many as its busiest node counted
        ratio = straggler["input_bound_ratio"]
        last = last_kind[straggler["node"]][1] if straggler["node"] in last_kind else last
        cause = straggler["cause"] if last == "input" else cause
        n_steps = [p["steps"] for p in per_node.values() if p["steps"] is not None]
        if n_steps:
            steps.total = max(n_steps)
    return {
        "train_job": name,
        "nodes": sorted(windows),
        "gpus": [{"node": i, "gpu": g} for i, g in sorted(gpus)],
        "start": min(a for a, _ in windows.values()), "end": max(b for _, b in windows.values()),
        "active_seconds": max([p["active_seconds"] for p in per_node.values() if p["active_seconds"]] or [None],
                              key=lambda x: x or 0),
        "phase_seconds": {p: _r(v) for p, v in sorted(phases.items())},
        # what every share is of: the training steps' compile-free wall time (eval and compile beside it)
        "step_seconds": _r(total) if total else None,
        # null without GPU samples (no teye_job_gpu_idle_seconds_total series): no GPU, no GPU figures
        "gpu_idle_seconds_by_phase": {p: _r(v) for p, v in sorted(idle.items())} if gpus else None,
        "input_bound_ratio": ratio,
        "straggler": straggler,
        "scaling_efficiency": _scaling_efficiency(rank_sums),
        "steps": steps.value, "samples": samples.value,
        # the exact mean (the histogram's own sum / count, never rounded) and the buckets the quantiles fall in
        "step_seconds_mean": _mean_step(step_sum, step_count),
        "step_seconds_p50_bounds": _bounds(0.5, hist), "step_seconds_p95_bounds": _bounds(0.95, hist),
        "samples_per_second": _r(thr, 3),
        "verdict": last, "verdict_shares": shares,
        "input_cause": cause,
        "input_cause_shares": {c: round(causes.get(c, 0) / n_causes, 4) for c in CAUSES} if n_causes else {},
        "source": source, "source_text": SOURCES.get(source, source),
        "config": _config(f, name, spans),
        "traces": _traces(f, name, spans),
        "per_node": [per_node[i] for i in sorted(per_node)],
        # when the reported run began on each node (teye_job_start_time_seconds); null from an older agent
        "run_start": {i: (round(sp.run.start, 3) if sp.run else None) for i, sp in sorted(spans.items())},
        # their memory that crept over the run's last 30 minutes, in words (issue 45); null: none did
        "memory_creep": _memory_creep(f, name, spans),
        "_resets": resets,
    }


def _memory_creep(f: Fetched, name: str, spans: Dict[str, Span]) -> Optional[str]:
    """The memory creep of the job's processes on one of its nodes over the last 30 minutes of its run there, by
    the agent's criterion (agent/phases/memory.py, the TeyeJobMemoryCreep rule's), in words; None where none
    creeps (or the run is shorter than the window)."""
    worst = None
    judge = MemoryWatch(None).judge
    for inst, sp in sorted(spans.items()):
        steps = dict(sp.cut([p for metric, _ph, _g, _le, pts in f.job_by.get((inst, name), [])
                             if metric == "teye_job_steps_total" for p in pts]))
        for kind in MEMORY_KINDS:
            pts = [(t, v) for t, v in S.window(sp.cut(f.memory.get((inst, name, kind), [])), sp.a, sp.b)]
            if not pts:
                continue
            samples = [(int(t * 1e9), int(steps.get(t, 0)), {kind: v}) for t, v in pts]
            c = judge(samples)
            if c is not None and (worst is None or c.grew_bytes > worst[1].grew_bytes):
                worst = (inst, c)
    if worst is None:
        return None
    inst, c = worst
    return c.sentence(who=f"on {inst}, its processes'")


def _mean_step(total: _Acc, count: _Acc) -> Optional[float]:
    """Mean step time from the histogram's own _sum and _count increases (exact: no rounding)."""
    return definitions.mean_step(total.value, count.value)


def _bounds(q: float, hist) -> Optional[List[Optional[float]]]:
    """[lower, upper] of the step-time bucket the q-quantile falls in; upper null above the last bound."""
    b = S.bucket_bounds(q, hist)
    return None if b is None else [b[0], None if math.isinf(b[1]) else b[1]]


# the per-rank sums (step seconds, phases, steps) of one rank over its node's window: their index in _rank_sums
_RANK_SUM = {"teye_job_rank_step_seconds_total": 0, "teye_job_rank_steps_total": 5}
_RANK_PHASE = {"data_wait": 1, "host": 2, "communication": 3, "compute": 4}
OWN_WAIT_THRESHOLD = 0.2         # teye:threshold:job_input_bound_ratio, the agent's input_bound_threshold
COMMUNICATION_THRESHOLD = 0.2    # teye:threshold:job_communication_ratio, the agent's communication_threshold


def _rank_sums(f: Fetched, name: str, spans: Dict[str, Span]) -> Dict[Tuple[str, str], List[Optional[float]]]:
    """(node, rank) -> [step seconds, data_wait, host, communication, compute seconds, steps] over the job's
    window on that node (steps None where the agent exports no teye_job_rank_steps_total)."""
    sums: Dict[Tuple[str, str], List[Optional[float]]] = {}
    for inst, sp in spans.items():
        for metric, rank, phase, pts in f.rank_by.get((inst, name), []):
            k = _RANK_SUM.get(metric) if metric != "teye_job_rank_phase_seconds_total" else _RANK_PHASE.get(phase)
            v, _ = S.increase(sp.cut(pts), sp.lo, sp.b) if k is not None else (None, 0)
            if v is None:
                continue
            acc = sums.setdefault((inst, rank), [0.0, 0.0, 0.0, 0.0, 0.0, None])
            acc[k] = (acc[k] or 0.0) + v
    return sums


def _scaling_efficiency(sums) -> Optional[float]:
    """1 - communication seconds / step seconds over the job's ranks that stepped, on all its nodes (the
    recording rule teye:job_scaling_efficiency:ratio5m over the whole run); None without rank series."""
    st = sum(s[0] for s in sums.values() if s[0] > 0)
    return _r(1 - sum(s[3] for s in sums.values() if s[0] > 0) / st) if st else None


def _straggler(sums, last_kind, last_cause) -> Optional[dict]:
    """The critical rank of a data-parallel job over all its nodes (docs/phases.md): of the ranks that made
    steps, the one whose own input and host wait is the largest share of its step time (ties: the lowest
    rank; ``rule`` own_wait); where no rank's own wait reaches 0.2 and the ranks' communication shares
    differ by 0.2 or more, the rank with the least communication share (ties: the lowest rank; ``rule``
    communication, verdict compute): it computes longest and the others wait for it in the gradient
    exchange.  None for a job without at least two such ranks.  An own-wait straggler's cause and verdict
    are its node's: each node's verdict is that of its own critical rank."""
    cands = [(inst, rank, s) for (inst, rank), s in sums.items() if s[0] > 0]
    if len(cands) < 2:
        return None
    order = lambda c: int(c[1]) if c[1].isdigit() else 0   # noqa: E731
    own = lambda c: (c[2][1] + c[2][2]) / c[2][0]          # noqa: E731
    comm = lambda c: c[2][3] / c[2][0]                     # noqa: E731
    inst, rank, s = max(cands, key=lambda c: (own(c), -order(c)))
    if own((inst, rank, s)) < OWN_WAIT_THRESHOLD and \
            max(map(comm, cands)) - min(map(comm, cands)) >= COMMUNICATION_THRESHOLD:
        crit = min(cands, key=lambda c: (comm(c), order(c)))
        inst, rank, s = crit
        others = [c for c in cands if c is not crit]
        per_step = [c[2][3] / c[2][5] for c in others if c[2][5]]
        return {"rank": int(rank) if rank.isdigit() else rank, "node": inst, "rule": "communication",
                "input_bound_ratio": _r(s[1] / s[0]), "own_wait_ratio": _r((s[1] + s[2]) / s[0]),
                "communication_ratio": _r(comm(crit)),
                "waiting_communication_ratio": _r(sum(map(comm, others)) / len(others)),
                # seconds per step (null where the agent exports no per-rank step counts)
                "compute_seconds_per_step": _r(s[4] / s[5]) if s[5] else None,
                "waiting_communication_seconds_per_step": (_r(sum(per_step) / len(per_step))
                                                           if len(per_step) == len(others) else None),
                "cause": None, "verdict": "compute", "ranks": len(cands)}
    kind = last_kind.get(inst, (0, None))[1]
    cause = last_cause.get(inst, (0, None))[1] if kind == "input" else ("host" if kind == "host" else None)
    return {"rank": int(rank) if rank.isdigit() else rank, "node": inst, "rule": "own_wait",
            "input_bound_ratio": _r(s[1] / s[0]), "own_wait_ratio": _r((s[1] + s[2]) / s[0]),
            "communication_ratio": _r(s[3] / s[0]), "cause": cause, "verdict": kind, "ranks": len(cands)}


def _gpu_numbers(f: Fetched, inst: str, gpu: str, a: float, b: float) -> dict:
    lo = a - f.step
    accs = {}
    for metric in ("teye_gpu_busy_seconds_total", "teye_gpu_sampled_seconds_total", "teye_gpu_energy_joules_total",
                   "teye_gpu_idle_gap_seconds_count", "teye_gpu_idle_gap_seconds_sum"):
        acc = _Acc()
        pts = f.gpu.get((metric, inst, gpu))
        if pts:
            acc.add(pts, lo, b, from_zero=metric != "teye_gpu_energy_joules_total")   # energy: since driver load
        accs[metric] = acc
    mem = [v for _, v in S.window(f.gmem.get((inst, gpu), []), a, b)]
    busy, sampled = accs["teye_gpu_busy_seconds_total"].value, accs["teye_gpu_sampled_seconds_total"].value
    return {"node": inst, "gpu": gpu, "start": a, "end": b,
            "busy_seconds": _r(busy), "sampled_seconds": _r(sampled), "busy_ratio": _r(_ratio(busy, sampled)),
            "memory_peak_bytes": max(mem) if mem else None,
            "energy_joules": _r(accs["teye_gpu_energy_joules_total"].value, 3),
            "idle_gaps": accs["teye_gpu_idle_gap_seconds_count"].value,
            "idle_gap_seconds": _r(accs["teye_gpu_idle_gap_seconds_sum"].value),
            "_resets": sum(x.resets for x in accs.values())}


def _host_numbers(f: Fetched, inst: str, a: float, b: float) -> dict:
    lo = a - f.step
    h = {}
    for q in ("cpu_busy", "cycles", "instructions", "dram_bytes"):
        acc = _Acc()
        pts = f.host.get((q, inst))
        if pts:
            acc.add(pts, lo, b, from_zero=False)   # since boot, not since the agent started
        h[q] = acc
    last = lambda q: max([v for _, v in S.window(f.host.get((q, inst), []), a, b)] or [None], key=lambda x: x or 0)  # noqa
    run = max(b - lo, 0.0)           # the span the counters were differenced over
    dram = h["dram_bytes"].value
    return {"node": inst, "cpu_busy_seconds": _r(h["cpu_busy"].value, 3), "cpus": last("cpus"),
            "memory_peak_bytes": last("mem_peak"), "memory_total_bytes": last("mem_total"),
            "cycles_per_instruction": _r(_ratio(h["cycles"].value, h["instructions"].value), 4),
            "memory_bandwidth_bytes_per_second": _r(dram / run, 1) if dram is not None and run > 0 else None,
            "_resets": h["cpu_busy"].resets}


def _job_cgroup_numbers(f: Fetched, inst: str, sj: str, a: float, b: float) -> Optional[dict]:
    """The Slurm job's own CPU, memory and I/O on one node, from its cgroup (the jobs collector); None when
    the agent there did not see the job's cgroup."""
    if ("job_cpu", inst, sj) not in f.jobcg:
        return None
    lo = a - f.step
    accs = {}
    for q in ("job_cpu", "job_read", "job_written"):
        acc = _Acc()
        pts = f.jobcg.get((q, inst, sj))
        if pts:
            acc.add(pts, lo, b)    # the job's counters start at zero with its cgroup
        accs[q] = acc

    def most(q):
        vals = [v for _, v in S.window(f.jobcg.get((q, inst, sj), []), a, b)]
        return max(vals) if vals else None
    # the last point its cgroup was seen at: a cgroup that vanished before the job's end (removed under
    # it, its node's agent restarted without the jobs collector) covers the job only until then
    seen = [t for t, _ in S.window(f.jobcg.get(("job_cpu", inst, sj), []), lo, b)]
    return {"node": inst, "cpu_seconds": _r(accs["job_cpu"].value, 3), "cpus": most("job_cpus"),
            "seen_until": max(seen) if seen else None,
            "memory_peak_bytes": most("job_mem_peak"), "memory_limit_bytes": most("job_mem_limit"),
            "read_bytes": accs["job_read"].value, "written_bytes": accs["job_written"].value,
            "_resets": sum(x.resets for x in accs.values())}


def _vanished(f: Fetched, inst: str, a: float, b: float) -> List[Tuple[float, float]]:
    pts = f.up.get(inst, [])
    have = [t for t, v in pts if v >= 1]
    return S.gaps(f.grid, have, a, b, f.step)
