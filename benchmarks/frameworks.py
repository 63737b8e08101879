"""Real training frameworks under `teye run` (issue 29): teye's figures against each script's own clock.

    python benchmarks/frameworks.py [--repeats N] [--steps N] [--fast-steps N] [--only torch,hf,lightning,keras,tf]
    python benchmarks/frameworks.py --only loaders,exit [--repeats N]

loaders, exit (issue 39): rows of their own, after the matrix.  loaders: tests/client/torch_loaders.py, 30 steps
of one plain PyTorch loop reading two loaders per step (the slow one first: ab; second: ba; zip(la, lb)), three,
one read every other step (alt), a second loader through itertools.cycle, two loaders and a validation pass run
to its end every 10 steps (val); the peer: the loop's own perf_counter around each next().  exit:
tests/client/torch_exit.py, children that end without atexit hooks: a forked child ending with os._exit, Pools of
the fork, forkserver and spawn contexts (4 tasks of 30 steps on 2 workers); the peer: the steps and samples the
job trained.

The matrix: framework x input x evaluation.
- framework: a plain PyTorch loop with a batch-size probe and validation passes under model.eval()/no_grad()
  (tests/client/torch_eval.py), the Hugging Face Trainer with a tiny BERT built from a config
  (tests/client/hf_trainer.py), PyTorch Lightning with its sanity check (tests/client/lightning_job.py),
  the same with 2 DataLoader workers (light-w2, issue 39: its own wait_s and collate_s are the workers',
  which the script does not see: its share columns read 0; eval s and train s are the figures to compare),
  Keras 3 Model.fit with validation_data every epoch, a predict between epochs and an evaluate and a predict
  after fit (tests/client/keras_eval.py: epochs of STEPS/4 batches), a custom TensorFlow loop with a probe
  and validation passes (tests/client/tf_eval_loop.py);
- input: slow (the scripts' __getitem__, or tf.data map, sleeps: an input-bound job) or fast (--fast: no
  sleep; what is left is the tiny models' compute and the DataLoader's or tf.data's own work);
- evaluation: every STEPS/4 steps (and the frameworks' own extras: the probe, Lightning's sanity check, the
  final pass of torch_eval.py) or none (EVERY 0: no evaluation set at all).
Slow cells train --steps steps (default 40), fast ones --fast-steps (default 200: their steps take a few ms).
Each run is unmodified: zero-code phases (`python -m agent run --`) to a fresh in-process agent phase path
(tests/client/helpers.LiveAgent, the compiled helpers where built), OMP_NUM_THREADS=1 and TensorFlow's thread
pools of 1 (on a shared 2-core host torch's intra-op threads otherwise spin against the neighbours and steps
vary tenfold).  The peer is
each script's own clock, printed by the script itself (one JSON line): the samples it trained, its
training time (train_s), its input wait (wait_s: time inside its training set's __getitem__, or in
torch_eval.py and tf_eval_loop.py the time asking for a batch, in keras_eval.py the time inside its training
map: Keras takes its batches where the script cannot time them), the time in its training loader's collate
function (collate_s; none in torch_eval.py, whose wait_s holds it; in keras_eval.py fetch_s stands in its
place: the eager fetch's own cost beyond the map's reading, which teye's timed fetch holds and the map's clock
misses, timed by the script on a twin of its pipeline), in lightning_job.py also the time between
its training batches less validation (between_s: the loader's and Lightning's own work too, an upper
bound of the input wait) and the time inside its evaluations (eval_s); in keras_eval.py and tf_eval_loop.py
also the time of the calls that traced and compiled the train step (compile_s: teye's compile phase, in no
share), taken out of train_s before any share or training time is compared.

Printed per cell, medians over the repeats (run in rounds: every cell once, then again, so a neighbour's
load falls on all cells alike): teye's training share of data_wait (data_wait / (data_wait + compute),
from its cumulative phase seconds) against the script's (wait_s / train_s, and (wait_s + collate_s) /
train_s; and between_s / train_s), the differences in points and the largest over the repeats; the
steps and samples teye counted against what the script trained (and in how many repeats both were
equal); teye's eval seconds against the script's eval_s; teye's training time (data_wait + compute)
against train_s; and the verdict teye gave (kind/cause, the commonest).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.client.helpers import HERE, LiveAgent, base_env, last_json, teye_run  # noqa: E402

FRAMEWORKS = {
    "torch": ("plain PyTorch loop", "torch_eval.py"),
    "hf": ("Hugging Face Trainer", "hf_trainer.py"),
    "lightning": ("Lightning Trainer", "lightning_job.py"),
    "light-w2": ("Lightning Trainer, 2 DataLoader workers", "lightning_job.py"),
    "keras": ("Keras Model.fit", "keras_eval.py"),
    "tf": ("TensorFlow custom loop", "tf_eval_loop.py"),
}
EXTRA = {"loaders": ("torch_loaders.py", ["ab", "ba", "zip", "three", "alt", "cycle", "val"]),
         "exit": ("torch_exit.py", ["fork", "pool-fork", "pool-forkserver", "pool-spawn", "pool-fork-with"])}
ENV = {"OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}


def command(fw: str, steps: int, every: int, fast: bool, tmp: str) -> list:
    args = [sys.executable, os.path.join(HERE, FRAMEWORKS[fw][1]), str(steps), str(every)]
    if fw == "hf":
        args.append(os.path.join(tmp, "out"))
    if fw == "light-w2":
        args += ["--workers", "2"]
    return args + (["--fast"] if fast else [])


def _under_teye(make_args, job: str):
    """Run make_args(tempdir) under `teye run` beside a live agent: (the script's own figures, teye's job),
    or ({"error": ...}, None) when the script failed or teye saw no job."""
    d = tempfile.mkdtemp(prefix="teye-fw-")
    agent = LiveAgent(d)
    try:
        r = teye_run(make_args(d), socket_path=agent.path, job=job, env=base_env(**ENV), timeout=600)
        if r.returncode != 0:
            return {"error": f"exit {r.returncode}: {r.stderr.strip()[-300:]}"}, None
        own = last_json(r.stdout)
        j = agent.jobs().get(job)
    finally:
        agent.close()
    if j is None:
        return {"error": "teye saw no job"}, None
    return own, j


def one_run(fw: str, steps: int, every: int, fast: bool, job: str) -> dict:
    """One run of one cell: the script's own figures and teye's, or {"error": ...}."""
    own, j = _under_teye(lambda d: command(fw, steps, every, fast, d), job)
    if j is None:
        return own
    ph = dict(j.phase_seconds)
    train = ph.get("data_wait", 0.0) + ph.get("compute", 0.0)
    verdict = j.verdict.kind + (f"/{j.verdict.cause}" if j.verdict.cause else "")
    # torch_eval.py times the whole next(loader) (collate included); the others time __getitem__ and, apart,
    # their training loader's collate function; keras_eval.py its map and, apart, the eager fetch's own cost
    own_all = own["wait_s"] + own.get("collate_s", own.get("fetch_s", 0.0))
    gap = own.get("between_s")   # lightning_job.py: between training batches, an upper bound of the wait
    # keras_eval.py and tf_eval_loop.py time the calls that traced and compiled their step (compile_s): teye's
    # compile phase, in no share and not in its training time (docs/phases.md)
    steps_s = own["train_s"] - own.get("compile_s", 0.0)
    return {"own_share": own["wait_s"] / steps_s, "own_all_share": own_all / steps_s,
            "own_gap_share": float("nan") if gap is None else gap / steps_s,
            "teye_share": ph.get("data_wait", 0.0) / train if train else float("nan"),
            "own_steps": own["steps"], "own_samples": own["samples"], "teye_steps": j.steps,
            "teye_samples": j.samples or 0, "own_eval": own["eval_s"], "teye_eval": ph.get("eval", 0.0),
            "own_train": steps_s, "teye_train": train, "verdict": verdict}


def extra_run(kind: str, mode: str, job: str) -> dict:
    """One run of a loaders or exit row: the script's own figures and teye's, or {"error": ...}."""
    script, _ = EXTRA[kind]
    own, j = _under_teye(lambda d: [sys.executable, os.path.join(HERE, script), mode, "30"], job)
    if j is None:
        return own
    ph = dict(j.phase_seconds)
    train = ph.get("data_wait", 0.0) + ph.get("compute", 0.0)
    return {"own_share": own["wait_s"] / own["train_s"] if "wait_s" in own else float("nan"),
            "teye_share": ph.get("data_wait", 0.0) / train if train else float("nan"),
            "own_steps": own["steps"], "teye_steps": j.steps, "own_samples": own.get("read", own["samples"]),
            "teye_samples": j.samples or 0, "own_eval": own.get("eval_s", 0.0), "teye_eval": ph.get("eval", 0.0),
            "verdict": j.verdict.kind + (f"/{j.verdict.cause}" if j.verdict.cause else "")}


def extra_row(kind: str, mode: str, runs: list, errors: list) -> str:
    label = f"{kind:7} {mode:15}"
    if not runs:
        return f"{label} failed: {errors[0] if errors else '?'}"
    verdict = collections.Counter(r["verdict"] for r in runs).most_common(1)[0][0]
    out = (f"{label} {_pct(_med(runs, 'teye_share')):>6} {_pct(_med(runs, 'own_share')):>6}  "
           f"{_med(runs, 'teye_steps'):5.0f}/{_med(runs, 'own_steps'):<5.0f} "
           f"{_med(runs, 'teye_samples'):5.0f}/{_med(runs, 'own_samples'):<5.0f}  "
           f"{_med(runs, 'teye_eval'):6.3f} {_med(runs, 'own_eval'):6.3f}  {verdict}")
    if errors:
        out += f"  ({len(errors)} failed: {errors[0]})"
    return out


def extras(kinds: list, repeats: int) -> None:
    rows = [(k, m) for k in kinds for m in EXTRA[k][1]]
    results = {r: ([], []) for r in rows}
    t0 = time.monotonic()
    for rep in range(repeats):
        for k, m in rows:
            r = extra_run(k, m, f"{k}-{m}-{rep}")
            runs, errors = results[(k, m)]
            (errors if "error" in r else runs).append(r.get("error", r))
        print(f"  round {rep + 1} of {repeats} done ({time.monotonic() - t0:.0f} s)", flush=True)
    print(f"\n{'':23} {'share %':^13}  {'steps':^11} {'samples':^11}  {'eval s':^13}  verdict")
    print(f"{'row':23} {'teye':>6} {'own':>6}  {'teye/own':^11} {'teye/own':^11}  {'teye':>6} {'own':>6}")
    for k, m in rows:
        print(extra_row(k, m, *results[(k, m)]))
    print(f"\nmedians of {repeats}; own eval: the probe and validation passes are not in it for loaders (the probe "
          f"is a few ms); own samples: what the loops read from their loaders")


def _pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:.1f}"


def _med(runs, key):
    return statistics.median(r[key] for r in runs)


def row(fw: str, fast: bool, every: int, runs: list, errors: list) -> str:
    label = f"{fw:9} {'fast' if fast else 'slow':4} {'every ' + str(every) if every else 'none':8}"
    if not runs:
        return f"{label} failed: {errors[0] if errors else '?'}"
    diffs = [100 * (r["teye_share"] - r["own_share"]) for r in runs]
    diffs_all = [100 * (r["teye_share"] - r["own_all_share"]) for r in runs]
    equal = sum(r["teye_steps"] == r["own_steps"] and r["teye_samples"] == r["own_samples"] for r in runs)
    verdict = collections.Counter(r["verdict"] for r in runs).most_common(1)[0][0]
    out = (f"{label} {100 * _med(runs, 'teye_share'):6.1f} {100 * _med(runs, 'own_share'):6.1f} "
           f"{statistics.median(diffs):+6.1f} {max(diffs, key=abs):+6.1f} {100 * _med(runs, 'own_all_share'):6.1f} "
           f"{statistics.median(diffs_all):+6.1f} {max(diffs_all, key=abs):+6.1f} "
           f"{_pct(_med(runs, 'own_gap_share')):>6}  "
           f"{_med(runs, 'teye_steps'):5.0f}/{_med(runs, 'own_steps'):<5.0f} "
           f"{_med(runs, 'teye_samples'):5.0f}/{_med(runs, 'own_samples'):<5.0f} {equal}/{len(runs)}  "
           f"{_med(runs, 'teye_eval'):6.2f} {_med(runs, 'own_eval'):6.2f}  "
           f"{_med(runs, 'teye_train'):6.2f} {_med(runs, 'own_train'):6.2f}  {verdict}")
    if errors:
        out += f"  ({len(errors)} failed: {errors[0]})"
    return out


def versions() -> str:
    out = []
    for mod in ("torch", "transformers", "lightning", "tensorflow", "keras"):
        try:
            out.append(f"{mod} {__import__(mod).__version__}")
        except ImportError:
            out.append(f"{mod} not installed")
    return ", ".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40, help="training steps of the slow (input-bound) cells")
    ap.add_argument("--fast-steps", type=int, default=200, help="training steps of the fast cells")
    ap.add_argument("--only", default=",".join(FRAMEWORKS), help="frameworks, comma-separated")
    args = ap.parse_args()
    fws = [f for f in args.only.split(",") if f and f not in EXTRA]
    kinds = [f for f in args.only.split(",") if f in EXTRA]
    if kinds and not fws:
        print(f"{versions()}; {os.cpu_count()} CPUs, one thread per pool; {args.repeats} repeats")
        extras(kinds, args.repeats)
        return 0
    for f in fws:
        if f not in FRAMEWORKS:
            ap.error(f"--only: unknown framework {f!r} (known: {', '.join(FRAMEWORKS)})")
    cells = [(fw, fast, ev) for fw in fws for fast in (False, True) for ev in (True, False)]
    results = {c: ([], []) for c in cells}
    print(f"{versions()}; {os.cpu_count()} CPUs, one thread per pool; {args.repeats} repeats; slow cells "
          f"{args.steps} steps, fast cells {args.fast_steps} steps; evaluation every steps/4")
    t0 = time.monotonic()
    for rep in range(args.repeats):
        for fw, fast, ev in cells:
            steps = args.fast_steps if fast else args.steps
            every = steps // 4 if ev else 0
            r = one_run(fw, steps, every, fast, f"{fw}-{'fast' if fast else 'slow'}-{every}-{rep}")
            runs, errors = results[(fw, fast, ev)]
            (errors if "error" in r else runs).append(r.get("error", r))
        print(f"  round {rep + 1} of {args.repeats} done ({time.monotonic() - t0:.0f} s)", flush=True)
    print()
    print(f"{'':9} {'':4} {'eval':8} {'training share %':^55}  {'steps':^11} {'samples':^11} {'eq':3}  "
          f"{'eval s':^13}  {'train s':^13}  verdict")
    print(f"{'framework':9} {'in':4} {'':8} {'teye':>6} {'own':>6} {'diff':>6} {'max':>6} {'own+c':>6} {'diff':>6} "
          f"{'max':>6} {'gap':>6}  {'teye/own':^11} {'teye/own':^11} {'':3}  {'teye':>6} {'own':>6}  {'teye':>6} "
          f"{'own':>6}")
    for fw, fast, ev in cells:
        steps = args.fast_steps if fast else args.steps
        print(row(fw, fast, steps // 4 if ev else 0, *results[(fw, fast, ev)]))
    print(f"\n{len(cells) * args.repeats} runs in {time.monotonic() - t0:.0f} s. share: data_wait / (data_wait + "
          f"compute) against the script's wait_s / train_s (own) and (wait_s + collate_s) / train_s (own+c: its "
          f"training loader's collate function timed too, keras_eval.py's eager fetch cost; torch_eval.py's wait_s "
          f"is the whole next(loader)), "
          f"points; gap: lightning_job.py's time between training batches (less validation) / train_s, an upper "
          f"bound of its input wait; diff: median, max: the largest over the repeats; eq: repeats where teye's "
          f"steps and samples both equal the script's")
    if kinds:
        extras(kinds, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
