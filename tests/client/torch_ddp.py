"""An unmodified DDP script (gloo, CPU) for `torchrun --nproc_per_node 2`: each rank trains STEPS steps."""
import atexit
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

STEPS = int(sys.argv[1])
dist.init_process_group("gloo")
torch.manual_seed(0)
data = TensorDataset(torch.randn(512, 8), torch.randn(512, 1))
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
model = DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for i, (x, y) in enumerate(loader):
    if i == STEPS:
        break
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
sys.stdout.write("rank %d loss %.6f\n" % (dist.get_rank(), loss.item()))  # one write: ranks' lines stay whole
sys.stdout.flush()
dist.barrier()
# gloo on CPU sometimes aborts ("terminate called without an active exception") while the interpreter
# tears its process group down, with or without teye: run the exit handlers, then leave without teardown
atexit._run_exitfuncs()
os._exit(0)
