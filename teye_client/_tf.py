"""TensorFlow: data_wait = time inside next() of a tf.data iterator (eager), or the time Keras' train function
waits for its batch; steps = calls of the compiled function that applies the optimizer (custom loops and
Keras Model.fit alike).

- Input waits: ``tf.data``'s ``OwnedIterator.__next__`` is wrapped after a shape check (a plain function
  of ``self``), and times only eager calls: inside a ``tf.function`` it runs once, while tracing.
- Keras 3 ``Model.fit`` takes its batches inside its compiled train function (``iterator.get_next()``
  inside a ``tf.function``), where Python cannot time them.  ``TensorFlowTrainer._make_function`` is
  wrapped (see :func:`patch_keras_trainer`): for the train step, the function it returns is replaced by
  one that fetches the batch eagerly from the same iterator (timed: data_wait) and calls Keras' own
  compiled one-step function on it (``one_step_on_data``, taken from the returned function's closure):
  the same batches in the same order, the same compiled step.  Where the shapes differ, or for
  ``steps_per_execution`` > 1 or a distribution strategy, Keras' function is kept as it is (steps only:
  ``tf-steps``, the reason on stderr with ``TEYE_DEBUG=1``).
- Steps: Keras 3's ``BaseOptimizer.apply`` marks the ``tf.function`` being traced when it is called (or,
  run eagerly, ends a step itself); each later call of a marked function ends a step when it returns.
  So the step boundary is the train function's call, as Keras' own batch callbacks see it.
- Compile: a call of a step function after which its tracing count (``experimental_get_tracing_count``)
  grew traced and compiled the graph (the first step; a retrace for a new input shape).  That call is the
  ``compile`` phase, between the step it ends (which ends where the call began) and the next: a one-time
  cost outside the step time that shares are taken of, as Keras' progress bar leaves the first step out of
  its time per step and the profiler is pointed past it.
- Evaluation: Keras' ``evaluate``, ``predict``, ``test_on_batch`` and ``predict_on_batch`` (fit's validation
  runs through ``evaluate``) are wrapped: each call is the ``eval`` phase (Session.evaluation).  Each tf.data
  iterator's waits carry its number, so a custom loop's validation pass over its own iterator is ``eval``
  by the rule PyTorch's DataLoader iterators follow (Session._evaluation).
"""
import itertools
import sys
import threading
import time

from ._common import TraceHook, batch_size, debug, session, wrapper_of

_ns = time.monotonic_ns
SOURCE = "tf.data"
STEPS_ONLY = "tf-steps"
_tracing = threading.local()  # the outermost tf.function whose call is running in this thread (None: none)
_active = [None]  # ... in any thread: MirroredStrategy traces replica functions in threads of its own
_iterators = itertools.count(1)


def _key(iterator):
    """The number of a tf.data iterator (negative: never one of PyTorch's DataLoader iterators), so that the
    waits of an iterator no step follows (a validation pass) are told from training's (Session._evaluation)."""
    k = getattr(iterator, "_teye_loader", None)
    if k is None:
        k = -next(_iterators)
        try:
            iterator._teye_loader = k
        except (AttributeError, TypeError):  # an object that takes no attributes: its waits stay unkeyed
            return None
    return k


def _plain(fn, argcount):
    code = getattr(fn, "__code__", None)
    return code is not None and code.co_argcount == argcount and not getattr(fn, "_teye", False)



def patch_iterator(module):
    cls = getattr(module, "OwnedIterator", None)
    orig = cls.__dict__.get("__next__") if isinstance(cls, type) else None
    eager = getattr(getattr(module, "context", None), "executing_eagerly", None)
    if orig is None or not _plain(orig, 1) or not callable(eager):
        debug("tf.data OwnedIterator.__next__ is not what teye expects: data_wait not observed")
        return False
    s = session

    def __next__(self):
        if not eager():
            return orig(self)
        t0 = _ns()
        try:
            batch = orig(self)
        except StopIteration:
            s.wait(t0, _ns(), 0, _key(self))  # the wait for the end of the epoch is a wait too
            raise
        s.wait(t0, _ns(), batch_size(batch), _key(self))
        return batch

    cls.__next__ = wrapper_of(__next__, orig)
    s.wait_source = SOURCE
    return True


