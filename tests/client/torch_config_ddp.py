"""An unmodified data-parallel script (gloo, CPU, 2 ranks under torchrun) whose settings the test knows:

    torch_config_ddp.py STEPS SLOW_MS HOOK

DistributedDataParallel(bucket_cap_mb=1, static_graph=False) with HOOK registered as its communication hook
("fp16": PyTorch's fp16_compress_hook; "own": a hook of the script's own, named after nothing of PyTorch's;
"none": no hook), gradient accumulation over 2 micro-batches with no_sync() on the first, a DataLoader with
batch_size=4 (num_workers=0); rank 1 sleeps SLOW_MS between its forward and backward (it computes longer,
so rank 0 waits for it in DDP's exchange).  Each rank prints one JSON line: what it set (the test's oracle
for the configuration series), its final loss (bit for bit, with and without teye) and its clocks.
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

STEPS, SLOW_MS, HOOK = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo")
RANK = dist.get_rank()
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(2 * 2 * 4 * STEPS, 16, generator=g), torch.randn(2 * 2 * 4 * STEPS, 1, generator=g))
loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=False))
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
model = DistributedDataParallel(net, bucket_cap_mb=1, static_graph=False)
if HOOK == "fp16":
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
    model.register_comm_hook(None, fp16_compress_hook)
elif HOOK == "own":
    def my_secret_hook_with_a_long_name(state, bucket):
        fut = dist.all_reduce(bucket.buffer().div_(dist.get_world_size()), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])
    model.register_comm_hook(None, my_secret_hook_with_a_long_name)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
t0 = time.perf_counter()
compute = slept = 0.0
it = iter(loader)
for step in range(STEPS):
    for micro in range(2):
        x, y = next(it)
        c0 = time.perf_counter()
        if micro == 0:
            with model.no_sync():
                loss = ((model(x) - y) ** 2).mean()
                loss.backward()
        else:
            loss = ((model(x) - y) ** 2).mean()
            if RANK == 1:
                s0 = time.perf_counter()
                time.sleep(SLOW_MS / 1000)
                slept += time.perf_counter() - s0
            loss.backward()
        compute += time.perf_counter() - c0
    opt.step()
    opt.zero_grad()
wall = time.perf_counter() - t0
line = json.dumps({"rank": RANK, "loss": loss.item(), "wall_s": wall, "compute_s": compute, "slept_s": slept,
                   "set": {"ddp.bucket_cap_bytes": str(1024 * 1024), "ddp.static_graph": "false",
                           "ddp.no_sync": "true", "loader.batch_size": "4", "loader.num_workers": "0",
                           "loader.pin_memory": "false", "loader.persistent_workers": "false"}})
sys.stdout.write(line + "\n")   # one write a rank: the two ranks' lines never interleave
sys.stdout.flush()
# the model (its reducer) holds the process group: dropped first, the group is released while the interpreter
# is whole (pytorch/pytorch#179291 describes the race at its teardown).  That is not enough: a rank still ended
# "terminate called without an active exception" (SIGABRT) after destroy_process_group() had returned, in 5 of
# 14 plain runs here (PyTorch 2.13, no teye: the interpreter's teardown).  So the rank leaves with os._exit, as
# multiprocessing's children do (teye's zero-code hook flushes before it, as it does for them).
del model, opt
dist.destroy_process_group()
sys.stderr.flush()
os._exit(0)
