"""Job reports from Prometheus: a fixed set of batched queries, then pure arithmetic per job.

Two rounds, whatever the number of jobs:

1. identity, over [since, until] at a coarse step: which GPUs each Slurm job's processes held
   (``teye_gpu_process_info{slurm_job}``) and where each training job reported
   (``teye_job_info{train_job}``), with ``count_over_time`` so that no short job falls between
   steps and the scrape interval can be read off;
2. everything else, over the union of the jobs' windows, on the nodes they ran on, at a step of
   about one scrape interval: GPU counters, GPU memory, training-job counters, verdicts, host CPU
   and memory, ``up``.  Each query aggregates or selects by name regex, so the number of queries
   is constant; the per-job work (counter differences over each job's own window and GPUs) is
   done here.

A Slurm job is linked to the training jobs that ran on its GPUs (``teye_job_gpu_idle_seconds_total``
on the same node and GPU, overlapping in time) or whose name carries its job id.

A training job name used again after its processes exited is a new run (``teye_job_start_time_seconds``
changes; its counters restart): a report describes one run, the latest in range (docs/report.md "Runs").
"""
from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..hostseries import either
from ..phases.protocol import SOURCES
from ..phases.verdict import CAUSES, KINDS, recommendation
from . import series as S
from .prom import Prometheus

# exit statuses for the jobs' conditions, most severe first (docs/report.md)
EXIT_UNKNOWN = 7
EXIT_NODE_VANISHED = 8
EXIT_CLOCK_SKEW = 9
EXIT_COUNTER_RESET = 10
EXIT_RUNNING = 11
EXIT_NO_PHASES = 12

PHASES = ("data_wait", "compute", "host", "communication", "checkpoint", "eval", "other")
DEFAULT_LOOKBACK_S = 7 * 86400
START_METRIC = "teye_job_start_time_seconds"   # a run's start; a new value: a new run (docs/report.md "Runs")
START_CHANGES = "teye_report_start_time_changes"   # changes() of it over the range (a name of the report's own)
MAX_POINTS = 10000          # Prometheus refuses more than 11,000 points per series
SKEW_TOLERANCE_S = 1.0


@dataclass
class Request:
    slurm_jobs: Sequence[str] = ()
    train_jobs: Sequence[str] = ()
    user: Optional[str] = None
    since: Optional[float] = None
    until: Optional[float] = None
    step: Optional[float] = None          # round-2 step; default: about one scrape interval
    cpus: Optional[int] = None             # cores allocated per job (Slurm's NumCPUs), for CPU efficiency
    mem_bytes: Optional[float] = None      # memory requested per job, for the "requested far above use" note
    grafana_url: Optional[str] = None


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
class Condition:
    code: int
    kind: str
    message: str

    def as_dict(self):
        return {"code": self.code, "kind": self.kind, "message": self.message}


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
                "|rank_steps_total|start_time_seconds)"
    # the run's start time (one value per run, docs/report.md "Runs") and how often it changed over the whole
    # range, sample by sample (evaluated once: @ end()): more changes than the grid shows are runs too short for
    # the grid.  In the same query: the number of queries stays fixed
    for m, pts in rng(f'{{__name__=~"{job_names}",{n}}} or label_replace(changes({START_METRIC}{{{n}}}'
                      f'[{_dur(t1 - t0 + step)}] @ end()), "__name__", "{START_CHANGES}", "", "")'):
        if m.get("__name__") == START_METRIC:
            f.starts[_key(m, "instance", "train_job")] = pts
        elif m.get("__name__") == START_CHANGES:
            f.start_changes[_key(m, "instance", "train_job")] = pts
        elif "rank" in m:   # a rank of a data-parallel job (the same query: the number of queries stays fixed)
            f.rank[_key(m, "__name__", "instance", "train_job", "rank", "phase")] = pts
        else:
            f.job[_key(m, "__name__", "instance", "train_job", "phase", "gpu", "le")] = pts
    for m, pts in rng(f'{{__name__=~"teye_job_(bottleneck|input_cause)",{n}}} == 1'):
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


# ------------------------------------------------------------------------------ per job

class _Acc:
    """Counter increases summed over several series, with the resets seen."""

    def __init__(self):
        self.total = 0.0
        self.seen = False
        self.resets = 0

    def add(self, pts, a, b, from_zero=True):
        v, r = S.increase(pts, a, b, from_zero)
        if v is not None:
            self.total += v
            self.seen = True
            self.resets += r

    @property
    def value(self):
        return self.total if self.seen else None


def _ratio(a, b):
    return None if a is None or not b else a / b


def _r(x, nd=6):
    return None if x is None else round(x, nd)


