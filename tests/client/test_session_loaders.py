"""Several loaders per step and the flush before os._exit (issue 39), in-process (teye_client.auto): which
loaders' waits are training and which are evaluation, with a reporter that records what it is given and
times the test makes; os._exit in a child process that sends to a datagram socket the test reads."""
import json
import os
import socket
import subprocess
import sys

import pytest

from teye_client import auto
from tests.client.helpers import base_env
from tests.client.test_session_eval import Recorder


class It:
    """A loader's iterator: something teye can hold a weak reference to."""


def session():
    s = auto.Session()
    s.wait_source = "torch"
    s.reporter = Recorder()
    s.exit_hook = True   # no atexit registration from a test
    return s


def loader(s, k):
    it = It()
    s.loader(k, it)
    return it


def shares(rep):
    """Per step: (start, end, samples, data_wait ns)."""
    return [(a, b, n, sum(p[2] - p[1] for p in ph if p[0] == '"data_wait"')) for a, b, n, ph in rep.steps]


@pytest.mark.parametrize("order", [(1, 2), (2, 1), (1, 2, 3), (3, 1, 2)])
def test_every_loader_a_step_reads_trains_in_any_order(order):
    s = session()
    held = [loader(s, k) for k in order]  # noqa: F841 (the job holds its iterators)
    t = 0
    for _ in range(3):
        for k in order:
            s.wait(t, t + 10, k, k)     # a slow fetch of k samples
            t += 10
        t += 5
        s.step(t)
    assert s.reporter.phases == []
    assert [x[2:] for x in shares(s.reporter)] == [(sum(order), 10 * len(order))] * 3


def test_a_loader_read_every_other_step_trains():
    s = session()
    a, b = loader(s, 1), loader(s, 2)   # noqa: F841
    s.wait(0, 10, 4, 1)
    s.wait(10, 20, 8, 2)
    s.step(25)
    s.wait(25, 35, 4, 1)
    s.step(40)
    s.wait(40, 50, 8, 2)               # the second loader first this time
    s.wait(50, 60, 4, 1)
    s.step(65)
    assert s.reporter.phases == [] and [x[2:] for x in shares(s.reporter)] == [(12, 20), (4, 10), (12, 20)]


def test_a_dropped_probe_and_an_ended_pass_are_eval_a_held_loader_is_not():
    s = session()
    loader(s, 9)                        # a probe: next(iter(loader)), dropped at once
    s.wait(0, 3, 4, 9)
    a, b = loader(s, 1), loader(s, 2)   # noqa: F841
    s.wait(5, 15, 4, 1)
    s.wait(15, 20, 8, 2)
    s.step(30)
    v = loader(s, 7)                    # a validation pass over an iterator the job keeps, run to its end
    s.wait(30, 40, 4, 7)
    s.wait(40, 42, 0, 7)
    s.ended.add(7)
    s.wait(45, 55, 4, 1)
    s.wait(55, 60, 8, 2)
    s.step(70)
    assert v is not None
    assert s.reporter.phases == [("eval", 0, 5), ("eval", 30, 45)]
    assert shares(s.reporter) == [(5, 30, 12, 15), (45, 70, 12, 15)]


def test_a_held_loader_read_under_no_grad_is_eval_unless_it_trained():
    """Lightning's validation: an iterator it keeps, read under no_grad() and stopped at the loader's length
    (no StopIteration); a training loader read under no_grad() (a teacher's batch) still trains."""
    s = session()
    a, b = loader(s, 1), loader(s, 2)   # noqa: F841
    s.wait(0, 10, 4, 1)
    s.wait(10, 15, 8, 2)
    s.step(20)
    v = loader(s, 7)                    # noqa: F841 (held)
    s.wait(20, 30, 4, 7)
    s.wait(30, 40, 4, 7)
    s.nograd.add(7)
    s.wait(40, 50, 4, 1)
    s.wait(50, 55, 8, 2)
    s.nograd.add(2)                     # a loader that trained, read under no_grad this time
    s.step(60)
    assert s.reporter.phases == [("eval", 20, 40)]
    assert shares(s.reporter) == [(0, 20, 12, 15), (40, 60, 12, 15)]


