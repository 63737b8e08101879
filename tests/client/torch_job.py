"""An unmodified PyTorch training script (no teye import): the zero-code tests run it with and without teye.

    python torch_job.py {slow|fast} NUM_WORKERS STEPS

It prints each step's loss, then one JSON line with its own wall-clock split measured with
time.perf_counter(): the time inside next() of the DataLoader iterator and the time from the
first next() to the last optimizer step (the oracle of tests/client/test_torch.py).
"""
import json
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

KIND, WORKERS, STEPS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
BATCH = 8


class Data(Dataset):
    def __init__(self, delay_s):
        self.delay_s = delay_s
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(4096, 64, generator=g)
        self.y = torch.randn(4096, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.delay_s:
            time.sleep(self.delay_s)  # slow storage or decoding
        return self.x[i], self.y[i]


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    delay = {"slow": 0.0015 if WORKERS == 0 else 0.004, "fast": 0.0}[KIND]
    loader = DataLoader(Data(delay), batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                        generator=torch.Generator().manual_seed(2))
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    big = torch.randn(256, 256)
    it = iter(loader)
    wait = 0.0
    first = None
    for step in range(STEPS):
        t0 = time.perf_counter()
        if first is None:
            first = t0
        x, y = next(it)
        wait += time.perf_counter() - t0
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        for _ in range(6):  # the device's share of the step: a few ms of CPU work
            big = torch.tanh(big @ big)
        opt.step()
        print("step %d loss %.6f" % (step, loss.item()))
    total = time.perf_counter() - first
    print(json.dumps({"wait_s": wait, "total_s": total, "steps": STEPS, "samples": STEPS * BATCH}))


if __name__ == "__main__":
    main()