@dataclass
class Run:
    """One run of a training job on one node: a stretch of the grid where ``teye_job_start_time_seconds``
    holds one value (docs/report.md "Runs").  ``cut``: a run of the same series came before it, so its
    counters count from zero at ``first`` (the drop there is the run boundary, not an agent restart)."""
    start: float                 # the gauge's value: when the run began (its first message), node clock
    first: float                 # first grid time that shows it
    last: float                  # last grid time that shows it
    cut: bool = False
    hi: float = math.inf         # points after this grid time belong to a later run
    backwards: bool = False      # it began before the run it follows (the node's clock stepped back?)
    prev_start: Optional[float] = None

    def points(self, pts):
        """The points of one of the job's series that belong to this run."""
        if not self.cut and self.hi == math.inf:
            return pts
        return S.window(pts, self.first if self.cut else -math.inf, self.hi)


@dataclass
class Span:
    """What the report counts of a training job on one node: the window (a, b) it shows, the grid time
    its counters are differenced from (``lo``), and the run it is (None: no start-time gauge, an older
    agent: the whole series, as before runs existed)."""
    a: float
    b: float
    lo: float
    run: Optional[Run] = None

    def cut(self, pts):
        """The points of one of the job's series that belong to this run (all of them without runs)."""
        return pts if self.run is None else self.run.points(pts)


def _runs(f: Fetched, inst: str, name: str) -> List[Run]:
    """The runs of a training job on a node, in the order the grid shows them ([] without the gauge)."""
    runs: List[Run] = []
    seen = set()      # the start values of the current run (more than one across an agent restart)
    for t, v in f.starts.get((inst, name), []):
        if runs and (round(v, 3) in seen or _same_process(f, inst, name, runs[-1].last, t)):
            seen.add(round(v, 3))     # an agent restarted under a running job: the same run, its counters reset
            runs[-1].last = t
            continue
        seen = {round(v, 3)}
        if runs:
            runs[-1].hi = runs[-1].last
        runs.append(Run(v, t, t, cut=bool(runs),
                        backwards=bool(runs) and v < runs[-1].start,
                        prev_start=runs[-1].start if runs else None))
    return runs


def _same_process(f: Fetched, inst: str, name: str, before: float, after: float) -> bool:
    """Whether the job's first process (teye_job_info{pid}) is the same on both sides of a new start time:
    then the agent restarted (it lost the job's state, so its next message began a "run") while the job
    ran on; a new run has new processes."""
    def newest(lo, hi):   # the pid of the series begun last among those seen in [lo, hi]
        got = [(pts[0][0], pid) for pid, pts in f.jinfo_pid.get((inst, name), []) if pid and S.window(pts, lo, hi)]
        return max(got)[1] if got else None
    last, first = newest(-math.inf, before), newest(after, after + f.step)
    return last is not None and last == first


def _span(f: Fetched, inst: str, name: str, info, run: Optional[Run]) -> Optional[Span]:
    """The job's activity on a node within one run (or the whole series without runs): the span in which its
    phase or step counters moved (a job that reports steps only has no phase counters: its steps time it);
    with a run, the span within that run's points."""
    first = last = None
    t_from = f.t0
    if run is not None and run.cut:
        t_from = run.first - f.step      # its counters start at `first`, from zero
    for metric, _, _, _, cp in f.job_by.get((inst, name), []):
        if metric not in ("teye_job_phase_seconds_total", "teye_job_steps_total"):
            continue
        if run is not None:
            cp = run.points(cp)
        a, b = S.first_last_change(cp, t_from, f.t1)
        if a is not None:
            first = a if first is None else min(first, a)
            last = b if last is None else max(last, b)
    if first is None:
        pts = info if run is None else S.window(info, run.first, run.hi)
        first, last = S.present(pts) if pts else (run.first, run.last) if run else (None, None)
        if first is None:
            return None
    # timed as before runs existed: from the first scrape at which its counters moved (its first message, the
    # gauge's value, can be long before its first step: imports, model building), which with a run is a point
    # of that run only
    return Span(first, last, first - f.step, run)


def _node_spans(f: Fetched, inst: str, name: str, info) -> List[Span]:
    runs = _runs(f, inst, name)
    spans = [_span(f, inst, name, info, r) for r in runs] if runs else [_span(f, inst, name, info, None)]
    return [sp for sp in spans if sp is not None]


def _earlier(sp: Span, inst: str) -> dict:
    """An earlier run on one node, with the --until that reports it alone: its last grid time, before the
    next run shows."""
    return {"node": inst, "start": round(sp.a, 3), "end": round(sp.b, 3),
            "run_start": round(sp.run.start, 3) if sp.run else None,
            "until": round(max(sp.b, sp.run.last if sp.run else sp.b), 3)}