def test_what_comes_before_an_evaluation_is_training():
    """Lightning makes a validation's iterator (its DataLoader workers started) before its on_validation_start,
    which its own clock counts as training: from the previous step to the evaluation's first wait is training,
    its training waits data_wait with their samples, the rest compute (outside the step's own interval, which
    starts after the evaluation)."""
    s = session()
    a, b = loader(s, 1), loader(s, 2)   # noqa: F841
    s.wait(0, 10, 4, 1)
    s.step(20)
    s.wait(25, 35, 4, 1)                # a training batch, then a validation pass (read under no_grad)
    v = loader(s, 7)                    # noqa: F841 (held)
    s.wait(50, 60, 4, 7)
    s.wait(60, 70, 4, 7)
    s.nograd.add(7)
    s.wait(75, 80, 8, 2)
    s.step(90)
    assert s.reporter.phases == [("eval", 50, 75), ("compute", 20, 25), ("data_wait", 25, 35), ("compute", 35, 50)]
    assert shares(s.reporter) == [(0, 20, 4, 10), (75, 90, 12, 5)]


def test_what_comes_before_a_tf_data_evaluation_is_in_neither():
    """tf.data's iterators are not registered (no s.loader()): a custom TensorFlow loop's own clock starts its
    evaluation after making the validation iterator and counts that in neither, and so does teye."""
    s = session()
    s.wait(0, 10, 4, 1)
    s.step(20)
    s.wait(30, 40, 4, 7)                # a validation pass run to its end, made from 20 to 30
    s.wait(40, 42, 0, 7)
    s.ended.add(7)
    s.wait(45, 55, 4, 1)
    s.step(60)
    assert s.reporter.phases == [("eval", 30, 45)]
    assert shares(s.reporter) == [(0, 20, 4, 10), (45, 60, 4, 10)]


def test_an_evaluation_ends_where_the_training_iterator_was_made():
    """A training iterator made after an evaluation's last wait (Lightning's after its sanity check, a plain
    loop's next epoch; its workers start then) ends the evaluation there: before the first step the run starts
    at its first training wait (as a job's without evaluation does), after a step the start-up is the step's."""
    s = session()
    v = loader(s, 7)                    # noqa: F841 (the sanity check's iterator, read under no_grad)
    s.wait(0, 10, 4, 7)
    s.wait(10, 20, 4, 7)
    s.nograd.add(7)
    t = It()
    s.loader(1, t, 30)                  # made at 30, its workers started: its first batch at 40
    s.wait(40, 50, 4, 1)
    s.step(60)
    assert s.reporter.phases == [("eval", 0, 30)]
    assert shares(s.reporter) == [(40, 60, 4, 10)]
    v2 = loader(s, 8)                   # noqa: F841 (a validation pass at the end of the epoch, run to its end)
    s.wait(70, 80, 4, 8)
    s.wait(80, 90, 0, 8)
    s.ended.add(8)
    t2 = It()
    s.loader(2, t2, 100)                # the next epoch's iterator
    s.wait(120, 130, 4, 2)
    s.step(140)
    assert s.reporter.phases[1:] == [("eval", 70, 100), ("compute", 60, 70)]
    assert shares(s.reporter)[1:] == [(100, 140, 4, 10)]
    # an iterator made before the evaluation's last wait: the evaluation runs on to its first batch
    v3 = loader(s, 9)                   # noqa: F841
    t3 = It()
    s.loader(3, t3, 145)
    s.wait(150, 160, 0, 9)
    s.ended.add(9)
    s.wait(170, 180, 4, 3)
    s.step(190)
    assert s.reporter.phases[3:] == [("eval", 150, 170), ("compute", 140, 150)]
    assert shares(s.reporter)[2:] == [(170, 190, 4, 10)]


def test_a_loader_teye_cannot_hold_trains():
    s = session()
    s.loader(1, 5)                      # an int takes no weak reference: cannot tell, so training
    s.wait(0, 10, 4, 1)
    s.wait(10, 15, 8, 2)
    s.step(20)
    assert s.reporter.phases == [] and shares(s.reporter) == [(0, 20, 12, 15)]


def test_a_dropped_leading_optimizer_hands_the_lead_on():
    s = session()

    class Opt:
        pass
    first, gan = Opt(), Opt()
    s.step(10, id(first))
    s.lead(first)
    s.step(20, id(gan))                 # a second optimizer while the first is held: not the job's step
    assert len(s.reporter.steps) == 1
    new = Opt()                          # a new model and optimizer per task (made first: another id) ...
    del first                            # ... and the old one dropped
    s.step(30, id(new))                 # leads from its first step
    assert len(s.reporter.steps) == 2 and s.leader == id(new)


