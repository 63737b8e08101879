"""An unmodified PyTorch loop that evaluates while it trains, with its own clock of its training steps.

    python torch_eval.py STEPS EVERY [optstep] [--fast]

A batch-size probe (next(iter(train_loader))) first; then STEPS training steps from a DataLoader whose
__getitem__ sleeps (input-bound training), and every EVERY steps, and once after the last step, a
validation pass over its own DataLoader under model.eval() / torch.no_grad() (its __getitem__ sleeps
too).  optstep: the validation loop also calls optimizer.step() (it is then training, by definition).
EVERY 0: no evaluation at all (neither the probe nor a validation pass).  --fast: no sleep in either
__getitem__ (the tiny model's compute and the loader's own work are left).
Prints one JSON line: its training steps' time (from asking for a batch to the end of optimizer.step()),
their input wait, the samples trained, the time spent evaluating (from the first evaluation batch
asked for to the next training batch asked for; the final pass to its last batch) and its input wait,
and the probe's time (to the first training batch asked for; 0 without a probe).
"""
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

from tests.client.own_clock import OwnClock


class Slow(Dataset):
    def __init__(self, n, sleep_s):
        self.x, self.y, self.sleep_s = torch.randn(n, 16), torch.randn(n, 1), sleep_s

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(self.sleep_s)
        return self.x[i], self.y[i]


torch.manual_seed(0)
fast = "--fast" in sys.argv[1:]
argv = [a for a in sys.argv if a != "--fast"]
steps, every = int(argv[1]), int(argv[2])
optstep = len(argv) > 3 and argv[3] == "optstep"
BS = 4
train_loader = DataLoader(Slow(BS * steps, 0 if fast else 0.002), batch_size=BS)
val_loader = DataLoader(Slow(BS * 6, 0 if fast else 0.004), batch_size=BS)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
probe_from = OwnClock.clock()
if every:
    probe = next(iter(train_loader))      # a batch-size probe: not training
    print("probe batch", len(probe[0]), flush=True)
own = OwnClock()
opt_in_eval = evals = 0
eval_wait_s = probe_s = 0.0


def evaluate():
    global opt_in_eval, evals, eval_wait_s
    evals += 1
    model.eval()
    total = 0.0
    with torch.no_grad() if not optstep else torch.enable_grad():
        it = iter(val_loader)
        while True:
            t = OwnClock.clock()
            batch = next(it, None)
            eval_wait_s += OwnClock.clock() - t      # its input wait (the end of the pass's too)
            if batch is None:
                break
            x, y = batch
            loss = ((model(x) - y) ** 2).mean()
            total += float(loss)
            if optstep:
                opt.zero_grad()
                loss.backward()
                opt.step()
                opt_in_eval += 1
    model.train()
    return total


it = iter(train_loader)


def train(batch):
    x, y = batch
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    for _ in range(20):                     # some compute
        torch.mm(torch.randn(64, 64), torch.randn(64, 64))
    opt.step()
    return len(x)


for i in range(steps):
    if i == 0 and every:
        probe_s = OwnClock.clock() - probe_from
    own.step(lambda: next(it), train)
    if every and (i + 1) % every == 0:
        print("eval after", i + 1, "loss %.5f" % own.evaluate(evaluate), flush=True)
own.report(steps, opt_in_eval=opt_in_eval, evals=evals, eval_wait_s=eval_wait_s, probe_s=probe_s)