def _train_job_windows(f: Fetched, name: str, before: Optional[float] = None):
    """The run of the training job to report on each node: (instance -> Span, earlier runs, remarks).

    On each node, its latest run (the last the grid shows; with ``before``, the last that began by then);
    a node whose chosen run ended before the newest one began ran an earlier run only.  Without the
    start-time gauge (an older agent) a node's whole series is one span, as before runs existed."""
    chosen: Dict[str, Span] = {}
    earlier: List[dict] = []
    remarks: List[Tuple[str, str]] = []     # (kind, sentence)
    for inst, info in f.jinfo_by.get(name, []):
        if not info:
            continue
        spans = _node_spans(f, inst, name, info)
        if before is not None:
            spans = [sp for sp in spans if sp.run is None or sp.a <= before]
        if not spans:
            continue
        chosen[inst] = spans[-1]
        for sp in spans[:-1]:
            earlier.append(_earlier(sp, inst))
        runs = [sp.run for sp in spans if sp.run is not None]
        for r in runs:
            if r.backwards:
                remarks.append(("start_time_backwards",
                                f"on {inst} the run of {name} seen from {_iso(r.first)} says it began at "
                                f"{r.start:.3f}, before the run it follows ({r.prev_start:.3f}): the node's clock "
                                f"stepped back? Runs are taken in the order Prometheus saw them"))
        ch = f.start_changes.get((inst, name))
        vals = [round(v, 3) for _, v in f.starts.get((inst, name), [])]
        shown = sum(1 for x, y in zip(vals, vals[1:]) if x != y)     # the changes the grid shows
        hidden = int(round(ch[-1][1])) - shown if ch and vals else 0
        if hidden > 0:
            remarks.append(("note", f"{hidden} run(s) of {name} on {inst} began and ended within one step of the "
                                    f"report ({f.step:g} s) and are not reported: give a smaller --step to see them"))
    newest = [sp.a for sp in chosen.values() if sp.run is not None]
    if newest:
        for inst, sp in list(chosen.items()):
            if sp.b < max(newest):          # that node ran only an earlier run of the name
                earlier.append(_earlier(sp, inst))
                del chosen[inst]
    # an earlier run's --until stops before the reported run shows on any node
    firsts = [sp.run.first for sp in chosen.values() if sp.run is not None]
    for e in earlier:
        later = [t - f.step for t in firsts if t > e["end"]]
        if later:
            e["until"] = round(max(e["end"], min(e["until"], min(later))), 3)
    return chosen, earlier, remarks


def _merge_runs(entries: List[dict]) -> List[dict]:
    """Earlier runs on several nodes, one entry per run: entries whose spans overlap are one run."""
    out: List[dict] = []
    for e in sorted(entries, key=lambda e: (e["start"], e["end"])):
        if out and e["start"] <= out[-1]["end"]:
            o = out[-1]
            o["end"], o["until"] = max(o["end"], e["end"]), max(o["until"], e["until"])
            o["nodes"] = sorted(set(o["nodes"]) | {e["node"]})
            if e["run_start"] is not None:
                o["run_start"] = min(x for x in (o["run_start"], e["run_start"]) if x is not None)
        else:
            out.append({"start": e["start"], "end": e["end"], "until": e["until"], "nodes": [e["node"]],
                        "run_start": e["run_start"]})
    for o in out:
        o["start_time"], o["end_time"] = _iso(o["start"]), _iso(o["end"])
    return out


