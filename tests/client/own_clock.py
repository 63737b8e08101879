"""The own clock of the evaluating loops (torch_eval.py, tf_eval_loop.py): a job's timing of its training steps
and of its evaluations, the oracle the evaluation tests compare teye with.  Standard library only."""
import json
import time

clock = time.perf_counter


class OwnClock:
    """A training step: from asking for its batch to the end of its optimizer step.  An evaluation: from
    its start (evaluate(), or eval_from set by the job) to the next training batch asked for, the last one to
    the end (report())."""

    clock = staticmethod(clock)

    def __init__(self):
        self.compile_s = 0.0   # summed by the job: its calls that traced its step function (in train_s too)
        self.train_s = self.wait_s = self.eval_s = 0.0
        self.samples = 0
        self.step_times = []
        self.eval_from = None

    def step(self, fetch, train):
        """One training step: batch = fetch() (the input wait), then train(batch), which returns its samples."""
        t0 = clock()
        if self.eval_from is not None:
            self.eval_s += t0 - self.eval_from
            self.eval_from = None
        batch = fetch()
        t1 = clock()
        self.samples += train(batch)
        t2 = clock()
        self.train_s += t2 - t0
        self.wait_s += t1 - t0
        self.step_times.append(t2 - t0)

    def evaluate(self, fn):
        self.eval_from = clock()
        return fn()

    def report(self, steps, final_end=None, **extra):
        """Print the one JSON line the tests read (after the job's own output); ``final_end``: where the last
        evaluation ended (its last batch), if not now."""
        if self.eval_from is not None:
            self.eval_s += (clock() if final_end is None else final_end) - self.eval_from
        print(json.dumps(dict({"steps": steps, "samples": self.samples, "train_s": self.train_s,
                               "wait_s": self.wait_s, "wait_share": self.wait_s / self.train_s,
                               "compile_s": self.compile_s,
                               "wait_share_steps": self.wait_s / (self.train_s - self.compile_s),
                               "eval_s": self.eval_s, "step_times": self.step_times}, **extra)))
