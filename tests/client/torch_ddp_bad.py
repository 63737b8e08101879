"""A data-parallel script (gloo, CPU) for `torchrun`, used the way issue 37's bad inputs use DDP.

    torch_ddp_bad.py MODE[+MODE...] STEPS
      fp16hook:  DDP with PyTorch's fp16_compress_hook registered (register_comm_hook)
      pyhook:    DDP with a Python communication hook of the script's own (an async dist.all_reduce of the
                 bucket, divided by the world size in the future's callback)
      nosync:    gradient accumulation: 2 micro-batches per optimizer step, the first under model.no_sync()
      unused:    find_unused_parameters=True; one parameter never gets a gradient
      twice:     DDP(DDP(net)) (the job's own exception, whatever PyTorch says of it)
      static:    static_graph=True (unused+static: both)
      die:       rank 1 ends with os._exit(3) at step 5, between its forward and its backward
      mixed:     DDP, and the loss averaged for logging by an explicit dist.all_reduce every step
      timeout:   a process group made with a 3 s timeout; rank 1 sleeps 30 s before its backward at step 3 (the
                 others' exchange times out; torchrun then stops rank 1 with SIGTERM)
      ddp:       plain DDP (run with --nproc_per_node 1: world size 1, nothing to exchange)

Each rank prints one JSON line per step, {"rank", "step", "loss", "logged"} with the losses as float.hex()
(bit for bit), and its own wall-clock timing so far (the test's oracle, never teye's): bwd_s, its time in
backward() and the optimizer step; alone_s, the same on a copy of the model that exchanges nothing
(median of 15, times the backwards run); comm_s, its time in the explicit all_reduce (mixed); step_s, from
its first batch wait to this optimizer step.  A rank whose training loop raises prints {"rank",
"error": the exception's type, "message": its first line, digits as N} and raises it on.
"""
import atexit
import datetime
import json
import os
import re
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from tests.client.ddp_clock import alone_seconds

MODE, STEPS = set(sys.argv[1].split("+")), int(sys.argv[2])
BATCH = 4
ACCUM = 2 if "nosync" in MODE else 1
if "timeout" in MODE:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
else:
    dist.init_process_group("gloo")
RANK, WORLD = dist.get_rank(), dist.get_world_size()


def say(**kw):
    sys.stdout.write(json.dumps(dict(rank=RANK, **kw)) + "\n")  # one write: ranks' lines stay whole
    sys.stdout.flush()


class Data(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(4096, 16, generator=g), torch.randn(4096, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 64), torch.nn.Linear(64, 1)
        if "unused" in MODE:
            self.unused = torch.nn.Linear(64, 1)   # never in the forward: no gradient

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


data = Data()
loader = DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(data, shuffle=False))
torch.manual_seed(0)
net = Net()
alone = alone_seconds(net, data.x[:BATCH], data.y[:BATCH])  # tests/client/ddp_clock.py


def pyhook(state, bucket):
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].div_(WORLD))


try:
    if "twice" in MODE:
        model = DistributedDataParallel(DistributedDataParallel(net))
    else:
        model = DistributedDataParallel(net, find_unused_parameters="unused" in MODE, static_graph="static" in MODE)
    if "fp16hook" in MODE:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif "pyhook" in MODE:
        model.register_comm_hook(None, pyhook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    bwd = comm = 0.0
    it = iter(loader)
    t_start = None
    for i in range(STEPS):
        opt.zero_grad()
        for m in range(ACCUM):
            t0 = time.monotonic()
            x, y = next(it)
            if t_start is None:
                t_start = t0  # teye's first step starts at the first wait too
            sync = m == ACCUM - 1
            if sync:
                loss = ((model(x) - y) ** 2).mean()
            else:
                with model.no_sync():
                    loss = ((model(x) - y) ** 2).mean()
            if "die" in MODE and RANK == 1 and i == 5:
                os._exit(3)
            if "timeout" in MODE and RANK == 1 and i == 3:
                time.sleep(30)
            b0 = time.monotonic()
            if sync:
                loss.backward()
            else:
                with model.no_sync():
                    loss.backward()
            bwd += time.monotonic() - b0
        b0 = time.monotonic()
        opt.step()
        bwd += time.monotonic() - b0
        logged = loss.detach().clone()
        if "mixed" in MODE:
            c0 = time.monotonic()
            dist.all_reduce(logged)
            logged /= WORLD
            comm += time.monotonic() - c0
        say(step=i, loss=loss.item().hex(), logged=logged.item().hex(), bwd_s=bwd, alone_s=alone * (i + 1) * ACCUM,
            comm_s=comm, step_s=time.monotonic() - t_start)
except BaseException as e:
    say(error=type(e).__name__, message=re.sub(r"\d+", "N", str(e).splitlines()[0] if str(e) else "")[:300])
    raise
dist.barrier()
# gloo on CPU sometimes aborts ("terminate called without an active exception") while the interpreter
# tears its process group down, with or without teye: run the exit handlers, then leave without teardown
atexit._run_exitfuncs()
os._exit(0)
