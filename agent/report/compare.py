"""`teye report --train-job NAME --compare [RUN]`: did the fix help?  The latest run of a training job beside an
earlier one (docs/report.md "Comparing runs").

Each run is reported by the report itself (``build``: the latest run, and the earlier run alone with the
``--until`` its ``earlier_runs`` entry gives), so a run's figures are exactly those its own report prints.  The
comparison adds one thing the report does not hold: each run's **spread**, the standard deviation of a
figure over the run's scrape intervals (the figure computed from each interval's counter increases alone,
e.g. that interval's step-time sum over its step count).  A change counts only where it exceeds the noise of
the two runs, ``NOISE_SIGMAS * sqrt(spread_a ** 2 + spread_b ** 2)``: what one scrape interval of each run
differs by in 95 % of cases, and at least the **floor**: ``MIN_RELATIVE_CHANGE`` of the earlier value for step time
and samples/s, ``MIN_SHARE_CHANGE`` for a phase's share.  The spread is within a run; what differs *between* runs
(a neighbour's load, the page cache, the timer's slack) moves a whole run and no interval shows it: two runs of
one unchanged loop, with spreads of 0.03 ms on 25.5 ms steps, differed by 0.07 ms (0.3 %) in CI.  Below the band
the change is printed as "no change beyond noise", never as "12 % faster"; without a spread (a run of fewer than
``MIN_INTERVALS`` intervals with steps) it is "not judged".
"""
from __future__ import annotations

import math
import re
import statistics
import sys
from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

from .model import EXIT_RUNNING, EXIT_UNKNOWN, PHASES, _iso, share_base

NOISE_SIGMAS = 2.0        # the noise band: this many standard deviations of the two runs' spreads together
MIN_INTERVALS = 3         # scrape intervals with steps a run needs for a spread
MIN_RELATIVE_CHANGE = 0.02  # the floor of the band for step time and samples/s: 2 % of the earlier value
MIN_SHARE_CHANGE = 0.01   # and for a phase's share: 1 point
EDGE_SHARE = 0.5          # an interval with less step time than this share of the run's median one is an edge
EXIT_WORLD_SIZE = 13      # the runs had different world sizes: compared per rank (docs/report.md "Exit status")
MAX_RUNS_BACK = 999       # --compare N: the Nth run before the latest; larger numbers are times

# the counters the per-interval figures are made of, in one range query per run
_SERIES = ("teye_job_step_seconds_sum", "teye_job_step_seconds_count", "teye_job_samples_total",
           "teye_job_phase_seconds_total", "teye_job_world_size", "teye_job_processes")


class CompareError(ValueError):
    """A comparison that cannot be made: a one-line reason and the exit status (docs/report.md)."""

    def __init__(self, message: str, exit_status: int):
        super().__init__(message)
        self.exit_status = exit_status


# ---------------------------------------------------------------------------------------------- pure arithmetic
def spread(values: Sequence[float]) -> Optional[float]:
    """Sample standard deviation of a figure over a run's scrape intervals; None under MIN_INTERVALS values."""
    xs = [v for v in values if v is not None and math.isfinite(v)]
    if len(xs) < MIN_INTERVALS:
        return None
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def judge(baseline: Optional[float], latest: Optional[float], s_base: Optional[float],
          s_latest: Optional[float], floor: float = 0.0) -> dict:
    """One numeric figure of two runs: the change, the noise band (the spreads' band, at least ``floor``) and
    whether the change exceeds it (``beyond_noise`` None: a figure missing in either run, or a run without a
    spread)."""
    out = {"previous": baseline, "latest": latest, "change": None, "relative_change": None,
           "previous_spread": s_base, "latest_spread": s_latest, "noise_floor": floor, "noise": None,
           "beyond_noise": None}
    if baseline is None or latest is None:
        return out
    d = latest - baseline
    out["change"] = d
    out["relative_change"] = d / baseline if baseline else None
    if s_base is not None and s_latest is not None:
        noise = max(NOISE_SIGMAS * math.sqrt(s_base ** 2 + s_latest ** 2), floor)
        out["noise"] = noise
        out["beyond_noise"] = abs(d) > noise
    return out


