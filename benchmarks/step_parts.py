"""The step's parts (issue 45): what they cost per training step, in one process, alternating.

    python benchmarks/step_parts.py [--rounds 15] [--steps 200]

Under `teye run`'s hook (this tree's teye_client, loaded here as the hook loads it), a PyTorch MLP (3 modules,
64-sample batches: the worst case, 0.7 ms steps on an idle core) and a small CNN (8 modules) train with the parts'
hooks in place and with them taken out (teye's entries removed from PyTorch's global hook tables, the backward
and copy wrappers swapped for what they wrap), alternating every ``--steps`` steps, ``--rounds`` times each.
Printed: the median process CPU time per step (µs) of each, their difference (what the parts cost a step), and
the wall time likewise.  CPU time is the figure a loaded machine disturbs least; compare within one run.
The rest of the zero-code session (input waits, steps) is in place in both: its cost is benchmarks/zero_code.py's.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    os.environ.setdefault("TEYE_PHASE_SOCKET", "/nonexistent/teye-bench.sock")   # nothing sent: the client's cost
    from teye_client import auto
    auto.install()
    import torch
    import torch.nn.modules.module as mm
    import torch.optim.optimizer as oo
    from torch.utils.data import DataLoader, TensorDataset
    from teye_client import _torch
    torch.manual_seed(0)
    torch.set_num_threads(1)

    teye_pre = {k: v for k, v in mm._global_forward_pre_hooks.items() if getattr(v, "_teye", False)}
    teye_post = {k: v for k, v in mm._global_forward_hooks.items() if getattr(v, "_teye", False)}
    teye_opt = {k: v for k, v in oo._global_optimizer_pre_hooks.items() if getattr(v, "_teye", False)}
    wrapped = {"backward": torch.autograd.backward, "to": torch.Tensor.to, "cuda": torch.Tensor.cuda}
    assert teye_pre and teye_post and teye_opt and all(getattr(f, "_teye", False) for f in wrapped.values()), \
        "the parts' hooks are not installed (TEYE_STEP_PARTS=0?)"

    def parts(on: bool):
        for table, mine in ((mm._global_forward_pre_hooks, teye_pre), (mm._global_forward_hooks, teye_post),
                            (oo._global_optimizer_pre_hooks, teye_opt)):
            for k, v in mine.items():
                if on:
                    table[k] = v
                else:
                    table.pop(k, None)
        always = mm._global_forward_hooks_always_called
        for k in teye_post:
            if on:
                always[k] = True
            else:
                always.pop(k, None)
        torch.autograd.backward = wrapped["backward"] if on else wrapped["backward"].__wrapped__
        torch.Tensor.to = wrapped["to"] if on else wrapped["to"].__wrapped__
        torch.Tensor.cuda = wrapped["cuda"] if on else wrapped["cuda"].__wrapped__

    models = {
        "mlp": (torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)),
                TensorDataset(torch.randn(64 * args.steps, 32), torch.randn(64 * args.steps, 1)),
                torch.nn.functional.mse_loss),
        "cnn": (torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                    torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                    torch.nn.Flatten(), torch.nn.Linear(32 * 8 * 8, 10)),
                TensorDataset(torch.randn(64 * args.steps // 4, 3, 32, 32), torch.randint(0, 10, (64 * args.steps // 4,))),
                torch.nn.functional.cross_entropy),
    }
    for name, (model, ds, lossf) in models.items():
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        cpu = {True: [], False: []}
        wall = {True: [], False: []}
        for r in range(args.rounds + 1):
            for on in (False, True):
                parts(on)
                t, c, n = time.perf_counter(), time.process_time(), 0
                for x, y in DataLoader(ds, batch_size=64):
                    loss = lossf(model(x), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    n += 1
                if r:   # the first round warms up
                    cpu[on].append((time.process_time() - c) / n * 1e6)
                    wall[on].append((time.perf_counter() - t) / n * 1e6)
        parts(True)
        off, on_ = statistics.median(cpu[False]), statistics.median(cpu[True])
        woff, won = statistics.median(wall[False]), statistics.median(wall[True])
        print(f"{name}: CPU per step, median of {args.rounds} alternating rounds of {n} steps: parts off {off:.0f} µs, "
              f"on {on_:.0f} µs ({on_ - off:+.1f} µs, {100 * (on_ / off - 1):+.1f} %); wall {woff:.0f} vs {won:.0f} µs "
              f"({won - woff:+.1f} µs)", flush=True)
    # the forward alone, where the hooks' share is largest: 2,000 calls of the MLP's forward (4 module calls, the
    # global hooks on each), alternating, process CPU per call
    model = models["mlp"][0]
    x = torch.randn(64, 32)
    per = {True: [], False: []}
    for r in range(args.rounds + 1):
        for on in (False, True):
            parts(on)
            c = time.process_time()
            for _ in range(2000):
                model(x)
            if r:
                per[on].append((time.process_time() - c) / 2000 * 1e6)
    parts(True)
    off, on_ = statistics.median(per[False]), statistics.median(per[True])
    print(f"mlp forward alone (4 module calls), CPU per call, median of {args.rounds} rounds of 2,000: parts off "
          f"{off:.1f} µs, on {on_:.1f} µs ({on_ - off:+.1f} µs)", flush=True)
    s = _torch.session
    print("parts sent by the session:", "yes" if s.reporter is not None else "no reporter (no agent)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
