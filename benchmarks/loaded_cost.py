"""What teye costs a training thread on a loaded machine (issue 47), and where it goes.

    python benchmarks/loaded_cost.py [--pairs N] [--hogs N] [--steps N] [--variants A,B] [--baseline DIR]

An unmodified PyTorch loop with gradient accumulation (tests/client/torch_accum.py: 4 batches per optimizer
step, each next() of its DataLoader timed by the script itself) runs beside N busy neighbours (processes
spinning on the CPU, default 2 on this 2-core machine), in rounds that alternate, in a shuffled order:

- bare:        no teye at all;
- teye:        `teye run` beside a real agent (`python -m agent agent`, the defaults: host collectors and the
               input probe sampling the job's processes every 50 ms while it waits for input);
- no-probe:    the same, the agent's input probe off (phases.input_sample_interval_seconds: 0);
- no-agent:    `teye run` with no agent listening (the client's hooks and its flush thread, sending nowhere);
- no-parts:    `teye run` with the step's parts off (TEYE_STEP_PARTS=0: no forward, backward and optimizer
               hooks), to the `teye` variant's agent where it runs, else to none.
- before:      with --baseline DIR, `teye run` of DIR's tree (another checkout: the client before a change),
               with no agent listening (so its peer is no-agent).

Per run, by the script's own clock: its input-wait share (time inside next() over the span from the first
next() to the last optimizer step) and the training thread's time per batch outside next() (the rest of the
span over the batches: the model's work, the loop's, and whatever teye adds on that thread).  Printed: the
medians per variant and each variant's difference from bare (share points, µs per batch), the peer being the
bare runs of the same rounds; then each variant's whole process (getrusage: CPU, sleeps, preemptions).
Figures move with the machine's load: compare within one run.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tests.procs import free_port, wait_http  # noqa: E402

PY = sys.executable
SCRIPT = os.path.join(ROOT, "tests", "client", "torch_accum.py")
ACCUM = 4


def _env(variant="") -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEYE_")}
    if variant == "no-parts":
        env["TEYE_STEP_PARTS"] = "0"
    env.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    return env


def hog() -> subprocess.Popen:
    return subprocess.Popen([PY, "-c", "while True: pass"])


def agent(d: str, name: str, probe: bool) -> tuple:
    sock = os.path.join(d, f"{name}.sock")
    conf = os.path.join(d, f"{name}.yaml")
    with open(conf, "w") as f:
        f.write("phases:\n  input_sample_interval_seconds: %s\n" % ("0.05" if probe else "0"))
    port = free_port()
    p = subprocess.Popen([PY, "-m", "agent", "agent", "--listen", f"127.0.0.1:{port}", "--phase-socket", sock,
                          "--config", conf], cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    wait_http(f"http://127.0.0.1:{port}/healthz", proc=p)
    return p, sock


def run(variant: str, socks: dict, steps: int, baseline: str = None) -> dict:
    args = [SCRIPT, "accumulate", str(steps), str(ACCUM)]
    root, env = ROOT, _env(variant)
    if variant == "bare":
        cmd = [PY] + args
    else:
        cmd = [PY, "-m", "agent", "run", "--socket", socks[variant], "--job", f"cost-{variant}", "--", PY] + args
        if variant == "before":
            root = baseline
            env["PYTHONPATH"] = baseline
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{variant}: exit {r.returncode}: {r.stderr[-2000:]}")
    own = json.loads(r.stdout.strip().splitlines()[-1])
    batches = own["steps"] * ACCUM
    return {"share": own["wait_s"] / own["total_s"],
            "rest_us": (own["total_s"] - own["wait_s"]) / batches * 1e6,
            # the whole process (start-up included): CPU seconds, sleeps and preemptions of all its threads
            "cpu_s": (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime),
            "nvcsw": ru1.ru_nvcsw - ru0.ru_nvcsw, "nivcsw": ru1.ru_nivcsw - ru0.ru_nivcsw}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=5, help="rounds (each runs every variant once)")
    ap.add_argument("--hogs", type=int, default=2, help="busy neighbours")
    ap.add_argument("--steps", type=int, default=60, help="optimizer steps per run (4 batches each)")
    ap.add_argument("--variants", default="bare,teye,no-probe,no-agent")
    ap.add_argument("--baseline", metavar="DIR", help="another checkout, run as the variant 'before'")
    a = ap.parse_args()
    variants = a.variants.split(",")
    if ("before" in variants) != bool(a.baseline):
        ap.error("the variant 'before' and --baseline DIR go together")
    baseline = os.path.abspath(a.baseline) if a.baseline else None
    d = tempfile.mkdtemp(prefix="teye-loaded-")
    os.chmod(d, 0o755)
    procs, socks = [], {"no-agent": os.path.join(d, "nobody.sock")}
    socks["before"] = socks["no-agent"]
    try:
        for name, probe in (("teye", True), ("no-probe", False)):
            if name in variants:
                p, socks[name] = agent(d, name, probe)
                procs.append(p)
        if "no-parts" in variants:
            socks["no-parts"] = socks.get("teye", socks["no-agent"])
        procs += [hog() for _ in range(a.hogs)]
        time.sleep(1.0)
        got = {v: [] for v in variants}
        rng = random.Random(0)
        for k in range(a.pairs):
            order = list(variants)
            rng.shuffle(order)
            for v in order:
                got[v].append(run(v, socks, a.steps, baseline))
            print(f"round {k + 1}: " + ", ".join(f"{v} {got[v][-1]['share']:.3f}/{got[v][-1]['rest_us']:.0f}us"
                                              for v in variants), flush=True)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(d, ignore_errors=True)
    med = {v: (statistics.median(x["share"] for x in got[v]), statistics.median(x["rest_us"] for x in got[v]))
           for v in variants}
    print(f"\n{a.hogs} busy neighbours, {a.pairs} rounds, {a.steps} steps x {ACCUM} batches a run; medians")
    print(f"{'variant':10} {'own share':>10} {'vs bare':>9} {'µs/batch':>9} {'vs bare':>9} {'pairwise Δshare':>16}")
    for v in variants:
        pair = [x["share"] - b["share"] for x, b in zip(got[v], got["bare"])] if "bare" in got else []
        pd = statistics.median(pair) if pair else float("nan")
        print(f"{v:10} {med[v][0]:10.3f} {100 * (med[v][0] - med['bare'][0]):+8.2f}p {med[v][1]:9.0f} "
              f"{med[v][1] - med['bare'][1]:+9.0f} {100 * pd:+15.2f}p")
    print("\nthe whole process, start-up included (getrusage of the child; medians): CPU seconds, voluntary context "
          "switches (sleeps), involuntary ones (preemptions)")
    for v in variants:
        cpu, sleeps, preempted = (statistics.median(x[k] for x in got[v]) for k in ("cpu_s", "nvcsw", "nivcsw"))
        print(f"{v:10} {cpu:8.3f} s {sleeps:8.0f} {preempted:8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
