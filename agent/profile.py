"""`teye profile [--output DIR] -- CMD ARGS...`: run one command and explain its GPU idle time.

No daemon is needed: the command runs with ``TEYE_PHASE_SOCKET`` pointing at a private
socket, this process samples the host (CPU) and the GPUs (when the GPU collector can
run) at a high rate, and when the command ends it prints an overview in the spirit of
the TensorFlow profiler's overview page (step-time breakdown, input-bound share, GPU
busy/idle and the longest idle gaps, verdict and recommendation), writes
``summary.json`` and, when matplotlib is installed, ``timeline.png`` (host phases vs
device work per step, idle gaps marked), and exits with the command's exit status.
"""
from __future__ import annotations

import bisect
import copy
import importlib.util
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .context import AgentContext
from .logutil import setup_logging
from .errors import ConfigError, ParseError, SourceUnavailable
from .phases import definitions
from .phases.jobs import JobView
from .phases.protocol import PHASES, STEPS_ONLY_SOURCES
from .phases.source import PhaseSource

log = logging.getLogger("teye.profile")

POLL_S = 0.25             # host/phase sampling period while the command runs
GPU_INTERVAL_S = 0.25     # GPU collector period (the driver ring is read at least this often)
RECORD_INTERVALS = 200_000
LONG_S = 86_400.0         # the profile's window: the whole run


class _CpuTracker:
    """Host CPU busy ratio over time from /proc/stat deltas."""

    def __init__(self, procfs: str):
        from .sources.cpu import MODES, CpuSource
        self.src = CpuSource(procfs)
        self._idle_modes = (MODES.index("idle"), MODES.index("iowait"))
        self.series: List[Tuple[int, float]] = []   # (t_ns, busy ratio since previous point)
        self.cpus = 0
        self._prev = None

    def sample(self, now_ns: int) -> None:
        try:
            r = self.src.collect()
        except (OSError, ParseError):
            return
        self.cpus = len(r.seconds)
        tot = [sum(mode) for mode in zip(*r.seconds.values())]  # seconds per mode, all CPUs
        total, idle = sum(tot), sum(tot[i] for i in self._idle_modes)
        if self._prev is not None:
            dt, di = total - self._prev[0], idle - self._prev[1]
            if dt > 0:
                self.series.append((now_ns, max(0.0, min(1.0, 1.0 - di / dt))))
        self._prev = (total, idle)

    def mean(self) -> Optional[float]:
        return sum(b for _, b in self.series) / len(self.series) if self.series else None


def _build_gpu(cfg, ctx):
    """The GPU collector, or (None, why) when it cannot run here."""
    from . import sources as sources_mod
    from .sampler import EXPECTED_ERRORS
    if not cfg["collectors"]["gpu"]["enabled"]:
        return None, "gpu collector disabled in the configuration"
    try:
        src = sources_mod.build("gpu", cfg, ctx)
    except SourceUnavailable as e:
        return None, str(e)
    except ModuleNotFoundError as e:
        return None, f"GPU collector not available ({e})"
    try:
        src.collect()  # one read up front: a machine without NVML says so here, once
    except EXPECTED_ERRORS as e:
        close = getattr(src, "close", None)
        if close:
            close()
        return None, str(e) or type(e).__name__
    return src, None


class _PmuWindow:
    """Hardware-counter totals at the start and end of the run (agent/pmu), or why there are none."""

    def __init__(self, cfg):
        self.src, self.note, self.first = None, None, None
        if not cfg["collectors"]["pmu"]["enabled"]:
            self.note = "pmu collector disabled in the configuration"
            return
        from .pmu.source import from_config
        try:
            self.src = from_config(cfg)
            self.first = self.src.collect()
        except (SourceUnavailable, OSError, ParseError) as e:
            self.note, self.src = str(e), None

    def close(self) -> None:
        if self.src is not None:
            self.src.close()

    def summary(self, seconds: float) -> Optional[Dict[str, Any]]:
        if self.src is None:
            return None
        from .pmu.summary import summarize
        try:
            last = self.src.collect()
        except (SourceUnavailable, OSError, ParseError) as e:
            self.note = str(e)
            return None
        finally:
            self.src.close()
        return summarize(self.first, last, seconds)


