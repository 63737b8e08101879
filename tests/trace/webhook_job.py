"""An unmodified PyTorch loop for the trace webhook's test: a slow DataLoader (input-bound), until STOP_FILE exists.

    webhook_job.py STOP_FILE

Prints one JSON line at the end: the steps it took and its last loss.
"""
import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

STOP = sys.argv[1]
torch.manual_seed(0)
torch.set_num_threads(1)


class Slow(Dataset):
    def __len__(self):
        return 100000

    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.full((16,), float(i % 5))


model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
n = 0
for x in DataLoader(Slow(), batch_size=2):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    n += 1
    if n % 10 == 0 and os.path.exists(STOP) or n >= 20000:
        break
print(json.dumps({"steps": n, "loss": float(loss.detach())}), flush=True)
