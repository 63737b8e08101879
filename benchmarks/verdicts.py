"""teye's verdict against the TensorFlow profiler and the wall clock over the studies' optimization matrix.

    python benchmarks/verdicts.py [--steps 10] [--warmup-steps 3] [--only naive-io20 tfdata-io20 ...]
                                  [--json FILE]

For every configuration (naive / tf.data; prefetch and parallel map on and off; cache;
batch 32-512; mixed precision; input slow by storage (--io-latency-ms, a sleep) or by CPU
(--decode-cost-ms, a busy loop)) one fresh process runs

    teye profile -- python -m workloads.train --model simple_cnn ... --profile-dir DIR

so the same profiled steps are seen three ways: the wall clock (the loop's own timing of
next()), the TensorFlow profiler's input-pipeline analyzer (xprof, headless) and teye
(phases over its socket, /proc samples of the process).  Printed side by side: input
share by each, the profiler's conclusion, teye's verdict and cause, samples/s; then each
disagreement and the largest ones.  Private GPU threads (TF_GPU_THREAD_MODE) are left
out on a machine without a GPU: they change nothing on the CPU device.

Needs the workloads-cpu (or workloads) extra and xprof (the dev extra).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from workloads.tfprofile import says_input_bound  # noqa: E402

# name -> (train arguments, what the configuration should be limited by: the ground truth)
MATRIX = {
    "naive-io20-bs32": (["--pipeline", "naive", "--io-latency-ms", "20", "--batch-size", "32"], "input/storage"),
    "naive-decode5-bs32": (["--pipeline", "naive", "--decode-cost-ms", "5", "--batch-size", "32"], "input/host_cpu"),
    "naive-io2-bs128": (["--pipeline", "naive", "--io-latency-ms", "2", "--batch-size", "128"], "input/storage"),
    # 64 reads of 20 ms in flight: 3,200 samples/s, twice what simple_cnn takes on 2 cores.  With the
    # default 16 (800/s) the loop waits 20-28 % of its time there, at the threshold: no clear ground truth.
    "tfdata-io20-64reads": (["--pipeline", "tfdata", "--io-latency-ms", "20", "--read-parallelism", "64",
                             "--batch-size", "32"], "compute"),
    "tfdata-io20-64reads-noprefetch": (["--pipeline", "tfdata", "--io-latency-ms", "20", "--read-parallelism", "64",
                                        "--batch-size", "32", "--no-prefetch"], "compute"),
    "tfdata-io100-4reads": (["--pipeline", "tfdata", "--io-latency-ms", "100", "--read-parallelism", "4",
                             "--batch-size", "32"], "input/storage"),
    "tfdata-io100-4reads-cache": (["--pipeline", "tfdata", "--io-latency-ms", "100", "--read-parallelism", "4",
                                   "--batch-size", "32", "--cache", "--synthetic-samples", "256"], "compute"),
    "tfdata-decode10-parallel": (["--pipeline", "tfdata", "--decode-cost-ms", "10", "--batch-size", "32"],
                                 "input/host_cpu"),
    "tfdata-decode10-serial": (["--pipeline", "tfdata", "--decode-cost-ms", "10", "--batch-size", "32",
                                "--no-parallel-map"], "input/host_cpu"),
    "tfdata-bs512": (["--pipeline", "tfdata", "--batch-size", "512", "--synthetic-samples", "2048"], "compute"),
    "tfdata-bs64-bf16": (["--pipeline", "tfdata", "--batch-size", "64", "--mixed-precision", "mixed_bfloat16"],
                         "compute"),
}


def run_one(name, args, steps, warmup, out_root, log):
    out = os.path.join(out_root, name)
    argv = [sys.executable, "-m", "agent", "profile", "--output", out, "--",
            sys.executable, "-m", "workloads.train", "--model", "simple_cnn", "--steps", str(warmup + steps),
            "--warmup-steps", str(warmup), "--no-progress", "--train-job", "bench",
            "--results", os.path.join(out, "results.json"), "--profile-dir", os.path.join(out, "tb"), *args]
    if "--synthetic-samples" not in args:
        argv += ["--synthetic-samples", "2048"]
    t0 = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"})
    took = time.monotonic() - t0
    if p.returncode != 0:
        log(f"{name}: exit {p.returncode}: {p.stderr.strip().splitlines()[-1:]}")
        return None
    with open(os.path.join(out, "results.json"), encoding="utf-8") as fh:
        res = json.load(fh)
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as fh:
        job = next(j for j in json.load(fh)["jobs"] if j["train_job"] == "bench")
    prof = res.get("tf_profiler") or {"error": "no profile"}
    row = {"name": name, "args": args, "seconds": round(took, 1), "samples_per_s": res["samples_per_s"],
           "wall_share": res["input_wait_fraction"], "teye_share": job["input_bound_ratio"],
           "teye_kind": job["verdict"]["kind"], "teye_cause": job["verdict"]["cause"],
           "teye_cpu_ratio": (job.get("input_wait") or {}).get("cpu_ratio"),
           "prof_share": None if "error" in prof else prof["percent"] / 100,
           "prof_class": prof.get("class", prof.get("error")), "prof_text": prof.get("text"),
           "prof_input": None if "error" in prof else says_input_bound(prof)}
    log(f"{name}: {took:.0f} s, wall {row['wall_share']:.3f}, profiler {row['prof_share']}, teye {row['teye_share']} "
        f"{row['teye_kind']}/{row['teye_cause']}")
    return row


def _fmt(x, pct=True):
    return "-" if x is None else (f"{100 * x:5.1f}%" if pct else f"{x:.2f}")


def report(rows, truth):
    print(f"\n{'configuration':<27} {'wall':>6} {'profiler':>8} {'profiler says':<14} {'teye':>6} "
          f"{'teye verdict':<20} {'cpu/wait':>8} {'samples/s':>9}  truth")
    for r in rows:
        verdict = r["teye_kind"] + (f"/{r['teye_cause']}" if r["teye_cause"] else "")
        print(f"{r['name']:<27} {_fmt(r['wall_share']):>6} {_fmt(r['prof_share']):>8} {str(r['prof_class']):<14} "
              f"{_fmt(r['teye_share']):>6} {verdict:<20} {_fmt(r['teye_cpu_ratio'], False):>8} "
              f"{r['samples_per_s']:9.1f}  {truth[r['name']]}")
    print("\ndisagreements (> 5 points, a different verdict, or a cause other than the ground truth):")
    any_ = False
    for r in rows:
        notes = []
        if r["prof_share"] is not None and abs(r["teye_share"] - r["prof_share"]) > 0.05:
            notes.append(f"teye vs profiler {100 * (r['teye_share'] - r['prof_share']):+.1f} points")
        if abs(r["teye_share"] - r["wall_share"]) > 0.05:
            notes.append(f"teye vs wall clock {100 * (r['teye_share'] - r['wall_share']):+.1f} points")
        if r["prof_input"] is not None and r["prof_input"] != (r["teye_kind"] == "input"):
            notes.append(f"verdicts differ: profiler {r['prof_class']}, teye {r['teye_kind']}")
        want = truth[r["name"]]
        got = r["teye_kind"] + (f"/{r['teye_cause']}" if r["teye_cause"] else "")
        if want != got:
            notes.append(f"teye says {got}, the configuration is {want}")
        if notes:
            any_ = True
            print(f"  {r['name']}: " + "; ".join(notes))
    if not any_:
        print("  none")
    with_prof = [r for r in rows if r["prof_share"] is not None]
    if with_prof:
        worst = max(with_prof, key=lambda r: abs(r["teye_share"] - r["prof_share"]))
        d = 100 * (worst["teye_share"] - worst["prof_share"])
        print(f"largest disagreement with the TF profiler: {worst['name']}: teye {_fmt(worst['teye_share'])} vs "
              f"profiler {_fmt(worst['prof_share'])} ({worst['prof_class']}), {d:+.2f} points")
    if rows:
        worst = max(rows, key=lambda r: abs(r["teye_share"] - r["wall_share"]))
        d = 100 * (worst["teye_share"] - worst["wall_share"])
        print(f"largest disagreement with the wall clock: {worst['name']}: teye {100 * worst['teye_share']:.2f}% vs "
              f"wall clock {100 * worst['wall_share']:.2f}%, {d:+.2f} points (teye rounds to 4 digits; both use the "
              f"loop's own timestamps, so this checks teye's step accounting, not an independent clock)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10, help="profiled steps per run (default: %(default)s)")
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--only", nargs="+", choices=sorted(MATRIX), help="run only these configurations")
    p.add_argument("--json", metavar="FILE", help="also write every row as JSON here")
    p.add_argument("--report", metavar="FILE", help="print the table of an earlier --json run instead of running")
    args = p.parse_args(argv)
    if args.report:
        with open(args.report, encoding="utf-8") as fh:
            rows = json.load(fh)
        report(rows, {n: MATRIX[n][1] for n in MATRIX})
        return 0

    def log(msg):
        print(f"  {msg}", file=sys.stderr, flush=True)

    out_root = tempfile.mkdtemp(prefix="teye-bench-verdicts-")
    names = args.only or list(MATRIX)
    rows = [r for r in (run_one(n, MATRIX[n][0], args.steps, args.warmup_steps, out_root, log) for n in names) if r]
    print(f"simple_cnn on this machine's CPU ({os.cpu_count()} cores), {args.steps} profiled steps after "
          f"{args.warmup_steps} warm-up steps per run; input share = data_wait / step time over the profiled steps "
          f"(wall clock: the loop's own timer; profiler: the percentage in its input conclusion)")
    report(rows, {n: MATRIX[n][1] for n in names})
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
