"""An unmodified PyTorch loop fed by a producer thread, with its own clock (issue 47, "a step begins where the
training thread begins it").

    python torch_producer.py STEPS [dies]

A producer thread starts first and fills a queue (4 batches) from a DataLoader whose __getitem__ sleeps; the
main thread then builds its model and optimizer (slowly: 0.8 s, as a large model's construction), and trains
STEPS steps on batches taken from the queue.  dies: the producer raises after 10 batches (bad input); the loop
stops when the queue stays empty for 2 s.  Prints one JSON line: its steps, the samples it trained on, its
steps' time (from asking the queue for a batch to the end of optimizer.step()) and each step's samples.
The producer is stopped and joined before the script ends: a daemon thread still inside PyTorch while the
interpreter exits can abort the process (`terminate called without an active exception`, exit -6: CI saw it
once, with or without teye a race of the script's own)."""
import json
import queue
import sys
import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 10 ** 6

    def __getitem__(self, i):
        time.sleep(0.001)
        return torch.randn(16), torch.randn(1)


steps = int(sys.argv[1])
dies = len(sys.argv) > 2 and sys.argv[2] == "dies"
q = queue.Queue(maxsize=4)
stop = threading.Event()


def produce():
    for k, batch in enumerate(DataLoader(Slow(), batch_size=6)):
        if dies and k == 10:
            raise RuntimeError("the producer dies")
        while not stop.is_set():
            try:
                q.put(batch, timeout=0.1)
                break
            except queue.Full:
                pass
        if stop.is_set():
            return


producer = threading.Thread(target=produce, daemon=True)
producer.start()
time.sleep(0.8)                         # the model's construction, on the main thread
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
clock = time.perf_counter
step_s, per_step, done = 0.0, [], 0
for i in range(steps):
    t0 = clock()
    try:
        x, y = q.get(timeout=2)
    except queue.Empty:
        break
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    for _ in range(10):
        torch.mm(torch.randn(64, 64), torch.randn(64, 64))
    opt.step()
    step_s += clock() - t0
    per_step.append(len(x))
    done += 1
stop.set()
producer.join(10)
print(json.dumps({"steps": done, "samples": sum(per_step), "step_s": step_s, "per_step": per_step}))