def idle_gaps(samples: Sequence, threshold: float, start_ns: int) -> List[Dict[str, float]]:
    """Merge consecutive samples at or below the busy threshold into gaps, longest first."""
    gaps = []
    cur = None
    for s in samples:
        if s.busy <= threshold:
            if cur is not None and s.start_ns <= cur[1]:
                cur[1] = s.end_ns
            else:
                if cur is not None:
                    gaps.append(cur)
                cur = [s.start_ns, s.end_ns]
        elif cur is not None:
            gaps.append(cur)
            cur = None
    if cur is not None:
        gaps.append(cur)
    gaps.sort(key=lambda g: g[0] - g[1])
    return [{"start_s": round((a - start_ns) / 1e9, 3), "duration_s": round((b - a) / 1e9, 3)} for a, b in gaps]


def _gpu_summary(ctx, t0: int, t1: int, threshold: float) -> List[Dict[str, Any]]:
    out = []
    for g in ctx.timeline.gpus():
        samples = ctx.timeline.window(g, t0, t1)
        obs = busy = 0.0
        for s in samples:
            ov = min(s.end_ns, t1) - max(s.start_ns, t0)
            if ov > 0:
                obs += ov
                busy += s.busy * ov
        if obs <= 0:
            continue
        out.append({"gpu": g, "observed_s": round(obs / 1e9, 3), "busy_ratio": round(busy / obs, 4),
                    "idle_ratio": round(1 - busy / obs, 4), "longest_idle_gaps": idle_gaps(samples, threshold, t0)[:5]})
    return out


def _round(x: Optional[float], nd: int) -> Optional[float]:
    return None if x is None else round(x, nd)


def _job_summary(j: JobView) -> Dict[str, Any]:
    # The evidence covers the whole run (the profile's window); its phase times are the time inside
    # the reported steps, so every share is a part of the step time (at most 1, never clipped).
    ev = j.evidence
    phases = dict(ev.phase_seconds)
    # the steps' time but compile, as every view takes it (agent.phases.definitions)
    step_total = ev.step_time if ev.step_seconds > 0 else 0.0
    phase_total = sum(v for p, v in phases.items() if p != "compile")
    breakdown = {}
    for p in PHASES:
        s = phases.get(p, 0.0)
        if p == "compile":   # between steps, in no share: compile_seconds
            continue
        if s or (p in ("data_wait", "compute", "host", "communication") and j.source not in STEPS_ONLY_SOURCES):
            breakdown[p] = {"seconds": round(s, 6), "share": round(ev.share(p), 4),
                            "ms_per_step": round(1000 * s / j.steps, 3) if j.steps else None}
    if step_total > 0:
        un = max(0.0, step_total - phase_total)
        breakdown["untracked"] = {"seconds": round(un, 6), "share": round(un / step_total, 4),
                                  "ms_per_step": round(1000 * un / j.steps, 3) if j.steps else None}
    idle_by_phase: Dict[str, float] = {}
    for _gpu, phase, s in j.gpu_idle_seconds:
        idle_by_phase[phase] = idle_by_phase.get(phase, 0.0) + s
    return {
        "train_job": j.train_job, "user": j.user, "uid": j.uid, "pid": j.pid, "processes": j.processes,
        "source": j.source,
        "steps": j.steps, "samples": j.samples,
        "step_seconds_total": round(step_total, 6),
        "mean_step_seconds": _round(definitions.mean_step(step_total, j.steps), 6),
        "samples_per_second": _round(definitions.samples_per_second(j.samples, step_total), 3),
        "step_time_breakdown": breakdown,
        # tracing and compiling step functions (TensorFlow's first call, a retrace): between steps, in no share
        "compile_seconds": round(dict(j.phase_seconds).get("compile", 0.0), 6),
        "input_bound_ratio": None if j.input_bound_ratio is None else round(j.input_bound_ratio, 4),
        "gpu_idle_ratio": None if j.gpu_idle_ratio is None else round(j.gpu_idle_ratio, 4),
        "gpu_idle_seconds_by_phase": ({k: round(v, 6) for k, v in sorted(idle_by_phase.items())}
                                      if j.gpu_idle_ratio is not None else None),   # null: no GPU samples
        "client_dropped_records": j.client_dropped,
        "input_wait": _input_wait_summary(ev.input_wait),
        "verdict": {"kind": j.verdict.kind, "cause": j.verdict.cause, "evidence": j.verdict.evidence,
                    "recommendation": j.verdict.recommendation},
    }


