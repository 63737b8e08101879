"""An unmodified data-parallel script (gloo, CPU) for `torchrun`: STEPS steps of a slow input, timing itself.

    ddp_traced_job.py STEPS SLEEP_MS READY_FILE

Each batch's Dataset read sleeps SLEEP_MS in the DataLoader (no workers: the wait is in next()); each step
does a fixed amount of matrix work.  Rank 0 writes READY_FILE after its fifth step (the test then asks for a
trace).  Each rank prints one JSON line: per step (numbered from 1, the first optimizer step), the time it
spent in next() and the step's span from the end of the previous optimizer step to the end of its own, by
its own perf_counter (the test's oracle); and its final loss (bit for bit with and without a trace).
"""
import json
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

STEPS, SLEEP_MS, READY = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo")
RANK = dist.get_rank()
torch.set_num_threads(1)


class Slow(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(4 * STEPS * 4, 32, generator=g), torch.randn(4 * STEPS * 4, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if i % 4 == 0:
            time.sleep(SLEEP_MS / 1000)
        return self.x[i], self.y[i]


data = Slow()
loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=False))
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.Tanh(), torch.nn.Linear(128, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
w = torch.randn(128, 128)
rows = []
it = iter(loader)
last = time.perf_counter()
for n in range(1, STEPS + 1):
    t0 = time.perf_counter()
    x, y = next(it)
    t1 = time.perf_counter()
    h = torch.randn(128, 128)
    for _ in range(20):
        h = torch.tanh(h @ w)
    loss = torch.nn.functional.mse_loss(model(x), y) + 0 * h.mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    end = time.perf_counter()
    rows.append([n, t1 - t0, end - last])
    last = end
    if n == 5 and RANK == 0:
        with open(READY, "w") as f:
            f.write("ready")
sys.stdout.write(json.dumps({"rank": RANK, "rows": rows, "loss": float(loss)}) + "\n")   # one write: ranks' lines
sys.stdout.flush()                                                                      # stay whole
# the model (its reducer) and the last loss's graph hold the process group: dropped first, so that the group is
# released while the interpreter is whole, not at its teardown, where gloo's threads can abort the process
# (rank 1 of the run without a trace ended "terminate called without an active exception" in stop 57's x11;
# tests/client/torch_config_ddp.py did once in stop 55; pytorch/pytorch#179291 describes the race)
del model, opt, loss, it
dist.barrier()
dist.destroy_process_group()