def intervals(points: Dict[Tuple[str, str], Dict[float, float]], a: float, b: float) -> Dict[str, List[float]]:
    """Per-interval figures of one run from its counters on the grid: ``points`` maps (metric, phase) to
    {grid time: value summed over the run's nodes}.  An interval counts when both ends lie in [a, b] (the
    point before ``a`` may still hold the previous run's counters), it made steps, no counter fell in it, and
    its step seconds are at least EDGE_SHARE of the run's median interval's: an interval that holds only the
    run's first or last few steps (a datagram's tail: a step whose data wait went in the datagram before) would
    read shares far from the run's and count as its noise.
    Returns figure -> values: ``step_seconds``, ``samples_per_step_second``, ``share.<phase>``."""
    times = sorted({t for pts in points.values() for t in pts if a - 1e-6 <= t <= b + 1e-6})
    out: Dict[str, List[float]] = defaultdict(list)
    phases = [k for k in points if k[0] == "teye_job_phase_seconds_total"]
    rows = []
    for t0, t1 in zip(times, times[1:]):
        def inc(key):
            pts = points.get(key, {})
            if t0 not in pts or t1 not in pts:
                return None
            return pts[t1] - pts[t0]
        n = inc(("teye_job_step_seconds_count", ""))
        s = inc(("teye_job_step_seconds_sum", ""))
        ph = {k[1]: inc(k) for k in phases}
        deltas = [x for x in [n, s, inc(("teye_job_samples_total", ""))] + list(ph.values()) if x is not None]
        if any(x < 0 for x in deltas):
            continue                 # a counter fell: an agent restart or the run boundary, not this run's time
        if n is None or n <= 0 or s is None:
            continue                 # no steps: a pause, or before the first / after the last step
        rows.append((n, s, inc(("teye_job_samples_total", "")), ph))
    if rows:
        typical = statistics.median(r[1] for r in rows)
        rows = [r for r in rows if r[1] >= EDGE_SHARE * typical]
    for n, s, smp, ph in rows:
        out["step_seconds"].append(s / n)
        if smp is not None and s > 0:
            out["samples_per_step_second"].append(smp / s)
        base = share_base({p: v for p, v in ph.items() if v is not None})
        if base > 0:
            for p, v in ph.items():
                if v is not None and p != "compile":
                    out[f"share.{p}"].append(v / base)
    return dict(out)


def _shares(job: dict) -> Dict[str, Optional[float]]:
    phases = job.get("phase_seconds") or {}
    base = share_base({p: v or 0.0 for p, v in phases.items()})
    return {p: (phases[p] or 0.0) / base if base else None for p in phases if p != "compile"}


def _per_rank(x: Optional[float], world: Optional[int]) -> Optional[float]:
    return None if x is None or not world else x / world


def figures(prev_job: dict, last_job: dict, prev_iv: Dict[str, List[float]], last_iv: Dict[str, List[float]],
            prev_world: Optional[int], last_world: Optional[int]) -> Dict[str, dict]:
    """The compared figures (stable keys), each judged against the two runs' spreads.  With different world
    sizes, samples/s is compared per rank (the job's samples/s over its world size)."""
    per_rank = prev_world is not None and last_world is not None and prev_world != last_world
    out: Dict[str, dict] = {}
    def floor(value):   # the band's floor for a figure whose earlier value is ``value``
        return MIN_RELATIVE_CHANGE * abs(value) if value is not None else 0.0
    st_prev = prev_job.get("step_seconds_mean")
    out["step_seconds_mean"] = judge(st_prev, last_job.get("step_seconds_mean"),
                                     spread(prev_iv.get("step_seconds", [])), spread(last_iv.get("step_seconds", [])),
                                     floor(st_prev))

    def rel_spread(iv, value):   # samples/s: the per-interval samples per step-second's relative spread
        xs = iv.get("samples_per_step_second", [])
        s = spread(xs)
        m = sum(xs) / len(xs) if xs else None
        return None if s is None or not m or value is None else s / m * value
    sp_prev, sp_last = prev_job.get("samples_per_second"), last_job.get("samples_per_second")
    if per_rank:
        sp_prev, sp_last = _per_rank(sp_prev, prev_world), _per_rank(sp_last, last_world)
    key = "samples_per_second_per_rank" if per_rank else "samples_per_second"
    out[key] = judge(sp_prev, sp_last, rel_spread(prev_iv, sp_prev), rel_spread(last_iv, sp_last), floor(sp_prev))
    sh_prev, sh_last = _shares(prev_job), _shares(last_job)
    for p in PHASES:
        if p == "compile" or (p not in sh_prev and p not in sh_last):
            continue
        out[f"share.{p}"] = judge(sh_prev.get(p, 0.0 if sh_prev else None), sh_last.get(p, 0.0 if sh_last else None),
                                  spread(prev_iv.get(f"share.{p}", [])), spread(last_iv.get(f"share.{p}", [])),
                                  MIN_SHARE_CHANGE)
    # the driver's view and memory: no per-interval spread here (each GPU's counters are not the job's
    # alone), so the change is given and not judged
    for key, get in (("gpu_idle_ratio", lambda j: None if j.get("gpu_busy_ratio") is None
                      else 1.0 - j["gpu_busy_ratio"]),
                     ("gpu_memory_peak_bytes", lambda j: j.get("gpu_memory_peak_bytes")),
                     ("memory_peak_bytes", lambda j: (j.get("memory") or {}).get("peak_bytes"))):
        out[key] = judge(get(prev_job), get(last_job), None, None)
    for key in ("verdict", "input_cause"):
        a, b = prev_job.get(key), last_job.get(key)
        out[key] = {"previous": a, "latest": b, "changed": a != b}
    return out


