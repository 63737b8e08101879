"""An unmodified PyTorch script (no teye import) whose model is torch.compile'd; input-bound (the dataset
sleeps).  The zero-code tests (tests/client/test_torch_compile.py) run it under ``teye run``.

    python torch_compile_job.py {compile|inductor|eager|fail} STEPS

- compile: ``torch.compile(model, backend="aot_eager", dynamic=False)`` (no C compiler needed); the epoch
  ends on a short batch mid-run (a new input shape: a recompile), then the next epoch's full batches (cached).
- inductor: the same with PyTorch's default backend (needs a C compiler; no test depends on it).
- eager: the same loop, no torch.compile.
- fail: compiled with a backend that raises; the job catches the error at its first step and goes on with
  the eager model (torch ends the compilation in a ``finally``: its interval is closed).

Its own clock (time.perf_counter) times each step (from the end of the previous one, the first from asking
for its batch, to the end of its optimizer step) and its input waits (inside next(), the new epoch's
iterator included); its compilations are timed with the same public callbacks PyTorch offers any job
(``torch._dynamo.callback.callback_handler``).  One JSON line at the end: steps, samples, step_s (the
steps' sum), wait_s, compile_s (the compilations, also in step_s), compiles (how many), first_step_s.
"""
import json
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

MODE, STEPS = sys.argv[1], int(sys.argv[2])
BATCH = 8
clock = time.perf_counter


class Data(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 64, generator=g)
        self.y = torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(0.0015)  # slow storage or decoding: the job is input-bound
        return self.x[i], self.y[i]


compiles = []   # [start, end] of each compilation, the job's own clock


def _own_compile_clock():
    from torch._dynamo.callback import callback_handler
    began = []
    callback_handler.register_start_callback(lambda args: began.append(clock()))
    callback_handler.register_end_callback(lambda args: compiles.append((began.pop(), clock())))


def failing_backend(gm, example_inputs):
    time.sleep(0.05)   # some work before it fails
    raise RuntimeError("this backend cannot compile the model")


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    # an epoch of STEPS // 2 full batches and one of 4 samples: a new input shape mid-run
    loader = DataLoader(Data(BATCH * (STEPS // 2) + 4), batch_size=BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(2))
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run = model
    if MODE != "eager":
        _own_compile_clock()
        backend = {"compile": "aot_eager", "inductor": "inductor"}.get(MODE, failing_backend)
        run = torch.compile(model, backend=backend, dynamic=False)
    it = iter(loader)
    steps = samples = 0
    step_s = wait_s = 0.0
    first_step_s = prev = None
    while steps < STEPS:
        t0 = clock()
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(loader)
            x, y = next(it)
        t1 = clock()
        try:
            out = run(x)
        except Exception as e:  # the compile failed: go on eager (what a job that can live without it does)
            print("torch.compile failed (%s): eager from now on" % type(e).__name__)
            run = model
            out = run(x)
        loss = torch.nn.functional.mse_loss(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t2 = clock()
        steps += 1
        samples += len(x)
        step_s += t2 - (t0 if prev is None else prev)   # from the previous step's end, as teye's steps run
        prev = t2
        wait_s += t1 - t0
        if first_step_s is None:
            first_step_s = t2 - t0
        print("step %d loss %.6f" % (steps, loss.item()))
    print(json.dumps({"steps": steps, "samples": samples, "step_s": step_s, "wait_s": wait_s,
                      "compile_s": sum(b - a for a, b in compiles), "compiles": len(compiles),
                      "first_step_s": first_step_s}))


if __name__ == "__main__":
    main()
