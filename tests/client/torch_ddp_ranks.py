"""An unmodified data-parallel script (gloo, CPU) for `torchrun`: STEPS steps, one slow rank or none.

    torch_ddp_ranks.py STEPS SLOW_RANK SLOW_MS MODE
      SLOW_RANK -1: no slow rank
      MODE ddp:       DistributedDataParallel; the slow rank's Dataset sleeps SLOW_MS per batch (its input)
      MODE allreduce: gradients averaged by an explicit dist.all_reduce per parameter; the slow rank
                      sleeps SLOW_MS in its step (its compute), so the others wait in all_reduce
      MODE fsdp:      FSDP (fully_shard on each layer and the model); the slow rank sleeps SLOW_MS between its
                      forward and backward; the script times the collectives FSDP calls itself (comm_s)
      MODE ddp_wide:  DistributedDataParallel on a wider model (about 280,000 parameters: 1.1 MB of gradients
                      per step, its middle layer applied 24 times) and batches of 256: an exchange that a shaped
                      link holds back and an unshaped one does not; SLOW_RANK as in ddp.  A communication
                      hook of the script's own (DDP's default exchange) notes when the gradients were ready:
                      exposed_s, its wait from there to the end of backward()
      MODE ddp_compute: DistributedDataParallel; the slow rank sleeps SLOW_MS between its forward and its
                      backward (its compute), so the others wait in DDP's gradient exchange

TEYE_TEST_IN_MEMORY=1: the batches are slices of tensors already in memory, no DataLoader iterated (teye then
sees steps only, and DDP's exchange).
Each rank prints one JSON line with its own wall-clock timing (the test's oracle, never teye's): the
time it spent in next() of its DataLoader, in all_reduce, and between its optimizer steps.
"""
import atexit
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from tests.client.ddp_clock import alone_seconds

STEPS, SLOW, SLOW_MS, MODE = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
BATCH = 256 if MODE == "ddp_wide" else 4   # wide: compute enough that an unshaped exchange is the smaller part
dist.init_process_group("gloo")
RANK = dist.get_rank()
slow = RANK == SLOW


class Data(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        n = max(4096, 4 * STEPS * BATCH)   # every rank of up to 4 reads STEPS batches of its own
        self.x, self.y = torch.randn(n, 16, generator=g), torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if slow and MODE in ("ddp", "ddp_wide"):
            time.sleep(SLOW_MS / 1000 / BATCH)  # a slow read, per sample
        return self.x[i], self.y[i]


data = Data()
loader = DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(data, shuffle=False))
torch.manual_seed(0)
class Wide(torch.nn.Module):
    """1.1 MB of gradients; its middle layer applied REPEAT times (shared weights): compute grows, the
    exchange does not (TEYE_TEST_REPEAT: the two-node test asks for more compute per byte exchanged)."""
    REPEAT = int(os.environ.get("TEYE_TEST_REPEAT", "24"))

    def __init__(self):
        super().__init__()
        self.l1, self.mid, self.out = torch.nn.Linear(16, 512), torch.nn.Linear(512, 512), torch.nn.Linear(512, 1)

    def forward(self, x):
        h = torch.relu(self.l1(x))
        for _ in range(self.REPEAT):
            h = torch.relu(self.mid(h))
        return self.out(h)


net = Wide() if MODE == "ddp_wide" else \
    torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
alone = alone_seconds(net, data.x[:BATCH], data.y[:BATCH])  # tests/client/ddp_clock.py
if MODE == "fsdp":
    # the script's own clock on FSDP's collectives: wrappers of its own around what FSDP calls (outermost
    # call only: a collective inside another, or its Work.wait, counts once)
    depth = [0]

    def clocked(fn):
        def call(*args, **kwargs):
            global comm
            if depth[0]:
                return fn(*args, **kwargs)
            depth[0] += 1
            c0 = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
                comm += time.monotonic() - c0
        return call

    for name in ("all_gather_single", "reduce_scatter_single", "all_reduce", "all_gather_into_tensor",
                 "reduce_scatter_tensor"):
        setattr(dist, name, clocked(getattr(dist, name)))
    dist.Work.wait = clocked(dist.Work.wait)
    from torch.distributed.fsdp import fully_shard
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    model = fully_shard(net)
else:
    model = DistributedDataParallel(net) if MODE in ("ddp", "ddp_wide", "ddp_compute") else net
ready = [0.0]   # ddp_wide: when DDP handed over the last gradient bucket (the script's own communication hook)
if MODE == "ddp_wide":
    world_group, size = dist.group.WORLD, dist.get_world_size()

    def own_clock_hook(state, bucket):
        """DDP's default exchange (the bucket divided by the world size, then summed over the ranks), with
        the time its gradients were ready: the rank waits from there to the end of backward()."""
        ready[0] = time.monotonic()
        buf = bucket.buffer()
        buf.div_(size)
        return world_group.allreduce([buf]).get_future().then(lambda f: f.value()[0])

    model.register_comm_hook(None, own_clock_hook)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
wait = comm = bwd = exposed = 0.0
IN_MEMORY = os.environ.get("TEYE_TEST_IN_MEMORY") == "1"   # issue 47: batches sliced from memory, no DataLoader
it = None if IN_MEMORY else iter(loader)
t_start = None
for i in range(STEPS):
    t0 = time.monotonic()
    if IN_MEMORY:   # tensors already in memory, no DataLoader (a synthetic benchmark, a get_batch loop)
        k = (RANK * STEPS + i) * BATCH % (len(data.x) - BATCH)
        x, y = data.x[k:k + BATCH], data.y[k:k + BATCH]
    else:
        x, y = next(it)
    t1 = time.monotonic()
    if t_start is None:
        t_start = t0  # teye's first step starts at the first wait too
    wait += t1 - t0
    loss = ((model(x) - y) ** 2).mean()
    if slow and MODE in ("ddp_compute", "fsdp"):
        time.sleep(SLOW_MS / 1000)  # more work on this rank, before its gradients are ready
    opt.zero_grad()
    b0 = time.monotonic()
    loss.backward()
    if MODE == "ddp_wide":
        exposed += time.monotonic() - ready[0]
    if MODE == "allreduce":
        if slow:
            time.sleep(SLOW_MS / 1000)  # more work on this rank
        c0 = time.monotonic()
        for p in net.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        comm += time.monotonic() - c0
    opt.step()
    bwd += time.monotonic() - b0
t_end = time.monotonic()
out = {"rank": RANK, "wait_s": wait, "comm_s": comm, "bwd_s": bwd, "exposed_s": exposed, "alone_s": alone * STEPS, "step_s": t_end - t_start, "steps": STEPS,
       "loss": round(loss.item(), 6)}
sys.stdout.write(json.dumps(out) + "\n")  # one write: ranks' lines stay whole
sys.stdout.flush()
dist.barrier()
# gloo on CPU sometimes aborts ("terminate called without an active exception") while the interpreter
# tears its process group down, with or without teye: run the exit handlers, then leave without teardown
atexit._run_exitfuncs()
os._exit(0)
