"""TensorFlow: data_wait = time inside next() of a tf.data iterator (eager); steps = calls of the compiled
function that applies the optimizer (custom loops and Keras Model.fit alike).

- Input waits: ``tf.data``'s ``OwnedIterator.__next__`` is wrapped after a shape check (a plain function
  of ``self``), and times only eager calls: inside a ``tf.function`` it runs once, while tracing.
  Keras ``Model.fit`` takes its batches inside its compiled train function, where Python cannot time
  them: a fit job reports steps only, and its verdict's evidence says the input wait was not observed.
- Steps: Keras 3's ``BaseOptimizer.apply`` marks the ``tf.function`` being traced when it is called (or,
  run eagerly, ends a step itself); each later call of a marked function ends a step when it returns.
  So the step boundary is the train function's call, as Keras' own batch callbacks see it.
"""
import threading
import time

from .auto import batch_size, debug, session, wrapper_of

_ns = time.monotonic_ns
SOURCE = "tf.data"
STEPS_ONLY = "tf-steps"
_tracing = threading.local()  # the outermost tf.function whose call is running in this thread (None: none)


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
            s.wait(t0, _ns(), 0)
            raise
        s.wait(t0, _ns(), batch_size(batch))
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
        try:
            out = orig(self, *args, **kwds)
        finally:
            local.fn = None
        if getattr(self, "_teye_step", False):
            s.step_guarded(_ns())
        return out

    cls.__call__ = wrapper_of(__call__, orig)
    if s.step_source is None:
        s.step_source = STEPS_ONLY
    return True


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
        if fn is not None:
            outer = fn
            try:
                outer._teye_step = True  # its calls are training steps
            except AttributeError:
                pass
        else:  # eager: this call is the step
            s.step_guarded(_ns(), id(self))
        return out

    cls.apply = wrapper_of(apply, orig)
    if s.step_source is None:
        s.step_source = STEPS_ONLY
    return True