def pick_run(earlier: List[dict], which: str, step: float) -> dict:
    """The earlier run ``which`` names (docs/report.md "Comparing runs"): ``previous``; N, the Nth run before
    the latest; or a time (unix seconds, ISO, 2h ago) inside the run or within 1 s of its start time.
    CompareError (exit 7) when none is."""
    from .main import parse_time
    runs = sorted(earlier, key=lambda e: (e["start"], e["end"]))
    if not runs:
        raise CompareError("only one run in range: nothing to compare it with (widen --since?)", EXIT_UNKNOWN)
    listing = "; ".join(f"{len(runs) - i}: {e['start_time']}" for i, e in enumerate(runs))
    if which in ("previous", "prev"):
        return runs[-1]
    if re.fullmatch(r"\d{1,3}", which):
        n = int(which)
        if 1 <= n <= len(runs):
            return runs[-n]
        raise CompareError(f"no run {which} before the latest: {len(runs)} earlier run(s) in range ({listing})",
                           EXIT_UNKNOWN)
    try:
        t = parse_time(which)
    except ValueError as e:
        raise CompareError(f"--compare {which[:80]!r}: not previous, a number of runs back or a time ({e})",
                           EXIT_UNKNOWN) from None
    for e in reversed(runs):
        if e["start"] - step <= t <= e["end"] + step or \
                (e.get("run_start") is not None and abs(e["run_start"] - t) <= 1.0):
            return e
    raise CompareError(f"no earlier run at {_iso(t)}: the earlier runs in range began {listing}", EXIT_UNKNOWN)


