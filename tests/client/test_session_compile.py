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
