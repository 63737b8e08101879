"""Start N local training workers with TF_CONFIG and report scaling efficiency.

    python -m workloads.launch --workers 2 -- --model simple_cnn --steps 50 --pipeline tfdata

Runs ``python -m workloads.train <train args> --distribute multiworker`` once with a
single worker (the baseline; skip it with ``--no-baseline``) and then with N workers
on free localhost ports, each worker with its own ``TF_CONFIG`` and its shard of the
input.  ``--batch-size`` is per worker, so this measures weak scaling:

    scaling efficiency = (N-worker job samples/s) / (N x one-worker samples/s)

where the job's samples/s is the sum over workers of their measured samples/s.  It also
checks that all workers end with bit-identical weights (a SHA-256 of every weight
tensor, recorded by each worker).  Standard library only: TensorFlow runs in the workers.
On a single machine the workers share its CPU cores (or GPUs: set CUDA_VISIBLE_DEVICES per
worker with ``--gpus-per-worker``), so CPU efficiency here is a lower bound of a cluster's.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

from . import train_command

__all__ = ["free_ports", "tf_config", "run_workers", "scaling_report", "main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def free_ports(n: int, host: str = "127.0.0.1") -> List[int]:
    """``n`` distinct TCP ports that were free a moment ago (bound together, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tf_config(ports: List[int], index: int, host: str = "127.0.0.1") -> str:
    """The TF_CONFIG JSON for worker ``index`` of a localhost cluster on ``ports``."""
    return json.dumps({"cluster": {"worker": [f"{host}:{p}" for p in ports]},
                       "task": {"type": "worker", "index": index}})


def _strip(train_args: List[str], names) -> List[str]:
    """``train_args`` without the options in ``names`` (and their values)."""
    out, skip = [], False
    for a in train_args:
        if skip:
            skip = False
            continue
        key = a.split("=", 1)[0]
        if key in names:
            skip = "=" not in a
            continue
        out.append(a)
    return out


# what a worker's log says when TensorFlow's gRPC server could not bind its port: the port was free when
# free_ports released it, and something else (another job, a client's ephemeral port) took it meanwhile
PORT_TAKEN = re.compile(r"Could not start gRPC server|Failed to add port to server|Address already in use")
PORT_TRIES = 3


def run_workers(n: int, train_args: List[str], out_dir: str, *, timeout_s: float = 600.0,
                gpus_per_worker: int = 0, python: str = sys.executable, log=print) -> Dict:
    """Run one n-worker job; returns {"ok", "returncodes", "results" (per worker or None), "logs", "tries"}.
    Started again, on new ports, where a worker could not bind its port (PORT_TAKEN), PORT_TRIES times at
    most."""
    for tries in range(1, PORT_TRIES + 1):
        got = _run_once(n, free_ports(n), train_args, out_dir, timeout_s, gpus_per_worker, python, log)
        got["tries"] = tries
        taken = [i for i, rc in enumerate(got["returncodes"]) if rc not in (0, None) and _port_taken(got["logs"][i])]
        if got["ok"] or not taken or tries == PORT_TRIES:
            return got
        log(f"workloads.launch: worker(s) {taken} could not bind their port (taken since it was chosen); "
            f"starting again on new ports")
    raise AssertionError("unreachable")


def _read(path: str) -> str:
    """A worker's log ("" where it cannot be read)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _port_taken(path: str) -> bool:
    return PORT_TAKEN.search(_read(path)) is not None


def log_tail(path: str, lines: int = 15) -> str:
    """The last ``lines`` lines of a worker's log ("" where it cannot be read)."""
    return "".join(_read(path).splitlines(True)[-lines:])


def _run_once(n: int, ports: List[int], train_args: List[str], out_dir: str, timeout_s: float,
              gpus_per_worker: int, python: str, log) -> Dict:
    os.makedirs(out_dir, exist_ok=True)
    args = _strip(train_args, {"--distribute", "--results"})
    procs, logs, result_paths = [], [], []
    try:
        for i in range(n):
            env = dict(os.environ)
            env["TF_CONFIG"] = tf_config(ports, i)
            env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            if gpus_per_worker:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i * gpus_per_worker + g) for g in range(gpus_per_worker))
            res = os.path.join(out_dir, f"worker-{i}.json")
            if os.path.exists(res):
                os.remove(res)
            logp = os.path.join(out_dir, f"worker-{i}.log")
            cmd = [*train_command(python), *args, "--distribute", "multiworker",
                   "--results", os.path.join(out_dir, "worker-{worker}.json"),
                   "--no-progress"]
            fh = open(logp, "w", encoding="utf-8")
            procs.append((subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT), fh))
            logs.append(logp)
            result_paths.append(res)
        deadline = time.monotonic() + timeout_s
        rcs: List[Optional[int]] = [None] * n
        while any(rc is None for rc in rcs):
            for i, (p, _) in enumerate(procs):
                if rcs[i] is None:
                    rcs[i] = p.poll()
            if any(rc not in (None, 0) for rc in rcs):
                break  # one worker failed: the others would wait for it forever
            if time.monotonic() > deadline:
                log(f"workloads.launch: timed out after {timeout_s:.0f} s")
                break
            time.sleep(0.05)
    finally:
        for p, fh in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            fh.close()
    rcs = [p.returncode for p, _ in procs]
    results = []
    for path in result_paths:
        try:
            with open(path, encoding="utf-8") as fh:
                results.append(json.load(fh))
        except (OSError, ValueError):
            results.append(None)
    ok = all(rc == 0 for rc in rcs) and all(r is not None for r in results)
    return {"ok": ok, "workers": n, "returncodes": rcs, "results": results, "logs": logs}


