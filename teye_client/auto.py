"""Zero-code phases: patch PyTorch / TensorFlow when the job imports them (docs/zero-code.md).

``install()`` (called by ``teye_client/_site/sitecustomize.py`` at interpreter start) puts a
finder first on ``sys.meta_path`` that watches a handful of module names.  When the program
imports one of them, the module is loaded as usual and then handed to its instrumentor
(``teye_client._torch``, ``teye_client._tf``); the finder itself never imports anything.  A
process that never imports a watched module pays one dictionary lookup per import.

The instrumentors feed a per-process ``Session`` (``teye_client._common``, which they share with this
module and which imports neither: no circle): the intervals spent waiting for input
(``data_wait``) and the ends of training steps.  The session makes its ``Reporter`` (socket,
flush thread) at the first step, so a process that never trains opens no socket and starts
no thread.  Standard library only, Python 3.8+.
"""
import atexit
import os
import sys

from . import _common
from ._common import (  # noqa: F401  (the names this module always had: tests and older callers use them)
    DDP_SAMPLE_RATE, Session, batch_size, carve, debug, from_signal_handler, job_name, session, warn, wrapper_of)

_installed = None


class _Finder:
    """A meta path finder that only watches: it lets the other finders find a watched module and wraps
    the loader's exec_module so the instrumentor sees the module once it has run."""

    def __init__(self, hooks):
        self.hooks = hooks  # module name -> callable(module)

    def find_spec(self, fullname, path=None, target=None):
        hook = self.hooks.get(fullname)
        if hook is None:
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        orig = loader.exec_module

        def exec_module(module):
            try:
                del loader.exec_module  # the instance attribute: the loader is as it was
            except AttributeError:
                pass
            orig(module)
            _run_hook(hook, module)

        try:
            loader.exec_module = exec_module
        except (AttributeError, TypeError):
            debug("cannot watch %s (its loader %s takes no attributes)" % (fullname, type(loader).__name__))
        return spec

    def invalidate_caches(self):
        pass


instrumented = []   # what this process's hooks patched, in order (said at exit with TEYE_DEBUG=1)


def _run_hook(hook, module):
    name = getattr(module, "__name__", "?")
    try:
        done = hook(module)
    except Exception as e:  # a patch that fails leaves the module as it was loaded
        debug("instrumenting %s failed: %s: %s" % (name, type(e).__name__, e))
        return
    if done and len(instrumented) < len(HOOKS):
        what = WHAT.get(name, name)
        instrumented.append(what)
        debug("zero-code phases: instrumented %s (%s)" % (what, name))


def _torch_dataloader(module):
    from . import _torch
    return _torch.patch_dataloader(module)


def _torch_modules(module):
    from . import _torch
    return _torch.patch_modules(module)


def _torch_backward(module):
    from . import _torch
    return _torch.patch_backward(module)


def _torch_copies(module):
    from . import _torch
    return _torch.patch_copies(module)


def _torch_optimizer(module):
    from . import _torch
    ok = _torch.patch_optimizer(module)
    if ok:
        _torch.count_optimizers(module)
    return ok


def _torch_distributed(module):
    from . import _torch
    return _torch.patch_collectives(module)


def _torch_ddp(module):
    from . import _torch
    return _torch.patch_ddp(module)


def _torch_compile(module):
    from . import _torch
    return _torch.patch_compile(module)


def _torch_autocast(module):
    from . import _config
    return _config.patch_autocast(module)


def _accelerate_loader(module):
    from . import _torch
    return _torch.patch_accelerate(module)


def _horovod_torch(module):
    from . import _torch
    return _torch.patch_horovod(module)


def _tf_iterator(module):
    from . import _tf
    return _tf.patch_iterator(module)


def _tf_function(module):
    from . import _tf
    return _tf.patch_function(module)


def _keras_optimizer(module):
    from . import _tf
    return _tf.patch_keras_optimizer(module)


def _keras_trainer(module):
    from . import _tf
    return _tf.patch_keras_trainer(module)


def _flush_reporters():
    rep = sys.modules.get("teye_client.reporter")
    if rep is not None:
        rep.flush_all()


def patch_pool(module):
    """multiprocessing.pool.worker, flushing the process's reporters before it sends each task's result: a
    Pool left by ``with Pool(...)`` is terminated (SIGTERM to its workers) as soon as the last result is in,
    which no flush can follow.  Sent first, the steps of a task are at the agent before its result is at the
    parent.  Workers in threads (ThreadPool: a queue.SimpleQueue takes no attribute) are left alone."""
    orig = module.__dict__.get("worker")
    if type(orig) is not type(patch_pool) or getattr(orig, "_teye", False):
        debug("multiprocessing.pool.worker is not the function teye expects: no flush per task")
        return False

    def worker(inqueue, outqueue, *args, **kwargs):
        put = getattr(outqueue, "put", None)
        if callable(put):
            def flushed_put(obj):
                try:
                    _flush_reporters()
                except Exception as e:  # never into the worker
                    debug("zero-code phases: the flush before a pool result: %s: %s" % (type(e).__name__, e))
                return put(obj)
            try:
                outqueue.put = flushed_put
            except (AttributeError, TypeError):
                pass
        return orig(inqueue, outqueue, *args, **kwargs)

    wrapper_of(worker, orig)
    worker.__module__ = orig.__module__   # pickled by reference (spawn, forkserver): multiprocessing.pool.worker
    module.worker = worker
    return True


