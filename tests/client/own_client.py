"""An unmodified PyTorch loop that reports its own phases with a Reporter (job "own-client").

    python own_client.py STEPS [late]

late: the Reporter is made after the first STEPS steps (zero-code phases had started), then STEPS more.
Prints each step's loss; exit status 0.
"""
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

from teye_client import Reporter

torch.manual_seed(0)
steps = int(sys.argv[1])
late = len(sys.argv) > 2 and sys.argv[2] == "late"
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
it = iter(DataLoader(TensorDataset(torch.randn(512, 8), torch.randn(512, 1)), batch_size=8))


def train(n, rep):
    for i in range(n):
        with rep.phase("data_wait") if rep else _none():
            x, y = next(it)
            time.sleep(0.01)
        with rep.phase("compute") if rep else _none():
            loss = ((model(x) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        if rep:
            rep.step(samples=8)
        print(i, "%.6f" % loss.item(), flush=True)


class _none:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


if late:
    train(steps, None)
rep = Reporter(train_job="own-client")
train(steps, rep)
rep.close()
