"""The studies' sweeps: ``python -m workloads.sweep --model simple_cnn --out sweep-out``.

* batch-size sweep: batch 8, 16, 32, ... (doubling) until a run runs out of memory
  (recorded as ``oom``; the sweep stops growing the batch) or the cap is reached;
* optimization matrix: thread mode (global, gpu_private) x precision (float32,
  mixed_float16) x pipeline (naive, tfdata) at one batch size.

Every point is a fresh ``python -m workloads.train`` process (thread mode and memory
only reset with the process), so a crash or out-of-memory in one point cannot take the
sweep down.  Outputs in ``--out``: ``batch_sweep.csv``/``.png`` (samples/s and step time
vs batch size) and ``matrix.csv``/``.png`` (a bar per configuration).  Extra training
options go after ``--`` and are passed to every point (e.g. ``-- --io-latency-ms 5``).
matplotlib (the ``plots`` extra) is imported only to draw the PNGs.
"""
from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

from . import train_command
from .train import EXIT_OK, EXIT_OOM, MODELS, PRECISIONS, THREAD_MODES
from .pipelines import PIPELINES

__all__ = ["Point", "run_train", "batch_sweep", "matrix_sweep", "write_csv", "plot_batch", "plot_matrix", "main"]

STATUS_OK = "ok"
STATUS_OOM = "oom"
STATUS_FAILED = "failed"
CSV_FIELDS = ["model", "batch_size", "pipeline", "gpu_thread_mode", "mixed_precision", "status",
              "samples_per_s", "step_time_p50_s", "step_time_p95_s", "input_wait_fraction",
              "device_kind", "device_name", "detail"]
TRAIN_CMD = tuple(train_command())   # python -m workloads.train (checkout) or -m teye workloads train


@dataclass
class Point:
    """One training run of a sweep: its knobs, its status and (when ok) its results."""

    model: str
    batch_size: int
    pipeline: str = "tfdata"
    gpu_thread_mode: str = "global"
    mixed_precision: str = "float32"
    status: str = ""
    results: Dict = field(default_factory=dict)
    detail: str = ""

    def argv(self, steps: int, extra: Sequence[str] = ()) -> List[str]:
        """Arguments for ``workloads.train`` (extra options last, so they can add knobs)."""
        out = ["--model", self.model, "--batch-size", str(self.batch_size), "--steps", str(steps),
               "--pipeline", self.pipeline, "--mixed-precision", self.mixed_precision, "--no-progress"]
        if self.gpu_thread_mode != "global":
            out += ["--gpu-thread-mode", self.gpu_thread_mode]
        return out + list(extra)

    def row(self) -> Dict:
        r = self.results
        return {
            "model": self.model, "batch_size": self.batch_size, "pipeline": self.pipeline,
            "gpu_thread_mode": self.gpu_thread_mode, "mixed_precision": self.mixed_precision,
            "status": self.status,
            "samples_per_s": r.get("samples_per_s", ""), "step_time_p50_s": r.get("step_time_p50_s", ""),
            "step_time_p95_s": r.get("step_time_p95_s", ""), "input_wait_fraction": r.get("input_wait_fraction", ""),
            "device_kind": r.get("device_kind", ""), "device_name": r.get("device_name", ""),
            "detail": self.detail,
        }

    @property
    def label(self) -> str:
        return f"{self.gpu_thread_mode}/{self.mixed_precision}/{self.pipeline}"