def _train_job_report(f: Fetched, name: str, spans: Dict[str, Span]) -> dict:
    step = f.step
    windows = {inst: (sp.a, sp.b) for inst, sp in spans.items()}
    phase_s: Dict[str, _Acc] = defaultdict(_Acc)
    idle_s: Dict[str, _Acc] = defaultdict(_Acc)
    steps, samples, step_sum, step_count = _Acc(), _Acc(), _Acc(), _Acc()
    buckets: Dict[float, _Acc] = defaultdict(_Acc)
    per_node: Dict[str, dict] = {}
    gpus = set()
    for inst, sp in spans.items():
        a, b, lo = sp.a, sp.b, sp.lo
        n_steps, n_samples, n_sum, n_count = _Acc(), _Acc(), _Acc(), _Acc()
        nb: Dict[float, _Acc] = defaultdict(_Acc)
        n_phase = _Acc()
        procs = 1.0
        for metric, phase, gpu, le, pts in f.job_by.get((inst, name), []):
            pts = sp.cut(pts)     # this run's points only: the drop at a run boundary is no reset
            if metric == "teye_job_phase_seconds_total":
                phase_s[phase].add(pts, lo, b)
                n_phase.add(pts, lo, b)
            elif metric == "teye_job_gpu_idle_seconds_total":
                idle_s[phase].add(pts, lo, b)
                gpus.add((inst, gpu))
            elif metric == "teye_job_steps_total":
                n_steps.add(pts, lo, b)
            elif metric == "teye_job_samples_total":
                n_samples.add(pts, lo, b)
            elif metric == "teye_job_step_seconds_sum":
                n_sum.add(pts, lo, b)
            elif metric == "teye_job_step_seconds_count":
                n_count.add(pts, lo, b)
            elif metric == "teye_job_step_seconds_bucket":
                nb[float(le)].add(pts, lo, b)
            elif metric == "teye_job_processes":
                procs = max([v for _, v in S.window(pts, a, b)] or [1.0])
        for acc, n_acc in ((steps, n_steps), (samples, n_samples), (step_sum, n_sum), (step_count, n_count)):
            if n_acc.seen:
                acc.total += n_acc.total
                acc.seen = True
                acc.resets += n_acc.resets
        for le, acc in nb.items():
            buckets[le].add([], 0, 0)
            if acc.seen:
                buckets[le].total += acc.total
                buckets[le].seen = True
        hist = [(le, acc.total) for le, acc in nb.items() if acc.seen]
        thr = _ratio(n_samples.value, n_sum.value)
        per_node[inst] = {"node": inst, "start": a, "end": b, "steps": n_steps.value, "samples": n_samples.value,
                          "step_seconds_mean": _mean_step(n_sum, n_count),
                          "step_seconds_p50_bounds": _bounds(0.5, hist),
                          "samples_per_second": _r(thr * procs if thr is not None else None, 3),
                          "processes": int(procs),
                          # the time it stepped there, at the least: its steps' wall time, else its phase time
                          # per process (what a run shorter than the grid's step is timed by)
                          "active_seconds": _r(n_sum.value if n_sum.value else
                                               (n_phase.value / procs if n_phase.value else None))}
    phases = {p: acc.value for p, acc in phase_s.items() if acc.value is not None}
    total = sum(phases.values())
    idle = {p: acc.value for p, acc in idle_s.items() if acc.value is not None}
    hist = [(le, acc.total) for le, acc in buckets.items() if acc.seen]
    # verdict over the job's life: one vote per node and grid step while it was active
    votes: Dict[str, int] = defaultdict(int)
    causes: Dict[str, int] = defaultdict(int)
    last_kind: Dict[str, Tuple[float, str]] = {}
    last_cause: Dict[str, Tuple[float, str]] = {}
    for inst, metric, what, pts in ((i, m, w, p) for i in windows for m, w, p in f.verdict_by.get((i, name), [])):
        a, b = windows[inst]
        for t, _ in S.window(spans[inst].cut(pts), a, b):
            if metric == "teye_job_bottleneck":
                votes[what] += 1
                if t >= last_kind.get(inst, (-1.0, ""))[0]:
                    last_kind[inst] = (t, what)
            else:
                causes[what] += 1
                if t >= last_cause.get(inst, (-1.0, ""))[0]:
                    last_cause[inst] = (t, what)
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
    ratio = _r(_ratio(phases.get("data_wait", 0.0), total)) if total else None
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
        "per_node": [per_node[i] for i in sorted(per_node)],
        # when the reported run began on each node (teye_job_start_time_seconds); null from an older agent
        "run_start": {i: (round(sp.run.start, 3) if sp.run else None) for i, sp in sorted(spans.items())},
        "_resets": resets,
    }


def _mean_step(total: _Acc, count: _Acc) -> Optional[float]:
    """Mean step time from the histogram's own _sum and _count increases (exact: no rounding)."""
    return total.value / count.value if total.value is not None and count.value else None


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
    return {"node": inst, "cpu_seconds": _r(accs["job_cpu"].value, 3), "cpus": most("job_cpus"),
            "memory_peak_bytes": most("job_mem_peak"), "memory_limit_bytes": most("job_mem_limit"),
            "read_bytes": accs["job_read"].value, "written_bytes": accs["job_written"].value,
            "_resets": sum(x.resets for x in accs.values())}


def _vanished(f: Fetched, inst: str, a: float, b: float) -> List[Tuple[float, float]]:
    pts = f.up.get(inst, [])
    have = [t for t, v in pts if v >= 1]
    return S.gaps(f.grid, have, a, b, f.step)


