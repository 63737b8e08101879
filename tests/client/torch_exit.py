"""Children that end without atexit hooks, each training with an unmodified PyTorch loop.

    python torch_exit.py MODE STEPS

MODE: fork (os.fork; the child trains STEPS steps and ends with os._exit(7), as multiprocessing's fork
context ends every worker), pool-fork, pool-forkserver, pool-spawn (a multiprocessing.Pool of 2 workers of
that context maps 4 tasks of STEPS steps each, then close() and join(); pool-fork-with: the block's end terminates
the pool instead, as `with Pool(...)` does), dlfork (a DataLoader worker whose
__getitem__ forks a child that ends with os._exit(3); the main process trains STEPS steps), kill (the
forked child trains STEPS steps and is killed by SIGKILL; the parent then trains STEPS steps).
Prints one JSON line: the steps trained in all processes and the samples, the exit statuses seen.
"""
import json
import multiprocessing as mp
import os
import signal
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

BS = 8
SEEN = set()   # the exit statuses the DataLoader worker's children ended with (dlfork)


def train(n, seed=0, loader=None):
    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    SEEN.clear()
    it = iter(loader or DataLoader(TensorDataset(torch.randn(BS * n, 8), torch.randn(BS * n, 1)), batch_size=BS))
    loss = None
    for _ in range(n):
        x, y = next(it)
        SEEN.update(int(v) for v in y[:, 0].tolist())
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.002)
    return "%.6f" % loss.item()


def task(i):
    return train(STEPS, seed=i)


class Forking(Dataset):
    """Each item forks a child that ends with os._exit(3) and checks that status."""
    def __len__(self):
        return BS * STEPS

    def __getitem__(self, i):
        pid = os.fork()
        if pid == 0:
            os._exit(3)
        _, st = os.waitpid(pid, 0)
        return torch.randn(8), torch.full((1,), float(os.waitstatus_to_exitcode(st)))


STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 10

if __name__ == "__main__":
    mode = sys.argv[1]
    out = {"steps": 0, "statuses": []}
    if mode in ("fork", "kill"):
        pid = os.fork()
        if pid == 0:
            print("child", train(STEPS), flush=True)
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(7)
        _, st = os.waitpid(pid, 0)
        out["statuses"].append(os.waitstatus_to_exitcode(st))
        out["steps"] = STEPS
        if mode == "kill":
            print("parent", train(STEPS), flush=True)
            out["steps"] += STEPS
    elif mode.startswith("pool-"):
        ctx = mp.get_context(mode.split("-")[1])
        with ctx.Pool(2) as pool:
            res = pool.map(task, range(4))
            if not mode.endswith("-with"):   # -with: leaving the block terminates the workers (SIGTERM)
                pool.close()
                pool.join()
        print("losses", res, flush=True)
        out["steps"] = 4 * STEPS
    elif mode == "dlfork":
        loader = DataLoader(Forking(), batch_size=BS, num_workers=1)
        print("dlfork", train(STEPS, loader=loader), flush=True)
        out["steps"] = STEPS
        out["statuses"] = sorted(SEEN)
    out["samples"] = BS * out["steps"]
    print(json.dumps(out))
