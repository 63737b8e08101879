"""Unmodified PyTorch loops that misuse their input pipeline (issue 29, "Bad input"), each with its own clock.

    python torch_bad.py {dies|threads|orphans} STEPS

dies: two DataLoader workers; the worker that loads batch STEPS // 2 exits (os._exit) a second into
  it, so the training loop, waiting for that batch, gets PyTorch's "worker exited unexpectedly"
  RuntimeError; the script catches it, reports it, trains the remaining steps from a fresh loader
  without workers and exits 3.
threads: one DataLoader iterated by two threads at once (a prefetching pair feeding a queue under a
  lock); the training loop takes its batches from the queue.
orphans: forks two workers it never waits for (one exits at once and stays a zombie until the job
  ends, one outlives the job, sleeping 1 s with its output closed), then trains.

Every mode's stdout is deterministic (what was trained; in threads mode an order-free checksum, as
the batches' order between the threads is not), then one JSON line of its own clock: the training
steps' time (first batch asked for to the end of the last optimizer.step()), the training loop's
input wait (time inside next() or queue.get()), its time between steps (from the end of one step, or the
first batch asked for, to the start of the next one's forward: the wait, the loop's own work on the batch
and, in threads mode, the GIL the prefetching threads hold meanwhile), the steps and samples trained, and the bytes its process
read from storage over the training (/proc/self/io's read_bytes: the workers it reaped too; a machine whose
page cache lacks what a forked worker touches reads there, with no read in the script).
"""
import json
import os
import queue
import sys
import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset

MODE, STEPS = sys.argv[1], int(sys.argv[2])
BS = 4
DIE_AT = STEPS // 2      # dies: the batch whose worker exits


class Slow(Dataset):
    """Samples that take 2 ms each to load (decoding, a remote read)."""

    def __init__(self, n, die=None):
        g = torch.Generator().manual_seed(0)
        self.x, self.y, self.die = torch.randn(n, 16, generator=g), torch.randn(n, 1, generator=g), die

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.die is not None and i == self.die * BS:
            time.sleep(1.0)      # the training loop has taken every batch before it and waits for this one
            os._exit(1)
        time.sleep(0.002)
        return self.x[i], self.y[i]


torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
clock = time.perf_counter
own = {"train_s": 0.0, "wait_s": 0.0, "before_s": 0.0, "steps": 0, "samples": 0}
first = None


def train(batch):
    own["before_s"] += clock() - own.get("end", first)   # the loop's time since its last step, the wait included
    x, y = batch
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    a = torch.randn(128, 128)
    for _ in range(120):                    # some compute: about as long as the batch took to load
        a = torch.tanh(torch.mm(a, a))
    opt.step()
    own["end"] = clock()
    own["steps"] += 1
    own["samples"] += len(x)
    return loss.item()


def take(get):
    """One batch from get(), its wait on the script's own clock."""
    global first
    t0 = clock()
    if first is None:
        first = t0
    try:
        return get()
    finally:
        own["wait_s"] += clock() - t0


def storage_reads():
    """This process's read_bytes (/proc/self/io: bytes fetched from storage, its reaped children's too)."""
    with open("/proc/self/io") as fh:
        return int([line for line in fh if line.startswith("read_bytes:")][0].split()[1])


reads0 = storage_reads()
status = 0
if MODE == "dies":
    it = iter(DataLoader(Slow(BS * STEPS, die=DIE_AT), batch_size=BS, num_workers=2))
    try:
        for i in range(STEPS):
            print("a", i, "%.5f" % train(take(lambda: next(it))), flush=True)
    except RuntimeError as e:
        print("worker died after", own["steps"], "steps:", "exited unexpectedly" in str(e), flush=True)
    del it
    rest = torch.utils.data.Subset(Slow(BS * STEPS), range(own["steps"] * BS, BS * STEPS))
    it = iter(DataLoader(rest, batch_size=BS))
    for i in range(STEPS - own["steps"]):
        print("b", i, "%.5f" % train(take(lambda: next(it))), flush=True)
    status = 3
elif MODE == "threads":
    it = iter(DataLoader(Slow(BS * STEPS), batch_size=BS))
    lock, q = threading.Lock(), queue.Queue(maxsize=4)

    def prefetch():
        while True:
            with lock:
                batch = next(it, None)
            q.put(batch)
            if batch is None:
                return

    threads = [threading.Thread(target=prefetch) for _ in range(2)]
    for t in threads:
        t.start()
    done = checksum = 0
    while done < 2:
        batch = take(q.get)
        if batch is None:
            done += 1
            continue
        checksum += float(batch[0].sum())
        train(batch)
    for t in threads:
        t.join()
    print("trained", own["steps"], "steps,", own["samples"], "samples, checksum %.3f" % checksum, flush=True)
elif MODE == "orphans":
    it = iter(DataLoader(Slow(BS * STEPS), batch_size=BS))
    for i in range(STEPS):
        if i == 2:
            if os.fork() == 0:
                os._exit(0)         # never waited for: a zombie until the job ends
            if os.fork() == 0:
                os.close(1)
                os.close(2)
                time.sleep(1.0)     # outlives the job
                os._exit(0)
        print("a", i, "%.5f" % train(take(lambda: next(it))), flush=True)
else:
    sys.exit("unknown mode " + MODE)
own["train_s"] = own.pop("end") - first
own["read_bytes"] = storage_reads() - reads0   # the training's reads, its reaped workers' too (dies: all reaped)
print(json.dumps(own), flush=True)
sys.exit(status)
