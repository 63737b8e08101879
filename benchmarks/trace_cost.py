"""What `teye trace --train-job` costs a job (issue 46): its steps with and without a trace, alternating.

    python benchmarks/trace_cost.py [--rounds 6] [--steps 5] [--model mlp|cnn|tf-cnn]

One process under teye's zero-code hook (this tree's teye_client, loaded as the hook loads it) trains a small
PyTorch model on CPU (single thread), each step timed by its own perf_counter; ``tf-cnn``: a TensorFlow custom
loop instead (a tf.function applying a Keras optimizer to the same convolutional model, batches taken eagerly
from a tf.data iterator over tensors in memory, one intra- and one inter-op thread), traced by TensorFlow's
profiler (teye_client/_tftrace.py: the size per step counts the XSpace and its Chrome conversion).  Rounds alternate: in a traced
round the script asks for a trace of ``--steps`` steps after its 10th step, as `teye trace` does (the same
request file, agent/trace/request.py), and the hook takes it at its next look; in an untraced round nothing is
asked.  Each round's step times are read at the same step numbers as the traced round's: the step at whose
end the profiler starts, the warm-up step, the traced steps, the last traced step (the profiler's stop runs at its end), the step
that writes the trace, and the 20 steps after.  Printed: the median of each against the untraced rounds', their
ratio, and the trace's size per step.  The request watch itself (a stat every 250 ms) is in both.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6, help="rounds of each kind (traced, untraced)")
    ap.add_argument("--steps", type=int, default=5, help="steps traced")
    ap.add_argument("--model", choices=("mlp", "cnn", "tf-cnn"), default="mlp")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="teye-trace-bench-")
    reqdir, out = os.path.join(tmp, "req"), os.path.join(tmp, "out")
    os.mkdir(out, 0o700)
    os.environ["TEYE_TRACE_REQUESTS"] = reqdir
    os.environ.setdefault("TEYE_PHASE_SOCKET", "/nonexistent/teye-bench.sock")   # nothing sent: the job's cost
    os.environ["TEYE_TRAIN_JOB"] = "trace_bench"
    from teye_client import auto
    auto.install()
    from agent.trace import request
    if args.model == "tf-cnn":
        hook, batches, train = _tf_loop()
    else:
        hook, batches, train = _torch_loop(args.model)
    return _measure(args, hook, batches, train, request, reqdir, out)


def _tf_loop():
    import numpy as np
    import tensorflow as tf
    import keras
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.utils.set_random_seed(0)
    rng = np.random.RandomState(0)
    data = tf.data.Dataset.from_tensor_slices((rng.rand(2048, 32, 32, 3).astype("float32"),
                                               rng.randint(0, 10, 2048))).batch(64)
    model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(16, 3, activation="relu"),
                              keras.layers.Conv2D(16, 3, activation="relu"), keras.layers.Flatten(),
                              keras.layers.Dense(10)])
    opt = keras.optimizers.SGD(0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    from teye_client import _tf
    return _tf, lambda: iter(data), lambda batch: step(*batch)


def _torch_loop(name):
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if name == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
        data = TensorDataset(torch.randn(4096, 256), torch.randint(0, 10, (4096,)))
    else:
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 3),
                                    torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(16 * 28 * 28, 10))
        data = TensorDataset(torch.randn(2048, 3, 32, 32), torch.randint(0, 10, (2048,)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    from teye_client import _torch

    def train(batch):
        x, y = batch
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    return _torch, lambda: iter(DataLoader(data, batch_size=64, shuffle=False)), train


def _measure(args, hook, batches, train, request, reqdir, out):
    def run_round(traced: bool, steps: int = 0):
        """A traced round runs until 20 steps after the trace was written; an untraced one ``steps`` steps."""
        times, req, base = [], None, 0
        it = batches()
        last = time.perf_counter()
        n, taken = 0, False
        while True:
            n += 1
            t = hook.trace_hook.tracer
            taken = taken or (t is not None and t.req is not None)
            if not traced and n > steps or traced and taken and t.req is None and n > t.first_step - base + args.steps + 21:
                break
            try:
                batch = next(it)
            except StopIteration:
                it = batches()
                batch = next(it)
            train(batch)
            now = time.perf_counter()
            times.append(now - last)
            last = now
            if traced and n == 10:
                base = hook.trace_hook.step_n - n   # (the hook counts steps since the process's first)
                if hook.trace_hook.tracer is not None:
                    hook.trace_hook.tracer.first_step = None
                req = request.write_request("trace_bench", os.geteuid(), args.steps, out, None, 0.0, 60.0,
                                            directory=reqdir)
        status = None
        if req is not None:
            got = request.statuses(req, "trace_bench")
            request.withdraw(req, "trace_bench")
            status = next(iter(got.values()), None)
            if status is not None and status.get("first_step") is not None:
                status["first_step"] -= base   # this round's step number
        return times, status

    run_round(False, 50)   # warm: the first steps' allocations
    rows = {"starting step": [], "warm-up step": [], "traced steps": [], "last traced step": [], "writing step": [], "20 steps after": []}
    base = {k: [] for k in rows}
    sizes = []
    for r in range(args.rounds):
        times, st = run_round(True)
        if st is None or st.get("state") != "done":
            print(f"round {r}: the trace did not complete: {st}", file=sys.stderr)
            return 1
        f, n = st["first_step"], args.steps
        idx = {"starting step": [f - 2], "warm-up step": [f - 1], "traced steps": list(range(f, f + n - 1)), "last traced step": [f + n - 1],
               "writing step": [f + n], "20 steps after": list(range(f + n + 1, f + n + 21))}
        plain, _ = run_round(False, len(times))
        for k, ix in idx.items():
            rows[k] += [times[i - 1] for i in ix]
            base[k] += [plain[i - 1] for i in ix]
        files = [st["trace"]] + list(st.get("raw") or ())
        sizes.append(sum(os.path.getsize(f) for f in files) / n)
        for f in files:
            os.unlink(f)
    print(f"teye trace cost: {args.model}, {args.rounds} traced and {args.rounds} untraced rounds alternating, "
          f"{args.steps} steps traced; median step time (ms), traced against untraced, at the same step numbers")
    print(f"{'':20} {'traced':>10} {'untraced':>10} {'ratio':>8}")
    for k in rows:
        a, b = statistics.median(rows[k]) * 1e3, statistics.median(base[k]) * 1e3
        print(f"{k:20} {a:10.2f} {b:10.2f} {a / b:8.2f}")
    print(f"trace size per step: median {statistics.median(sizes) / 1024:.0f} KiB")
    print(json.dumps({"rows": {k: [statistics.median(rows[k]), statistics.median(base[k])] for k in rows},
                      "bytes_per_step": statistics.median(sizes)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
