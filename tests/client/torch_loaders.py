"""An unmodified PyTorch loop whose every step reads several DataLoaders (labelled + unlabelled, the shape of
semi-supervised, contrastive and multi-task training), with its own clock.

    python torch_loaders.py MODE STEPS

MODE: ab (the slow labelled loader read first, then the fast unlabelled one), ba (the fast one first), zip
(``for (x, y), u in zip(la, lb)``), three (a third loader after the two), alt (the second loader read only
every other step), cycle (the second loader through itertools.cycle: after its 3 batches, replays that read
no loader), val (as ab, and after every 10th step a validation pass under torch.no_grad() over an iterator
the job keeps, run to its end: evaluation, its time from its start to the next training batch asked for).  The labelled loader's __getitem__ sleeps (input-bound training).  A batch-size probe
(next(iter(lb))) comes first, which is evaluation, not training.
Prints one JSON line: steps, samples read from the loaders for the steps, the time of the steps (the whole
loop: from the end of the previous step, its line printed, or for the first step and the first after a
validation pass from asking for its first batch, to the end of its own line) and the input wait inside them
(perf_counter right around each next()), the probe's time (to the first training batch asked for) and the
validation passes' (from their start to the next training batch asked for).
"""
import itertools
import json
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

clock = time.perf_counter


class Data(Dataset):
    def __init__(self, n, sleep_s):
        self.x, self.sleep_s = torch.randn(n, 16), sleep_s

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.x[i], self.x[i, :1]


torch.manual_seed(0)
mode, steps = sys.argv[1], int(sys.argv[2])
BA, BB = 4, 8
la = DataLoader(Data(BA * steps, 0.008), batch_size=BA)          # slow: ~32 ms a batch
lb = DataLoader(Data(BB * (3 if mode == "cycle" else steps), 0), batch_size=BB)
lc = DataLoader(Data(2 * steps, 0), batch_size=2)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
probe_from = clock()
print("probe batch", len(next(iter(lb))[0]), flush=True)
lv = DataLoader(Data(4 * 5, 0.002), batch_size=4)
wait = total = probe_s = eval_s = 0.0
eval_from = None
samples = 0


def timed(it):
    global wait, samples
    t = clock()
    b = next(it)
    wait += clock() - t
    return b


if mode == "zip":
    src = zip(la, lb)
    fetch = [lambda: timed(src)]
elif mode == "cycle":
    ia, ib = iter(la), itertools.cycle(lb)
    fetch = [lambda: timed(ia), lambda: timed(ib)]
else:
    ia, ib, ic = iter(la), iter(lb), iter(lc)
    fetch = {"ab": [lambda: timed(ia), lambda: timed(ib)], "ba": [lambda: timed(ib), lambda: timed(ia)],
             "three": [lambda: timed(ia), lambda: timed(ib), lambda: timed(ic)],
             "alt": [lambda: timed(ia), lambda: timed(ib)], "val": [lambda: timed(ia), lambda: timed(ib)]}[mode]
read = 0    # samples read from the loaders (a cycle's replays read none)
t_prev = None   # where the previous step ended (its line printed): a step is the whole loop from there
for i in range(steps):
    t0 = clock()
    if i == 0:
        probe_s = t0 - probe_from
    if eval_from is not None:
        eval_s += t0 - eval_from
        eval_from = t_prev = None
    got = [f() for f in (fetch if mode != "alt" or i % 2 == 0 else fetch[:1])]
    if mode == "zip":
        got = list(got[0])
    loss = sum(((model(b[0]) - b[1]) ** 2).mean() for b in got)
    opt.zero_grad()
    loss.backward()
    opt.step()
    samples += sum(len(b[0]) for b in got)
    read += sum(len(b[0]) for b in got) if mode != "cycle" else BA + (BB if i < 3 else 0)
    print("step", i, "%.6f" % loss.item(), flush=True)
    t_end = clock()
    total += t_end - (t0 if t_prev is None else t_prev)
    t_prev = t_end
    if mode == "val" and i % 10 == 9 and i + 1 < steps:
        eval_from = clock()
        vit = iter(lv)            # kept: still alive (and at its end) at the next step
        with torch.no_grad():
            print("val", sum(float(((model(x) - y) ** 2).mean()) for x, y in vit), flush=True)
print(json.dumps({"steps": steps, "samples": samples, "read": read, "train_s": total, "wait_s": wait,
                  "wait_share": wait / total, "probe_s": probe_s, "eval_s": eval_s}))
