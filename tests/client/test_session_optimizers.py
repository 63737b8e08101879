"""Several optimizers (issue 47, docs/zero-code.md "Several optimizers"): the job's step is the loop iteration,
the optimizer that steps least; its samples are the iteration's.  In-process, with a reporter that records
what it is given; the times, batches and optimizer steps are the ones the test makes (its own schedule is the
oracle: iterations, their start and end, their samples)."""
import pytest

from tests.client.test_session_loaders import loader, session, shares


class Opt:
    """An optimizer: something teye can hold a weak reference to."""


def gan(s, iterations, d_steps, t0=0, batch=12):
    """A GAN loop: per iteration one batch (10 ns wait), ``d_steps`` discriminator steps (10 ns each), one
    generator step (10 ns).  Returns the iterations' own (start, end, samples)."""
    d, g = Opt(), Opt()
    s.optimizer_made(d)
    s.optimizer_made(g)
    it = loader(s, 1)   # noqa: F841 (held: the loader trains)
    t, truth = t0, []
    for _ in range(iterations):
        start = t
        s.wait(t, t + 10, batch, 1)
        t += 10
        for _ in range(d_steps):
            t += 10
            s.step(t, id(d))
        t += 10
        s.step(t, id(g))
        truth.append((start, t, batch))
    s._keep = (d, g)
    return truth


@pytest.mark.parametrize("d_steps", [1, 2, 3])
def test_a_gan_step_is_its_loop_iteration(d_steps):
    """The issue's GAN stepping its discriminator twice per iteration counted 60 steps for 30 iterations (the
    first optimizer to step led); now 30, each the iteration's time and batch."""
    s = session()
    truth = gan(s, 30, d_steps)
    s._flush_lead()   # what the exit does: nothing is left held
    got = [(a, b, n) for a, b, n, _ in shares(s.reporter)]
    if d_steps == 1:
        # D and G alternate: D leads (the first to step), each of its steps one iteration, from the batch's
        # wait to D's step; G's step runs into the next step (its compute), so the time and batches are exact
        assert len(got) == 30 and sum(n for _, _, n in got) == 30 * 12
        assert [n for _, _, n in got] == [12] * 30
    else:
        assert got == truth, (got[:3], truth[:3])
    # the data_wait of each step is its batch's 10 ns
    assert [w for *_, w in shares(s.reporter)] == [10] * 30


def test_two_optimizers_one_never_steps():
    """Bad input of issue 47: two optimizers made, one never steps: every step of the other is the job's, none
    lost and none merged (held at first, then sent as they were)."""
    s = session()
    a, b = Opt(), Opt()
    s.optimizer_made(a)
    s.optimizer_made(b)
    it = loader(s, 1)   # noqa: F841
    truth = []
    for i in range(20):
        s.wait(20 * i, 20 * i + 5, 4, 1)
        s.step(20 * i + 20, id(a))
        truth.append((20 * i, 20 * i + 20, 4))
        # the first 7 are held (the second optimizer may still step), the 8th sends them all, then each goes
        assert len(s.reporter.steps) == (0 if i < 7 else i + 1), (i, s.reporter.steps)
    s._flush_lead()                       # the exit (nothing left held here)
    assert [(x, y, n) for x, y, n, _ in shares(s.reporter)] == truth


def test_a_short_job_with_two_optimizers_sends_its_held_steps_at_exit():
    s = session()
    a, b = Opt(), Opt()
    s.optimizer_made(a)
    s.optimizer_made(b)
    it = loader(s, 1)   # noqa: F841
    for i in range(3):
        s.wait(20 * i, 20 * i + 5, 4, 1)
        s.step(20 * i + 20, id(a))
    assert s.reporter.steps == []         # held: the second optimizer may still step
    s._flush_lead()                       # registered at exit when the first was held
    assert [(x, y, n) for x, y, n, _ in shares(s.reporter)] == [(0, 20, 4), (20, 40, 4), (40, 60, 4)]


def test_one_optimizer_is_never_held():
    s = session()
    a = Opt()
    s.optimizer_made(a)
    it = loader(s, 1)   # noqa: F841
    s.wait(0, 5, 4, 1)
    s.step(20, id(a))
    assert [(x, y, n) for x, y, n, _ in shares(s.reporter)] == [(0, 20, 4)]


def test_a_producer_threads_batches_are_the_steps_that_took_them():
    """Issue 47: a producer thread fills a queue of 4 before the training thread's first step (made its
    optimizer at 100); each step takes one batch of 6, the producer refills one while it runs, and the last 4
    steps drain the queue.  The first step starts at 100 (not at the producer's first fetch at 0), every step
    counts 6 samples (not 24, 6, ..., 0), and the total is every batch taken."""
    s = session()
    s.off_thread = True
    opt = Opt()
    s.optimizer_made(opt)
    s.opt_made_ns = 100
    for k in range(4):                     # the queue's fill, read ahead
        s.wait(10 * k, 10 * k + 5, 6)
    t = 100
    for i in range(10):
        if i < 6:                          # the refill while the step runs (the producer's loader has 10)
            s.wait(t + 2, t + 4, 6)
        t += 20
        s.step(t, id(opt))
    got = [(a, b, n) for a, b, n, _ in s.reporter.steps]
    assert got[0] == (100, 120, 6), got
    assert [n for _, _, n in got] == [6] * 10 and sum(n for _, _, n in got) == 60, got


def test_a_dataloader_read_in_a_generator_of_the_jobs_own_is_steps_only():
    """Issue 47: the caller of a DataLoader's next() decides: the loop itself (its wait is the step's input
    wait) or a generator of the job's own, which may do the loop's data work between the batches on the
    training thread (then steps only: never compute).  A framework's generator (under site-packages) is not
    the job's.  The session then sends steps and samples only."""
    from teye_client import _torch

    def gen():
        yield 1

    def plain():
        return 1
    assert _torch._job_generator(gen.__code__) and not _torch._job_generator(plain.__code__)
    site = compile("def g():\n    yield 1\n", "/usr/lib/python3/dist-packages/accelerate/data_loader.py", "exec")
    ns = {}
    exec(site, ns)
    assert not _torch._job_generator(ns["g"].__code__)
    s = session()
    it, ev = loader(s, 1), loader(s, 2)   # noqa: F841
    s.wait(0, 5, 8, 1)
    s.step(20)
    s.generator_loader(2)                 # a validation pass read through a generator expression
    s.nograd.add(2)
    s.wait(22, 24, 8, 2)
    s.wait(30, 35, 8, 1)
    s.step(50)
    assert not s.own_gen and [len(ph) for *_, ph in s.reporter.steps] == [2, 2]   # training as it was
    s.generator_loader(1)                 # the training loader read through the job's own generator
    s.wait(55, 60, 8, 1)
    s.step(80)
    assert s.own_gen and s.reporter.steps[-1] == (50, 80, 8, [])
