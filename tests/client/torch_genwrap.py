"""An unmodified PyTorch loop whose data work runs on the training thread, with its own clock (issue 47).

    python torch_genwrap.py STEPS MODE
      wrap:      a generator of its own wraps a DataLoader and augments each batch on the main thread (8 ms)
      pure:      a pure Python generator makes the batches (8 ms each), no DataLoader
      get_batch: nanoGPT-style get_batch() slicing tensors in memory and augmenting them (8 ms), no DataLoader

Prints one JSON line: its steps and samples, its steps' time (from asking for a batch to the end of
optimizer.step()) and the time it spent getting each batch (the data work, the generator's or get_batch's)."""
import json
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

steps, mode = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
X, Y = torch.randn(4096, 16), torch.randn(4096, 1)


def augment(x):
    t = time.perf_counter()
    while time.perf_counter() - t < 0.008:   # the loop's own data work, on this thread (CPU, not a sleep)
        x = x * 1.0
    return x


def wrapped():
    for x, y in DataLoader(TensorDataset(X, Y), batch_size=8):
        yield augment(x), y


def pure():
    i = 0
    while True:
        yield augment(X[i:i + 8]), Y[i:i + 8]
        i = (i + 8) % 4000


def get_batch(i):
    k = (8 * i) % 4000
    return augment(X[k:k + 8]), Y[k:k + 8]


model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
it = wrapped() if mode == "wrap" else pure() if mode == "pure" else None
clock = time.perf_counter
step_s = data_s = 0.0
samples = 0
for i in range(steps):
    t0 = clock()
    x, y = next(it) if it is not None else get_batch(i)
    data_s += clock() - t0
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step_s += clock() - t0
    samples += len(x)
print(json.dumps({"steps": steps, "samples": samples, "step_s": step_s, "data_s": data_s,
                  "data_share": data_s / step_s}))
