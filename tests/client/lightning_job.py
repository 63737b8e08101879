"""An unmodified PyTorch Lightning run with a sanity check and validation every EVERY steps inside the epoch.

    python lightning_job.py STEPS EVERY [SANITY] [--fast] [--workers N]

EVERY: Lightning's val_check_interval, batches (10) or a fraction of the epoch (0.5).

Its own clock (a Callback): the time of the sanity check and of each validation, from the start of
training (after the sanity check) to the end of its last batch less the validations in between,
and the time inside the training set's __getitem__ (its input wait: no workers); the samples trained.
EVERY 0: no evaluation (no validation loader, so neither a sanity check nor validation).  --fast: no sleep
in __getitem__ (the tiny model's compute and the loader's own work are left).  --workers N: both loaders read
by N DataLoader worker processes (not persistent: Lightning starts a validation's workers before its
on_validation_start, and the training loader's after the sanity check); wait_s and collate_s are then the
workers' (not seen here: 0), and the oracle is the clock of the hooks.  Prints one JSON line;
collate_s: the time in the training loader's collate function (not in wait_s); fetch_s: the time in the
training loader's next() (the whole fetch: the DataLoader's own work, and with workers the wait for them);
between_s: from the end of
each training batch (the first: from the start) to the next one's start, less validation (the loader's
and Lightning's own work between batches: an upper bound of the input wait).  Before the JSON line, what
it trained (its weights' sum).
"""
import json
import sys
import time

import lightning as L
import torch

fast = "--fast" in sys.argv[1:]
argv = [a for a in sys.argv if a != "--fast"]
workers = 0
if "--workers" in argv:
    i = argv.index("--workers")
    workers = int(argv[i + 1])
    del argv[i:i + 2]
steps, every = int(argv[1]), (float(argv[2]) if "." in argv[2] else int(argv[2]))
sanity = int(argv[3]) if len(argv) > 3 else 2
SLEEP_S = 0 if fast else 0.005
BS = 4
torch.manual_seed(0)


class Slow(torch.utils.data.Dataset):
    def __init__(self, n, sleep_s):
        self.x, self.y, self.sleep_s, self.spent = torch.randn(n, 16), torch.randn(n, 1), sleep_s, 0.0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        t = time.perf_counter()
        time.sleep(self.sleep_s)
        self.spent += time.perf_counter() - t
        return self.x[i], self.y[i]


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.trained = 0

    def training_step(self, batch, i):
        x, y = batch
        self.trained += len(x)
        return ((self.net(x) - y) ** 2).mean()

    def validation_step(self, batch, i):
        x, y = batch
        return ((self.net(x) - y) ** 2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Clock(L.Callback):
    def __init__(self):
        self.eval_s, self.evals, self._t = 0.0, 0, None
        self.begin = self.end = None
        self.eval_in_train = 0.0
        self.between_s = 0.0   # from the end of a training batch (or the start) to the next one's start

    def on_train_start(self, trainer, module):    # after the sanity check
        self.begin = time.perf_counter()
        self.eval_in_train = -self.eval_s
        self._last, self._eval_at_last = self.begin, self.eval_s

    def on_train_batch_start(self, trainer, module, *a):
        self.between_s += time.perf_counter() - self._last - (self.eval_s - self._eval_at_last)

    def on_train_batch_end(self, trainer, module, *a):
        self.end = time.perf_counter()
        self.eval_before_end = self.eval_s
        self._last, self._eval_at_last = self.end, self.eval_s

    def on_validation_start(self, trainer, module):   # the sanity check runs the validation loop too
        self._t = time.perf_counter()

    def on_validation_end(self, trainer, module):
        self.eval_s += time.perf_counter() - self._t
        self.evals += 1


train_set = Slow(BS * steps, SLEEP_S)
model, clock = Model(), Clock()
trainer = L.Trainer(max_steps=steps, val_check_interval=every or None, limit_val_batches=6 if every else 0,
                    num_sanity_val_steps=sanity if every else 0,
                    accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, callbacks=[clock])
collate_s = 0.0


def collate(batch):
    """torch's default_collate, timed (batching the samples: input work too, not in wait_s)."""
    global collate_s
    t = time.perf_counter()
    try:
        return torch.utils.data.default_collate(batch)
    finally:
        collate_s += time.perf_counter() - t


fetch_s = 0.0


class _Fetches:
    """The training loader's iterator, each next() timed (the whole fetch by this script's clock: the
    DataLoader's own work around __getitem__ and collate too, which teye's wait is)."""

    def __init__(self, it):
        self.it = it

    def __iter__(self):
        return self

    def __next__(self):
        global fetch_s
        t = time.perf_counter()
        try:
            return next(self.it)
        finally:
            fetch_s += time.perf_counter() - t

    def __len__(self):
        return len(self.it)


class TimedLoader(torch.utils.data.DataLoader):
    def __iter__(self):
        return _Fetches(super().__iter__())


loader = TimedLoader(train_set, batch_size=BS, collate_fn=collate, num_workers=workers)
val = torch.utils.data.DataLoader(Slow(BS * 6, SLEEP_S), batch_size=BS, num_workers=workers) if every else None
t0 = time.perf_counter()
trainer.fit(model, loader, val)
wall = time.perf_counter() - t0
print("weights %.5f" % float(sum(p.detach().sum() for p in model.parameters())))
print(json.dumps({"steps": trainer.global_step, "samples": model.trained, "wall_s": wall,
                  "train_s": clock.end - clock.begin - (clock.eval_before_end + clock.eval_in_train),
                  "wait_s": train_set.spent, "collate_s": collate_s, "fetch_s": fetch_s,
                  "between_s": clock.between_s, "eval_s": clock.eval_s, "evals": clock.evals, "workers": workers}))
