"""A small unmodified PyTorch loop for the zero-code bad-input tests.

    python torch_small.py STEPS [pause|fork]

pause: after STEPS steps print "paused" and wait for a line on stdin, then STEPS more (the test
restarts the agent meanwhile).  fork: after STEPS steps fork without exec; the child trains 2 steps
and exits normally, then the parent trains STEPS more.  forkmid: as fork, but the parent forks
between next() and optimizer.step() (its batch is read, its step not taken) and finishes that step
after the child has exited.  Exit status: $EXIT (default 0).
"""
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
steps = int(sys.argv[1])
mode = sys.argv[2] if len(sys.argv) > 2 else ""
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
it = iter(DataLoader(TensorDataset(torch.randn(512, 8), torch.randn(512, 1)), batch_size=8))


def train(n, tag):
    for i in range(n):
        x, y = next(it)
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(tag, i, "%.6f" % loss.item(), flush=True)
        time.sleep(0.005)


train(steps, "a")
if mode == "pause":
    print("paused", flush=True)
    sys.stdin.readline()
    train(steps, "b")
elif mode == "fork":
    pid = os.fork()
    if pid == 0:
        train(2, "child")
        sys.exit(0)
    os.waitpid(pid, 0)
    train(steps, "b")
elif mode == "forkmid":
    x, y = next(it)          # the parent's batch: read before the fork ...
    pid = os.fork()
    if pid == 0:
        train(2, "child")
        sys.exit(0)
    os.waitpid(pid, 0)
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()               # ... its step taken after it
    print("m", 0, "%.6f" % loss.item(), flush=True)
    train(steps, "b")
sys.exit(int(os.environ.get("EXIT", "0")))