def _input_wait_summary(w) -> Optional[Dict[str, Any]]:
    """What the job's processes did during their data_wait (None: not sampled)."""
    if w is None:
        return None
    r = w.cpu_ratio
    return {"measured_wait_s": round(w.wait_s, 6), "cpu_s": round(w.cpu_s, 6),
            "cpu_ratio": None if r is None else round(r, 4), "read_bytes": w.read_bytes,
            "io_stall_s": None if w.io_stall_s is None else round(w.io_stall_s, 6),
            "cpu_stall_s": None if w.cpu_stall_s is None else round(w.cpu_stall_s, 6),
            "run_delay_s": None if w.run_delay_s is None else round(w.run_delay_s, 6),
            "problem": w.problem or None}


def render_overview(summary: Dict[str, Any]) -> str:
    """The text overview printed when the command ends."""
    lines = [f"teye profile: {' '.join(summary['command'])}",
             f"  exit status {summary['exit_status']}, {summary['duration_s']:.1f} s"]
    host = summary["host"]
    if host.get("cpu_busy_ratio") is not None:
        lines.append(f"  host: {host['cpus']} CPUs, {100 * host['cpu_busy_ratio']:.0f} % busy on average")
    if host.get("counters") is not None:
        from .pmu.summary import render
        lines.append(f"  host counters: {render(host['counters'])}")
    elif host.get("counters_note"):
        lines.append(f"  host counters: not available ({host['counters_note']})")
    if not summary["gpus"]:
        lines.append(f"  devices: none ({summary['gpu_note']})")
    for g in summary["gpus"]:
        gaps = ", ".join(f"{x['duration_s']:.2f} s at +{x['start_s']:.1f} s" for x in g["longest_idle_gaps"][:3])
        lines.append(f"  GPU {g['gpu']}: busy {100 * g['busy_ratio']:.0f} %, idle {100 * g['idle_ratio']:.0f} %"
                     + (f"; longest idle gaps: {gaps}" if gaps else ""))
    if not summary["jobs"]:
        lines.append("  no phase messages arrived: zero-code phases cover PyTorch and TensorFlow loops "
                     "(docs/zero-code.md); any other loop can use teye_client.Reporter (docs/phases.md)")
    for j in summary["jobs"]:
        mean = j["mean_step_seconds"]
        lines.append("")
        lines.append(f"Job {j['train_job']} (user {j['user']}, pid {j['pid']}, phases from {j['source']}): "
                     f"{j['steps']} steps"
                     + (f", mean step {1000 * mean:.1f} ms" if mean else ""))
        if j["source"] in STEPS_ONLY_SOURCES:
            lines.append("  steps only: the job's input wait is not observed, so its step time is not split "
                         "(untracked below); the verdict says only what its GPUs show")
        lines.append("  step-time breakdown      ms/step    share")
        for p, b in j["step_time_breakdown"].items():
            ms = "" if b["ms_per_step"] is None else f"{b['ms_per_step']:9.1f}"
            bar = "#" * int(round(20 * b["share"]))
            lines.append(f"    {p:<20}{ms:>9} {100 * b['share']:7.1f} %  {bar}")
        if j.get("compile_seconds"):
            lines.append(f"  compile: {j['compile_seconds']:.2f} s tracing and compiling step functions, between "
                         "steps (in no share)")
        if j["input_bound_ratio"] is not None:
            lines.append(f"  input-bound: {100 * j['input_bound_ratio']:.1f} % of step time waiting for input")
        if j["gpu_idle_ratio"] is not None:
            by = ", ".join(f"{k} {v:.2f} s" for k, v in j["gpu_idle_seconds_by_phase"].items())
            lines.append(f"  GPU idle {100 * j['gpu_idle_ratio']:.0f} % of the job's step time; idle by phase: {by}")
        else:
            lines.append("  GPU idle: n/a (no GPU samples for this job)")
        v = j["verdict"]
        w = j.get("input_wait")
        if w and w["cpu_ratio"] is not None:
            lines.append(f"  while waiting for input: {w['cpu_ratio']:.2f} CPU s per s of data_wait"
                         + (f", {w['read_bytes'] / 1e6:.1f} MB read" if w["read_bytes"] is not None else ""))
        cause = f" ({v['cause']})" if v.get("cause") else ""
        lines.append(f"  verdict: {v['kind'].upper()}{cause}: {v['evidence']}")
        lines.append(f"  recommendation: {v['recommendation']}")
    lines.append("")
    outs = ["summary.json"] + ([summary["timeline_png"]] if summary.get("timeline_png") else [])
    lines.append(f"wrote {', '.join(os.path.join(summary['output_dir'], o) for o in outs)}"
                 + ("" if summary.get("timeline_png") else f" (no timeline: {summary.get('timeline_note')})"))
    return "\n".join(lines) + "\n"


