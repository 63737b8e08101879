"""A step whose call traced and compiled its tf.function (teye_client._tf: the tracing count grew), in-process:
the step ends where the call began, the call is the ``compile`` phase between it and the next step, and the
next step starts where the call ended.  Times are the test's own (ns); the reporter records what it is given."""
import pytest

from teye_client import _common
from tests.client.test_session_eval import session


@pytest.fixture
def now(monkeypatch):
    """The clock the session reads after its bookkeeping (the test's: 0, before every time below, unless set)."""
    t = [0]
    monkeypatch.setattr(_common, "_ns", lambda: t[0])
    return t


def test_the_call_that_compiled_is_compile_between_two_steps(now):
    s = session()
    s.wait(0, 10, 4, -1)                       # the first batch's fetch
    s.step_guarded(900, None, 12, True)        # the first call: 888 ns of tracing, compiling and one step
    s.wait(900, 910, 4, -1)
    s.step_guarded(930, None, 911, False)      # a compiled call: the step's compute
    s.wait(930, 940, 2, -1)                    # the last, shorter batch: a retrace
    s.step_guarded(1500, None, 941, True)
    s.wait(1500, 1510, 4, -1)
    s.step_guarded(1530, None, 1511)
    rep = s.reporter
    assert rep.phases == [('compile', 12, 900), ('compile', 941, 1500)]
    assert rep.steps == [
        (0, 12, 4, [('"data_wait"', 0, 10), ('"compute"', 10, 12)]),
        (900, 930, 4, [('"data_wait"', 900, 910), ('"compute"', 910, 930)]),
        (930, 941, 2, [('"data_wait"', 930, 940), ('"compute"', 940, 941)]),
        (1500, 1530, 4, [('"data_wait"', 1500, 1510), ('"compute"', 1510, 1530)])]


def test_the_bookkeeping_after_a_compiling_call_is_compile_too(now):
    """At its first step the session makes its reporter (teye's own one-time cost): the compile phase runs to
    the end of that, and the next step starts there."""
    s = session()
    s.wait(0, 10, 4, -1)
    now[0] = 950
    s.step_guarded(900, None, 12, True)
    s.wait(960, 970, 4, -1)
    s.step_guarded(990, None, 971)
    assert s.reporter.phases == [('compile', 12, 950)]
    assert [x[:2] for x in s.reporter.steps] == [(0, 12), (950, 990)]


def test_a_steps_only_job_that_compiled_has_a_step_of_no_time_then_compile(now):
    s = session()
    s.wait_source = None                       # no input wait observable (a generator): steps only
    s.step_guarded(500, None, 20, True)
    s.step_guarded(560, None, 505)
    assert s.reporter.phases == [('compile', 20, 500)]
    assert [x[:2] for x in s.reporter.steps] == [(20, 20), (500, 560)]


def test_a_call_with_no_known_start_is_the_step_as_before(now):
    s = session()
    s.wait(0, 10, 4, -1)
    s.step_guarded(900, None, None, True)      # where the instrumentor cannot say when the call began
    assert s.reporter.phases == [] and [x[:2] for x in s.reporter.steps] == [(0, 900)]


# torch.compile (teye_client._torch.patch_compile -> Session.compiled): a compilation on the thread that steps is
# the compile phase of the step it lies in, carved out of its compute like a collective

ME = _common._thread()


def test_a_compilation_inside_a_step_is_carved_out_of_its_compute(now):
    s = session()
    s.wait(0, 10, 8, -1)
    s.compiled(15, 700, ME)                   # the forward traced and compiled
    s.compiled(720, 760, ME)                  # the backward compiled at its first run
    s.step_guarded(800)
    s.wait(800, 810, 8, -1)
    s.step_guarded(830)                       # no compilation: the step as before
    s.wait(830, 840, 4, -1)
    s.comm(850, 860)
    s.compiled(845, 849, ME)                  # a recompile (a new shape), before a collective
    s.step_guarded(870)
    assert s.reporter.phases == []
    assert s.reporter.steps == [
        (0, 800, 8, [('"data_wait"', 0, 10), ('"compute"', 10, 15), ('"compile"', 15, 700), ('"compute"', 700, 720),
                     ('"compile"', 720, 760), ('"compute"', 760, 800)]),
        (800, 830, 8, [('"data_wait"', 800, 810), ('"compute"', 810, 830)]),
        (830, 870, 4, [('"data_wait"', 830, 840), ('"compute"', 840, 845), ('"compile"', 845, 849),
                       ('"compute"', 849, 850), ('"communication"', 850, 860), ('"compute"', 860, 870)])]


