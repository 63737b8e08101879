"""The report's notes (advice read off a job's figures) and its links (Grafana)."""
from __future__ import annotations

from typing import List, Optional

from ..phases.advice import RankFacts
from ..phases.verdict import recommendation
from .model import Request


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
    creeps = [tj["memory_creep"] for tj in job.get("train_job_details") or () if tj.get("memory_creep")]
    if creeps:
        notes.append("Memory creeps (the job will run out of it; look for a reference kept across steps): "
                     + "; ".join(creeps) + ".")
    if job.get("verdict"):
        kind = job["verdict"]
        # the advice in the job's own framework (verdict.recommendation), as `teye profile` gives it, from what
        # the job is configured with and its critical rank where that one computes longer (issue 45)
        s = job.get("straggler") or {}
        rank = (RankFacts(s["rank"], s.get("compute_seconds_per_step") or 0.0) if s.get("rule") == "communication"
                and isinstance(s.get("rank"), int) else None)
        text = recommendation(kind, job.get("input_cause") if kind == "input" else None, job.get("source") or "client",
                              tuple((job.get("config") or {}).items()), cpu.get("allocated_cores"), rank)
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


def _run_notes(job: dict, earlier: List[dict], short: bool, run: float, active: float, step: float) -> List[str]:
    """What the report says of the run itself: a short run's timing, earlier runs of the same name."""
    notes = []
    if short:
        notes.append(f"Short run: its counters moved within one step of the report ({step:g} s, about one "
                     f"scrape interval), so its start and end are known to that step only; its run time "
                     f"({run:.1f} s) is the time it stepped ({active:.1f} s).")
    if earlier:
        name = job["train_jobs"][0] if len(job["train_jobs"]) == 1 else "NAME"
        runs = "; ".join(f"{e['start_time']} to {e['end_time']} ({', '.join(e['nodes'])}): --until {e['until']:.3f}"
                         for e in earlier)
        notes.append(f"Earlier run(s) of the same name in the range, not counted here (this report is of the "
                     f"latest run only): {runs}. Report one with `teye report --train-job {name} --until "
                     f"<its until>`.")
    return notes
