"""An unmodified PyTorch script whose DataLoader worker makes the training loop wait, three ways:

    python torch_cause.py {burn|sleep|read} STEPS FILE

burn: each sample burns about 1.5 ms of CPU in pure Python (decoding, augmentation), no I/O;
sleep: each sample sleeps 1.5 ms (a lock, a remote service), no CPU, no I/O;
read: each sample reads 1 MiB at a random offset of FILE with O_DIRECT, past the page cache, so every
read goes to storage (on this kind of VM about 0.8 ms a read, a tenth of it CPU).
One worker process does the work (num_workers=1); the training process itself only waits in next().
It prints one JSON line: its own wait share (perf_counter around next()) and what its worker read.
"""
import json
import mmap
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

MODE, STEPS, FILE = sys.argv[1], int(sys.argv[2]), sys.argv[3]
CHUNK = 1 << 20


class Data(Dataset):
    def __init__(self):
        self.fd = self.buf = None
        self.blocks = os.path.getsize(FILE) // CHUNK

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        if MODE == "burn":
            t = time.thread_time() + 0.0015
            x = 0
            while time.thread_time() < t:
                x += 1
        elif MODE == "sleep":
            time.sleep(0.0015)
        else:
            if self.fd is None:  # in the worker process
                self.fd = os.open(FILE, os.O_RDONLY | os.O_DIRECT)
                self.buf = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT needs
            assert os.preadv(self.fd, [self.buf], (i * 7919 % self.blocks) * CHUNK) == CHUNK
        return torch.zeros(16), torch.zeros(1)


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    loader = DataLoader(Data(), batch_size=8, num_workers=1)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    it = iter(loader)
    wait = 0.0
    first = None
    for _ in range(STEPS):
        t0 = time.perf_counter()
        if first is None:
            first = t0
        x, y = next(it)
        wait += time.perf_counter() - t0
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(json.dumps({"wait_share": wait / (time.perf_counter() - first)}))


if __name__ == "__main__":
    main()
