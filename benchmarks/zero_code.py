"""Zero-code phases: what they cost, side by side with the same thing without them (docs/zero-code.md).

    python benchmarks/zero_code.py [--rounds N] [--skip-tf]

1. interpreter start-up, `python -c pass`, with teye's sitecustomize directory first on PYTHONPATH and
   without: median of 20 alternating runs each (it runs in every Python process where it is enabled);
2. samples/s of a small PyTorch CNN and of a tiny MLP (0.7 ms steps: the worst case; DataLoader over
   tensors in memory, batch 64) and of the studies' CNN (workloads.train simple_cnn, tf.data),
   instrumented and not, alternating rounds, medians;
3. client CPU per step: the process's CPU time (all threads: the flush thread included) per step of
   the zero-code session (what the DataLoader wrapper and the optimizer hook call), batching on,
   sending to a live receiver in another process;
4. agent CPU per step: the receive thread's CPU (thread clock) for the batched datagrams the client
   sends (10 steps of 3 phases each: 100 ms of 10 ms steps), with the compiled helpers and without
   (TEYE_PURE_PYTHON=1), in fresh processes (benchmarks/_serve_cost.py with 10 steps per datagram);
5. Keras Model.fit: samples/s of the studies' CNN (simple_cnn, batch 64, tf.data in memory) under an
   unmodified fit, with zero-code phases and without, alternating rounds, medians; the fixed cost per
   step of teye's train function against Keras' own (a 1-unit model, alternating in one process, the
   figure a shared host's load disturbs least); and, for 3 input
   latencies (a tf.data map that waits 0, 20 and 60 ms per batch), teye's data_wait share over the
   profiled batches (the intervals a live phase receiver got) next to the TensorFlow profiler's
   input-pipeline analysis of the same batches (xprof, headless: workloads/tfprofile.py).
6. ``--parts [--main DIR]`` (issue 45): the cost of the step's parts per step, in µs: the PyTorch MLP and CNN
   loops' time per step (64 / samples per second) without teye, with the hook of DIR's tree (default
   /work/main: the same hook before the parts), with this tree's hook and its parts switched off
   (TEYE_STEP_PARTS=0), and with this tree's hook, alternating in each round, medians.
Figures move with this machine's load: compare within one run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
SITE = None  # made by make_site(): the layout deploy/install.sh installs, byte-compiled


def make_site(d: str) -> str:
    """sitecustomize.py + teye_client/*.py, byte-compiled, as deploy/install.sh installs them (a tree where
    __pycache__ cannot be written, or PYTHONDONTWRITEBYTECODE, would compile the hook at every start)."""
    import compileall
    import shutil
    site = os.path.join(d, "site")
    os.makedirs(os.path.join(site, "teye_client"))
    shutil.copy(os.path.join(ROOT, "teye_client", "_site", "sitecustomize.py"), site)
    for f in os.listdir(os.path.join(ROOT, "teye_client")):
        if f.endswith(".py"):
            shutil.copy(os.path.join(ROOT, "teye_client", f), os.path.join(site, "teye_client"))
    compileall.compile_dir(site, quiet=1)
    return site


def _env(on: bool, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEYE_")}
    env["PYTHONPATH"] = os.pathsep.join(([SITE] if on else []) + [ROOT])
    env.update(extra)
    return env


def startup(n: int = 20):
    times = {True: [], False: []}
    for _ in range(n):
        for on in (False, True):
            t = time.perf_counter()
            subprocess.run([PY, "-c", "pass"], env=_env(on), check=True)
            times[on].append(time.perf_counter() - t)
    return statistics.median(times[False]) * 1e3, statistics.median(times[True]) * 1e3


TORCH_LOOP = r"""
import sys, time, torch
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0); torch.set_num_threads(1)
if sys.argv[1] == "mlp":   # the worst case: 0.7 ms steps
    ds = TensorDataset(torch.randn(64 * 400, 32), torch.randn(64 * 400, 1))
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    lossf = torch.nn.functional.mse_loss
else:                      # a small CNN on CIFAR-shaped batches
    ds = TensorDataset(torch.randn(64 * 60, 3, 32, 32), torch.randint(0, 10, (64 * 60,)))
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                torch.nn.Flatten(), torch.nn.Linear(32 * 8 * 8, 10))
    lossf = torch.nn.functional.cross_entropy
opt = torch.optim.SGD(model.parameters(), lr=0.01)
n = 0
for epoch in range(2):
    if epoch == 1:
        t = time.perf_counter()
    for x, y in DataLoader(ds, batch_size=64):
        loss = lossf(model(x), y); opt.zero_grad(); loss.backward(); opt.step()
        n += len(x) if epoch else 0
print(n / (time.perf_counter() - t))
"""


def torch_rate(rounds: int, sock: str, model: str):
    out = {True: [], False: []}
    for _ in range(rounds):
        for on in (False, True):
            r = subprocess.run([PY, "-c", TORCH_LOOP, model], env=_env(on, TEYE_PHASE_SOCKET=sock),
                               capture_output=True, text=True, check=True)
            out[on].append(float(r.stdout.split()[-1]))
    return statistics.median(out[False]), statistics.median(out[True])


def cnn_rate(rounds: int, sock: str):
    out = {True: [], False: []}
    with tempfile.TemporaryDirectory() as d:
        for _ in range(rounds):
            for on in (False, True):
                res = os.path.join(d, "r.json")
                # --no-reporter: with its own Reporter the loop is that reporter's job, zero-code stands aside
                subprocess.run([PY, "-m", "workloads.train", "--model", "simple_cnn", "--batch-size", "64",
                                "--steps", "60", "--warmup-steps", "10", "--pipeline", "tfdata",
                                "--synthetic-samples", "2048", "--no-progress", "--no-reporter", "--results", res],
                               env=_env(on, TEYE_PHASE_SOCKET=sock), capture_output=True, check=True, cwd=ROOT)
                with open(res) as fh:
                    r = json.load(fh)
                out[on].append(_samples_per_s(r))
    return statistics.median(out[False]), statistics.median(out[True])


def _samples_per_s(r: dict) -> float:
    for k in ("samples_per_s", "samples_per_second"):
        if k in r:
            return float(r[k])
    s = r.get("summary") or {}
    for k in ("samples_per_second", "throughput"):
        if k in s:
            return float(s[k])
    raise KeyError(f"no samples/s in the results: {sorted(r)}")


FIT = r"""
import json, sys, time
import numpy as np
import tensorflow as tf
import keras
from workloads.models import loss_fn, simple_cnn
steps, warm, latency, prof = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:7]
B = 64
keras.utils.set_random_seed(0)
x = np.random.RandomState(0).rand(B * 8, 32, 32, 3).astype("float32")
y = np.random.RandomState(1).randint(0, 10, B * 8).astype("int32")
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(B).repeat()
if latency:
    def read(a):
        time.sleep(latency / 1000)
        return a
    ds = ds.map(lambda a, b: (tf.ensure_shape(tf.numpy_function(read, [a], tf.float32), a.shape), b))
model = simple_cnn()
model.compile(keras.optimizers.Adam(1e-3), loss_fn("simple_cnn"))
class Clock(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if batch == warm:
            self.t = time.perf_counter()
            self.c = time.process_time()
clock = Clock()
cbs = [clock]
if prof:
    from workloads.tfprofile import profile_callback
    cbs.append(profile_callback(prof[0], int(prof[1]), int(prof[2])))
model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=cbs)
wall, cpu = time.perf_counter() - clock.t, time.process_time() - clock.c
print(B * (steps - warm) / wall, 1000 * cpu / (steps - warm))
"""


FIT_CALL = r"""
import statistics, time
import numpy as np
import tensorflow as tf
import keras
keras.utils.set_random_seed(0)
x = np.random.RandomState(0).rand(64, 4).astype("float32")
ds = tf.data.Dataset.from_tensor_slices((x, x.sum(1, keepdims=True))).batch(8).repeat()
m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
m.compile("sgd", "mse")
m.fit(ds, steps_per_epoch=5, epochs=1, verbose=0)   # builds and traces the train function
teye_fn = m.train_function
keras_fn = teye_fn.__wrapped__                      # the function Keras made, behind teye's
it = iter(ds)
for f in (teye_fn, keras_fn):
    for _ in range(50):
        f(it)
res = {"keras": [], "teye": []}
for _ in range(15):
    for name, f in (("keras", keras_fn), ("teye", teye_fn)):
        t = time.perf_counter()
        for _ in range(200):
            f(it)
        res[name].append((time.perf_counter() - t) / 200 * 1e6)
print(statistics.median(res["keras"]), statistics.median(res["teye"]))
"""


def fit_call_cost(sock: str):
    """us per call of Keras' own train function and of teye's (a 1-unit Dense model: the fixed cost per step),
    alternating blocks of 200 calls in one process with zero-code phases on (teye's records go to sock)."""
    r = subprocess.run([PY, "-c", FIT_CALL], cwd=ROOT, capture_output=True, text=True, check=True,
                       env=_env(True, TEYE_PHASE_SOCKET=sock, TF_CPP_MIN_LOG_LEVEL="3"))
    keras_us, teye_us = map(float, r.stdout.split()[-2:])
    return keras_us, teye_us


def fit_rate(rounds: int, sock: str, steps: int = 150, warm: int = 20):
    """(samples/s, process CPU ms per step) of the studies' CNN under an unmodified Model.fit, medians, without
    zero-code phases and with.  CPU per step (all threads) moves less than wall time with a shared host's load."""
    out = {True: [], False: []}
    for _ in range(rounds):
        for on in (False, True):
            r = subprocess.run([PY, "-c", FIT, str(steps), str(warm), "0"], cwd=ROOT, capture_output=True,
                               text=True, check=True, env=_env(on, TEYE_PHASE_SOCKET=sock, TF_CPP_MIN_LOG_LEVEL="3"))
            out[on].append(tuple(map(float, r.stdout.split()[-2:])))
    med = lambda on, k: statistics.median(x[k] for x in out[on])  # noqa: E731
    return (med(False, 0), med(False, 1)), (med(True, 0), med(True, 1))


def fit_fidelity(latency_ms: float, d: str, steps: int = 16, first: int = 4, last: int = 13):
    """(teye's data_wait share, the profiler's input percent / 100, its class) over batches first..last."""
    sys.path.insert(0, ROOT)
    from agent.context import AgentContext
    from agent.config import defaults
    from agent.phases.source import PhaseSource
    from workloads.tfprofile import input_analysis
    sock = os.path.join(d, f"fit-{latency_ms:g}.sock")
    tb = os.path.join(d, f"tb-{latency_ms:g}")
    src = PhaseSource(defaults()["phases"], AgentContext(), socket_path=sock, record_intervals=8192)
    try:
        subprocess.run([PY, "-c", FIT, str(steps), "0", str(latency_ms), tb, str(first), str(last)], cwd=ROOT,
                       capture_output=True, text=True, check=True,
                       env=_env(True, TEYE_PHASE_SOCKET=sock, TEYE_TRAIN_JOB="fit", TF_CPP_MIN_LOG_LEVEL="3"))
        time.sleep(0.5)   # the client's last flush
        rec = list(src.table.recorded)
    finally:
        src.close()
    st = [(a, b) for j, p, a, b in rec if j == "fit" and p == "step"]
    lo, hi = st[first][0], st[last][1]
    wait = sum(min(b, hi) - max(a, lo) for j, p, a, b in rec if j == "fit" and p == "data_wait" and b > lo and a < hi)
    prof = input_analysis(tb)
    return wait / sum(b - a for a, b in st[first:last + 1]), prof["percent"] / 100, prof["class"]


CLIENT = r"""
import sys, time
from teye_client import auto
from teye_client.reporter import Reporter
s = auto.session
s.wait_source = "torch"
s.reporter = Reporter(train_job="bench", socket_path=sys.argv[1], source="torch")
ns = time.monotonic_ns
N = int(sys.argv[2])
def loop(n, instrumented):
    c = time.process_time()
    for i in range(n):
        t0 = ns(); t1 = ns()
        if instrumented:
            s.wait(t0, t1, 64); s.step(ns(), 1)
    return time.process_time() - c
loop(2000, True)
base = min(loop(N, False) for _ in range(3))
inst = min(loop(N, True) for _ in range(3))
s.reporter.close()
print((inst - base) / N * 1e6, s.reporter.sent, s.reporter.dropped)
"""


def client_cpu(sock: str, n: int = 200000):
    r = subprocess.run([PY, "-c", CLIENT, sock, str(n)], env=_env(False), capture_output=True, text=True, check=True)
    us, sent, dropped = r.stdout.split()
    return float(us), int(sent), int(dropped)


def agent_cpu(pure: bool):
    env = _env(False, **({"TEYE_PURE_PYTHON": "1"} if pure else {}))
    r = subprocess.run([PY, os.path.join(ROOT, "benchmarks", "_serve_cost.py"), ROOT, "7", "10"], env=env,
                       capture_output=True, text=True, check=True)
    path = "compiled" if "path: compiled" in r.stderr else "python"
    return float(r.stdout), path


class Drain:
    """A receiver in another process that reads and discards datagrams (a live agent's socket)."""

    def __init__(self, path: str):
        self.proc = subprocess.Popen([PY, "-c", "import socket,sys\ns=socket.socket(socket.AF_UNIX,socket.SOCK_DGRAM)\n"
                                      "s.bind(sys.argv[1])\nprint('ok',flush=True)\nwhile True: s.recv(65536)", path],
                                     stdout=subprocess.PIPE, text=True)
        self.proc.stdout.readline()

    def close(self):
        self.proc.kill()
        self.proc.wait()


def _fit_rows(rounds: int, sock: str, d: str) -> None:
    (base, base_cpu), (inst, inst_cpu) = fit_rate(rounds, sock)
    print(f"studies' CNN under Keras Model.fit (tf.data in memory) samples/s, median of {rounds}: "
          f"without {base:,.0f}, with {inst:,.0f} ({100 * (inst / base - 1):+.1f} %); process CPU per step: "
          f"without {base_cpu:.2f} ms, with {inst_cpu:.2f} ms ({100 * (inst_cpu / base_cpu - 1):+.1f} %)")
    keras_us, teye_us = fit_call_cost(sock)
    print(f"Model.fit train-function call, 1-unit Dense model (the fixed cost per step), median of 15 x 200 "
          f"calls alternating in one process: Keras' own {keras_us:.0f} us, teye's (timed fetch + Keras' "
          f"one-step function + the session's records) {teye_us:.0f} us ({teye_us - keras_us:+.0f} us a step; "
          f"{100 * (teye_us - keras_us) / 1000 / base_cpu:+.2f} % of the CNN's {base_cpu:.1f} ms CPU step)")
    for lat in (0, 20, 60):
        teye, prof, cls = fit_fidelity(lat, d)
        print(f"Model.fit input-bound share over the same 10 batches, map waiting {lat} ms a batch: "
              f"teye {100 * teye:.1f} %, TensorFlow profiler {100 * prof:.1f} % ({cls}); "
              f"difference {100 * (teye - prof):+.1f} points")


def parts_cost(rounds: int, sock: str, main_tree: str, d: str, models=("mlp", "cnn")):
    """Per-step µs of the torch loops: (model, {setting: median µs a step}) for the settings of --parts, one
    model at a time (a generator: each printed as it is measured)."""
    global ROOT
    here = ROOT
    try:
        ROOT = main_tree
        main_site = make_site(os.path.join(d, "main"))
    finally:
        ROOT = here
    settings = {
        "without teye": {"PYTHONPATH": ROOT},
        "main's hook": {"PYTHONPATH": os.pathsep.join([main_site, main_tree])},
        "this hook, parts off": {"PYTHONPATH": os.pathsep.join([SITE, ROOT]), "TEYE_STEP_PARTS": "0"},
        "this hook, parts on": {"PYTHONPATH": os.pathsep.join([SITE, ROOT])},
    }
    for model in models:
        got = {k: [] for k in settings}
        for _ in range(rounds):
            for name, extra in settings.items():
                env = {k: v for k, v in os.environ.items() if not k.startswith("TEYE_")}
                env.update(extra, TEYE_PHASE_SOCKET=sock)
                r = subprocess.run([PY, "-c", TORCH_LOOP, model], env=env, capture_output=True, text=True, check=True)
                got[name].append(64 / float(r.stdout.split()[-1]) * 1e6)
        yield model, {k: statistics.median(v) for k, v in got.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-tf", action="store_true")
    ap.add_argument("--fit-only", action="store_true", help="only the Keras Model.fit rows (5.)")
    ap.add_argument("--parts", action="store_true", help="only the step parts' cost per step (6.)")
    ap.add_argument("--main", default="/work/main", help="the tree whose hook --parts compares with")
    ap.add_argument("--models", default="mlp,cnn", help="--parts: the PyTorch loops to time (mlp, cnn)")
    args = ap.parse_args()
    global SITE
    d = tempfile.mkdtemp(prefix="teye-zc-bench-")
    SITE = make_site(d)
    sock = os.path.join(d, "phases.sock")
    drain = Drain(sock)
    try:
        if args.fit_only:
            _fit_rows(args.rounds, sock, d)
            return 0
        if args.parts:
            for model, us in parts_cost(args.rounds, sock, args.main, d, args.models.split(",")):
                base = us["without teye"]
                print(f"PyTorch {model}, µs a step, median of {args.rounds} alternating rounds: " + ", ".join(
                    f"{k} {v:.0f} ({v - base:+.0f})" for k, v in us.items())
                    + f"; the parts cost {us['this hook, parts on'] - us['this hook, parts off']:+.0f} µs a step",
                    flush=True)
            return 0
        off, on = startup()
        print(f"start-up `python -c pass`, median of 20: without {off:.1f} ms, with the hook {on:.1f} ms "
              f"(+{on - off:.1f} ms)")
        us, sent, dropped = client_cpu(sock)
        print(f"client CPU per step (zero-code session, batching on): {us:.2f} us "
              f"({sent} datagrams for 200,000+ steps, {dropped} records dropped)")
        c_us, c_path = agent_cpu(False)
        p_us, p_path = agent_cpu(True)
        print(f"agent CPU per step, batched datagrams of 10 steps: {c_us:.2f} us ({c_path}) vs {p_us:.2f} us "
              f"({p_path}); ratio {c_us / p_us:.2f}")
        try:
            import torch  # noqa: F401
            for model, what in (("cnn", "PyTorch small CNN"), ("mlp", "PyTorch MLP (0.7 ms steps, worst case)")):
                base, inst = torch_rate(args.rounds, sock, model)
                print(f"{what} samples/s, median of {args.rounds}: without {base:,.0f}, with {inst:,.0f} "
                      f"({100 * (inst / base - 1):+.1f} %)")
        except ImportError:
            print("PyTorch MLP: torch is not installed (the torch extra)")
        if not args.skip_tf:
            base, inst = cnn_rate(args.rounds, sock)
            print(f"studies' CNN (simple_cnn, tf.data) samples/s, median of {args.rounds}: without {base:,.0f}, "
                  f"with {inst:,.0f} ({100 * (inst / base - 1):+.1f} %)")
        if not args.skip_tf:
            _fit_rows(args.rounds, sock, d)
    finally:
        drain.close()
        import shutil
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
