"""An unmodified PyTorch loop whose step parts have known costs (issue 45), timed by its own clock.

    python torch_parts.py MODE STEPS

Each step: a batch from a DataLoader; a forward through a model whose inner module sleeps FWD_S (nested
modules: only the outermost counts); a loss whose autograd Function sleeps BWD_S in its backward; an
optimizer whose step sleeps OPT_S; a little Python between them (other).  The script measures each part
around its own calls (perf_counter) and prints, last, one JSON line: the seconds of each part and of
compute (the step less its next()), as the script's own clock saw them.

MODE: plain; hooks (the user registers forward hooks of their own); eval (a no_grad evaluation forward
per step, which is not the training forward); accum (two forwards and backwards per optimizer step); gan
(a second optimizer stepped every other step, and a scheduler); raise (a backward that raises every 5th
step, caught by the loop); custom (an optimizer class of its own, not torch.optim's: no steps);
leak N (keeps N bytes per step alive: the memory grows by N a step); cache N (fills a cache of 20 N once,
by step 20); saw N (grows by N a step and frees it all every 10 steps); traceml (plain, each step marked with
TraceML's trace_step, for benchmarks/traceml_side.py).  The JSON line also gives the loop's wall time (loop_s).
"""
import atexit
import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

FWD_S, BWD_S, OPT_S, GAP_S = 0.006, 0.009, 0.004, 0.002
torch.manual_seed(0)
mode = sys.argv[1]
steps = int(sys.argv[2])
extra = int(sys.argv[3]) if len(sys.argv) > 3 else 0
clock = time.perf_counter
rank = 0
if mode == "ddp":
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    FWD_S += 0.012 * rank   # rank 1 computes longer: rank 0 waits for it in the gradient exchange


class Slow(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 1)

    def forward(self, x):
        time.sleep(FWD_S)
        return self.lin(x)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Slow()
        self.act = torch.nn.Identity()

    def forward(self, x):
        return self.act(self.inner(x))


class SlowBackward(torch.autograd.Function):
    fail = False
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        time.sleep(BWD_S)
        if mode == "raise" and SlowBackward.fail:
            raise RuntimeError("backward failed on purpose")
        return g


class SlowSGD(torch.optim.SGD):
    def step(self, closure=None):
        time.sleep(OPT_S)
        return super().step(closure)


class OwnOptimizer:
    """Not a torch.optim.Optimizer: PyTorch's hooks never see it."""

    def __init__(self, params, lr):
        self.params, self.lr = list(params), lr

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def step(self):
        time.sleep(OPT_S)
        with torch.no_grad():
            for p in self.params:
                p -= self.lr * p.grad


model = Model()
if mode == "ddp":
    model = DistributedDataParallel(model)
if mode == "hooks":
    calls = [0]
    model.register_forward_hook(lambda m, a, o: calls.__setitem__(0, calls[0] + 1))
    model.inner.register_forward_pre_hook(lambda m, a: None)
opt = OwnOptimizer(model.parameters(), 0.05) if mode == "custom" else SlowSGD(model.parameters(), lr=0.05)
if mode == "gan":
    critic = torch.nn.Linear(1, 1)
    opt2 = SlowSGD(critic.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3)
data = TensorDataset(torch.randn(steps * 16, 8), torch.randn(steps * 16, 1))
if mode == "ddp":
    from torch.utils.data import DistributedSampler
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
else:
    loader = DataLoader(data, batch_size=8)
it = iter(loader)
own = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0, "compute": 0.0, "steps": 0}
kept, cache = [], []


def fwd_bwd(x, y, fail=False):
    t = clock()
    out = model(x)
    own["forward"] += clock() - t
    time.sleep(GAP_S)
    loss = SlowBackward.apply(((out - y) ** 2).mean())
    t = clock()
    try:
        SlowBackward.fail = fail
        loss.backward()
    except RuntimeError:
        pass
    own["backward"] += clock() - t
    return loss


if mode == "traceml":   # plain, its steps marked as TraceML 0.5 needs in a loop of one's own (benchmarks/traceml_side.py)
    import traceml_ai as traceml
    traceml.init(mode="auto")
    marked = lambda: traceml.trace_step(model)  # noqa: E731
else:
    import contextlib
    marked = contextlib.nullcontext
t_end = None
loop_t0 = clock()
for i in range(steps):
    t0 = clock()
    x, y = next(it)
    t1 = clock()
    if t_end is not None:
        own["compute"] += t0 - t_end     # the loop's own time between the step's end and next()
    with marked():
        opt.zero_grad()
        loss = fwd_bwd(x, y, fail=(mode == "raise" and i % 5 == 4))
        if mode == "accum":
            t2 = clock()
            x2, y2 = next(it)
            own["compute"] -= clock() - t2   # a wait, not compute
            loss = fwd_bwd(x2, y2)
        if mode == "eval":
            with torch.no_grad():
                time.sleep(0.0)
                model(x)
        t = clock()
        opt.step()
        own["optimizer"] += clock() - t
    if i > 0:
        own["optimizer_rest"] = own.get("optimizer_rest", 0.0) + clock() - t
    if mode == "gan" and i % 2 == 1:
        opt2.zero_grad()
        critic(loss.detach().reshape(1, 1)).sum().backward()
        t = clock()
        opt2.step()
        own["optimizer"] += clock() - t
        own["optimizer_rest"] += clock() - t
    if mode == "gan":
        sched.step()
    if mode == "leak":
        kept.append(b"\x01" * extra)      # written, so resident
    elif mode == "cache" and i < 20:
        cache.append(b"\x01" * extra)
    elif mode == "saw":
        kept.append(b"\x01" * extra)
        if len(kept) == 10:
            kept.clear()
    if mode in ("leak", "cache", "saw") and i + 1 in (20, steps):
        print("paused", i + 1, flush=True)   # the test reads the memory series here
        sys.stdin.readline()
    t_end = clock()
    own["compute"] += t_end - t1
    own["steps"] += 1
    # one write (a print of several values is several under PYTHONUNBUFFERED=1: ranks' pieces interleave, and
    # the other rank's JSON line can follow a piece of this one's; CI lost rank 0's so)
    sys.stdout.write("step %d %d %.8f\n" % (rank, i, loss.item()))
    sys.stdout.flush()
own["rank"] = rank
own["loop_s"] = clock() - loop_t0
# teye's hooks left in PyTorch's global module hook tables (none once they narrowed to the model: the test's check
# that the parts it asserts were timed through the narrowed hooks; the script reads, never changes, the tables)
_mm = torch.nn.modules.module
own["global_forward_hooks"] = sum(1 for t in (_mm._global_forward_pre_hooks, _mm._global_forward_hooks)
                                  for f in t.values() if getattr(f, "_teye", False))
sys.stdout.write(json.dumps(own) + "\n")   # one write: ranks' lines stay whole
sys.stdout.flush()
if mode == "ddp":
    dist.barrier()
    atexit._run_exitfuncs()   # (gloo's teardown aborts now and then, with or without teye: torch_ddp.py)
    os._exit(0)
