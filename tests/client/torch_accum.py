"""An unmodified PyTorch script with several batches per optimizer step (no teye import).

    python torch_accum.py accumulate STEPS ACCUM   # ACCUM batches (backward each) per optimizer step
    python torch_accum.py epoch EPOCHS             # one optimizer step per epoch: a whole epoch inside a step

Gradient accumulation is the default shape of many Hugging Face and Lightning jobs.  The script times
every next() of its DataLoader iterator itself with time.perf_counter() (the end-of-epoch StopIteration
included) and prints one JSON line: the time inside next(), the time from the first next() to the last
optimizer step, the optimizer steps and the samples it trained on (the oracle of test_torch.py).
"""
import json
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

BATCH = 8
SIZE = 48   # samples per epoch: 6 batches


class Slow(Dataset):
    def __len__(self):
        return SIZE

    def __getitem__(self, i):
        time.sleep(0.0006)  # slow storage: ~5 ms a batch
        return torch.full((16,), float(i % 7)), torch.ones(1)


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    mode = sys.argv[1]
    loader = DataLoader(Slow(), batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(2))
    model = torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    big = torch.randn(256, 256)
    own = {"wait": 0.0, "first": None, "samples": 0, "steps": 0}

    def timed_next(it):
        t0 = time.perf_counter()
        if own["first"] is None:
            own["first"] = t0
        try:
            return next(it)
        except StopIteration:
            return None
        finally:
            own["wait"] += time.perf_counter() - t0

    def train_on(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        own["samples"] += len(x)
        return loss

    def device_work():
        nonlocal big
        for _ in range(6):
            big = torch.tanh(big @ big)

    if mode == "accumulate":
        steps, accum = int(sys.argv[2]), int(sys.argv[3])
        it = iter(loader)
        for step in range(steps):
            opt.zero_grad()
            for _ in range(accum):
                batch = timed_next(it)
                if batch is None:      # a new epoch (the wait for the end of the last one counted above)
                    it = iter(loader)
                    batch = timed_next(it)
                loss = train_on(*batch)
                device_work()
            opt.step()
            own["steps"] += 1
            print("step %d loss %.6f" % (step, loss.item()))
    else:
        for epoch in range(int(sys.argv[2])):
            opt.zero_grad()
            it = iter(loader)
            while True:
                batch = timed_next(it)
                if batch is None:
                    break
                loss = train_on(*batch)
                device_work()
            opt.step()
            own["steps"] += 1
            print("epoch %d loss %.6f" % (epoch, loss.item()))
    total = time.perf_counter() - own["first"]
    print(json.dumps({"wait_s": own["wait"], "total_s": total, "steps": own["steps"], "samples": own["samples"]}))


if __name__ == "__main__":
    main()