def _notes(job: dict, req: Request) -> List[str]:
    notes = []
    gpus = job["gpus"]
    busy = [g for g in gpus if (g["busy_ratio"] or 0) >= 0.05]
    never = [g for g in gpus if g["busy_ratio"] is not None and g["busy_ratio"] < 0.01]
    if gpus and not busy:
        notes.append(f"The job was allocated {len(gpus)} GPU(s) and none of them was ever busy: request no GPU "
                     f"(or check that the code runs on the GPU: device placement, CUDA_VISIBLE_DEVICES).")
    elif len(gpus) > 1 and len(busy) == 1:
        g = busy[0]
        idle = f"{len(never)} of {len(gpus)} allocated GPUs never busy: " if never else ""
        notes.append(f"{idle}Only one GPU of {len(gpus)} did work (GPU {g['gpu']} on {g['node']}): the code does "
                     f"not use the others (data or model parallelism), so request 1 GPU or make it multi-GPU.")
    elif never:
        names = ", ".join(f"{g['node']}/GPU {g['gpu']}" for g in never)
        notes.append(f"{len(never)} of {len(gpus)} allocated GPUs never busy ({names}).")
    r = job.get("gpu_busy_ratio")
    if r is not None and busy and r < 0.5:
        notes.append(f"GPU busy {100 * r:.0f} % of the job's time: the GPUs wait more than they work "
                     f"(see the verdict and idle time by phase below).")
    cpu = job.get("cpu") or {}
    whole = " (whole-node figure: no cgroup of the job was seen, so other jobs on its nodes count too)"
    if cpu.get("efficiency") is not None and cpu["efficiency"] < 0.5 and (cpu.get("allocated_cores") or 0) > 1:
        notes.append(f"CPU cores mostly idle: {100 * cpu['efficiency']:.0f} % of {cpu['allocated_cores']:g} allocated "
                     f"cores used; request fewer (or use them for the input pipeline)."
                     + (whole if cpu.get("source") == "node" else ""))
    mem = job.get("memory") or {}
    if mem.get("requested_bytes") and mem.get("peak_bytes") and mem["peak_bytes"] < 0.25 * mem["requested_bytes"]:
        notes.append(f"Memory requested far above use: peak {mem['peak_bytes'] / 2**30:.1f} GiB of "
                     f"{mem['requested_bytes'] / 2**30:.1f} GiB requested; ask for less so more jobs fit."
                     + (whole if mem.get("source") == "node" else ""))
    if job.get("verdict"):
        kind = job["verdict"]
        # the advice in the job's own framework (verdict.recommendation), as `teye profile` gives it
        text = recommendation(kind, job.get("input_cause") if kind == "input" else None, job.get("source") or "client")
        notes.append(f"Verdict {kind}" + (f" (cause {job['input_cause']})" if kind == "input" and
                                          job.get("input_cause") else "") + f": {text}")
    return notes


def _grafana(req: Request, job: dict) -> Optional[str]:
    if not req.grafana_url:
        return None
    base = req.grafana_url.rstrip("/")
    parts = [f"from={int(job['start'] * 1000)}", f"to={int(job['end'] * 1000) if job['state'] != 'running' else 'now'}"]
    for n in job["nodes"]:
        parts.append(f"var-node={n}")
    tj = job["train_jobs"]
    parts.append(f"var-train_job={tj[0]}" if len(tj) == 1 else "var-train_job=All")
    return f"{base}/d/teye-job/teye-job?" + "&".join(parts)