CHILD = r"""
import os, sys
from teye_client import auto
auto.install()
from teye_client.reporter import Reporter
auto.session.reporter = Reporter(train_job="exit-job", socket_path=sys.argv[1], flush_ms=10000)
for i in range(5):
    auto.session.reporter.record_step((), 10 * i, 10 * i + 5, 4)
os._exit(int(sys.argv[2]))
"""


@pytest.mark.parametrize("status", [0, 7])
def test_os_exit_flushes_first_and_keeps_its_status(tmp_path, status):
    path = str(tmp_path / "phases.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(path)
    try:
        r = subprocess.run([sys.executable, "-c", CHILD, path, str(status)], env=base_env(), capture_output=True,
                           text=True, timeout=60)
        assert (r.returncode, r.stdout, r.stderr) == (status, "", "")
        srv.settimeout(0.5)
        steps, sums = [], []
        try:
            while True:
                msg = json.loads(srv.recv(1 << 16))
                assert msg["job"] == "exit-job"
                steps += msg["steps"]
                sums += msg.get("sums", [])
        except socket.timeout:
            pass
        # the first went at once (a quiet spell), the other 4 wait for a flush_ms of 10 s: only the exit sends them
        # (5 ns steps: summed in a window, issue 38, which the exit flush closes)
        assert steps[0] == [0, 5, 4]
        assert len(steps) + sum(w[2] for w in sums) == 5 and sum(s[2] for s in steps) + sum(w[3] for w in sums) == 20
    finally:
        srv.close()


def test_os_exit_is_wrapped_once():
    before = os._exit
    try:
        auto._wrap_exit()
        auto._wrap_exit()
        assert os._exit._teye and not getattr(os._exit.__wrapped__, "_teye", False)
    finally:
        os._exit = before


def _fake_accelerate(s, batches):
    """accelerate's DataLoaderShard as it reads: batch k+1 fetched (a timed DataLoader wait) before batch k
    is yielded; the fetches go through the session as the patched DataLoader's do."""
    import types
    clock = {"t": 0}

    class DataLoaderShard:
        closed = False

        def __iter__(self):
            def fetch(i):
                s.wait(clock["t"], clock["t"] + 10, 4, 1)
                clock["t"] += 10
                return [i] * 4
            try:
                current = fetch(0)
                for i in range(1, batches):
                    nxt = fetch(i)
                    yield current
                    current = nxt
                s.wait(clock["t"], clock["t"] + 1, 0, 1)   # the fetch that found the end (StopIteration)
                clock["t"] += 1
                yield current
            finally:
                DataLoaderShard.closed = True

    return types.SimpleNamespace(DataLoaderShard=DataLoaderShard), clock


class _Shape:
    def __init__(self, n):
        self.shape = (n,)


@pytest.mark.parametrize("stop", [3, 5])
def test_a_read_ahead_loader_counts_the_batches_the_steps_took(monkeypatch, stop):
    """Issue 39 (Hugging Face's 644 samples for 640): accelerate fetches one batch ahead; stopped mid-epoch
    (3 of 5 batches) the job trained 3 batches, and the samples are those of the batches handed on, at the
    step that took them; the waits keep their time (the fetch ahead is waited for)."""
    from teye_client import _torch
    s = session()
    monkeypatch.setattr(_torch, "session", s)
    monkeypatch.setattr(_torch, "batch_size", lambda b: len(b))
    mod, clock = _fake_accelerate(s, 5)
    held = loader(s, 1)  # noqa: F841
    assert _torch.patch_accelerate(mod) is True
    it = iter(mod.DataLoaderShard())
    for k in range(stop):
        next(it)
        clock["t"] += 5
        s.step(clock["t"])
    it.close()
    assert mod.DataLoaderShard.closed                  # closing teye's generator closes accelerate's
    got = shares(s.reporter)
    assert [x[2] for x in got] == [4] * stop           # 4 samples a step: 3 x 4 = 12, not 16
    assert [x[3] for x in got] == [20] + [10] * (stop - 2) + ([10] if stop < 5 else [1])
    assert _torch.patch_accelerate(mod) is False        # never wrapped twice
