"""The training thread's own data work (issue 47, docs/zero-code.md "The loop's own data work"): where no
DataLoader is read on the thread that steps, its time before each outermost forward, since its last other part,
less the copies to the device in it, is ``data_wait`` and the rest of the step ``compute``.  In-process, on a
clock the test moves: the schedule it makes (data work, parts, steps, teye's own bookkeeping) is the oracle."""
import pytest

from teye_client import _common, auto

F, B, O, H = 0, 1, 2, 3   # the parts: forward, backward, optimizer, h2d_copy
W, C = '"data_wait"', '"compute"'


class Recorder:
    source = None
    _src_due = False

    def __init__(self):
        self.steps = []

    def record_step(self, phases, a, b, samples, parts=None):
        self.steps.append((a, b, samples, [(phases[i], phases[i + 1], phases[i + 2])
                                           for i in range(0, len(phases), 3)]))


class Clock:
    def __init__(self):
        self.t = 1000

    def __call__(self):
        return self.t


class Opt:
    """An optimizer: something teye can hold a weak reference to."""


@pytest.fixture
def loop(monkeypatch):
    """(session, clock, thread): a session of a loop without a DataLoader, on the test's clock; ``thread``
    holds the id the session reads as the current thread's."""
    clock = Clock()
    me = {"id": 1}
    monkeypatch.setattr(_common, "_ns", clock)
    monkeypatch.setattr(_common, "_thread", lambda: me["id"])
    s = auto.Session()
    s.reporter = Recorder()
    s.exit_hook = True
    s.step_source, s.work_source = "torch-steps", "torch-forward"
    orig = s._step

    def step_with_bookkeeping(*a, **kw):   # teye's own work at each step: 7 ns the job's clock has inside it
        orig(*a, **kw)
        clock.t += 7

    monkeypatch.setattr(s, "_step", step_with_bookkeeping)
    s._keep = Opt()
    s.optimizer_made(s._keep)
    return s, clock, me


def part(s, clock, kind, ns):
    s.pbegin(kind)
    clock.t += ns
    s.pend()


def sums(rep):
    """Per step: (data_wait ns, compute ns, its span)."""
    return [(sum(y - x for n, x, y in ph if n == W), sum(y - x for n, x, y in ph if n == C), b - a)
            for a, b, _, ph in rep.steps]


def test_each_micro_batchs_data_work_before_its_forward_and_none_of_teyes_bookkeeping(loop):
    """Gradient accumulation over two micro-batches, 30 and 20 ns of data work before their forwards; the
    first step begins where the optimizer was made, the next ones after teye's 7 ns of bookkeeping, which is
    compute (the job's optimizer step holds it)."""
    s, clock, _ = loop
    for _ in range(3):
        clock.t += 30
        part(s, clock, F, 10)
        part(s, clock, B, 10)
        clock.t += 20
        part(s, clock, F, 10)
        part(s, clock, B, 10)
        part(s, clock, O, 5)
        s.step_guarded(clock.t)
    assert sums(s.reporter) == [(50, 45, 95), (50, 52, 102), (50, 52, 102)]
    assert s.reporter.source == "torch-forward"


def test_a_copy_to_the_device_before_the_forward_is_compute(loop):
    s, clock, _ = loop
    for _ in range(2):
        clock.t += 10
        part(s, clock, H, 4)   # the batch to the GPU: h2d_copy, compute
        clock.t += 6           # work on the copied batch before the forward: data work
        part(s, clock, F, 10)
        part(s, clock, B, 10)
        part(s, clock, O, 5)
        s.step_guarded(clock.t)
    assert sums(s.reporter) == [(16, 29, 45), (16, 36, 52)]


def test_a_forward_on_another_thread_is_not_the_loops_data_work(loop):
    """A forward another thread runs (an evaluator, a teacher model served from a thread) places nothing: the
    step's data work is its own thread's."""
    s, clock, me = loop
    clock.t += 10
    part(s, clock, F, 10)
    part(s, clock, B, 10)
    me["id"] = 2
    part(s, clock, F, 10)   # another thread's forward, 30 ns after the step's start (its own first part)
    me["id"] = 1
    part(s, clock, O, 5)
    s.step_guarded(clock.t)
    assert sums(s.reporter) == [(10, 35, 45)]


def test_without_a_forward_the_step_stays_steps_only(loop):
    s, clock, _ = loop
    clock.t += 30
    part(s, clock, B, 10)   # no forward seen (a model that is not an nn.Module)
    part(s, clock, O, 5)
    s.step_guarded(clock.t)
    # (its first step from its end, as every steps-only first step without a wait before it)
    assert s.reporter.steps == [(1045, 1045, 0, [])] and s.reporter.source == "torch-steps"