def _assemble(f: Fetched, req: Request, now: float, slurm: Optional[str], tjs: List[str],
              gpu_windows: Dict[Tuple[str, str], Tuple[float, float]], user: str, until_given: bool,
              cg_windows: Optional[Dict[str, Tuple[float, float]]] = None) -> dict:
    conds: List[Condition] = []
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
    if not gpu_windows:   # a training job not under Slurm: the GPUs it was credited idle time on
        for tr in tj_reports:
            for g in tr["gpus"]:
                a, b = tr["start"], tr["end"]
                old = gpu_windows.get((g["node"], g["gpu"]))
                gpu_windows[(g["node"], g["gpu"])] = (min(a, old[0]), max(b, old[1])) if old else (a, b)
    cg_windows = cg_windows or {}
    spans = list(gpu_windows.values()) + [(t["start"], t["end"]) for t in tj_reports] + list(cg_windows.values())
    starts, ends = [a for a, _ in spans], [b for _, b in spans]
    start, end = min(starts), max(ends)
    nodes = sorted({i for i, _ in gpu_windows} | {n for t in tj_reports for n in t["nodes"]} | set(cg_windows))
    gpus = [_gpu_numbers(f, i, g, a, b) for (i, g), (a, b) in sorted(gpu_windows.items())]
    running = bool(f.grid) and end >= f.grid[-1] - 0.5 * f.step
    state = "running" if running else "finished"
    if running:
        conds.append(Condition(EXIT_RUNNING, "running",
                               f"still running at {_iso(end)}: the report covers the job so far"))
    # per node
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
        for x, y in gone:
            conds.append(Condition(EXIT_NODE_VANISHED, "node_vanished",
                                   f"node {inst} did not answer from {_iso(x)} to {_iso(y)} ({y - x:.0f} s): its "
                                   f"numbers miss that time"))
        off = f.skew.get(inst)
        if off is not None:
            conds.append(Condition(EXIT_CLOCK_SKEW, "clock_skew",
                                   f"node {inst}'s samples are stamped {off[0]:.1f} s ahead of Prometheus' clock: "
                                   f"its times do not line up with the other nodes' (check NTP/chrony there)"))
    slowest = None
    if len(per_node) > 1:
        with_steps = [p for p in per_node if p["step_seconds_mean"]]
        if with_steps:     # the longest mean step (exact), not a bucket
            slowest = max(with_steps, key=lambda p: p["step_seconds_mean"])["node"]
        else:
            cands = [p for p in per_node if p["gpu_busy_ratio"] is not None]
            slowest = min(cands, key=lambda p: p["gpu_busy_ratio"])["node"] if cands else None
    cg = {}
    for inst in nodes if slurm else ():
        x = _job_cgroup_numbers(f, inst, slurm, start, end)
        if x is not None:
            cg[inst] = x
            per_node[nodes.index(inst)]["job_cpu_seconds"] = x["cpu_seconds"]
            per_node[nodes.index(inst)]["job_memory_peak_bytes"] = x["memory_peak_bytes"]
    resets = sum(g["_resets"] for g in gpus) + sum(t["_resets"] for t in tj_reports) + \
        sum(h["_resets"] for h in hosts.values()) + sum(x["_resets"] for x in cg.values())
    if resets:
        conds.append(Condition(EXIT_COUNTER_RESET, "counter_reset",
                               f"{resets} counter reset(s) during the job (an agent restarted): increases are summed "
                               f"across the restart; what happened between the last scrape before it and the "
                               f"restart is lost"))
    busy = [g["busy_seconds"] for g in gpus if g["busy_seconds"] is not None]
    sampled = [g["sampled_seconds"] for g in gpus if g["sampled_seconds"] is not None]
    energy = [g["energy_joules"] for g in gpus if g["energy_joules"] is not None]
    gaps_n = [g["idle_gaps"] for g in gpus if g["idle_gaps"] is not None]
    gaps_s = [g["idle_gap_seconds"] for g in gpus if g["idle_gap_seconds"] is not None]
    mem_peaks = [g["memory_peak_bytes"] for g in gpus if g["memory_peak_bytes"] is not None]
    # a run's length: from the first to the last grid point at which its counters moved, and at least the time
    # it stepped (a run inside one scrape interval moved at one point only: 0 s on the grid)
    active = max([t["active_seconds"] or 0.0 for t in tj_reports] or [0.0])
    seen = end - start
    run = max(seen, active)
    short = bool(tj_reports) and seen < f.step
    # training-job side, pooled over the linked training jobs
    job = {
        "slurm_job": slurm, "train_jobs": [t["train_job"] for t in tj_reports], "user": user,
        "state": state, "nodes": nodes, "start": round(start, 3), "end": round(end, 3),
        "start_time": _iso(start), "end_time": _iso(end), "run_seconds": round(run, 3), "short_run": short,
        "gpus": [{k: v for k, v in g.items() if not k.startswith("_")} for g in gpus],
        "gpu_busy_ratio": _r(_ratio(sum(busy), sum(sampled))) if sampled else None,
        "gpu_memory_peak_bytes": max(mem_peaks) if mem_peaks else None,
        "idle_gaps": {"count": sum(gaps_n), "seconds": _r(sum(gaps_s)),
                      "mean_seconds": _r(sum(gaps_s) / sum(gaps_n)) if sum(gaps_n) else None} if gaps_n else None,
        "gpu_energy_joules": _r(sum(energy), 3) if energy else None,
        "gpu_energy_kwh": _r(sum(energy) / 3.6e6, 6) if energy else None,
        "per_node": per_node, "slowest_node": slowest,
    }
    if tj_reports:
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
        total = sum(phases.values())
        nv = sum(votes.values())
        main = max(tj_reports, key=lambda t: t["steps"] or 0)
        stragglers = [t["straggler"] for t in tj_reports if t["straggler"]]
        straggler = max(stragglers, key=lambda s: s["own_wait_ratio"]) if stragglers else None
        job.update({
            "phase_seconds": {p: _r(v) for p, v in sorted(phases.items())},
            "gpu_idle_seconds_by_phase": ({p: _r(v) for p, v in sorted(idle.items())}
                                          if any(t["gpu_idle_seconds_by_phase"] is not None for t in tj_reports)
                                          else None),
            "input_bound_ratio": (straggler["input_bound_ratio"] if straggler is not None
                                  else _r(phases.get("data_wait", 0.0) / total) if total else None),
            "straggler": straggler,
            "scaling_efficiency": main["scaling_efficiency"],
            "verdict": main["verdict"], "verdict_shares": {k: round(v / nv, 4) for k, v in votes.items()} if nv else {},
            "input_cause": main["input_cause"], "input_cause_shares": main["input_cause_shares"],
            "source": main["source"], "source_text": main["source_text"],
            "steps": sum(t["steps"] or 0 for t in tj_reports),
            "samples": _sum([t["samples"] for t in tj_reports]),   # None: no job counted samples (steps only)
            "step_seconds_mean": main["step_seconds_mean"], "step_seconds_p50_bounds": main["step_seconds_p50_bounds"],
            "step_seconds_p95_bounds": main["step_seconds_p95_bounds"],
            "samples_per_second": main["samples_per_second"],
            "train_job_details": [{k: v for k, v in t.items() if not k.startswith("_")} for t in tj_reports],
            "phases_omitted": None,
        })
    else:
        job.update({"phase_seconds": None, "gpu_idle_seconds_by_phase": None, "input_bound_ratio": None,
                    "straggler": None, "scaling_efficiency": None,
                    "verdict": None, "verdict_shares": {}, "input_cause": None, "input_cause_shares": {},
                    "source": None, "source_text": None,
                    "steps": None, "samples": None, "step_seconds_mean": None, "step_seconds_p50_bounds": None,
                    "step_seconds_p95_bounds": None,
                    "samples_per_second": None, "train_job_details": [],
                    "phases_omitted": "no training job reported phases on this job's GPUs (not instrumented: "
                                      "see docs/phases.md, or run it under `teye run`)"})
        conds.append(Condition(EXIT_NO_PHASES, "no_phases", "no phases reported: phase, verdict and step sections "
                                                            "omitted"))
    cpu_busy = sum(h["cpu_busy_seconds"] or 0 for h in hosts.values())
    node_cpus = sum(h["cpus"] or 0 for h in hosts.values())
    span = seen + f.step    # CPU time is differenced from the scrape before the start, as every counter
    # the job's own cgroup where its nodes' agents saw it; the whole nodes' counters otherwise (marked so)
    job_cpu = _sum([x["cpu_seconds"] for x in cg.values()])
    cg_cpus = _sum([x["cpus"] for x in cg.values()])
    alloc = req.cpus or (cg_cpus if cg else None)
    used = job_cpu if cg else cpu_busy
    job["cpu"] = {"allocated_cores": alloc, "node_cpus": node_cpus or None,
                  "source": "job_cgroup" if cg else "node",
                  "job_seconds": job_cpu, "cgroup_cpus": cg_cpus,
                  "node_busy_seconds": _r(cpu_busy, 3),
                  "efficiency": _r(used / (alloc * span), 4) if alloc and span > 0 and used is not None else None,
                  "node_busy_ratio": _r(cpu_busy / (node_cpus * span), 4) if node_cpus and span > 0 else None,
                  "cycles_per_instruction": _r(_mean([h["cycles_per_instruction"] for h in hosts.values()]), 4),
                  "memory_bandwidth_bytes_per_second": _r(_sum([h["memory_bandwidth_bytes_per_second"]
                                                               for h in hosts.values()]), 1)}
    if cg:
        job["memory"] = {"peak_bytes": _sum([x["memory_peak_bytes"] for x in cg.values()]), "source": "job_cgroup",
                         "requested_bytes": req.mem_bytes or _sum([x["memory_limit_bytes"] for x in cg.values()]),
                         "limit_bytes": _sum([x["memory_limit_bytes"] for x in cg.values()]),
                         "node_peak_bytes": _sum([h["memory_peak_bytes"] for h in hosts.values()])}
        job["io"] = {"read_bytes": _sum([x["read_bytes"] for x in cg.values()]),
                     "written_bytes": _sum([x["written_bytes"] for x in cg.values()]), "source": "job_cgroup"}
    else:
        mem_peak = _sum([h["memory_peak_bytes"] for h in hosts.values()])
        job["memory"] = {"peak_bytes": mem_peak, "requested_bytes": req.mem_bytes, "source": "node",
                         "limit_bytes": None, "node_peak_bytes": mem_peak}
        job["io"] = None
    job["earlier_runs"] = earlier
    job["notes"] = _notes(job, req) + run_notes
    if short:
        job["notes"].append(f"Short run: its counters moved within one step of the report ({f.step:g} s, about one "
                            f"scrape interval), so its start and end are known to that step only; its run time "
                            f"({run:.1f} s) is the time it stepped ({active:.1f} s).")
    if earlier:
        name = job["train_jobs"][0] if len(job["train_jobs"]) == 1 else "NAME"
        runs = "; ".join(f"{e['start_time']} to {e['end_time']} ({', '.join(e['nodes'])}): --until {e['until']:.3f}"
                         for e in earlier)
        job["notes"].append(f"Earlier run(s) of the same name in the range, not counted here (this report is of the "
                            f"latest run only): {runs}. Report one with `teye report --train-job {name} --until "
                            f"<its until>`.")
    job["grafana_url"] = _grafana(req, job)
    conds.sort(key=lambda c: c.code)
    job["conditions"] = [c.as_dict() for c in conds]
    job["complete"] = not conds or all(c.code in (EXIT_NO_PHASES,) for c in conds)
    job["exit_status"] = conds[0].code if conds else 0
    return job


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _sum(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) if xs else None


