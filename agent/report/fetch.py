"""The report's queries to Prometheus, all of them (one place for every PromQL string), and their answers indexed.

Two rounds, whatever the number of jobs:

1. identity, over [since, until] at a coarse step: which GPUs each Slurm job's processes held
   (``teye_gpu_process_info{slurm_job}``) and where each training job reported
   (``teye_job_info{train_job}``), with ``count_over_time`` so that no short job falls between
   steps and the scrape interval can be read off;
2. everything else, over the union of the jobs' windows, on the nodes they ran on, at a step of
   about one scrape interval: GPU counters, GPU memory, training-job counters, verdicts, host CPU
   and memory, ``up``.  Each query aggregates or selects by name regex, so the number of queries
   is constant; the per-job work (counter differences over each job's own window and GPUs) is
   done in agent/report/figures.py.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..hostseries import either
from .model import Request
from .prom import Prometheus

START_METRIC = "teye_job_start_time_seconds"   # a run's start; a new value: a new run (docs/report.md "Runs")
START_CHANGES = "teye_report_start_time_changes"   # changes() of it over the range (a name of the report's own)
MAX_POINTS = 10000          # Prometheus refuses more than 11,000 points per series
SKEW_TOLERANCE_S = 1.0


def _re_alt(values) -> str:
    return "|".join(re.escape(v).replace("\\", "\\\\").replace('"', '\\"') for v in sorted(set(values)))


def _lbl(values) -> str:
    """A PromQL regex literal matching exactly these values."""
    return '"' + _re_alt(values) + '"'


def _dur(seconds: float) -> str:
    """A PromQL duration (whole milliseconds: PromQL refuses '1.5s')."""
    return f"{max(1, int(round(seconds * 1000)))}ms"


def _key(m: Dict[str, str], *names) -> Tuple[str, ...]:
    return tuple(m.get(n, "") for n in names)


@dataclass
class Fetched:
    """Round 2's answers, indexed."""
    t0: float
    t1: float
    step: float
    grid: List[float]
    procs: Dict[Tuple[str, str, str], List[Tuple[float, float]]] = field(default_factory=dict)   # (inst,gpu,slurm)
    alloc: Dict[Tuple[str, str, str], List[Tuple[float, float]]] = field(default_factory=dict)   # (inst,gpu,slurm)
    jobcg: Dict[Tuple[str, str, str], List[Tuple[float, float]]] = field(default_factory=dict)   # (q,inst,slurm)
    proc_user: Dict[Tuple[str, str, str], str] = field(default_factory=dict)
    jinfo: Dict[Tuple[str, str], List[Tuple[float, float]]] = field(default_factory=dict)        # (inst, train_job)
    jinfo_user: Dict[Tuple[str, str], str] = field(default_factory=dict)
    jinfo_source: Dict[Tuple[str, str], Tuple[float, str]] = field(default_factory=dict)  # (last seen, source)
    jinfo_pid: Dict[Tuple[str, str], List[Tuple[str, list]]] = field(default_factory=dict)  # [(first pid, pts)]
    gpu: Dict[Tuple[str, str, str], List[Tuple[float, float]]] = field(default_factory=dict)     # (name,inst,gpu)
    gmem: Dict[Tuple[str, str], List[Tuple[float, float]]] = field(default_factory=dict)
    job: Dict[Tuple[str, str, str, str, str, str], List[Tuple[float, float]]] = field(default_factory=dict)
    verdict: Dict[Tuple[str, str, str, str], List[Tuple[float, float]]] = field(default_factory=dict)
    rank: Dict[Tuple[str, str, str, str, str], List[Tuple[float, float]]] = field(default_factory=dict)
    host: Dict[Tuple[str, str], List[Tuple[float, float]]] = field(default_factory=dict)        # (q, inst)
    up: Dict[str, List[Tuple[float, float]]] = field(default_factory=dict)
    skew: Dict[str, Tuple[float, float]] = field(default_factory=dict)
    # indexes by training job (built once by index(), so per-job work never scans every series)
    job_by: Dict[Tuple[str, str], list] = field(default_factory=dict)       # (inst, tj) -> [(metric, phase, gpu, le, pts)]
    verdict_by: Dict[Tuple[str, str], list] = field(default_factory=dict)   # (inst, tj) -> [(metric, what, pts)]
    jinfo_by: Dict[str, list] = field(default_factory=dict)                 # tj -> [(inst, pts)]
    rank_by: Dict[Tuple[str, str], list] = field(default_factory=dict)      # (inst, tj) -> [(metric, rank, phase, pts)]
    starts: Dict[Tuple[str, str], List[Tuple[float, float]]] = field(default_factory=dict)         # (inst, tj)
    memory: Dict[Tuple[str, str, str], List[Tuple[float, float]]] = field(default_factory=dict)    # (inst, tj, kind)
    start_changes: Dict[Tuple[str, str], List[Tuple[float, float]]] = field(default_factory=dict)  # (inst, tj)

    def index(self) -> None:
        for (metric, inst, tj, rank, phase), pts in self.rank.items():
            self.rank_by.setdefault((inst, tj), []).append((metric, rank, phase, pts))
        for (metric, inst, tj, phase, gpu, le), pts in self.job.items():
            self.job_by.setdefault((inst, tj), []).append((metric, phase, gpu, le, pts))
        for (metric, inst, tj, what), pts in self.verdict.items():
            self.verdict_by.setdefault((inst, tj), []).append((metric, what, pts))
        for (inst, tj), pts in self.jinfo.items():
            self.jinfo_by.setdefault(tj, []).append((inst, pts))