def patch_function(module):
    cls = getattr(module, "Function", None)
    orig = cls.__dict__.get("__call__") if isinstance(cls, type) else None
    code = getattr(orig, "__code__", None)
    if code is None or code.co_flags & 0x0C != 0x0C or getattr(orig, "_teye", False):
        debug("tf.function's Function.__call__ is not what teye expects: no TensorFlow steps")
        return False
    s = session
    local = _tracing

    def __call__(self, *args, **kwds):
        outer = getattr(local, "fn", None)
        if outer is not None:  # a tf.function called while another one traces: the outer one is the step
            return orig(self, *args, **kwds)
        local.fn = self
        _active[0] = self
        traced = _traces(self)
        t0 = _ns()
        try:
            out = orig(self, *args, **kwds)
        finally:
            local.fn = None
            if _active[0] is self:
                _active[0] = None
        if getattr(self, "_teye_step", False):
            s.step_guarded(_ns(), None, t0, traced is not None and _traces(self) != traced)
            trace_tick()
        return out

    cls.__call__ = wrapper_of(__call__, orig)
    if s.step_source is None:
        s.step_source = STEPS_ONLY
    return True


def _tf_profile(_trace, steps):
    from . import _tftrace
    return _tftrace.TfProfile(sys.modules["tensorflow"], steps)


# teye trace's request watch and trace (_tftrace), ticked where a step ends
trace_hook = TraceHook(_tf_profile)
trace_tick = trace_hook.tick


def _traces(fn):
    """How many times the tf.function fn has been traced (None where TensorFlow does not say): a call after
    which the count grew traced and compiled its graph, a one-time cost that is not the step's (``compile``)."""
    count = getattr(fn, "experimental_get_tracing_count", None)
    try:
        return count() if count is not None else None
    except Exception:  # not the public method teye expects: no compile phase, the call is the step's compute
        return None


def _eager():
    """Whether TensorFlow executes eagerly here (True where TensorFlow is not loaded: another backend)."""
    context = sys.modules.get("tensorflow.python.eager.context")
    eager = getattr(context, "executing_eagerly", None)
    return eager() if callable(eager) else True


def patch_keras_optimizer(module):
    cls = getattr(module, "BaseOptimizer", None)
    orig = cls.__dict__.get("apply") if isinstance(cls, type) else None
    if orig is None or getattr(orig, "__code__", None) is None or orig.__code__.co_argcount < 2:
        debug("Keras BaseOptimizer.apply is not what teye expects: no TensorFlow steps")
        return False
    s = session
    local = _tracing

    def apply(self, *args, **kwargs):
        out = orig(self, *args, **kwargs)
        fn = getattr(local, "fn", None)
        if fn is None and not _eager():  # traced in a thread of its own (a MirroredStrategy replica)
            fn = _active[0]
            if fn is None:
                return out  # traced outside any tf.function teye saw: no step to mark
        if fn is not None:
            outer = fn
            try:
                outer._teye_step = True  # its calls are training steps
            except AttributeError:
                pass
        else:  # eager: this call is the step
            s.step_guarded(_ns(), id(self))
            trace_tick()
        return out

    cls.apply = wrapper_of(apply, orig)
    if s.step_source is None:
        s.step_source = STEPS_ONLY
    return True


KERAS = "keras"


def _closure(fn):
    """name -> cell contents of fn's closure (empty when it has none)."""
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None) or ()
    if code is None or len(code.co_freevars) != len(cells):
        return {}
    out = {}
    for name, cell in zip(code.co_freevars, cells):
        try:
            out[name] = cell.cell_contents
        except ValueError:  # an empty cell
            pass
    return out