def _job_rate(job: Dict) -> float:
    return sum(r["samples_per_s"] for r in job["results"] if r and r.get("samples_per_s") is not None)


def scaling_report(single: Optional[Dict], multi: Dict) -> Dict:
    """Throughputs, scaling efficiency and the weight-consistency check of a launch."""
    shas = [r.get("weights_sha256") for r in multi["results"] if r]
    rep = {
        "workers": multi["workers"],
        "ok": multi["ok"],
        "returncodes": multi["returncodes"],
        "per_worker_samples_per_s": [r.get("samples_per_s") if r else None for r in multi["results"]],
        "job_samples_per_s": _job_rate(multi) if multi["ok"] else None,
        "weights_identical": bool(multi["ok"] and len(set(shas)) == 1 and len(shas) == multi["workers"]),
        "weights_sha256": shas,
        "single_worker_samples_per_s": None,
        "scaling_efficiency": None,
        "speedup": None,
    }
    if single is not None and single["ok"] and multi["ok"]:
        one = _job_rate(single)
        rep["single_worker_samples_per_s"] = one
        if one > 0:
            rep["speedup"] = rep["job_samples_per_s"] / one
            rep["scaling_efficiency"] = rep["speedup"] / multi["workers"]
    return rep


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        k = argv.index("--")
        own, train_args = argv[:k], argv[k + 1:]
    else:
        own, train_args = argv, []
    p = argparse.ArgumentParser(prog="python -m workloads.launch",
                                description="Run N local MultiWorkerMirroredStrategy workers and report scaling "
                                            "efficiency against one worker. Training options go after '--'.")
    p.add_argument("--workers", type=int, default=2, help="number of worker processes (default: %(default)s)")
    p.add_argument("--no-baseline", action="store_true", help="skip the one-worker baseline run")
    p.add_argument("--gpus-per-worker", type=int, default=0,
                   help="give each worker its own CUDA_VISIBLE_DEVICES slice (default: all see everything)")
    p.add_argument("--out", help="folder for worker logs and results (default: a new temporary folder)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before the workers are killed")
    p.add_argument("--report", metavar="FILE", help="also write the scaling report as JSON here")
    args = p.parse_args(own)
    if args.workers < 1:
        p.error("--workers must be >= 1")
    if args.gpus_per_worker < 0:
        p.error("--gpus-per-worker must be >= 0")
    out = args.out or tempfile.mkdtemp(prefix="teye-launch-")

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    single = None
    if not args.no_baseline and args.workers > 1:
        log(f"workloads.launch: baseline, 1 worker (logs in {out}/single)")
        single = run_workers(1, train_args, os.path.join(out, "single"), timeout_s=args.timeout,
                             gpus_per_worker=args.gpus_per_worker, log=log)
        if not single["ok"]:
            log(f"workloads.launch: the one-worker baseline failed (exit {single['returncodes']}); "
                f"see {single['logs'][0]}")
            return single["returncodes"][0] or EXIT_FAILED
    log(f"workloads.launch: {args.workers} workers (logs in {out}/multi)")
    multi = run_workers(args.workers, train_args, os.path.join(out, "multi"), timeout_s=args.timeout,
                        gpus_per_worker=args.gpus_per_worker, log=log)
    rep = scaling_report(single, multi)
    rep["out"] = out
    if args.report:
        with open(args.report, "w", encoding="utf-8") as fh:
            json.dump(rep, fh, indent=2)
            fh.write("\n")
    if not multi["ok"]:
        bad = [i for i, rc in enumerate(multi["returncodes"]) if rc != 0]
        log(f"workloads.launch: worker(s) {bad} failed (exit codes {multi['returncodes']}); logs: "
            + ", ".join(multi["logs"][i] for i in bad))
        # the ones that failed by themselves first (the others were killed: -9, as they would wait for ever)
        for i in [i for i in bad if multi["returncodes"][i] != -9] or bad:
            log(f"workloads.launch: the end of worker {i}'s log:\n{log_tail(multi['logs'][i])}")
        # a usage/data error (2) in any worker is the launch's usage error too
        return EXIT_USAGE if EXIT_USAGE in multi["returncodes"] else EXIT_FAILED
    rates = ", ".join(f"{r:.1f}" for r in rep["per_worker_samples_per_s"])
    line = (f"{args.workers} workers: {rep['job_samples_per_s']:.1f} samples/s (per worker: {rates}); "
            f"weights identical on all workers: {'yes' if rep['weights_identical'] else 'NO'}")
    if rep["scaling_efficiency"] is not None:
        line += (f"; 1 worker: {rep['single_worker_samples_per_s']:.1f} samples/s; speedup {rep['speedup']:.2f}x, "
                 f"scaling efficiency {rep['scaling_efficiency'] * 100:.0f}%")
    print(line, flush=True)
    return EXIT_OK if rep["weights_identical"] else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