def _fetch_identity(prom: Prometheus, req: Request, since: float, until: float):
    """Round 1: (slurm presence, train-job presence, scrape interval estimate)."""
    s1 = max(1.0, math.ceil((until - since) / 1000.0))
    since = until - math.ceil((until - since) / s1) * s1    # the grid ends exactly at `until`
    sel = []
    if req.slurm_jobs:
        sel.append(f"slurm_job=~{_lbl(req.slurm_jobs)}")
    elif req.user:
        sel.append(f'user={_lbl([req.user])},slurm_job!=""')
    slurm = []
    if sel:
        q = (f"max by (instance, gpu, slurm_job, user) "
             f"(count_over_time(teye_gpu_process_info{{{','.join(sel)}}}[{_dur(s1)}]))")
        if req.slurm_jobs:   # also the GPUs allocated to it (prolog), and a job with no GPU at all (its cgroup)
            jsel = f"slurm_job=~{_lbl(req.slurm_jobs)}"
            q += (f" or max by (instance, gpu, slurm_job) (count_over_time(teye_gpu_allocation_info{{{jsel}}}"
                  f"[{_dur(s1)}])) or max by (instance, slurm_job) (count_over_time("
                  f'teye_slurm_job_cpu_seconds_total{{{jsel},mode="user"}}[{_dur(s1)}]))')
        slurm = prom.query_range(q, since, until, s1)
    train = []
    if req.train_jobs or req.user:
        tsel = f"train_job=~{_lbl(req.train_jobs)}" if req.train_jobs else f"user={_lbl([req.user])}"
        train = prom.query_range(f"max by (instance, train_job, user) "
                                 f"(count_over_time(teye_job_info{{{tsel}}}[{_dur(s1)}]))", since, until, s1)
    most = max([v for _, pts in slurm + train for _, v in pts] or [0])
    scrape = s1 / most if most >= 2 else None
    return slurm, train, s1, scrape


def _step_of(scrape: Optional[float]) -> float:
    """The report's step for an estimated scrape interval: whole seconds, at least 1, so that an estimate of
    0.999 or 1.001 s (the scrapes' jitter, seen over another window on the next call) gives the same grid."""
    return max(float(round(scrape or 1.0)), 1.0)


def _grid_end(t1: float, until: float, step: float, until_given: bool) -> float:
    """The last point of the report's grid: a multiple of the step (Unix time), so that the grid is the same on
    every call whatever the time of the call; each grid point holds the newest sample at or before it, so a run's
    first and last movement land on the same points every time (docs/report.md "Runs").  The multiple at or
    after t1, except past an --until given (samples after it are not the report's): the multiple before."""
    end = math.ceil(t1 / step - 1e-9) * step
    if until_given and end > until + 1e-6:
        end = math.floor(until / step + 1e-9) * step
    return round(end, 3)


def _scrape_interval(prom: Prometheus, nodes: Sequence[str], t0: float, t1: float) -> Optional[float]:
    """About one scrape interval: the median spacing of up's samples on the nodes before t1 (None: not known)."""
    w = _dur(min(300.0, max(2.0, t1 - t0)))
    u = f"up{{instance=~{_lbl(nodes)}}}"
    res = prom.query(f"quantile(0.5, (max_over_time(timestamp({u})[{w}:1s]) - min_over_time(timestamp({u})"
                     f"[{w}:1s])) / ((count_over_time({u}[{w}]) > 1) - 1))", at=t1)
    return res[0][2] if res and res[0][2] > 0 and not math.isnan(res[0][2]) else None