# ------------------------------------------------------------------------------------------- Prometheus side
def _quoted(name: str) -> str:
    """A label value as a PromQL string literal."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _series_points(prom, name: str, a: float, b: float, step: float) -> Dict[Tuple[str, str], Dict[float, float]]:
    """The run's counters on the report's grid, summed over nodes: (metric, phase) -> {t: value}; the world
    size gauge as the largest value seen and the processes as their sum over nodes, per time."""
    sel = '{__name__=~"' + "|".join(_SERIES) + '",train_job=' + _quoted(name) + '}'
    lo = a - step
    out: Dict[Tuple[str, str], Dict[float, float]] = defaultdict(dict)
    for m, pts in prom.query_range(sel, lo, b, step):
        key = (m.get("__name__", ""), m.get("phase", "") if m.get("__name__") == "teye_job_phase_seconds_total" else "")
        d = out[key]
        for t, v in pts:
            t = round(t, 3)
            if key[0] == "teye_job_world_size":
                d[t] = max(d.get(t, v), v)
            else:
                d[t] = d.get(t, 0.0) + v
    return dict(out)


def _still_running(prom, name: str, at: float) -> bool:
    """Whether the job's agent said a process of its run still ran at ``at`` (teye_job_running, its newest sample
    then): the report's grid says so only when the counters moved at its last point, which a run between two
    scrapes at the time of the call misses."""
    sel = 'teye_job_running{train_job=' + _quoted(name) + '}'
    return any(v == 1 for _, _, v in prom.query(f"max({sel})", at=at))


def world_size(points, a: float, b: float) -> Optional[int]:
    """The run's world size: its launcher's (teye_job_world_size), else the processes reporting it summed over
    its nodes; the most seen over the run."""
    for key in (("teye_job_world_size", ""), ("teye_job_processes", "")):
        vals = [v for t, v in points.get(key, {}).items() if a - 1e-6 <= t <= b + 1e-6]
        if vals:
            return int(round(max(vals)))
    return None


def _run_info(job: dict, world: Optional[int], n_iv: int) -> dict:
    det = (job.get("train_job_details") or [{}])[0]
    starts = [v for v in (det.get("run_start") or {}).values() if v is not None]
    return {"start": job["start"], "end": job["end"], "start_time": job["start_time"], "end_time": job["end_time"],
            "run_start": min(starts) if starts else None, "state": job["state"],
            "steps": None if job.get("steps") is None else int(round(job["steps"])),
            "world_size": world, "scrape_intervals": n_iv, "input_bound_ratio": job.get("input_bound_ratio"),
            "exit_status": job["exit_status"], "conditions": job["conditions"]}


def compare(prom, req, name: str, which: str, latest_doc: dict) -> dict:
    """The comparison document (docs/report.md "Comparing runs") of the latest run of ``name`` (``latest_doc``,
    the report already built) and the earlier run ``which`` names.  CompareError: no comparison possible."""
    from dataclasses import replace
    from .build import build
    jobs = [j for j in latest_doc["jobs"] if name in j["train_jobs"]]
    if not jobs:
        raise CompareError(f"unknown job {name}: no series in Prometheus between {_iso(latest_doc['since'])} and "
                           f"{_iso(latest_doc['until'])}", EXIT_UNKNOWN)
    last_job = jobs[0]
    step = latest_doc.get("step_seconds") or 1.0
    e = pick_run(last_job.get("earlier_runs") or [], which, step)
    prev_doc = build(prom, replace(req, until=e["until"]))
    prev_jobs = [j for j in prev_doc["jobs"] if name in j["train_jobs"]]
    if not prev_jobs:
        raise CompareError(f"the earlier run of {name} that began {e['start_time']} has no series left in "
                           f"Prometheus (retention?)", EXIT_UNKNOWN)
    prev_job = prev_jobs[0]
    pstep = prev_doc.get("step_seconds") or step
    pts_l = _series_points(prom, name, last_job["start"], last_job["end"], step)
    pts_p = _series_points(prom, name, prev_job["start"], prev_job["end"], pstep)
    iv_l = intervals(pts_l, last_job["start"], last_job["end"])
    iv_p = intervals(pts_p, prev_job["start"], prev_job["end"])
    w_l = world_size(pts_l, last_job["start"], last_job["end"])
    w_p = world_size(pts_p, prev_job["start"], prev_job["end"])
    figs = figures(prev_job, last_job, iv_p, iv_l, w_p, w_l)
    conds = []
    if w_l is not None and w_p is not None and w_l != w_p:
        conds.append({"code": EXIT_WORLD_SIZE, "kind": "world_size_differs",
                      "message": f"the runs had different world sizes ({w_p} then {w_l}): samples/s is compared "
                                 f"per rank; step time and shares as they are"})
    if last_job["state"] != "running" and _still_running(prom, name, latest_doc["until"]):
        last_job = {**last_job, "state": "running"}
    if last_job["state"] == "running":
        conds.append({"code": EXIT_RUNNING, "kind": "running",
                      "message": f"the latest run is still running: compared so far (to {last_job['end_time']})"})
    codes = [c["code"] for c in conds] + [j["exit_status"] for j in (prev_job, last_job) if j["exit_status"]]
    return {"version": 1, "prometheus": latest_doc["prometheus"], "generated": latest_doc["generated"],
            "train_job": name, "step_seconds": step, "noise_sigmas": NOISE_SIGMAS, "min_intervals": MIN_INTERVALS,
            "min_relative_change": MIN_RELATIVE_CHANGE, "min_share_change": MIN_SHARE_CHANGE,
            "previous": _run_info(prev_job, w_p, len(iv_p.get("step_seconds", []))),
            "latest": _run_info(last_job, w_l, len(iv_l.get("step_seconds", []))),
            "figures": figs, "conditions": conds, "exit_status": min(codes) if codes else 0}


# ------------------------------------------------------------------------------------------------------- text
_LABELS = {"step_seconds_mean": "Step time (mean)", "samples_per_second": "Samples/s",
           "samples_per_second_per_rank": "Samples/s per rank", "gpu_idle_ratio": "GPU idle (driver)",
           "gpu_memory_peak_bytes": "GPU memory peak", "memory_peak_bytes": "Host memory peak",
           "verdict": "Verdict", "input_cause": "Input cause"}


def _fmt(key: str, x) -> str:
    from .render import _bytes, _step_ms
    if x is None:
        return "n/a"
    if key == "step_seconds_mean":
        return _step_ms(x)
    if key.startswith("share.") or key == "gpu_idle_ratio":
        return f"{100 * x:.1f} %"
    if key.endswith("_bytes"):
        return _bytes(x)
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def _change(key: str, f: dict) -> str:
    if "changed" in f:
        return "changed" if f["changed"] else "same"
    if f["change"] is None:
        return "n/a"
    if f["change"] == 0:
        return "no change"
    if key.startswith("share.") or key == "gpu_idle_ratio":
        txt = f"{100 * f['change']:+.1f} points"
    elif f["relative_change"] is not None:
        txt = f"{100 * f['relative_change']:+.1f} %"
    else:
        txt = _fmt(key, f["change"])
    if f["beyond_noise"] is None:
        return txt + (" (not judged: no spread)" if f["change"] else "")
    band = f"{100 * f['noise']:.1f} points" if key.startswith("share.") else _fmt(key, f["noise"])
    if not f["beyond_noise"]:
        return f"no change beyond noise ({txt}, noise ±{band})"
    return f"{txt} (beyond noise ±{band})"


def text(doc: dict) -> str:
    p, l_ = doc["previous"], doc["latest"]
    mark = lambda r: r["start_time"] + (" (RUNNING: so far)" if r["state"] == "running" else "")  # noqa: E731
    L = [f"Training job {doc['train_job']}: the latest run against an earlier one",
         f"  previous: {mark(p)} to {p['end_time']}, {p['steps']} steps, world size {p['world_size'] or 'n/a'}",
         f"  latest:   {mark(l_)} to {l_['end_time']}, {l_['steps']} steps, world size {l_['world_size'] or 'n/a'}",
         f"  A change counts beyond {doc['noise_sigmas']:g} standard deviations of the runs' spread over their "
         f"scrape intervals ({p['scrape_intervals']} and {l_['scrape_intervals']}), and beyond "
         f"{100 * doc.get('min_relative_change', MIN_RELATIVE_CHANGE):g} % "
         f"({100 * doc.get('min_share_change', MIN_SHARE_CHANGE):g} point for a share).", ""]
    rows = [("", "previous", "latest", "change")]
    for key, f in doc["figures"].items():
        label = _LABELS.get(key) or (f"Share {key.split('.', 1)[1]}" if key.startswith("share.") else key)
        rows.append((label, _fmt(key, f["previous"]), _fmt(key, f["latest"]), _change(key, f)))
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    L += [f"  {r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]:>{w[2]}}  {r[3]}".rstrip() for r in rows]
    return "\n".join(L) + "\n"


def run(args, prom, req, latest_doc: dict) -> int:
    """The --compare hook of `teye report`: print the comparison, or one line saying why there is none."""
    import json
    name = args.train_job[0]
    try:
        doc = compare(prom, req, name, args.compare, latest_doc)
    except CompareError as e:
        print(f"teye report: --compare {name}: {e}", file=sys.stderr)
        return e.exit_status
    sys.stdout.write(json.dumps(doc, indent=1, sort_keys=True) + "\n" if args.format == "json" else text(doc))
    for c in doc["conditions"]:
        print(f"teye report: --compare {name}: {c['kind']}: {c['message']}", file=sys.stderr)
    return doc["exit_status"]
