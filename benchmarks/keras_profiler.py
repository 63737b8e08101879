"""Keras Model.fit on models no test contains: teye's input share against the TensorFlow profiler's (issue 39).

    python benchmarks/keras_profiler.py [--repeats 3] [--steps 120] [--load N] [--only mlp,aug,text]

Each model of benchmarks/keras_models.py runs unmodified under `teye run` (zero-code phases to a fresh
in-process agent phase path, tests/client/helpers.LiveAgent), with the TensorFlow profiler tracing batches
2 .. STEPS-1, all but the first two (TensorBoard's default profile_batch is the second; the first traces and
compiles): the peer is the input-pipeline analyzer's input percentage over those batches
(workloads/tfprofile.py).  Over a shorter window a neighbour's load that comes and goes makes the window
differ from the run by tens of points (a third of the run: 20-35 % against the run's 36-41 % for mlp).  --load N runs N busy Python loops beside it (the issue's figures were taken under
load).  TensorFlow's thread pools are 1 each, as in the tests.  Printed per model, medians over the repeats
(in rounds: every model once, then again):

- prof: the profiler's input share of those batches;
- window: teye's data_wait share of the same batches (from the intervals the agent received);
- run: teye's share over the whole run as the agent, `teye report` and the recording rules give it:
  data_wait over the phases' time but ``compile``;
- run, compile counted: the same with the compile call counted (what teye read before the ``compile``
  phase: the call was the first step's compute; the same run, so the same load);
- compile s, and steps counted against the job's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.client.helpers import LiveAgent, base_env, teye_run  # noqa: E402
from workloads.tfprofile import input_analysis  # noqa: E402

JOB = os.path.join(ROOT, "benchmarks", "keras_models.py")
MODELS = ("mlp", "aug", "text")
# TEYE_SUM_STEPS=0: every step as its own interval (a prefetched batch makes some steps shorter than the 10 ms
# the client would sum), so that the window column can be cut at the profiler's batches
ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "OMP_NUM_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1",
       "TF_NUM_INTRAOP_THREADS": "1", "TEYE_SUM_STEPS": "0"}


def one_run(model: str, steps: int) -> dict:
    first, last = 2, steps - 1
    with tempfile.TemporaryDirectory() as d:
        agent = LiveAgent(d, record_intervals=8 * steps + 64)
        try:
            tb = os.path.join(d, "tb")
            r = teye_run([sys.executable, JOB, model, str(steps), os.path.join(d, "out.json"), tb, str(first),
                          str(last)], socket_path=agent.path, job=model, env=base_env(**ENV), timeout=900)
            if r.returncode != 0:
                raise RuntimeError(f"{model}: exit {r.returncode}: {r.stderr[-1500:]}")
            j = agent.jobs()[model]
            rec = [x for x in agent.src.table.recorded if x[0] == model]
        finally:
            agent.close()
        prof = input_analysis(tb)
    ts = [(s, e) for _, p, s, e in rec if p == "step"]
    lo, hi = ts[first][0], ts[last][1]
    wait = sum(min(e, hi) - max(s, lo) for _, p, s, e in rec if p == "data_wait" and e > lo and s < hi)
    ph = dict(j.phase_seconds)
    total = sum(ph.values())
    comp = ph.get("compile", 0.0)
    dw = ph.get("data_wait", 0.0)
    return {"prof": prof["percent"] / 100, "window": wait / sum(e - s for s, e in ts[first:last + 1]),
            "run": dw / (total - comp), "before": dw / total, "compile_s": comp, "steps": j.steps,
            "steps_ok": j.steps == steps, "verdict": j.verdict.kind}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--load", type=int, default=0, help="busy Python loops beside the jobs")
    ap.add_argument("--only", default=",".join(MODELS))
    a = ap.parse_args()
    models = [m for m in a.only.split(",") if m]
    bad = [m for m in models if m not in MODELS]
    if bad or a.repeats < 1 or a.steps < 12 or a.load < 0:
        ap.error(f"unknown model {bad}" if bad else "--repeats >= 1, --steps >= 12, --load >= 0")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.load)]
    runs = {m: [] for m in models}
    try:
        for _ in range(a.repeats):
            for m in models:
                runs[m].append(one_run(m, a.steps))
    finally:
        for h in hogs:
            h.kill()
    import tensorflow as tf
    import keras
    print(f"Keras {keras.__version__}, TensorFlow {tf.__version__}; {a.steps} steps, profiler over batches "
          f"2..{a.steps - 1}; {a.load} busy loops beside; medians of {a.repeats}")
    print(f"{'model':6} {'prof':>6} {'window':>7} {'run':>6} {'run-prof':>9} {'compile counted':>16} "
          f"{'its diff':>9} {'compile s':>10} {'steps':>9} verdict")
    for m in models:
        rs = runs[m]

        def med(k):
            return statistics.median(r[k] for r in rs)
        worst = max(abs(r["run"] - r["prof"]) for r in rs)
        print(f"{m:6} {med('prof'):6.1%} {med('window'):7.1%} {med('run'):6.1%} "
              f"{100 * statistics.median(r['run'] - r['prof'] for r in rs):+8.1f}p "
              f"{med('before'):16.1%} {100 * statistics.median(r['before'] - r['prof'] for r in rs):+8.1f}p "
              f"{med('compile_s'):10.2f} {sum(r['steps_ok'] for r in rs)}/{len(rs)} exact "
              f"{statistics.mode(r['verdict'] for r in rs)}   (run-prof worst {100 * worst:.1f}p)")
    print(json.dumps(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