PHASE_COLORS = {"data_wait": "#d62728", "host": "#7f7f7f", "compute": "#2ca02c", "communication": "#9467bd",
                "checkpoint": "#8c564b", "eval": "#17becf", "compile": "#e377c2", "other": "#bcbd22"}
HOST_LANE = ("data_wait", "host", "checkpoint", "eval", "compile", "other")
DEVICE_LANE = ("compute", "communication")
GPU_BUSY_COLOR = "#98df8a"   # a GPU's utilization (its own colour: it is not a phase the job reported)
IDLE_COLOR = "#ff7f0e"       # device idle: hatched, drawn from GPU samples only
CPU_COLOR = "#1f77b4"
FIG_WIDTH_IN, DPI = 12.0, 100
BAND_PX = 8                  # steps narrower than this are drawn in bands at least this wide
TICK_PX = 8                  # step boundaries are ticked only where a step is at least this wide


def _band_edges(steps: Sequence[Tuple[int, int]], lo: int, hi: int, width_ns: float) -> List[int]:
    """Contiguous band edges over [lo, hi]: at step starts, each band at least ``width_ns`` wide (a regular
    grid when there are no steps)."""
    if steps:
        starts = [s for s, _ in steps]
    else:
        n = max(1, int((hi - lo) // max(width_ns, 1)))
        starts = [lo + (hi - lo) * i // n for i in range(n)]
    edges = [lo]
    for s in starts:
        if s - edges[-1] >= width_ns:
            edges.append(s)
    if hi - edges[-1] < width_ns and len(edges) > 1:
        edges.pop()      # a narrow last band joins the one before it
    edges.append(hi)
    return edges


def phase_bands(intervals: Sequence[Tuple[str, int, int]], steps: Sequence[Tuple[int, int]], want: Sequence[str],
                width_ns: float) -> List[Tuple[int, int, Dict[str, float]]]:
    """The lane's phases summed into bands of whole steps at least ``width_ns`` wide: (start_ns, end_ns,
    {phase: ns inside the band}); every nanosecond of every interval lands in exactly one band."""
    mine = [(ph, s, e) for ph, s, e in intervals if ph in want and e > s]
    if not mine:
        return []
    lo = min(min(s for _, s, _ in mine), steps[0][0] if steps else 1 << 62)
    hi = max(max(e for _, _, e in mine), steps[-1][1] if steps else 0)
    edges = _band_edges(steps, lo, hi, width_ns)
    bands = [(a, b, {}) for a, b in zip(edges, edges[1:])]
    for ph, s, e in mine:
        i = max(0, bisect.bisect_right(edges, s) - 1)
        while i < len(bands) and bands[i][0] < e:
            a, b, acc = bands[i]
            ov = min(e, b) - max(s, a)
            if ov > 0:
                acc[ph] = acc.get(ph, 0.0) + ov
            i += 1
    return bands


def _draw_lane(ax, y: float, intervals, steps, want, band_ns: float, sec, seen: set) -> bool:
    """One job lane: each interval as it is where steps are wide enough, else bands of whole steps, each a
    stacked bar whose colours share its height in proportion to its phases' time (summed over the job's
    processes).  True: banded."""
    widths = sorted(e - s for s, e in steps)
    banded = bool(widths) and widths[len(widths) // 2] < band_ns or (not steps and len(intervals) > 2000)
    if not banded:
        for ph in want:
            segs = [(sec(s), max((e - s) / 1e9, 1e-4)) for p, s, e in intervals if p == ph]
            if segs:
                # no antialiasing: edges fall on whole pixels, each pixel has one phase's colour
                ax.broken_barh(segs, (y - 0.35, 0.7), color=PHASE_COLORS[ph], antialiased=False, linewidth=0,
                               label=None if ph in seen else ph)
                seen.add(ph)
        return False
    # a stacked bar per band: each phase's height is its share of the band's time, so its area is its time
    bars: Dict[str, Tuple[List[float], List[float], List[float], List[float]]] = {}
    for a, b, acc in phase_bands(intervals, steps, want, band_ns):
        total = sum(acc.values())
        scale = 1.0 / max(total, b - a)   # overlapping processes: shares of their sum
        bottom = y - 0.35
        for ph in want:
            h = 0.7 * acc.get(ph, 0.0) * scale
            if h > 0:
                xs, ws, ys, hs = bars.setdefault(ph, ([], [], [], []))
                xs.append(sec(a)), ws.append((b - a) / 1e9), ys.append(bottom), hs.append(h)
                bottom += h
    for ph in want:
        if ph in bars:
            xs, ws, ys, hs = bars[ph]
            ax.bar(xs, hs, width=ws, bottom=ys, align="edge", color=PHASE_COLORS[ph], antialiased=False,
                   linewidth=0, label=None if ph in seen else ph)
            seen.add(ph)
    return banded


def _gpu_lane(ax, y: float, samples, threshold: float, t0: int, band_ns: float, sec, seen: set) -> None:
    """A GPU's utilization (bar height: busy), averaged over bands where samples are narrower than a band, and
    its idle gaps (samples at or below the busy threshold) hatched."""
    bars: List[Tuple[int, int, float]] = []
    for s in samples:
        if bars and s.end_ns - bars[-1][0] < band_ns and s.start_ns <= bars[-1][1]:
            a, b, busy_ns = bars[-1]
            bars[-1] = (a, s.end_ns, busy_ns + s.busy * (s.end_ns - s.start_ns))
        else:
            bars.append((s.start_ns, s.end_ns, s.busy * (s.end_ns - s.start_ns)))
    for a, b, busy_ns in bars:
        ax.broken_barh([(sec(a), (b - a) / 1e9)], (y - 0.35, 0.7 * busy_ns / (b - a)), color=GPU_BUSY_COLOR,
                       label=None if "gpu" in seen else "GPU busy")
        seen.add("gpu")
    gaps = [(g["start_s"], g["duration_s"]) for g in idle_gaps(samples, threshold, t0)]
    if gaps:
        ax.broken_barh(gaps, (y - 0.35, 0.7), facecolor="none", edgecolor=IDLE_COLOR, hatch="///",
                       label=None if "idle" in seen else "device idle (GPU samples)")
        seen.add("idle")


def timeline_figure(t0: int, t1: int, intervals, jobs: List[str], ctx, cpu_series, threshold: float,
                    gpu_note: Optional[str] = None, cpus: int = 0):
    """The 'software pipeline' figure: per job, host phases vs device phases as reported; per GPU its
    utilization with its idle gaps hatched (from GPU samples only: without them the lane says so); the host
    CPU busy share on an axis of its own, in per cent."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    gpus = [g for g in ctx.timeline.gpus() if ctx.timeline.window(g, t0, t1)][:8]
    rows: List[Tuple[str, Any]] = []
    for job in jobs[:3]:
        rows.append((f"{job}\nCPU (input, host)", ("host", job)))
        rows.append((f"{job}\ndevice (compute, comm.)", ("device", job)))
    for g in gpus:
        rows.append((f"GPU {g} busy", ("gpu", g)))
    if not gpus:
        rows.append(("GPUs", ("nogpu", None)))
    height = 0.7 * len(rows)
    fig, (ax, cax) = plt.subplots(2, 1, sharex=True, figsize=(FIG_WIDTH_IN, 2.4 + height),
                                  gridspec_kw={"height_ratios": [height, 1.1]}, dpi=DPI)
    span_s = max(1e-3, (t1 - t0) / 1e9)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([lab for lab, _ in reversed(rows)], fontsize=8)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    cax.set_xlim(0, span_s)
    cax.set_ylim(0, 100)
    cax.set_yticks([0, 50, 100])
    cax.set_ylabel(f"host CPU busy, %\n(of {cpus} CPUs)" if cpus else "host CPU busy, %", fontsize=8)
    cax.set_xlabel("seconds since the command started")
    ax.set_title("teye profile: host preparing batches vs device training "
                 "(hatched: device idle, from GPU samples)", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))   # the legend goes below, outside the lanes
    px = max(1.0, ax.get_window_extent().width)
    band_ns = BAND_PX * span_s * 1e9 / px
    sec = lambda t: (t - t0) / 1e9  # noqa: E731
    seen: set = set()
    by_job: Dict[str, List[Tuple[str, int, int]]] = {}
    for job, ph, s, e in intervals:
        by_job.setdefault(job, []).append((ph, s, e))
    for r, (_, (kind, key)) in enumerate(rows):
        y = len(rows) - 1 - r
        if kind in ("host", "device"):
            mine = by_job.get(key, [])
            steps = sorted((s, e) for ph, s, e in mine if ph == "step")
            banded = _draw_lane(ax, y, mine, steps, HOST_LANE if kind == "host" else DEVICE_LANE, band_ns, sec, seen)
            wide = [(s, e) for s, e in steps if (e - s) >= TICK_PX * span_s * 1e9 / px]
            if kind == "device" and not banded and len(wide) == len(steps):
                ax.vlines([sec(s) for s, _ in steps], y - 0.45, y + 0.45, colors="black", linewidth=0.4)
        elif kind == "gpu":
            _gpu_lane(ax, y, ctx.timeline.window(key, t0, t1), threshold, t0, band_ns, sec, seen)
        else:
            ax.text(span_s / 2, y, "no GPU samples" + (f" ({gpu_note})" if gpu_note else ""), ha="center",
                    va="center", fontsize=8, color="#555555")
    if cpu_series:
        cax.step([0.0] + [sec(t) for t, _ in cpu_series], [100 * cpu_series[0][1]] + [100 * b for _, b in cpu_series],
                 where="pre", color=CPU_COLOR, linewidth=1)
    cax.grid(axis="y", linewidth=0.3)
    if seen:
        fig.legend(*ax.get_legend_handles_labels(), loc="lower center", fontsize=7, ncol=8, frameon=False)
    return fig


def plot_timeline(path: str, t0: int, t1: int, intervals, jobs: List[str], ctx, cpu_series,
                  threshold: float, gpu_note: Optional[str] = None, cpus: int = 0) -> None:
    """Write ``timeline_figure`` as a PNG."""
    import matplotlib.pyplot as plt
    fig = timeline_figure(t0, t1, intervals, jobs, ctx, cpu_series, threshold, gpu_note, cpus)
    try:
        fig.savefig(path, dpi=DPI)
    finally:
        plt.close(fig)


def _wait_quiet(src: PhaseSource, quiet_s: float = 0.15, limit_s: float = 2.0) -> None:
    """Let the receiver drain the datagrams the command sent before it exited."""
    deadline = time.monotonic() + limit_s
    last = -1
    while time.monotonic() < deadline:
        n = src.receiver.received
        if n == last:
            return
        last = n
        time.sleep(quiet_s)


def main(args, cfg: dict) -> int:
    cmd = list(args.cmd or [])
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("teye profile: no command given; usage: teye profile [--output DIR] -- CMD ARGS...", file=sys.stderr)
        return 2
    setup_logging(cfg["log_level"] if getattr(args, "log_level", None) else "warning")
    out_dir = args.output
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--output {out_dir}: {e.strerror or e}") from None
    if shutil.which(cmd[0]) is None and not os.path.exists(cmd[0]):
        print(f"teye profile: command not found: {cmd[0]}", file=sys.stderr)
        return 127

    pcfg = copy.deepcopy(cfg["phases"])
    pcfg["window_seconds"] = LONG_S          # the verdict covers the whole run
    pcfg["job_expiry_seconds"] = LONG_S
    pcfg["stall_seconds"] = LONG_S
    ctx = AgentContext()
    tmp = tempfile.mkdtemp(prefix="teye-profile-")
    sock_path = os.path.join(tmp, "phases.sock")
    phases = PhaseSource(pcfg, ctx, socket_path=sock_path, record_intervals=RECORD_INTERVALS,
                         procfs=cfg["procfs"], sysfs=cfg["sysfs"])
    gpu_src, gpu_note = _build_gpu(cfg, ctx)
    sampler = None
    if gpu_src is not None:
        from .sampler import Sampler
        sampler = Sampler({"gpu": (gpu_src, min(GPU_INTERVAL_S, cfg["collectors"]["gpu"]["interval_seconds"]))})
        sampler.start()
    cpu = _CpuTracker(cfg["procfs"])
    pmu = _PmuWindow(cfg)
    from .run import instrumented_env
    env = instrumented_env(os.environ, socket_path=sock_path)  # zero-code phases for unmodified scripts
    t0 = ctx.clock()
    cpu.sample(t0)
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the command; we still report
    try:
        try:
            proc = subprocess.Popen(cmd, env=env)
        except OSError as e:
            print(f"teye profile: cannot run {cmd[0]}: {e.strerror or e}", file=sys.stderr)
            return 127
        old_term = signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
        try:
            while True:
                try:
                    rc = proc.wait(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    now = ctx.clock()
                    cpu.sample(now)
                    phases.collect()
        finally:
            signal.signal(signal.SIGTERM, old_term)
        t1 = ctx.clock()
        cpu.sample(t1)
        counters = pmu.summary((t1 - t0) / 1e9)
        _wait_quiet(phases)
        if sampler is not None:
            sampler.stop()
            sampler.read_once("gpu")  # the driver samples up to the end of the run
        reading = phases.collect(force=True)
        intervals = list(phases.table.recorded or ())
    finally:
        signal.signal(signal.SIGINT, old_int)
        phases.close()
        pmu.close()
        if sampler is not None:
            sampler.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    status = rc if rc >= 0 else 128 - rc
    jobs = sorted(reading.jobs, key=lambda j: (-j.steps, -sum(s for _, s in j.phase_seconds)))
    summary: Dict[str, Any] = {
        "command": cmd, "exit_status": status, "duration_s": round((t1 - t0) / 1e9, 3), "output_dir": out_dir,
        "host": {"cpus": cpu.cpus, "cpu_busy_ratio": None if cpu.mean() is None else round(cpu.mean(), 4)},
        "gpus": _gpu_summary(ctx, t0, t1, cfg["gpu"]["busy_threshold"]),
        "gpu_note": gpu_note or "no GPU samples during the run",
        "jobs": [_job_summary(j) for j in jobs],
        "messages": {k: v for k, v in reading.results if v},
        "timeline_png": None, "timeline_note": None,
    }
    summary["host"]["counters"], summary["host"]["counters_note"] = counters, pmu.note
    from .pmu.summary import refine_verdict
    for j in summary["jobs"]:  # the host counters are evidence; a saturated host turns "input" into "host"
        j["verdict"] = refine_verdict(j["verdict"], counters, summary["host"]["cpu_busy_ratio"],
                                      cfg["pmu"]["memory_peak_bytes_per_second"])
    if importlib.util.find_spec("matplotlib") is None:
        summary["timeline_note"] = "matplotlib is not installed (pip install 'teye[plots]')"
    else:
        try:
            plot_timeline(os.path.join(out_dir, "timeline.png"), t0, t1, intervals, [j.train_job for j in jobs],
                          ctx, cpu.series, cfg["gpu"]["busy_threshold"], gpu_note=gpu_note,
                          cpus=cpu.cpus)
            summary["timeline_png"] = "timeline.png"
        except (OSError, ValueError) as e:
            summary["timeline_note"] = f"plotting failed: {e}"
    try:
        with open(os.path.join(out_dir, "summary.json"), "w", encoding="utf-8") as fh:
            json.dump(summary, fh, indent=2)
            fh.write("\n")
    except OSError as e:
        print(f"teye profile: cannot write {out_dir}/summary.json: {e.strerror or e}", file=sys.stderr)
    sys.stdout.write(render_overview(summary))
    sys.stdout.flush()
    return status