def test_a_compilation_on_another_thread_is_not_the_steps(now):
    """A model compiled in a thread of its own overlaps the loop's work: carving it would take that time
    from the loop; it is dropped (the step is as it would be without it)."""
    s = session()
    s.wait(0, 10, 8, -1)
    s.compiled(20, 60, ME + 1)
    s.step_guarded(100)
    assert s.reporter.phases == []
    assert s.reporter.steps == [(0, 100, 8, [('"data_wait"', 0, 10), ('"compute"', 10, 100)])]


def test_a_warm_up_compilation_before_the_first_batch_is_compile_apart_from_the_first_step(now):
    s = session()
    s.compiled(0, 400, ME)                    # model(example) before the loop reads its first batch
    s.wait(450, 460, 8, -1)
    s.compiled(470, 480, ME)                  # the backward, inside the first step
    s.step_guarded(500)
    assert s.reporter.phases == [("compile", 0, 400)]
    assert s.reporter.steps == [
        (450, 500, 8, [('"data_wait"', 450, 460), ('"compute"', 460, 470), ('"compile"', 470, 480),
                       ('"compute"', 480, 500)])]


class Handler:
    """torch._dynamo.callback.callback_handler's registration methods, and the callbacks as PyTorch calls them."""

    def __init__(self):
        self.start_callbacks, self.end_callbacks = [], []

    def register_start_callback(self, cb):
        self.start_callbacks.append(cb)
        return cb

    def register_end_callback(self, cb):
        self.end_callbacks.append(cb)
        return cb

    def start(self):
        for cb in self.start_callbacks:
            cb(None)

    def end(self):
        for cb in self.end_callbacks:
            cb(None)


@pytest.fixture
def handler(now, monkeypatch):
    import types
    from teye_client import _torch
    s = session()
    monkeypatch.setattr(_torch, "session", s)
    h = Handler()
    assert _torch.patch_compile(types.SimpleNamespace(callback_handler=h)) is True
    assert _torch.patch_compile(types.SimpleNamespace(callback_handler=h)) is False   # never twice
    assert len(h.start_callbacks) == len(h.end_callbacks) == 1
    monkeypatch.setattr(_torch, "_ns", lambda: now[0])
    return s, h


def test_a_start_without_its_end_leaves_nothing_open(handler, now):
    """A start whose end never comes (PyTorch ends them in a finally; a callback registered mid-compilation,
    two threads compiling at once) opens nothing that runs on into later steps: the next start replaces it."""
    s, h = handler
    s.wait(0, 10, 8, -1)
    now[0] = 20
    h.start()                                 # never ended
    now[0] = 50
    h.start()
    now[0] = 90
    h.end()
    s.step_guarded(100)
    s.wait(100, 110, 8, -1)
    now[0] = 120
    h.end()                                   # an end without a start, in the next step: nothing
    s.step_guarded(130)
    assert s.reporter.steps == [
        (0, 100, 8, [('"data_wait"', 0, 10), ('"compute"', 10, 50), ('"compile"', 50, 90), ('"compute"', 90, 100)]),
        (100, 130, 8, [('"data_wait"', 100, 110), ('"compute"', 110, 130)])]


def test_a_compilation_that_ends_on_another_thread_is_dropped(handler, now, monkeypatch):
    """PyTorch's count of compilations in progress is the process's: two threads compiling at once have the
    start called on one and the end maybe on the other; that interval belongs to neither."""
    from teye_client import _torch
    s, h = handler
    s.wait(0, 10, 8, -1)
    now[0] = 20
    monkeypatch.setattr(_torch, "_thread", lambda: ME + 1)
    h.start()                                 # another thread's start
    monkeypatch.setattr(_torch, "_thread", lambda: ME)
    now[0] = 60
    h.end()                                   # ... ended on the thread that steps
    s.step_guarded(100)
    assert s.reporter.steps == [(0, 100, 8, [('"data_wait"', 0, 10), ('"compute"', 10, 100)])]


def test_a_handler_of_another_shape_is_left_alone(monkeypatch, capsys):
    import types
    from teye_client import _torch
    monkeypatch.setattr(_common, "_DEBUG", True)
    assert _torch.patch_compile(types.SimpleNamespace(callback_handler=object())) is False
    assert _torch.patch_compile(types.SimpleNamespace()) is False
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all("torch.compile's compilation stays in compute" in e for e in err), err
