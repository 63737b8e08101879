"""teye's step parts beside TraceML 0.5's on one script with known parts (issue 45), and the wall time of each.

    python benchmarks/traceml_side.py [--rounds 3] [--steps 300] [--traceml-path DIR]

The script is tests/client/torch_parts.py (a DataLoader; a forward that sleeps 6 ms, a backward 9 ms, an
optimizer step 4 ms, 2 ms of Python between them), timing each part itself with perf_counter.  Three ways,
alternating, ``--rounds`` times each:

- bare:    python torch_parts.py plain STEPS
- teye:    teye run (zero-code, unmodified) beside an in-process agent (tests/client/helpers.LiveAgent), whose
           job table gives the parts (teye_job_step_part_seconds_total's figures) and the phases;
- traceml: traceml run torch_parts.py --args traceml STEPS: the same loop with each step marked by TraceML's
           trace_step(model), as TraceML 0.5 needs in a loop of one's own (its zero-code path is for the
           Hugging Face, Lightning and RF-DETR trainers); its final_summary.json gives its step breakdown.

Printed: each part's share of the step time by the script's own clock, by teye and by TraceML (medians over
the rounds); the loop's wall time by its own clock (median) under each, and the ratio to bare.  TraceML is
installed apart (``pip install --target DIR traceml-ai==0.5.0 msgspec``; its other needs are teye's dev
extras): --traceml-path DIR.  Without it the traceml rows are left out.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
SCRIPT = os.path.join(ROOT, "tests", "client", "torch_parts.py")
PARTS = ("forward", "backward", "optimizer")


def _own(stdout: str) -> dict:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")][-1]


def _env(extra_path=None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(p for p in (ROOT, extra_path) if p))
    env.pop("TEYE_PHASE_SOCKET", None)
    return env


def bare(steps: int) -> dict:
    p = subprocess.run([sys.executable, SCRIPT, "plain", str(steps)], env=_env(), cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    own = _own(p.stdout)
    return {"loop_s": own["loop_s"], "own": {q: own[q] / own["compute"] for q in PARTS}}


def teye(steps: int, sockdir: str) -> dict:
    from tests.client.helpers import LiveAgent
    agent = LiveAgent(sockdir)
    try:
        p = subprocess.run([sys.executable, "-m", "agent", "run", "--socket", agent.path, "--job", "side", "--",
                            sys.executable, SCRIPT, "plain", str(steps)], env=_env(), cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
        jobs = agent.jobs()
    finally:
        agent.close()
    assert p.returncode == 0, p.stderr[-2000:]
    own = _own(p.stdout)
    j = jobs["side"]
    (proc,) = j.inside.processes
    parts = dict(proc.part_seconds)
    compute = dict(j.phase_seconds)["compute"]
    return {"loop_s": own["loop_s"], "own": {q: own[q] / own["compute"] for q in PARTS},
            "seen": {q: parts.get(q, 0.0) / compute for q in PARTS}}


def traceml(steps: int, path: str, logs: str) -> dict:
    tool = os.path.join(path, "bin", "traceml")
    name = f"side{time.monotonic_ns()}"
    os.makedirs(logs, exist_ok=True)
    p = subprocess.run([sys.executable, tool, "run", SCRIPT, "--logs-dir", logs, "--run-name", name,
                        "--no-dashboard-auto-open", "--args", "traceml", str(steps)], env=_env(path), cwd=logs,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    own = _own(p.stdout)
    found = glob.glob(os.path.join(logs, name, "**", "final_summary.json"), recursive=True)
    assert found, f"no final_summary.json under {logs}/{name}: {p.stdout[-1500:]}"
    with open(found[0]) as fh:
        summary = json.load(fh)
    return {"loop_s": own["loop_s"], "own": {q: own[q] / own["compute"] for q in PARTS},
            "seen": traceml_parts(summary), "summary": found[0]}


def traceml_parts(summary: dict) -> dict:
    """Forward, backward and optimizer as shares of the step less its input wait (the script's "compute"), from
    TraceML's final summary: its step-time figures (forward_ms, backward_ms, optimizer_ms, step_time_ms,
    input_wait_ms, h2d_ms, residual_ms: a window average, as its report prints them)."""
    st = _find(summary, "forward_ms")
    if st is None:
        raise KeyError("no forward_ms in TraceML's summary: " + json.dumps(summary)[:1500])
    ms = {q: float(st.get(q + "_ms") or 0.0) for q in PARTS}
    if st.get("step_time_ms") is not None:
        compute = float(st["step_time_ms"]) - float(st.get("input_wait_ms") or 0.0)
    else:
        compute = sum(ms.values()) + sum(float(st.get(k) or 0.0) for k in ("h2d_ms", "residual_ms"))
    return {q: ms[q] / compute for q in PARTS}


def _find(doc, key):
    """The first dict in ``doc`` (depth first) that has ``key``."""
    if isinstance(doc, dict):
        if key in doc:
            return doc
        doc = list(doc.values())
    if isinstance(doc, list):
        for v in doc:
            got = _find(v, key)
            if got is not None:
                return got
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--traceml-path", help="a directory traceml-ai 0.5 was installed into (pip install --target)")
    args = ap.parse_args()
    runs = {"bare": [], "teye": []}
    if args.traceml_path:
        runs["traceml"] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            runs["bare"].append(bare(args.steps))
            runs["teye"].append(teye(args.steps, tempfile.mkdtemp(dir=tmp)))
            if args.traceml_path:
                runs["traceml"].append(traceml(args.steps, args.traceml_path, os.path.join(tmp, "logs")))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]['loop_s']:.2f} s" for k, v in runs.items()),
                  flush=True)
    med = statistics.median
    print(f"\n{args.steps} steps of tests/client/torch_parts.py, {args.rounds} rounds, medians")
    print(f"{'part':10} {'bare: own':>10} {'teye: own':>10} {'teye':>8} {'traceml: own':>13} {'traceml':>8}"
          "   (% of the step's compute; 'own': the script's clock in that run)")
    for q in PARTS:
        cols = [f"{100 * med(x['own'][q] for x in runs['bare']):9.1f}%"]
        for k, w in (("teye", 10), ("traceml", 13)):
            if k in runs:
                cols += [f"{100 * med(x['own'][q] for x in runs[k]):{w - 1}.1f}%",
                         f"{100 * med(x['seen'][q] for x in runs[k]):7.1f}%"]
            else:
                cols += [f"{'-':>{w}}", f"{'-':>8}"]
        print(f"{q:10} " + " ".join(cols))
    base = med(x["loop_s"] for x in runs["bare"])
    print(f"\n{'run':8} {'loop wall s':>12} {'ratio':>6}")
    for k, v in runs.items():
        t = med(x["loop_s"] for x in v)
        print(f"{k:8} {t:12.2f} {t / base:6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
