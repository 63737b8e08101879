"""Session.evaluation (teye_client.auto): what a framework declares as evaluation (Keras' evaluate, predict,
test_on_batch, predict_on_batch) is the eval phase, apart from the steps.  In-process, with a reporter
that records what it is given; the times are the ones the test makes."""
from teye_client import _common, auto


class Recorder:
    source = None
    _src_due = False

    def __init__(self):
        self.phases, self.steps = [], []

    def record_phase(self, name, a, b):
        self.phases.append((name, a, b))

    def record_step(self, phases, a, b, samples):
        self.steps.append((a, b, samples, [(phases[i], phases[i + 1], phases[i + 2])
                                           for i in range(0, len(phases), 3)]))


def session():
    s = auto.Session()
    s.wait_source = "tf.data"
    s.reporter = Recorder()
    s.exit_hook = True   # no atexit registration from a test
    return s


def test_an_evaluation_between_steps_is_eval_and_the_next_step_starts_after_it(monkeypatch):
    s = session()
    s.wait(0, 10, 4, -1)
    s.step(20)                                   # a training step 0..20
    clock = iter([30, 90])
    monkeypatch.setattr(_common, "_ns", lambda: next(clock))

    def evaluate():
        s.wait(40, 60, 4, -2)                    # its batch: evaluation's, not training's
        return "logs"

    assert s.evaluation(evaluate) == "logs"
    s.wait(95, 100, 4, -1)
    s.step(110)
    rep = s.reporter
    assert rep.phases == [("eval", 30, 90)]
    assert rep.steps[-1] == (90, 110, 4, [('"compute"', 90, 95), ('"data_wait"', 95, 100), ('"compute"', 100, 110)])


def test_an_evaluation_inside_another_counts_once_and_one_that_steps_trains(monkeypatch):
    s = session()
    s.wait(0, 10, 4, -1)
    s.step(20)
    clock = iter([30, 40, 50, 60, 70])
    monkeypatch.setattr(_common, "_ns", lambda: next(clock))
    s.evaluation(lambda: s.evaluation(lambda: None))          # fit's evaluate calling predict in a callback
    assert s.evals == [(30, 40)]

    def trains():                                             # an "evaluation" that applies the optimizer
        s.wait(52, 55, 4, -3)
        s.step(58)
    s.evaluation(trains)
    assert s.evals == [] and s.reporter.phases == [("eval", 30, 40)]
    assert s.reporter.steps[-1][:3] == (40, 58, 4)


def test_an_evaluation_no_step_follows_is_reported_at_exit(monkeypatch):
    s = session()
    s.wait(0, 10, 4, -1)
    s.step(20)
    clock = iter([30, 80])
    monkeypatch.setattr(_common, "_ns", lambda: next(clock))
    s.evaluation(lambda: s.wait(40, 60, 4, -2))              # a final model.evaluate()
    s.finish()
    assert s.reporter.phases == [("eval", 30, 80)] and len(s.reporter.steps) == 1 and s.waits == []
