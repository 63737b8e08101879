"""Input pipelines and multi-worker scaling of the reference workloads (a benchmark, not a test).

    python benchmarks/pipelines.py [--models simple_cnn resnet50 facenet] [--io-latency-ms 5]
                                   [--batch-size 64] [--repeats 3] [--workers 2]

1. naive vs tfdata: for every model, ``python -m workloads.train`` with the same
   injected per-read latency, each pipeline ``--repeats`` times (fresh processes,
   alternating naive/tfdata so background load hits both alike); prints the median
   samples/s, input-wait fraction and step time side by side, and the tfdata/naive
   ratio.  The studies' effect to reproduce: tfdata >= 1.5x naive on simple_cnn.
2. Scaling: ``workloads.launch`` runs simple_cnn with 1 and with ``--workers`` local
   CPU workers (MultiWorkerMirroredStrategy, weak scaling: the batch is per worker)
   and reports the speedup and scaling efficiency (job samples/s / (N x 1-worker)).

Needs the workloads extra (TensorFlow).  Statistics skip the first ``--warmup-steps``
steps of each run (tracing, pipeline fill).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from workloads.launch import run_workers, scaling_report  # noqa: E402
from workloads.sweep import STATUS_OK, run_train  # noqa: E402

# steps per run: enough to dwarf the warm-up, small enough for a laptop CPU
DEFAULT_STEPS = {"simple_cnn": 40, "facenet": 30, "resnet50": 8}


def _median(xs):
    return statistics.median(xs) if xs else float("nan")


def bench_pipelines(models, args, log):
    rows = []
    for model in models:
        steps = args.steps or DEFAULT_STEPS[model]
        runs = {"naive": [], "tfdata": []}
        for rep in range(args.repeats):
            for pipe in ("naive", "tfdata"):
                argv = ["--model", model, "--batch-size", str(args.batch_size), "--steps", str(steps),
                        "--warmup-steps", str(args.warmup_steps), "--pipeline", pipe,
                        "--io-latency-ms", str(args.io_latency_ms), "--no-progress", "--seed", str(rep)]
                status, res, detail = run_train(argv)
                if status != STATUS_OK:
                    log(f"{model} {pipe} run {rep + 1}: {status} ({detail})")
                    continue
                runs[pipe].append(res)
                log(f"{model} {pipe} run {rep + 1}/{args.repeats}: {res['samples_per_s']:.1f} samples/s, "
                    f"input wait {res['input_wait_fraction'] * 100:.1f}%")
        row = {"model": model, "steps": steps}
        for pipe, rs in runs.items():
            row[pipe] = {
                "runs": len(rs),
                "samples_per_s": [r["samples_per_s"] for r in rs],
                "median_samples_per_s": _median([r["samples_per_s"] for r in rs]),
                "median_input_wait_fraction": _median([r["input_wait_fraction"] for r in rs]),
                "median_step_time_p50_s": _median([r["step_time_p50_s"] for r in rs]),
            }
            if rs:
                row["device"] = f"{rs[0]['device_kind']} ({rs[0]['device_name']})"
        n, t = row["naive"]["median_samples_per_s"], row["tfdata"]["median_samples_per_s"]
        row["ratio"] = t / n if n and n == n and t == t else float("nan")
        rows.append(row)
    return rows


def bench_scaling(args, log):
    out = tempfile.mkdtemp(prefix="teye-bench-scaling-")
    train_args = ["--model", "simple_cnn", "--batch-size", str(args.batch_size), "--steps", str(args.scaling_steps),
                  "--warmup-steps", str(args.warmup_steps), "--pipeline", "tfdata"]
    effs, reps = [], []
    for rep in range(args.scaling_repeats):
        single = run_workers(1, train_args, os.path.join(out, f"r{rep}-single"), log=log)
        multi = run_workers(args.workers, train_args, os.path.join(out, f"r{rep}-multi"), log=log)
        r = scaling_report(single, multi)
        reps.append(r)
        if r["scaling_efficiency"] is not None:
            effs.append(r["scaling_efficiency"])
            log(f"scaling run {rep + 1}: 1 worker {r['single_worker_samples_per_s']:.1f} samples/s, "
                f"{args.workers} workers {r['job_samples_per_s']:.1f} samples/s, efficiency "
                f"{r['scaling_efficiency'] * 100:.0f}%, weights identical: {r['weights_identical']}")
        else:
            log(f"scaling run {rep + 1} failed: {r['returncodes']} (logs in {out})")
    return reps, effs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["simple_cnn", "resnet50", "facenet"],
                   choices=sorted(DEFAULT_STEPS))
    p.add_argument("--io-latency-ms", type=float, default=5.0)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, help="steps per run (default: per model, %s)" % DEFAULT_STEPS)
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--scaling-steps", type=int, default=30)
    p.add_argument("--scaling-repeats", type=int, default=3)
    p.add_argument("--no-scaling", action="store_true")
    p.add_argument("--json", metavar="FILE", help="also write every number as JSON here")
    args = p.parse_args(argv)

    def log(msg):
        print(f"  {msg}", file=sys.stderr, flush=True)

    rows = bench_pipelines(args.models, args, log)
    print(f"\nnaive vs tfdata, batch {args.batch_size}, {args.io_latency_ms:g} ms per read, "
          f"median of {args.repeats} runs each")
    print(f"{'model':<11} {'steps':>5} | {'naive samples/s':>15} {'wait':>6} {'p50 ms':>8} | "
          f"{'tfdata samples/s':>16} {'wait':>6} {'p50 ms':>8} | {'tfdata/naive':>12}")
    for r in rows:
        n, t = r["naive"], r["tfdata"]
        print(f"{r['model']:<11} {r['steps']:>5} | {n['median_samples_per_s']:>15.1f} "
              f"{n['median_input_wait_fraction'] * 100:>5.1f}% {n['median_step_time_p50_s'] * 1e3:>8.1f} | "
              f"{t['median_samples_per_s']:>16.1f} {t['median_input_wait_fraction'] * 100:>5.1f}% "
              f"{t['median_step_time_p50_s'] * 1e3:>8.1f} | {r['ratio']:>11.2f}x")
    if rows and "device" in rows[0]:
        print(f"device: {rows[0]['device']}")
    scaling = None
    if not args.no_scaling:
        reps, effs = bench_scaling(args, log)
        scaling = {"runs": reps, "efficiencies": effs, "median_efficiency": _median(effs)}
        print(f"\nscaling, simple_cnn tfdata, batch {args.batch_size} per worker, CPU, "
              f"1 vs {args.workers} local workers (MultiWorkerMirroredStrategy)")
        for i, r in enumerate(reps):
            if r["scaling_efficiency"] is not None:
                print(f"  run {i + 1}: 1 worker {r['single_worker_samples_per_s']:.1f} samples/s, "
                      f"{args.workers} workers {r['job_samples_per_s']:.1f} samples/s, speedup {r['speedup']:.2f}x, "
                      f"efficiency {r['scaling_efficiency'] * 100:.0f}%, identical weights: {r['weights_identical']}")
        print(f"  median scaling efficiency: {scaling['median_efficiency'] * 100:.0f}% "
              f"({os.cpu_count()} CPU cores shared by all workers)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"pipelines": rows, "scaling": scaling, "args": vars(args)}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
