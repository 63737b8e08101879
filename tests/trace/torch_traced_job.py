"""A tiny CPU training loop under torch.profiler that times its own phases (issue 46's oracle).

Usage: torch_traced_job.py TRACE_FILE SLEEP_S
The dataset sleeps SLEEP_S per batch inside the DataLoader (no workers, so the wait is in __next__);
each step does a fixed amount of matrix work.  The profiler's schedule traces ACTIVE steps after WAIT +
WARMUP; the script prints, as one JSON line, the step numbers it traced and its own perf_counter split
of those steps: time in next() and each step's span from the end of one prof.step() call to the start
of the next (inside the span ProfilerStep#N covers), and from the start of one prof.step() call to the end
of the next (around it).
"""
import json
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

WAIT, WARMUP, ACTIVE = 1, 1, 5


class Slow(Dataset):
    def __init__(self, sleep_s: float):
        self.sleep_s = sleep_s

    def __len__(self):
        return 1000

    def __getitem__(self, i):
        time.sleep(self.sleep_s)
        return torch.full((64,), float(i % 7))


def main():
    trace, sleep_s = sys.argv[1], float(sys.argv[2])
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = torch.randn(256, 256)
    loader = iter(DataLoader(Slow(sleep_s), batch_size=1))
    steps = WAIT + WARMUP + ACTIVE
    rows = []
    sched = torch.profiler.schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched,
                                on_trace_ready=lambda p: p.export_chrome_trace(trace)) as prof:
        after = last_before = time.perf_counter()
        for n in range(steps):
            t0 = time.perf_counter()
            batch = next(loader)
            t1 = time.perf_counter()
            x = torch.randn(256, 256)
            for _ in range(6):
                x = torch.tanh(x @ w)
            loss = model(batch).pow(2).mean() + x.mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            before = time.perf_counter()
            row = {"step": n, "wait_s": t1 - t0, "step_s": before - after, "outer_s": before - last_before}
            prof.step()
            after = time.perf_counter()
            row["outer_s"] += after - before
            rows.append(row)
            last_before = before
    traced = [r for r in rows if WAIT + WARMUP <= r["step"] < steps]
    print(json.dumps({"traced_steps": [r["step"] for r in traced],
                      "wait_s": sum(r["wait_s"] for r in traced),
                      "total_s": sum(r["step_s"] for r in traced),
                      "outer_s": sum(r["outer_s"] for r in traced)}))


if __name__ == "__main__":
    main()