def _iso(t: float) -> str:
    import datetime
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _link(f: Fetched, slurm_gpus: Dict[str, Dict[Tuple[str, str], Tuple[float, float]]],
          tj_spans: Optional[Dict[str, Dict[str, List[Tuple[float, float]]]]] = None) -> Dict[str, List[str]]:
    """slurm job -> training jobs that ran on its GPUs (same node and GPU, overlapping time) or carry its id.
    Any run of a training job links it (``tj_spans``: only these spans, per training job and node)."""
    # A training job's series outlive it (they expire phases.job_expiry_seconds after its last message), so
    # its time on a node is when its phase counters moved, not when its series existed.
    windows: Dict[str, Dict[str, Tuple[float, float]]] = {}

    def active(inst, tj):     # each run of it there (one span without the start-time gauge)
        if tj_spans is not None:
            return tj_spans.get(tj, {}).get(inst, [])
        if tj not in windows:
            windows[tj] = {i: [(sp.a, sp.b) for sp in _node_spans(f, i, tj, info)]
                           for i, info in f.jinfo_by.get(tj, []) if info}
        return windows[tj].get(inst, [])
    tj_gpus: Dict[Tuple[str, str], List[Tuple[str, float, float]]] = defaultdict(list)
    names_on: Dict[str, List[Tuple[str, float, float]]] = defaultdict(list)
    keys = f.job if tj_spans is None else [(m, i, tj, p, g, le) for tj, per in tj_spans.items() for i in per
                                            for m, p, g, le, _ in f.job_by.get((i, tj), [])]
    for k in keys:
        metric, inst, tj, _, gpu, _ = k
        if metric == "teye_job_gpu_idle_seconds_total" and f.job.get(k):
            tj_gpus[(inst, gpu)] += [(tj, a, b) for a, b in active(inst, tj)]
    for (inst, tj), pts in f.jinfo.items():
        if pts:
            names_on[inst] += [(tj, a, b) for a, b in active(inst, tj)]
    out: Dict[str, List[str]] = {}
    for sj, gw in slurm_gpus.items():
        found = set()
        idre = re.compile(rf"(^|\D){re.escape(sj)}(\D|$)")
        for (inst, gpu), (a, b) in gw.items():
            for tj, x, y in tj_gpus.get((inst, gpu), []):
                if x <= b + f.step and y >= a - f.step:
                    found.add(tj)
            for tj, x, y in names_on.get(inst, []):
                if idre.search(tj) and x <= b + f.step and y >= a - f.step:
                    found.add(tj)
        out[sj] = sorted(found)
    return out


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
        t0 = max(since, min(a for a, _ in spans) - s1)
        # one coarse step past the last sighting, so that a job that ended just before a coarse grid point
        # is not seen "present at the end" (running) on the fine grid
        t1 = min(until, max(b for _, b in spans) + s1)
        if not req.step:   # about one scrape interval: the spacing of up's samples before t1
            w = _dur(min(300.0, max(2.0, t1 - t0)))
            u = f"up{{instance=~{_lbl(nodes)}}}"
            res = prom.query(f"quantile(0.5, (max_over_time(timestamp({u})[{w}:1s]) - min_over_time(timestamp({u})"
                             f"[{w}:1s])) / ((count_over_time({u}[{w}]) > 1) - 1))", at=t1)
            scrape = res[0][2] if res and res[0][2] > 0 and not math.isnan(res[0][2]) else None
        step = req.step or _step_of(scrape)
        step = max(step, math.ceil((t1 - t0) / MAX_POINTS))
        t1 = _grid_end(t1, until, step, req.until is not None)
        t0 = t1 - math.ceil((t1 - max(since, t0 - step)) / step - 1e-9) * step
        f = _fetch(prom, nodes, t0, t1, step)
        f.index()
        f.skew = _skew(prom, nodes, now)
        # Slurm jobs: the GPUs their processes held, when
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
        wanted = list(req.slurm_jobs) if req.slurm_jobs else (sorted(found_slurm) if req.user else [])
        links = _link(f, {sj: slurm_gpus[sj] for sj in wanted if sj in slurm_gpus})
        until_given = req.until is not None
        for sj in wanted:
            if sj not in slurm_gpus and sj not in slurm_cg:
                continue
            doc["jobs"].append(_assemble(f, req, now, sj, links.get(sj, []), dict(slurm_gpus.get(sj, {})),
                                         slurm_user.get(sj, ""), until_given, dict(slurm_cg.get(sj, {}))))
        linked = {tj for v in links.values() for tj in v}
        tj_wanted = list(req.train_jobs) if req.train_jobs else \
            (sorted(found_train - linked) if req.user else [])
        for tj in tj_wanted:
            if tj not in found_train:
                continue
            users = [f.jinfo_user.get((i, tj)) for i, _ in f.jinfo_by.get(tj, []) if f.jinfo_user.get((i, tj))]
            # the Slurm job its reported run ran in, if any: its GPUs' holder
            spans = {i: [(sp.a, sp.b)] for i, sp in _train_job_windows(f, tj)[0].items()}
            own = _link(f, slurm_gpus, {tj: spans}) if slurm_gpus else {}
            owner = next((sj for sj in sorted(own) if tj in own[sj]), None)
            rep = _assemble(f, req, now, owner, [tj], dict(slurm_gpus[owner]) if owner else {},
                            users[0] if users else "", until_given, dict(slurm_cg.get(owner, {})) if owner else {})
            rep["train_jobs"] = sorted(set(rep["train_jobs"]) | {tj}) if rep["train_jobs"] else [tj]
            doc["jobs"].append(rep)
        doc["step_seconds"] = step
    doc["queries"] = prom.queries
    codes = [j["exit_status"] for j in doc["jobs"] if j["exit_status"]]
    if unknown:
        codes.append(EXIT_UNKNOWN)
    doc["exit_status"] = min(codes) if codes else 0
    return doc


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
