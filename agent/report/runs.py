"""Which stretch of which series a report counts: runs, spans, and the training jobs linked to a Slurm job.

A training job name used again after its processes exited is a new run (``teye_job_start_time_seconds``
changes; its counters restart): a report describes one run, the latest in range (docs/report.md "Runs").

A Slurm job is linked to the training jobs that ran on its GPUs (``teye_job_gpu_idle_seconds_total``
on the same node and GPU, overlapping in time) or whose name carries its job id.
"""
from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from . import series as S
from .fetch import Fetched
from .model import _iso


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