def _report_grid(prom: Prometheus, req: Request, nodes: Sequence[str], since: float, until: float, s1: float,
                 scrape: Optional[float], spans: Sequence[Tuple[float, float]]) -> Tuple[float, float, float]:
    """Round 2's grid (t0, t1, step) over the jobs' sightings in round 1 (``spans``, on its step ``s1``)."""
    t0 = max(since, min(a for a, _ in spans) - s1)
    # one coarse step past the last sighting, so that a job that ended just before a coarse grid point
    # is not seen "present at the end" (running) on the fine grid
    t1 = min(until, max(b for _, b in spans) + s1)
    if not req.step:   # about one scrape interval: the spacing of up's samples before t1
        scrape = _scrape_interval(prom, nodes, t0, t1)
    step = req.step or _step_of(scrape)
    step = max(step, math.ceil((t1 - t0) / MAX_POINTS))
    t1 = _grid_end(t1, until, step, req.until is not None)
    t0 = t1 - math.ceil((t1 - max(since, t0 - step)) / step - 1e-9) * step
    return t0, t1, step


def _fetch(prom: Prometheus, nodes: Sequence[str], t0: float, t1: float, step: float) -> Fetched:
    n = f"instance=~{_lbl(nodes)}"
    grid = [round(t0 + i * step, 3) for i in range(int(round((t1 - t0) / step)) + 1)]
    f = Fetched(t0, t1, step, grid)
    rng = lambda q: prom.query_range(q, t0, t1, step)  # noqa: E731
    # the GPUs each Slurm job's processes held, and (src="alloc") those the prolog says it was allocated
    for m, pts in rng(f"max by (instance, gpu, slurm_job, user) (teye_gpu_process_info{{{n}}}) or label_replace("
                      f'max by (instance, gpu, slurm_job) (teye_gpu_allocation_info{{{n},slurm_job!=""}}), '
                      f'"src", "alloc", "", "")'):
        k = _key(m, "instance", "gpu", "slurm_job")
        if m.get("src") == "alloc":
            f.alloc[k] = pts
            continue
        f.procs[k] = pts
        f.proc_user[k] = m.get("user", "")
    for m, pts in rng(f"max by (instance, train_job, user, source, pid) (teye_job_info{{{n}}})"):
        k = _key(m, "instance", "train_job")
        f.jinfo_pid.setdefault(k, []).append((m.get("pid", ""), pts))
        # one series per source the job's phases came from (a job that switches sources has two)
        f.jinfo[k] = sorted(dict(f.jinfo.get(k, []) + list(pts)).items()) if k in f.jinfo else pts
        f.jinfo_user[k] = m.get("user", "")
        if pts and pts[-1][0] >= f.jinfo_source.get(k, (-1.0, ""))[0]:
            f.jinfo_source[k] = (pts[-1][0], m.get("source") or "client")
    gpu_names = "teye_gpu_(busy_seconds_total|sampled_seconds_total|energy_joules_total|idle_gap_seconds_count" \
                "|idle_gap_seconds_sum)"
    for m, pts in rng(f'{{__name__=~"{gpu_names}",{n}}}'):
        f.gpu[_key(m, "__name__", "instance", "gpu")] = pts
    for m, pts in rng(f"max by (instance, gpu) (max_over_time(teye_gpu_memory_used_bytes{{{n}}}[{_dur(step)}]))"):
        f.gmem[_key(m, "instance", "gpu")] = pts
    job_names = "teye_job_(phase_seconds_total|gpu_idle_seconds_total|steps_total|samples_total|step_seconds_bucket" \
                "|step_seconds_sum|step_seconds_count|processes|rank_phase_seconds_total|rank_step_seconds_total" \
                "|rank_steps_total|start_time_seconds|running|last_message_age_seconds|memory_bytes|cpu_seconds_total" \
                "|cpus)"
    # the run's start time (one value per run, docs/report.md "Runs") and how often it changed over the whole
    # range, sample by sample (evaluated once: @ end()): more changes than the grid shows are runs too short for
    # the grid.  In the same query: the number of queries stays fixed
    for m, pts in rng(f'{{__name__=~"{job_names}",{n}}} or label_replace(changes({START_METRIC}{{{n}}}'
                      f'[{_dur(t1 - t0 + step)}] @ end()), "__name__", "{START_CHANGES}", "", "")'):
        if m.get("__name__") == "teye_job_memory_bytes":   # (issue 45) the creep: agent/report/figures.py
            if m.get("kind") != "device_peak":
                f.memory[_key(m, "instance", "train_job", "kind")] = pts
        elif m.get("__name__") == START_METRIC:
            f.starts[_key(m, "instance", "train_job")] = pts
        elif m.get("__name__") == START_CHANGES:
            f.start_changes[_key(m, "instance", "train_job")] = pts
        elif "rank" in m:   # a rank of a data-parallel job (the same query: the number of queries stays fixed)
            f.rank[_key(m, "__name__", "instance", "train_job", "rank", "phase")] = pts
        else:
            f.job[_key(m, "__name__", "instance", "train_job", "phase", "gpu", "le")] = pts
    # the verdicts, and (the same query: the number of queries stays fixed) what the job is configured with
    # and (issue 46) the traces taken on request
    for m, pts in rng(f'{{__name__=~"teye_job_(bottleneck|input_cause|config_info|trace_info)",{n}}} == 1'):
        if m.get("__name__") == "teye_job_config_info":
            f.verdict[("teye_job_config_info", m.get("instance", ""), m.get("train_job", ""),
                       f'{m.get("key", "")}={m.get("value", "")}')] = pts
            continue
        if m.get("__name__") == "teye_job_trace_info":
            f.verdict[_key(m, "__name__", "instance", "train_job", "id")] = pts
            continue
        f.verdict[_key(m, "__name__", "instance", "train_job", "kind" if "kind" in m else "cause")] = pts
    host = " or ".join(f'label_replace({e}, "q", "{q}", "", "")' for q, e in (
        # the host's CPU and memory: teye's, or node_exporter's where teye leaves the host to it (agent/hostseries.py)
        ("cpu_busy", either(f'sum by (instance) (teye_cpu_seconds_total{{mode!~"idle|iowait|steal",{n}}})')),
        ("cpus", either(f"max by (instance) (teye_cpus{{{n}}})")),
        ("mem_peak", either(f"max by (instance) (max_over_time(teye_memory_used_bytes{{{n}}}[{_dur(step)}]))")),
        ("mem_total", either(f"max by (instance) (teye_memory_total_bytes{{{n}}})")),
        ("cycles", f"sum by (instance) (teye_cpu_cycles_total{{{n}}})"),
        ("instructions", f"sum by (instance) (teye_cpu_instructions_total{{{n}}})"),
        ("dram_bytes", f'sum by (instance) ({{__name__=~"teye_memory_(read|written|transferred)_bytes_total",'
                       f'{n}}})'),
        # each Slurm job's own cgroup (the jobs collector)
        ("job_cpu", f"sum by (instance, slurm_job) (teye_slurm_job_cpu_seconds_total{{{n}}})"),
        ("job_cpus", f"max by (instance, slurm_job) (teye_slurm_job_cpus{{{n}}})"),
        ("job_mem_peak", f"max by (instance, slurm_job) (max_over_time(teye_slurm_job_memory_peak_bytes{{{n}}}"
                         f"[{_dur(step)}]))"),
        ("job_mem_limit", f"max by (instance, slurm_job) (teye_slurm_job_memory_limit_bytes{{{n}}})"),
        ("job_read", f"sum by (instance, slurm_job) (teye_slurm_job_read_bytes_total{{{n}}})"),
        ("job_written", f"sum by (instance, slurm_job) (teye_slurm_job_written_bytes_total{{{n}}})"),
    ))
    for m, pts in rng(host):
        if m.get("q", "").startswith("job_"):
            f.jobcg[_key(m, "q", "instance", "slurm_job")] = pts
        else:
            f.host[_key(m, "q", "instance")] = pts
    for m, pts in rng(f"max by (instance) (up{{{n}}})"):
        f.up[m.get("instance", "")] = pts
    return f


def _skew(prom: Prometheus, nodes: Sequence[str], now: float) -> Dict[str, Tuple[float, float]]:
    """Nodes whose samples are stamped ahead of Prometheus' clock (by more than SKEW_TOLERANCE_S).

    Samples carry the time of whoever stamped them: the scraping Prometheus, an edge Prometheus in
    agent mode (the central tier), or an exporter's own timestamps.  Evaluated 5 minutes after
    Prometheus' "now", an instant selector sees only samples stamped after now: the nodes that are
    ahead.  A node behind cannot be told from one whose data arrive late, and a node that no longer
    reports cannot be checked: both are said in docs/report.md."""
    res = prom.query(f"max by (instance) (timestamp(teye_gpu_sampled_seconds_total{{instance=~{_lbl(nodes)}}})) "
                     f"- {now:.3f}", at=now + 300)
    return {m.get("instance", ""): (v, v) for m, _, v in res if v > SKEW_TOLERANCE_S}