def run_train(argv: Sequence[str], *, timeout_s: float = 3600.0, cmd: Sequence[str] = TRAIN_CMD,
              log: Callable[[str], None] = lambda m: None):
    """Run one training process; returns (status, results dict, detail).

    Exit status 3 (``tf.errors.ResourceExhaustedError``) and death by SIGKILL (the
    kernel's OOM killer) are ``oom``; any other failure is ``failed`` with the last
    line of its output as detail.
    """
    fd, res = tempfile.mkstemp(prefix="teye-sweep-", suffix=".json")
    os.close(fd)
    os.remove(res)
    try:
        full = [*cmd, *argv, "--results", res]
        log("running: " + " ".join(full[1:]))
        try:
            proc = subprocess.run(full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return STATUS_FAILED, {}, f"timed out after {timeout_s:.0f} s"
        lines = [ln for ln in (proc.stdout or "").splitlines() if ln.strip()]
        tail = lines[-1][:300] if lines else ""
        if proc.returncode == EXIT_OOM or proc.returncode in (-9, 137):
            return STATUS_OOM, {}, tail or "killed (out of memory)"
        if proc.returncode != EXIT_OK:
            return STATUS_FAILED, {}, f"exit {proc.returncode}: {tail}"
        try:
            with open(res, encoding="utf-8") as fh:
                return STATUS_OK, json.load(fh), ""
        except (OSError, ValueError) as e:
            return STATUS_FAILED, {}, f"no results file ({e})"
    finally:
        if os.path.exists(res):
            os.remove(res)


Runner = Callable[[List[str]], tuple]


def batch_sweep(model: str, *, start: int = 8, cap: int = 1024, steps: int = 20, extra: Sequence[str] = (),
                runner: Optional[Runner] = None, log: Callable[[str], None] = lambda m: None) -> List[Point]:
    """Double the batch from ``start`` until a point is out of memory, fails, or passes ``cap``."""
    if start < 1 or cap < start:
        raise ValueError(f"need 1 <= start <= cap, got start={start} cap={cap}")
    runner = runner or (lambda argv: run_train(argv, log=log))
    points, bs = [], start
    while bs <= cap:
        pt = Point(model, bs)
        pt.status, pt.results, pt.detail = runner(pt.argv(steps, extra))
        log(f"batch {bs}: {pt.status}" + (f" {pt.results['samples_per_s']:.1f} samples/s" if pt.status == STATUS_OK
                                          else f" ({pt.detail})"))
        points.append(pt)
        if pt.status != STATUS_OK:
            break  # out of memory (or broken): larger batches will not fit either
        bs *= 2
    return points


def matrix_sweep(model: str, batch_size: int, *, steps: int = 20,
                 thread_modes: Sequence[str] = ("global", "gpu_private"),
                 precisions: Sequence[str] = ("float32", "mixed_float16"), pipelines: Sequence[str] = PIPELINES,
                 extra: Sequence[str] = (), runner: Optional[Runner] = None,
                 log: Callable[[str], None] = lambda m: None) -> List[Point]:
    """Every combination of thread mode x precision x pipeline at one batch size."""
    runner = runner or (lambda argv: run_train(argv, log=log))
    points = []
    for tm, prec, pipe in itertools.product(thread_modes, precisions, pipelines):
        pt = Point(model, batch_size, pipeline=pipe, gpu_thread_mode=tm, mixed_precision=prec)
        pt.status, pt.results, pt.detail = runner(pt.argv(steps, extra))
        log(f"{pt.label}: {pt.status}" + (f" {pt.results['samples_per_s']:.1f} samples/s" if pt.status == STATUS_OK
                                          else f" ({pt.detail})"))
        points.append(pt)
    return points


def write_csv(path: str, points: Sequence[Point]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        w.writeheader()
        for pt in points:
            w.writerow(pt.row())


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_batch(path: str, points: Sequence[Point]) -> None:
    """samples/s and step time (p50) vs batch size, OOM points marked."""
    plt = _pyplot()
    ok = [p for p in points if p.status == STATUS_OK]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    bs = [p.batch_size for p in ok]
    a1.plot(bs, [p.results["samples_per_s"] for p in ok], "o-")
    a2.plot(bs, [p.results["step_time_p50_s"] * 1e3 for p in ok], "o-")
    for p in points:
        if p.status == STATUS_OOM:
            for a in (a1, a2):
                a.axvline(p.batch_size, color="red", linestyle="--")
                a.annotate("OOM", (p.batch_size, 0.95), xycoords=("data", "axes fraction"), color="red", ha="right")
    for a, title in ((a1, "samples/s"), (a2, "step time p50 (ms)")):
        a.set_xscale("log", base=2)
        a.set_xlabel("batch size")
        a.set_title(title)
        a.grid(True, alpha=0.3)
    model = points[0].model if points else ""
    fig.suptitle(f"{model}: batch-size sweep")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_matrix(path: str, points: Sequence[Point]) -> None:
    """One bar (samples/s) per configuration; failed/OOM configurations shown as empty bars."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(points)), 4.5))
    vals = [p.results.get("samples_per_s", 0.0) if p.status == STATUS_OK else 0.0 for p in points]
    bars = ax.bar(range(len(points)), vals, color=["tab:blue" if p.pipeline == "tfdata" else "tab:orange"
                                                     for p in points])
    for b, p in zip(bars, points):
        text = f"{b.get_height():.0f}" if p.status == STATUS_OK else p.status.upper()
        ax.annotate(text, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(points)))
    ax.set_xticklabels([p.label.replace("/", "\n") for p in points], fontsize=8)
    ax.set_ylabel("samples/s")
    model = points[0].model if points else ""
    bs = points[0].batch_size if points else ""
    ax.set_title(f"{model} bs={bs}: thread mode x precision x pipeline")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot(fn, path: str, points: Sequence[Point], log) -> None:
    try:
        fn(path, points)
    except ImportError as e:
        log(f"no plot {path}: matplotlib is not installed ({e}); pip install 'teye[plots]' (the CSV is written)")


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: List[str] = []
    if "--" in argv:
        k = argv.index("--")
        argv, extra = argv[:k], argv[k + 1:]
    p = argparse.ArgumentParser(prog="python -m workloads.sweep",
                                description="Batch-size sweep and optimization matrix, as in the studies. "
                                            "Options after '--' go to every training run.")
    p.add_argument("--model", choices=MODELS, default="simple_cnn")
    p.add_argument("--mode", choices=("batch", "matrix", "both"), default="both")
    p.add_argument("--start-batch", type=int, default=8, help="first batch size (default: %(default)s)")
    p.add_argument("--max-batch", type=int, default=1024, help="largest batch size tried (default: %(default)s)")
    p.add_argument("--matrix-batch", type=int, default=64, help="batch size of the matrix (default: %(default)s)")
    p.add_argument("--steps", type=int, default=20, help="training steps per point (default: %(default)s)")
    p.add_argument("--thread-modes", nargs="+", choices=THREAD_MODES, default=["global", "gpu_private"])
    p.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=["float32", "mixed_float16"])
    p.add_argument("--pipelines", nargs="+", choices=PIPELINES, default=list(PIPELINES))
    p.add_argument("--out", default="sweep-out", help="folder for the CSVs and PNGs (default: %(default)s)")
    p.add_argument("--no-plots", action="store_true", help="CSV only (no matplotlib needed)")
    args = p.parse_args(argv)
    if args.start_batch < 1 or args.max_batch < args.start_batch:
        p.error("need 1 <= --start-batch <= --max-batch")
    if args.steps < 2 or args.matrix_batch < 1:
        p.error("need --steps >= 2 and --matrix-batch >= 1")
    os.makedirs(args.out, exist_ok=True)

    def log(msg):
        print(f"workloads.sweep: {msg}", file=sys.stderr, flush=True)

    if args.mode in ("batch", "both"):
        pts = batch_sweep(args.model, start=args.start_batch, cap=args.max_batch, steps=args.steps, extra=extra,
                          log=log)
        write_csv(os.path.join(args.out, "batch_sweep.csv"), pts)
        if not args.no_plots:
            _plot(plot_batch, os.path.join(args.out, "batch_sweep.png"), pts, log)
        last = pts[-1]
        end = {STATUS_OK: f"reached the cap {args.max_batch}", STATUS_OOM: f"out of memory at batch {last.batch_size}",
               STATUS_FAILED: f"failed at batch {last.batch_size}: {last.detail}"}[last.status]
        print(f"batch sweep ({args.model}): {len(pts)} points, {end}; "
              f"{os.path.join(args.out, 'batch_sweep.csv')}", flush=True)
    if args.mode in ("matrix", "both"):
        pts = matrix_sweep(args.model, args.matrix_batch, steps=args.steps, thread_modes=args.thread_modes,
                           precisions=args.precisions, pipelines=args.pipelines, extra=extra, log=log)
        write_csv(os.path.join(args.out, "matrix.csv"), pts)
        if not args.no_plots:
            _plot(plot_matrix, os.path.join(args.out, "matrix.png"), pts, log)
        ok = [pt for pt in pts if pt.status == STATUS_OK]
        best = max(ok, key=lambda pt: pt.results["samples_per_s"]) if ok else None
        print(f"matrix ({args.model} bs={args.matrix_batch}): {len(ok)}/{len(pts)} ok"
              + (f", best {best.label} {best.results['samples_per_s']:.1f} samples/s" if best else "")
              + f"; {os.path.join(args.out, 'matrix.csv')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
