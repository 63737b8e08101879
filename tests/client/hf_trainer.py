"""An unmodified Hugging Face Trainer run: a tiny BERT built from a config (nothing downloaded), synthetic
token data, evaluation every EVERY steps.

    python hf_trainer.py STEPS EVERY OUTDIR [--fast] [--mid-epoch]

EVERY 0: no evaluation (eval_strategy "no", no evaluation set).  --fast: no sleep in __getitem__ (what is left
is the tiny model's compute and the loader's own work).

Its own clock: the time inside trainer.evaluate() (a Trainer subclass times it), from the start of
training (on_train_begin) to the end of its last step less the evaluations before it, and inside the training set's __getitem__ (its input wait: no workers); the samples trained.  The training set's __getitem__
sleeps (an input-bound job).  Prints one JSON line; collate_s: the time in the collator while training (not in
wait_s).
"""
import json
import sys
import time

import torch
from transformers import (BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments,
                          default_data_collator)

fast = "--fast" in sys.argv[1:]
mid = "--mid-epoch" in sys.argv[1:]   # the training set 3 batches longer than STEPS: max_steps stops mid-epoch
argv = [a for a in sys.argv if a not in ("--fast", "--mid-epoch")]
steps, every, out = int(argv[1]), int(argv[2]), argv[3]
SLEEP_S = 0 if fast else 0.01
BS = 4
torch.manual_seed(0)


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, sleep_s):
        g = torch.Generator().manual_seed(n)
        self.ids = torch.randint(1, 100, (n, 16), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)
        self.sleep_s = sleep_s
        self.spent = 0.0   # time inside __getitem__: the input wait (num_workers=0)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        t = time.perf_counter()
        time.sleep(self.sleep_s)
        self.spent += time.perf_counter() - t
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(16, dtype=torch.long),
                "labels": self.labels[i]}


class Timed(Trainer):
    eval_s = 0.0
    evals = 0
    evaluating = False

    def evaluate(self, *a, **kw):
        t = time.perf_counter()
        Timed.evaluating = True
        try:
            return super().evaluate(*a, **kw)
        finally:
            Timed.evaluating = False
            Timed.eval_s += time.perf_counter() - t
            Timed.evals += 1


class Collate:
    """The Trainer's own default collator, timed while training (batching the samples: input work too)."""
    spent = 0.0

    def __call__(self, features):
        t = time.perf_counter()
        try:
            return default_data_collator(features)
        finally:
            if not Timed.evaluating:
                Collate.spent += time.perf_counter() - t


class Span(TrainerCallback):
    """From the start of training (after the trainer's set-up) to the end of its last step."""
    begin = end = None

    def on_train_begin(self, args, state, control, **kw):
        Span.begin = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        Span.end = time.perf_counter()
        Span.eval_at_end = Timed.eval_s


cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=64, max_position_embeddings=32, num_labels=2)
model = BertForSequenceClassification(cfg)
args = TrainingArguments(output_dir=out, max_steps=steps, per_device_train_batch_size=BS,
                         per_device_eval_batch_size=BS, eval_strategy="steps" if every else "no",
                         eval_steps=every or None,
                         save_strategy="no", logging_strategy="no", report_to=[], use_cpu=True,
                         dataloader_num_workers=0, disable_tqdm=True, seed=0)
train_set = Tokens(BS * (steps + 3) if mid else BS * steps, SLEEP_S)
trainer = Timed(model=model, args=args, train_dataset=train_set,
                eval_dataset=Tokens(BS * 6, SLEEP_S) if every else None,
                data_collator=Collate(),
                callbacks=[Span()])
t0 = time.perf_counter()
trainer.train()
wall = time.perf_counter() - t0
print(json.dumps({"steps": trainer.state.global_step, "samples": BS * trainer.state.global_step,
                  "train_s": Span.end - Span.begin - Span.eval_at_end, "wall_s": wall, "wait_s": train_set.spent, "eval_s": Timed.eval_s,
                  "collate_s": Collate.spent,
                  "evals": Timed.evals}))
