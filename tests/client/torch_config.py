"""An unmodified single-process script whose settings the test knows (issue 45):

    torch_config.py MODE STEPS

  tuned:    DataLoader(batch_size=4, num_workers=2, pin_memory=True, persistent_workers=True,
            prefetch_factor=2) over a Dataset whose __getitem__ spins the CPU for SPIN_MS per sample (the
            workers cannot keep up: the loop waits for its input), the forward under
            torch.autocast("cpu", dtype=torch.bfloat16), two epochs
  subclass: a DataLoader subclass with extra attributes of its own (an object, a 1 MB string), whose
            prefetch_factor is a 1 MB string and batch_size an object once it is made (num_workers=0)
  fork:     batch_size=8 in the parent; after a first epoch it forks a child that trains on its own
            DataLoader (batch_size=2) and leaves with os._exit(0); the parent trains on

The last line is JSON: what the script set, its final loss, the pids, and its own clock of the time it
waited in next() and of its steps (the oracle of the input-bound share).
"""
import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

MODE, STEPS = sys.argv[1], int(sys.argv[2])
SPIN_MS = 15.0


class Data(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if MODE == "tuned":
            end = time.perf_counter() + SPIN_MS / 1000
            while time.perf_counter() < end:   # decoding: CPU work in the worker
                pass
        return self.x[i], self.y[i]


class Loader(DataLoader):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.extra = object()
        self.notes = "n" * 2**20
        self.__dict__["prefetch_factor"] = "p" * 2**20
        self.__dict__["batch_size"] = object()


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
wait = step_s = 0.0


def train(loader, steps, autocast=False):
    global wait, step_s
    done = 0
    loss = None
    while done < steps:
        it = iter(loader)
        while done < steps:
            t0 = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            if autocast:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out = model(x)
            else:
                out = model(x)
            loss = ((out.float() - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            wait += t1 - t0
            step_s += time.perf_counter() - t0
            done += 1
    return loss


out = {"mode": MODE, "pid": os.getpid()}
if MODE == "tuned":
    loader = DataLoader(Data(4 * STEPS // 2), batch_size=4, num_workers=2, pin_memory=True,
                        persistent_workers=True, prefetch_factor=2)
    loss = train(loader, STEPS, autocast=True)
    out["set"] = {"loader.num_workers": "2", "loader.pin_memory": "true", "loader.persistent_workers": "true",
                  "loader.prefetch_factor": "2", "loader.batch_size": "4", "autocast.dtype": "bfloat16"}
elif MODE == "subclass":
    loss = train(Loader(Data(64), batch_size=4), STEPS)
    out["set"] = {"loader.num_workers": "0", "loader.pin_memory": "false", "loader.persistent_workers": "false"}
elif MODE == "fork":
    data = Data(64)
    loss = train(DataLoader(data, batch_size=8), 8)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(r)
        closs = train(DataLoader(data, batch_size=2), STEPS)
        os.write(w, json.dumps({"pid": os.getpid(), "loss": closs.item()}).encode())
        os.close(w)
        os._exit(0)
    os.close(w)
    got = b""
    while True:
        chunk = os.read(r, 4096)
        if not chunk:
            break
        got += chunk
    _, status = os.waitpid(child, 0)
    out["child"] = json.loads(got)
    out["child_status"] = status
    loss = train(DataLoader(data, batch_size=8), STEPS)
    out["set"] = {"loader.num_workers": "0", "loader.pin_memory": "false", "loader.persistent_workers": "false",
                  "loader.batch_size": "8"}
    out["child_set"] = dict(out["set"], **{"loader.batch_size": "2"})
out.update(loss=loss.item(), wait_s=wait, step_s=step_s)
print(json.dumps(out), flush=True)
