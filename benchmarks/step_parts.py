"""The step's parts (issue 45): what they cost per training step, in one process, alternating.

    python benchmarks/step_parts.py [--rounds 15] [--steps 200]

Under `teye run`'s hook (this tree's teye_client, loaded here as the hook loads it), a PyTorch MLP (3 modules,
64-sample batches: the worst case, 0.7 ms steps on an idle core), a small CNN (8 modules) and a deep MLP (80
small layers: 161 module calls a forward, as many as ResNet-50's) train in three states, alternating every
``--steps`` steps, ``--rounds`` times each: the parts' hooks taken out (no forward hook, the backward and copy
wrappers swapped for what they wrap: "off"), the forward seen through PyTorch's global module hooks ("global":
every module call takes nn.Module's slow path, as during a job's first steps) and through hooks on the model
alone ("narrowed": what teye does after the first steps, teye_client._torch._Forwards).  Printed: the median
process CPU time per step (µs) of each, the differences (what the parts cost a step), and the wall time likewise.
CPU time is the figure a loaded machine disturbs least; compare within one run.
The rest of the zero-code session (input waits, steps) is in place in both: its cost is benchmarks/zero_code.py's.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import weakref

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


STATES = ("off", "global", "narrowed")


def _switch(torch, mm, oo, _torch):
    """parts(state, model): the parts' hooks off, global (learning, held there) or narrowed (to ``model``)."""
    fw = _torch.forwards
    teye_opt = {k: v for k, v in oo._global_optimizer_pre_hooks.items() if getattr(v, "_teye", False)}
    wrapped = {"backward": torch.autograd.backward, "to": torch.Tensor.to, "cuda": torch.Tensor.cuda}
    assert fw is not None and teye_opt and all(getattr(f, "_teye", False) for f in wrapped.values()), \
        "the parts' hooks are not installed (TEYE_STEP_PARTS=0?)"
    learn = _torch.NARROW_AFTER
    assert any(getattr(v, "_teye", False) for v in mm._global_forward_pre_hooks.values())

    def parts(state: str, model=None):
        for h in fw.handles:
            h.remove()
        fw.handles, fw.narrowed, fw.steps, fw.roots = (), False, 0, {}
        on = state != "off"
        _torch.NARROW_AFTER = 10 ** 9 if state == "global" else learn
        if state == "global":
            fw.install_global()
        elif state == "narrowed":
            fw.roots = {id(model): weakref.ref(model)}
            fw._narrow()
            assert fw.narrowed
        for k, v in teye_opt.items():
            if on:
                oo._global_optimizer_pre_hooks[k] = v
            else:
                oo._global_optimizer_pre_hooks.pop(k, None)
        torch.autograd.backward = wrapped["backward"] if on else wrapped["backward"].__wrapped__
        torch.Tensor.to = wrapped["to"] if on else wrapped["to"].__wrapped__
        torch.Tensor.cuda = wrapped["cuda"] if on else wrapped["cuda"].__wrapped__

    return parts


def _models(torch, TensorDataset, steps: int) -> dict:
    """name -> (model, dataset, loss function)."""
    nn = torch.nn
    return {
        "mlp": (nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)),
                TensorDataset(torch.randn(64 * steps, 32), torch.randn(64 * steps, 1)), nn.functional.mse_loss),
        "cnn": (nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Flatten(), nn.Linear(32 * 8 * 8, 10)),
                TensorDataset(torch.randn(64 * steps // 4, 3, 32, 32), torch.randint(0, 10, (64 * steps // 4,))),
                nn.functional.cross_entropy),
        "deep": (nn.Sequential(*[m for _ in range(80) for m in (nn.Linear(32, 32), nn.ReLU())]),
                 TensorDataset(torch.randn(64 * steps // 4, 32), torch.randn(64 * steps // 4, 32)),
                 nn.functional.mse_loss),
    }


def _train(name, model, ds, lossf, parts, rounds, torch, DataLoader, fw) -> None:
    """Training steps in each state, alternating; prints the medians."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cpu = {st: [] for st in STATES}
    wall = {st: [] for st in STATES}
    for r in range(rounds + 1):
        for st in STATES:
            parts(st, model)
            t, c, n = time.perf_counter(), time.process_time(), 0
            for x, y in DataLoader(ds, batch_size=64):
                loss = lossf(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                n += 1
            if st == "narrowed":
                assert fw.narrowed, "the hooks widened during the round"
            if r:   # the first round warms up
                cpu[st].append((time.process_time() - c) / n * 1e6)
                wall[st].append((time.perf_counter() - t) / n * 1e6)
    c = {st: statistics.median(v) for st, v in cpu.items()}
    w = {st: statistics.median(v) for st, v in wall.items()}
    print(f"{name}: CPU per step, median of {rounds} alternating rounds of {n} steps: parts off "
          f"{c['off']:.0f} µs; global hooks {c['global']:.0f} µs ({c['global'] - c['off']:+.1f} µs, "
          f"{100 * (c['global'] / c['off'] - 1):+.1f} %); narrowed {c['narrowed']:.0f} µs "
          f"({c['narrowed'] - c['off']:+.1f} µs, {100 * (c['narrowed'] / c['off'] - 1):+.1f} %); wall "
          f"{w['off']:.0f} / {w['global']:.0f} / {w['narrowed']:.0f} µs", flush=True)


def _forward_alone(model, parts, rounds, torch) -> None:
    """The forward alone, where the hooks' share is largest: the deep MLP's (161 module calls), alternating,
    process CPU per call."""
    x = torch.randn(64, 32)
    per = {st: [] for st in STATES}
    for r in range(rounds + 1):
        for st in STATES:
            parts(st, model)
            c0 = time.process_time()
            for _ in range(200):
                model(x)
            if r:
                per[st].append((time.process_time() - c0) / 200 * 1e6)
    m = {st: statistics.median(v) for st, v in per.items()}
    print(f"deep forward alone (161 module calls, autograd on), CPU per call, median of {rounds} rounds of 200: "
          f"parts off {m['off']:.1f} µs, global hooks {m['global']:.1f} µs ({m['global'] - m['off']:+.1f}), "
          f"narrowed {m['narrowed']:.1f} µs ({m['narrowed'] - m['off']:+.1f})", flush=True)


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
    parts = _switch(torch, mm, oo, _torch)
    models = _models(torch, TensorDataset, args.steps)
    for name, (model, ds, lossf) in models.items():
        _train(name, model, ds, lossf, parts, args.rounds, torch, DataLoader, _torch.forwards)
    _forward_alone(models["deep"][0], parts, args.rounds, torch)
    parts("narrowed", models["deep"][0])
    s = _torch.session
    print("parts sent by the session:", "yes" if s.reporter is not None else "no reporter (no agent)")
    return 0

if __name__ == "__main__":
    sys.exit(main())
