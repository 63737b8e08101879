"""The report document as text (bars, like jobstats), Markdown, JSON, and the compact epilog summary."""
from __future__ import annotations

import json
import math
import textwrap
from typing import List, Optional

from .model import _iso, share_base

WIDTH = 40


def _pct(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{100 * x:.0f} %"


def _bar(x: Optional[float]) -> str:
    if x is None:
        return "[" + " " * WIDTH + "]  n/a"
    n = max(0, min(WIDTH, int(round(x * WIDTH))))
    return "[" + "|" * n + " " * (WIDTH - n) + f"] {100 * x:4.0f} %"


def _bytes(b: Optional[float]) -> str:
    if b is None:
        return "n/a"
    for unit, size in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if b >= size:
            return f"{b / size:.1f} {unit}"
    return f"{b:.0f} B"


def _dur(s: float) -> str:
    s = int(round(s))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{d}-" if d else "") + f"{h:02d}:{m:02d}:{s:02d}"


def _step_ms(x: Optional[float]) -> str:
    """An exact mean step time to three significant figures: 109 ms, 26.6 ms, 2.41 s."""
    if x is None:
        return "n/a"
    v, unit = (1000 * x, "ms") if x < 1 else (x, "s")
    digits = max(0, 2 - int(math.floor(math.log10(v)))) if v > 0 else 0
    return f"{v:.{digits}f} {unit}"


def _bucket(b) -> str:
    """A quantile's bucket as the data gives it: "100-250 ms", "1-2.5 s", "> 60 s"."""
    if not b:
        return "n/a"
    lo, hi = b
    if hi is None:
        return f"> {1000 * lo:g} ms" if lo < 1 else f"> {lo:g} s"
    return f"{1000 * lo:g}-{1000 * hi:g} ms" if hi <= 1 else f"{lo:g}-{hi:g} s"


def _job_lines(j: dict, md: bool) -> List[str]:
    """One job's report: who and when, conditions, GPU busy, phases and verdict, host, notes."""
    code = "    " if md else ""
    L = _ident_lines(j, md)
    L += _gpu_lines(j, md, code)
    L += _phase_lines(j, md, code)
    L += _host_lines(j, md, code)
    if j["notes"]:
        L += ["", "### Notes" if md else "Notes"]
        for n in j["notes"]:
            L.append(f"- {n}" if md else textwrap.fill(n, 100, initial_indent="  * ", subsequent_indent="    "))
    L.append("")
    return L


def _ident_lines(j: dict, md: bool) -> List[str]:
    """The title, the job's identity and run (earlier runs, traces, dashboard) and its conditions."""
    L: List[str] = []
    title = f"Slurm job {j['slurm_job']}" if j["slurm_job"] else f"Training job {', '.join(j['train_jobs'])}"
    if md:
        L += [f"## {title}", ""]
    else:
        L += ["=" * 72, f"  {title}".ljust(72), "=" * 72]
    state = "RUNNING (report so far)" if j["state"] == "running" else "finished"
    ident = [("Slurm job", j["slurm_job"] or "-"), ("Training jobs", ", ".join(j["train_jobs"]) or "-"),
             ("User", j["user"] or "-"), ("State", state), ("Nodes", ", ".join(j["nodes"])),
             ("GPUs", str(len(j["gpus"]))), ("Start", j["start_time"]), ("End", j["end_time"]),
             ("Run time", _dur(j["run_seconds"]) + (" (short: under one step of the report, timed by its steps)"
                                                   if j.get("short_run") else ""))]
    runs = j.get("earlier_runs") or []
    if runs:   # the report is of the latest run; say how to report the others
        name = j["train_jobs"][0] if len(j["train_jobs"]) == 1 else "NAME"
        ident.append(("Earlier runs", f"{len(runs)} of the same name, not counted here (the latest run is "
                                      f"reported); the last one: teye report --train-job {name} --until "
                                      f"{runs[-1]['until']:.3f}"))
    traces = j.get("traces") or []
    if traces:   # issue 46: the traces taken on request (teye trace), where the job's user finds them
        last = traces[-1]["id"]
        nodes = ", ".join(sorted({t["node"] for t in traces if t["id"] == last}))
        ident.append(("Traces", f"{len({t['id'] for t in traces})} taken on request; the latest {last} on {nodes} "
                                f"(files <output>/<train_job>.{last}.<node>.rank<R>.pt.trace.json or .tf.trace.json; docs/trace.md)"))
    for k, v in ident:
        L.append(f"- **{k}:** {v}" if md else f"{k:>15}: {v}")
    if j.get("grafana_url"):
        L.append(f"- **Dashboard:** [{j['grafana_url']}]({j['grafana_url']})" if md
                 else f"{'Dashboard':>15}: {j['grafana_url']}")
    if md and j["conditions"]:
        L.append("")
    for c in j["conditions"]:
        L.append(f"> **{c['kind']}**: {c['message']}" if md else f"  ! {c['kind']}: {c['message']}")
    return L


def _gpu_lines(j: dict, md: bool, code: str) -> List[str]:
    """GPU busy overall, per node and per GPU; memory peak, energy and idle gaps."""
    L = ["", "### GPU busy (driver samples)" if md else "GPU busy (from the driver's samples)"]
    L.append(f"{code}  overall          {_bar(j['gpu_busy_ratio'])}")
    for n in j["per_node"]:
        mark = "  <- slowest" if n["node"] == j.get("slowest_node") else ""
        L.append(f"{code}  {n['node'][:15]:15}  {_bar(n['gpu_busy_ratio'])}{mark}")
        for g in j["gpus"]:
            if g["node"] == n["node"]:
                L.append(f"{code}    GPU {g['gpu']:9}  {_bar(g['busy_ratio'])}  mem peak {_bytes(g['memory_peak_bytes'])}")
    gaps = j.get("idle_gaps")
    L.append("")
    L.append(f"GPU memory peak: {_bytes(j['gpu_memory_peak_bytes'])}; GPU energy: "
             + ("n/a" if j["gpu_energy_joules"] is None else f"{j['gpu_energy_kwh']:.4f} kWh "
                f"({j['gpu_energy_joules']:.0f} J)"))
    if gaps:
        L.append(f"Idle gaps: {gaps['count']:.0f} gaps, {gaps['seconds']:.1f} s in all"
                 + (f", mean {gaps['mean_seconds']:.2f} s" if gaps["mean_seconds"] else ""))
    return L


def _phase_lines(j: dict, md: bool, code: str) -> List[str]:
    """The phases as shares of the step time, the input-bound share, the verdict, the straggler, the scaling
    efficiency and the steps."""
    L = ["", "### Phases" if md else "Phases (as the job reported them)"]
    if j["phase_seconds"] is None:
        L.append(f"  omitted: {j['phases_omitted']}")
        return L
    # bars are shares of the step time, as the input-bound share is (agent.phases.definitions): compile
    # and eval are beside the training steps, in no share of them
    total = j.get("step_seconds") or share_base({p: v or 0 for p, v in j["phase_seconds"].items()}) or 1.0
    idle = j["gpu_idle_seconds_by_phase"]   # None: no GPU samples of the job, so no GPU figures
    for p, v in j["phase_seconds"].items():
        if not v and not (idle or {}).get(p):
            continue   # phases the job never entered
        gi = "n/a" if idle is None else f"{idle.get(p, 0.0):.1f} s"
        between = {"compile": ", between steps", "eval": ", beside training"}.get(p, "")
        L.append(f"{code}  {p:15}  {_bar((v or 0) / total)}  {v:.1f} s{between}, GPU idle {gi}")
    L.append(f"Input-bound share: {_pct(j['input_bound_ratio'])}")
    shares = ", ".join(f"{k} {_pct(v)}" for k, v in sorted(j["verdict_shares"].items(), key=lambda kv: -kv[1])
                       if v > 0)
    cause = f" (cause {j['input_cause']})" if j["verdict"] == "input" and j["input_cause"] else ""
    L.append(f"Verdict: {j['verdict'] or 'n/a'}{cause}; over the job: {shares or 'n/a'}"
             + (f"; phases from {j['source_text']}" if j.get("source_text") else ""))
    if j.get("straggler"):
        L.append(_straggler_line(j["straggler"]))
    se = j.get("scaling_efficiency")
    if se is not None:
        L.append(f"Scaling efficiency: {_pct(se)} ({_pct(1 - se)} of step time in the exchange)")
    # the mean is exact (sum / count); a quantile is only known to its bucket: its bounds are printed
    L.append(f"Steps: {j['steps']:.0f}, step time mean {_step_ms(j.get('step_seconds_mean'))}, "
             f"p50 {_bucket(j.get('step_seconds_p50_bounds'))}, p95 {_bucket(j.get('step_seconds_p95_bounds'))}"
             + ("" if j["samples_per_second"] is None else f", {j['samples_per_second']:.1f} samples/s"))
    return L


def _straggler_line(st: dict) -> str:
    """The rank that holds the others back: by its compute (they wait in the exchange) or its own input."""
    if st.get("rule") == "communication":   # it computes longest: the others wait in the exchange
        share = (f"communication {_pct(st['communication_ratio'])} of its step, "
                 f"{_pct(st['waiting_communication_ratio'])} of theirs")
        if st.get("compute_seconds_per_step") is not None and \
                st.get("waiting_communication_seconds_per_step") is not None:
            return (f"Straggler: rank {st['rank']} on {st['node']} computes "
                    f"{_step_ms(st['compute_seconds_per_step'])} per step; the job's other {st['ranks'] - 1} "
                    f"ranks wait {_step_ms(st['waiting_communication_seconds_per_step'])} of it in gradient "
                    f"exchange ({share})")
        return (f"Straggler: rank {st['rank']} on {st['node']} computes longest; the job's other "
                f"{st['ranks'] - 1} ranks wait for it in gradient exchange ({share})")
    why = f", cause {st['cause']}" if st["cause"] else ""
    return (f"Straggler: rank {st['rank']} on {st['node']} waits {_pct(st['own_wait_ratio'])} of its step on "
            f"its own input and host work (input {_pct(st['input_bound_ratio'])}{why}); the job's other "
            f"{st['ranks'] - 1} ranks wait for it")


def _host_lines(j: dict, md: bool, code: str) -> List[str]:
    """CPU efficiency (the job's cgroup where seen), the nodes' CPU, memory peak, hardware counters, I/O."""
    cpu, mem = j["cpu"], j["memory"]
    L = ["", "### Host" if md else "Host"]
    where = {"job_cgroup": "the job's cgroup", "node": "whole nodes: no job cgroup seen",
             "job_processes": "the job's processes and their workers: no job cgroup seen"}
    if cpu["efficiency"] is not None:
        given = "allocated cores" if cpu.get("source") != "job_processes" else "CPUs they may run on"
        L.append(f"{code}  CPU efficiency   {_bar(cpu['efficiency'])}  of {cpu['allocated_cores']:g} {given} "
                 f"({where.get(cpu.get('source'), 'whole nodes')})")
    elif cpu.get("cgroup_vanished"):
        L.append(f"{code}  CPU efficiency   n/a: the job's cgroup vanished before its end ("
                 + ", ".join(f"{n} last seen {t}" for n, t in cpu["cgroup_vanished"].items())
                 + "): its CPU, memory and I/O figures cover it until then")
    elif cpu.get("source") == "node" and not cpu.get("short_run"):
        L.append(f"{code}  CPU efficiency   n/a: no cgroup of the job seen (the nodes' figure below is every "
                 f"process's, not the job's)")
    why = " (the run is shorter than a scrape interval)" if cpu.get("short_run") else ""
    L.append(f"{code}  node CPU busy    {_bar(cpu['node_busy_ratio'])}  of {int(cpu['node_cpus'] or 0) or 'n/a'} CPUs "
             f"(the whole nodes, all their processes: not the job's){why}")
    extra = []
    if cpu["cycles_per_instruction"] is not None:
        extra.append(f"CPI {cpu['cycles_per_instruction']:.2f}")
    if cpu["memory_bandwidth_bytes_per_second"] is not None:
        extra.append(f"memory bandwidth {_bytes(cpu['memory_bandwidth_bytes_per_second'])}/s")
    L.append(f"Host memory peak: {_bytes(mem['peak_bytes'])}"
             + (f" of {_bytes(mem['requested_bytes'])} requested" if mem["requested_bytes"] else "")
             + f" ({where.get(mem.get('source'), 'whole nodes')})"
             + ("; " + ", ".join(extra) if extra else ""))
    io = j.get("io")
    if io:
        L.append(f"I/O (the job's cgroup): read {_bytes(io['read_bytes'])}, written {_bytes(io['written_bytes'])}")
    return L


def text(doc: dict, md: bool = False) -> str:
    L: List[str] = []
    if md:
        L += ["# teye job report", ""]
    for j in doc["jobs"]:
        L += _job_lines(j, md)
    for u in doc["unknown_jobs"]:
        L.append(f"unknown job {u}: Prometheus has no series for it between {_when(doc.get('since'))} and "
                 f"{_when(doc.get('until'))}")
    if not doc["jobs"] and not doc["unknown_jobs"]:
        L.append("no jobs matched")
    return "\n".join(L) + "\n"


def _when(t: Optional[float]) -> str:
    """A report's bound as a date (UTC), as the report prints its start and end."""
    return "n/a" if t is None else _iso(t)


def as_json(doc: dict) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


SUMMARY_KEYS = ("slurm_job", "train_jobs", "state", "nodes", "run_seconds", "gpu_busy_ratio", "input_bound_ratio",
                "verdict", "input_cause", "gpu_energy_joules", "gpu_memory_peak_bytes", "step_seconds_mean",
                "samples_per_second", "slowest_node", "exit_status")


def summary(doc: dict, limit: int = 1024) -> str:
    """One job's compact JSON (the epilog's AdminComment): short keys, ratios in %, at most ``limit`` bytes.

    Notes are dropped first, then the training-job names, then optional numbers, so the result always
    parses; ``"t": 1`` says something was cut."""
    if not doc["jobs"]:
        return json.dumps({"v": 1, "err": doc.get("exit_status", 0)}, separators=(",", ":"))
    j = doc["jobs"][0]
    s = {"v": 1, "job": j["slurm_job"], "tj": j["train_jobs"], "st": j["state"][0], "n": j["nodes"],
         "rt": round(j["run_seconds"]), "gb": _p(j["gpu_busy_ratio"]), "ib": _p(j["input_bound_ratio"]),
         "vd": j["verdict"], "ic": j["input_cause"], "ej": _i(j["gpu_energy_joules"]),
         "gm": _i(j["gpu_memory_peak_bytes"]), "sm": _ms1(j.get("step_seconds_mean")), "sps": _i(j["samples_per_second"]),
         "slow": j["slowest_node"], "x": j["exit_status"],
         "notes": [n.split(":")[0][:80] for n in j["notes"]]}
    s = {k: v for k, v in s.items() if v not in (None, [], "")}
    for cut in ("notes", "tj", "slow", "sm", "sps", "gm", "n"):
        out = json.dumps(s, separators=(",", ":"))
        if len(out.encode()) <= limit:
            return out
        s.pop(cut, None)
        s["t"] = 1
    out = json.dumps({"v": 1, "job": j["slurm_job"], "gb": s.get("gb"), "vd": s.get("vd"), "t": 1},
                     separators=(",", ":"))
    return out[:limit] if len(out.encode()) <= limit else json.dumps({"v": 1, "t": 1})


def _p(x):
    return None if x is None else round(100 * x, 1)


def _ms1(x):
    return None if x is None else round(1000 * x, 1)


def _i(x, scale=1):
    return None if x is None else int(round(x * scale))