def _mp_pool(module):
    return patch_pool(module)


# module -> instrumentor, run right after the module has been executed (the instrumentors import
# nothing of the framework that the module has not already imported)
HOOKS = {
    "torch.utils.data.dataloader": _torch_dataloader,
    "torch.optim.optimizer": _torch_optimizer,
    "torch.nn.modules.module": _torch_modules,
    "torch.autograd": _torch_backward,
    "torch._tensor": _torch_copies,
    "torch.distributed.distributed_c10d": _torch_distributed,
    "torch.nn.parallel.distributed": _torch_ddp,
    "torch._dynamo.callback": _torch_compile,
    "torch.amp.autocast_mode": _torch_autocast,
    "horovod.torch.mpi_ops": _horovod_torch,
    "accelerate.data_loader": _accelerate_loader,
    "tensorflow.python.data.ops.iterator_ops": _tf_iterator,
    "tensorflow.python.eager.polymorphic_function.polymorphic_function": _tf_function,
    "keras.src.optimizers.base_optimizer": _keras_optimizer,
    "keras.src.backend.tensorflow.trainer": _keras_trainer,
    "multiprocessing.pool": _mp_pool,
}
# what each hook's patch observes, in the words TEYE_DEBUG=1 prints
WHAT = {
    "torch.utils.data.dataloader": "PyTorch DataLoader input waits",
    "torch.optim.optimizer": "PyTorch optimizer steps",
    "torch.nn.modules.module": "PyTorch forward (step part)",
    "torch.autograd": "PyTorch backward (step part)",
    "torch._tensor": "PyTorch host-to-device copies (step part)",
    "torch.distributed.distributed_c10d": "torch.distributed collectives",
    "torch.nn.parallel.distributed": "DDP gradient exchange",
    "torch._dynamo.callback": "torch.compile compilations",
    "torch.amp.autocast_mode": "the dtype of torch.autocast regions",
    "horovod.torch.mpi_ops": "Horovod synchronize",
    "accelerate.data_loader": "accelerate DataLoaderShard samples",
    "tensorflow.python.data.ops.iterator_ops": "tf.data input waits",
    "tensorflow.python.eager.polymorphic_function.polymorphic_function": "tf.function steps",
    "keras.src.optimizers.base_optimizer": "Keras optimizer steps",
    "keras.src.backend.tensorflow.trainer": "Keras fit/evaluate/predict",
    "multiprocessing.pool": "multiprocessing Pool flush per task",
}


def install():
    """Install the import hook once; modules already imported are instrumented now."""
    global _installed
    if _installed is not None:
        return _installed
    hooks = dict(HOOKS)
    _installed = _Finder(hooks)
    sys.meta_path.insert(0, _installed)
    for name, hook in hooks.items():
        mod = sys.modules.get(name)
        if mod is not None:
            _run_hook(hook, mod)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=session.reset)
    _wrap_exit()
    if _common._DEBUG:
        debug("zero-code phases: hook loaded in pid %d (Python %d.%d): it instruments PyTorch, TensorFlow, Keras, "
              "Horovod and multiprocessing when the program imports them" % ((os.getpid(),) + sys.version_info[:2]))
        atexit.register(_say_what_it_did)
    return _installed


def _say_what_it_did():
    """TEYE_DEBUG=1, at exit: what the hook instrumented in this process and what it reported (a script that
    imports no framework hears that it was loaded and why nothing was sent)."""
    rep = session.reporter
    if session.aside:
        sent = "the process reported its own phases (its own Reporter)"
    elif rep is not None:
        sent = "reported job %r to %s" % (rep.train_job, rep.socket_path)
    elif session.disabled:
        sent = "switched off after an error (said above): nothing sent"
    else:
        sent = "no training step seen: nothing sent"
    what = ", ".join(instrumented) if instrumented else (
        "nothing (the process imported none of PyTorch, TensorFlow, Keras, Horovod, multiprocessing.pool)")
    debug("zero-code phases in pid %d: instrumented %s; %s" % (os.getpid(), what, sent))


def _wrap_exit():
    """os._exit, flushing first: multiprocessing ends each fork and forkserver child with os._exit, and a
    forked child often ends so on its own; atexit hooks never run there, so the last steps (up to one
    flush_ms of them) would be lost.  The status is passed on unchanged; the flush never raises."""
    orig = getattr(os, "_exit", None)
    if orig is None or getattr(orig, "_teye", False):
        return

    def _exit(status):
        try:
            session.exit_flush()
        except BaseException as e:  # noqa: BLE001 (the process is leaving: nothing of teye's may stop it)
            debug("zero-code phases: the flush before os._exit: %s: %s" % (type(e).__name__, e))
        orig(status)

    os._exit = wrapper_of(_exit, orig)