def patch_keras_trainer(module):
    """Keras 3 on TensorFlow: time the train function's batch fetch (module docstring)."""
    cls = getattr(module, "TensorFlowTrainer", None)
    orig = cls.__dict__.get("_make_function") if isinstance(cls, type) else None
    tf = getattr(module, "tf", None)
    get_next = getattr(getattr(getattr(tf, "data", None), "Iterator", None), "get_next", None)
    if orig is None or not _plain(orig, 2) or get_next is None:
        debug("Keras TensorFlowTrainer._make_function is not what teye expects: Model.fit reports steps only")
        return False
    s = session
    iterator_types = (tf.data.Iterator,)

    def _make_function(self, step_function):
        function = orig(self, step_function)
        if getattr(getattr(step_function, "__func__", step_function), "__name__", None) != "train_step":
            return function  # evaluate / predict: not training steps
        why = _why_not_observed(self, function, tf)
        if why:
            debug("Model.fit input wait not observed (steps only): " + why)
            return function
        one_step = _closure(function)["one_step_on_data"]

        def train_function(iterator):
            if s.aside or type(iterator).__name__ != "OwnedIterator" or not isinstance(iterator, iterator_types):
                return function(iterator)  # the job reports itself, or not a plain tf.data iterator: Keras' own
            t0 = _ns()
            data = iterator.get_next()     # the batch Keras' function would take: OutOfRangeError at the end
            t1 = _ns()
            if s.source != KERAS:
                s.source = KERAS
            s.wait(t0, t1, batch_size(data), _key(iterator))
            return one_step(data)

        return wrapper_of(train_function, function)

    cls._make_function = wrapper_of(_make_function, orig)
    _patch_keras_evaluation(cls)
    return True


EVALUATION = ("evaluate", "predict", "test_on_batch", "predict_on_batch")


def _patch_keras_evaluation(cls):
    """Keras' evaluate, predict, test_on_batch and predict_on_batch (fit's validation calls evaluate): the
    time of each call is evaluation (Session.evaluation), not training."""
    s = session
    for name in EVALUATION:
        orig = cls.__dict__.get(name)
        code = getattr(getattr(orig, "__wrapped__", orig), "__code__", None)  # under Keras' traceback filter
        if code is None or getattr(orig, "_teye", False) or not code.co_argcount >= 2:
            debug("Keras TensorFlowTrainer.%s is not what teye expects: its time counts as training" % name)
            continue
        cls_method = _evaluation_of(s, orig)
        setattr(cls, name, wrapper_of(cls_method, orig))


def _evaluation_of(s, orig):
    def method(self, *args, **kwargs):
        return s.evaluation(orig, self, *args, **kwargs)
    return method


def _why_not_observed(model, function, tf):
    """Why Keras' train function cannot be replaced by a timed fetch + its one-step function ("" if it can)."""
    if getattr(model, "steps_per_execution", 1) != 1:
        return "steps_per_execution is %s (one batch per call is what teye times)" % model.steps_per_execution
    cells = _closure(function)
    if not callable(cells.get("one_step_on_data")) or not callable(cells.get("multi_step_on_iterator")) or \
            getattr(getattr(function, "__code__", None), "co_argcount", 0) != 1:
        return "Keras' train function is not what teye expects (no one_step_on_data in its closure)"
    try:  # tf: the one Keras' trainer module imported (teye imports no framework)
        if tf.distribute.has_strategy() or model.distribute_strategy is not tf.distribute.get_strategy():
            return "a distribution strategy (%s) feeds its replicas" % type(model.distribute_strategy).__name__
    except Exception as e:  # the strategy cannot be read: stand aside
        return "the distribution strategy cannot be read (%s)" % type(e).__name__
    return ""
