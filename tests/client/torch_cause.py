"""An unmodified PyTorch script whose DataLoader worker makes the training loop wait, three ways:

    python torch_cause.py {burn|sleep|nap|read} STEPS FILE [PIECE_KIB READS]

burn: each sample burns about 1.5 ms of CPU in pure Python (decoding, augmentation), no I/O;
burn-main: the same in the training process's own thread (num_workers=0: the decoder a loaded host starves);
sleep: each sample sleeps 1.5 ms (a lock, a remote service), no CPU, no I/O;
nap: each sample sleeps 6 ms: as sleep, with the DataLoader's own per-batch CPU (collating, passing the batch
  between the processes: 0.4-0.6 CPU s per s of a 12 ms wait on the test VM) a small part of the wait;
read: each sample reads READS pieces of PIECE_KIB KiB (default 2 of 1024) at scattered offsets of FILE
  (a clean file), past the page cache: the worker drops the file's pages (posix_fadvise DONTNEED) when it
  opens it and each piece's once read, and turns readahead off (FADV_RANDOM), so every read goes to
  storage and counts in /proc/<pid>/io read_bytes.
One worker process does the work (num_workers=1; burn-main: none); the training process itself only waits in next().
It prints one JSON line of its own figures: its wait share (perf_counter around next()), the bytes its
worker read, the CPU time of both processes per second of wait (from the second batch to the last:
each sample carries its worker's process_time()) and its main thread's run-queue wait per second of wait.
"""
import json
import mmap
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

MODE, STEPS, FILE = sys.argv[1], int(sys.argv[2]), sys.argv[3]
PIECE = int(sys.argv[4]) << 10 if len(sys.argv) > 4 else 1 << 20
READS = int(sys.argv[5]) if len(sys.argv) > 5 else 2


class Data(Dataset):
    def __init__(self):
        self.fd = None
        self.pieces = os.path.getsize(FILE) // PIECE

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        if MODE in ("burn", "burn-main"):
            t = time.thread_time() + 0.0015
            x = 0
            while time.thread_time() < t:
                x += 1
        elif MODE == "sleep":
            time.sleep(0.0015)
        elif MODE == "nap":
            time.sleep(0.006)
        elif MODE == "direct":
            if self.fd is None:  # in the worker process
                self.fd = os.open(FILE, os.O_RDONLY | os.O_DIRECT)
                self.buf = mmap.mmap(-1, PIECE)  # page-aligned, as O_DIRECT needs
            for k in range(READS):
                off = ((i * READS + k) * 7919 % self.pieces) * PIECE
                assert os.preadv(self.fd, [self.buf], off) == PIECE
        else:
            if self.fd is None:  # in the worker process
                self.fd = os.open(FILE, os.O_RDONLY)
                os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)  # a clean file: its pages go
                os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)    # no readahead: each read is its own
            for k in range(READS):
                off = ((i * READS + k) * 7919 % self.pieces) * PIECE
                assert len(os.pread(self.fd, PIECE, off)) == PIECE
                os.posix_fadvise(self.fd, off, PIECE, os.POSIX_FADV_DONTNEED)  # and go again once read
        return torch.zeros(16), torch.zeros(1), torch.tensor(time.process_time(), dtype=torch.float64)


def run_delay():
    """Seconds this (main) thread was runnable but waited for a CPU (0 without schedstats)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    loader = DataLoader(Data(), batch_size=8, num_workers=0 if MODE == "burn-main" else 1)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    it = iter(loader)
    wait = total_wait = 0.0
    first = None
    for i in range(STEPS):
        t0 = time.perf_counter()
        if first is None:
            first = t0
        x, y, cpu = next(it)
        t1 = time.perf_counter()
        total_wait += t1 - t0
        if i == 0:   # the window of the CPU figures starts once the first batch is in
            main0, worker0, delay0 = time.process_time(), float(cpu.max()), run_delay()
        else:
            wait += t1 - t0
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    cpu_s = time.process_time() - main0 + (float(cpu.max()) - worker0 if MODE != "burn-main" else 0.0)
    delay = run_delay() - delay0
    print(json.dumps({"wait_share": total_wait / (time.perf_counter() - first), "cpu_per_wait_s": cpu_s / wait,
                      "delay_per_wait_s": delay / wait,
                      "wait_s": total_wait,
                      "read_bytes": STEPS * 8 * READS * PIECE if MODE in ("read", "direct") else 0}))


if __name__ == "__main__":
    main()
