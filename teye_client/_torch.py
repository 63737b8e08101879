"""PyTorch: data_wait = time inside next() of every DataLoader iterator; a step ends at Optimizer.step().

- Steps: ``torch.optim.optimizer.register_optimizer_step_post_hook`` (PyTorch's official global hook,
  since 2.0) calls ``session.step`` after every optimizer step.
- Input waits: ``_BaseDataLoaderIter.__next__`` is wrapped (a private name: PyTorch has no hook for it),
  after checking that it looks as expected: a plain function of ``self`` defined on the base class,
  which its subclasses (single-process, multi-worker) do not override.  Otherwise teye stands aside
  (steps only; one stderr line with TEYE_DEBUG=1).
- DataLoader worker processes only run the dataset: they never step, so they never report.
- Communication: the collectives a job calls from Python (``COLLECTIVES`` of
  ``torch.distributed.distributed_c10d``, and ``Work.wait()`` on their async handles) are timed as
  ``communication``, after checking that each is a plain Python function (else that one is left
  alone).  The wrappers pass arguments, results and exceptions through unchanged.
- Horovod (``horovod.torch``): the waits in ``synchronize(handle)`` are ``communication``.
- DistributedDataParallel's gradient exchange runs inside ``backward()`` in C++: its exposed part (the
  exchange's time beyond its overlap with the backward computation) is read from DDP's own timers
  (its logger, set to time every iteration) and reported as ``communication`` (Session.exchange).
- Batches read in another thread than the one that steps (a prefetching thread feeding a queue, two
  threads sharing one iterator): the training loop's own wait (on the queue) cannot be seen, and the
  loader's waits overlap its compute, so from then on the process reports steps and samples only, no
  data_wait split (``Session.off_thread``): an absent input-bound share rather than a wrong one.
- torch.compile: each compilation (``torch._dynamo.callback.callback_handler``'s start and end callbacks) on
  the thread that steps is the ``compile`` phase of the step it lies in, carved out of its compute
  (patch_compile, Session.compiled).
- Evaluation: each iterator's waits carry its number; waits of iterators whose batches no optimizer
  step follows (validation, test, probes) are the ``eval`` phase, not training (Session._evaluation).
"""
import itertools
import sys
import threading
import time
from weakref import ref as _weakref

from . import _config
from ._common import TraceHook, batch_size, debug, session, wrapper_of

_ns = time.monotonic_ns
_thread = threading.get_ident
SOURCE = "torch"            # waits observed at the DataLoader
STEPS_ONLY = "torch-steps"  # steps only: no DataLoader iterator seen (or it could not be patched)
OWN_WORK = "torch-forward"  # the input is the training thread's time before each forward (Session._data_work)
COLLECTIVES = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "barrier",
               # FSDP's all-gathers and reduce-scatters (torch 2.10+ names; the older ones above)
               "all_gather", "all_gather_single", "reduce_scatter", "reduce_scatter_single", "all_to_all_single")
_loaders = itertools.count(1)
_is_grad = None   # torch.is_grad_enabled, once torch has it


def _grad_enabled():
    """Whether autograd is on (off under torch.no_grad() and inference_mode(), where evaluation reads its
    batches); True where torch cannot tell yet."""
    global _is_grad
    f = _is_grad
    if f is None:
        f = getattr(sys.modules.get("torch"), "is_grad_enabled", None)
        if not callable(f):
            return True
        _is_grad = f
    return f()



def patch_dataloader(module):
    base = getattr(module, "_BaseDataLoaderIter", None)
    if not isinstance(base, type):
        debug("torch.utils.data.dataloader has no _BaseDataLoaderIter class: data_wait not observed")
        return False
    orig = base.__dict__.get("__next__")
    code = getattr(orig, "__code__", None)
    if code is None or code.co_argcount != 1 or code.co_kwonlyargcount or getattr(orig, "_teye", False):
        debug("torch DataLoader: _BaseDataLoaderIter.__next__ is not the function teye expects: data_wait not observed")
        return False
    subs = [c for c in vars(module).values() if isinstance(c, type) and c is not base and issubclass(c, base)]
    for c in subs:
        if "__next__" in c.__dict__:
            debug("torch DataLoader: %s overrides __next__: data_wait not observed" % c.__name__)
            return False
    s = session

    def __next__(self):
        t0 = _ns()
        # which iterator: a number of its own (an id() is reused once it is freed), so that the waits of
        # a loader no optimizer step follows (evaluation) are told from training's (Session._evaluation)
        k = getattr(self, "_teye_loader", None)
        if k is None:
            k = self._teye_loader = next(_loaders)
            s.loader(k, self, getattr(self, "_teye_made", None))
            _config.keyed(k, self)   # the settings it was made with (issue 45)
            # who reads it (asked once per iterator: a frame costs about 2 µs to look at here): the loop
            # itself, or a generator of the job's own
            if not s.own_gen and _job_generator(sys._getframe(1).f_code):
                s.generator_loader(k)   # steps only once a training step takes its batches (not evaluation's)
        if not _grad_enabled():
            s.nograd.add(k)   # read under no_grad(): evaluation's, unless this loader trains (Session._evaluation)
        t = _thread()
        if t != s.wait_thread:   # another thread reads batches: is it the one that steps? (see patch_optimizer)
            if s.wait_thread is not None:
                s.off_thread = True
            s.wait_thread = t
        try:
            batch = orig(self)
        except BaseException as e:
            # the wait for the end of the epoch is a wait too, and so is one that ends in an error (a worker
            # that died: the training loop waited for its batch until PyTorch noticed)
            if isinstance(e, StopIteration):
                s.ended.add(k)
            s.wait(t0, _ns(), 0, k)
            raise
        s.wait(t0, _ns(), batch_size(batch), k)
        return batch

    base.__next__ = wrapper_of(__next__, orig)
    s.wait_source = SOURCE
    _patch_made(base)
    return True


_CO_GENERATORS = 0x20 | 0x200   # inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR


def _job_generator(code):
    """Whether ``code`` (the caller of a DataLoader's next()) is a generator of the job's own, outside any
    installed package: one that wraps the loader and may do the loop's data work on the training thread
    (augmenting, collating, moving to the device) between the batches teye times (issue 47).  A framework's
    generator (accelerate's DataLoaderShard, Lightning's fetchers: under site-packages) is not."""
    if not code.co_flags & _CO_GENERATORS:
        return False
    f = code.co_filename.replace("\\", "/")
    return "/site-packages/" not in f and "/dist-packages/" not in f and not f.startswith("<frozen")


def _patch_made(base):
    """Each iterator notes when it began to be made (``_BaseDataLoaderIter.__init__``, which the single-process
    and multi-worker iterators call first, before the workers start): an evaluation followed by a training
    iterator made after it ends there (Session._evaluation).  Anything other than the plain two-argument
    function teye expects is left alone (the evaluation then ends at the training iterator's first wait)."""
    init = base.__dict__.get("__init__")
    code = getattr(init, "__code__", None)
    if code is None or code.co_argcount != 2 or code.co_kwonlyargcount or getattr(init, "_teye", False):
        debug("torch DataLoader: _BaseDataLoaderIter.__init__ is not the function teye expects: "
              "an evaluation runs on to the next training batch")
        return False

    def __init__(self, loader):
        t0 = _ns()
        init(self, loader)
        try:
            self._teye_made = t0
        except Exception:  # an iterator that takes no attribute: the evaluation ends at its first wait
            pass
        _config.loader_made(self, loader)   # its settings (issue 45: teye_client._config)

    base.__init__ = wrapper_of(__init__, init)
    return True


def patch_optimizer(module):
    register = getattr(module, "register_optimizer_step_post_hook", None)
    if not callable(register):
        debug("torch.optim.optimizer has no register_optimizer_step_post_hook: no steps, no phases")
        return False
    s = session
    if s.step_source is None:
        s.step_source = STEPS_ONLY

    def _teye_step(optimizer, args, kwargs):
        if s.wait_thread is not None and s.wait_thread != _thread():
            s.off_thread = True   # its batches are read in another thread than the one that steps
        if s.pdepth or s.device is not None or parts:
            try:
                end_optimizer_part()
            except Exception as e:  # never into the training loop: the parts of this step are other
                debug("zero-code phases: the optimizer part: %s: %s" % (type(e).__name__, e))
        s.step_guarded(_ns(), id(optimizer))  # the id, not the optimizer: teye keeps nothing of the job alive
        if s.leader == id(optimizer):
            try:
                s.lead(optimizer)                 # a weak reference: the next optimizer leads once it is gone
            except Exception as e:  # never into the training loop
                debug("zero-code phases: the leading optimizer: %s: %s" % (type(e).__name__, e))
            fw = forwards
            if fw is not None:
                try:
                    fw.tick()
                except Exception as e:  # never into the training loop
                    debug("zero-code phases: the forward hooks: %s: %s" % (type(e).__name__, e))
            trace_tick()

    parts = patch_optimizer_parts(module)
    register(_teye_step)
    return True


def _trace_store(_trace, job):
    """The default process group's store (every rank of the job reaches it, on every node: torchrun's rendezvous
    store), for the ranks of all nodes to agree on a trace's first step; None where no group is initialised."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    c10d = sys.modules.get("torch.distributed.distributed_c10d")   # (loaded with torch.distributed: teye imports
    get = getattr(c10d, "_get_default_store", None)                # no framework itself)
    return _trace.StoreExchange(get(), job) if get is not None else None


# teye trace's request watch and trace, ticked at the end of each loop iteration (the leading optimizer's step)
trace_hook = TraceHook(lambda _trace, steps: _trace.TorchProfile(sys.modules["torch"], steps), _trace_store)
trace_tick = trace_hook.tick


def _timed(orig):
    """orig, its time recorded as communication (a collective inside another is timed once)."""
    s = session

    def collective(*args, **kwargs):
        if s.in_comm:
            return orig(*args, **kwargs)
        s.in_comm += 1
        t0 = _ns()
        try:
            return orig(*args, **kwargs)
        finally:
            s.in_comm -= 1
            s.comm(t0, _ns())

    return wrapper_of(collective, orig)


def patch_collectives(module):
    """Time the collectives a job calls from Python, and Work.wait(), as communication."""
    done = []
    for name in COLLECTIVES:
        orig = module.__dict__.get(name)
        if orig is None:
            continue   # not in this version
        if type(orig) is not type(patch_collectives) or getattr(orig, "_teye", False):
            debug("torch.distributed.%s is not the function teye expects: not timed" % name)
            continue
        setattr(module, name, _timed(orig))
        done.append(name)
    work = module.__dict__.get("Work")
    wait = getattr(work, "wait", None)
    if work is None or not callable(wait) or getattr(wait, "_teye", False):
        debug("torch.distributed Work.wait is not what teye expects: not timed")
    else:
        try:
            work.wait = _timed(wait)
            done.append("Work.wait")
        except (AttributeError, TypeError) as e:
            debug("torch.distributed Work.wait cannot be wrapped (%s): not timed" % e)
    return done


def patch_ddp(module):
    """Every DistributedDataParallel made from now on has its logger time every iteration (Session.track_ddp),
    so that its exchange can be read at each step.  The module's results and process group are untouched."""
    cls = module.__dict__.get("DistributedDataParallel")
    init = getattr(cls, "__dict__", {}).get("__init__")
    if (type(init) is not type(patch_ddp) or getattr(init, "_teye", False)
            or not callable(getattr(cls, "_get_ddp_logging_data", None))
            or not callable(getattr(cls, "_set_ddp_runtime_logging_sample_rate", None))):
        debug("torch DistributedDataParallel is not the class teye expects: its gradient exchange stays in compute")
        return False
    s = session

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        try:
            s.track_ddp(self)
        except Exception as e:  # never into the job: its exchange stays in compute
            debug("DDP's exchange not timed: %s: %s" % (type(e).__name__, e))
        _config.ddp_made(self)   # its settings (issue 45)

    cls.__init__ = wrapper_of(__init__, init)
    _config.patch_ddp(cls)       # its comm hook and no_sync, noted
    return True


_GENERATOR = 0x20   # inspect.CO_GENERATOR (inspect not imported into every job for one constant)


def patch_accelerate(module):
    """accelerate's ``DataLoaderShard.__iter__`` (the loader Hugging Face's Trainer reads) fetches one batch
    ahead of the one it yields.  Its fetches stay timed by the DataLoader's own __next__ (the loop waits for
    them), but their samples count when a batch is yielded (Session.consumed): a run stopped by max_steps in
    the middle of an epoch trained one batch fewer than was fetched.  Anything other than the one-argument
    generator function teye expects is left alone (the samples then count at the fetch, one batch over)."""
    cls = module.__dict__.get("DataLoaderShard")
    orig = getattr(cls, "__dict__", {}).get("__iter__")
    code = getattr(orig, "__code__", None)
    if (type(orig) is not type(patch_accelerate) or code is None or code.co_argcount != 1
            or not code.co_flags & _GENERATOR or getattr(orig, "_teye", False)):
        debug("accelerate DataLoaderShard.__iter__ is not the generator teye expects: samples count at each fetch")
        return False
    s = session

    def __iter__(self):
        it = orig(self)
        while True:
            s.ahead += 1
            try:
                batch = next(it)
            except StopIteration:
                return
            finally:
                s.ahead -= 1
            try:
                s.consumed(batch_size(batch))
            except Exception as e:  # never into the job: the samples of this batch are not counted
                debug("zero-code phases: accelerate's batch: %s: %s" % (type(e).__name__, e))
            try:
                yield batch
            except GeneratorExit:   # the job stopped reading (max_steps): so does accelerate's generator
                it.close()
                raise

    cls.__iter__ = wrapper_of(__iter__, orig)
    return True


def patch_horovod(module):
    """Horovod for PyTorch (``horovod.torch.mpi_ops``): its all-reduce runs in Horovod's own background
    thread, overlapping the backward pass; what the step waits for is ``synchronize(handle)`` (called by
    ``hvd.DistributedOptimizer.step()`` and by the job's own ``hvd.allreduce``), timed as communication.
    Anything other than the plain function teye expects is left alone."""
    orig = module.__dict__.get("synchronize")
    if type(orig) is not type(patch_horovod) or getattr(orig, "_teye", False):
        debug("horovod.torch.mpi_ops.synchronize is not the function teye expects: Horovod's exchange not timed")
        return False
    module.synchronize = _timed(orig)
    return True


def patch_compile(module):
    """torch.compile's compilations (``torch._dynamo.callback.callback_handler``: PyTorch calls its start
    callbacks when the outermost compilation in progress begins and its end callbacks when it ends, in a
    ``finally``, also when the compilation raises; on the compiling thread; a frame traced for the first time,
    a retrace for a new shape, a backward compiled at its first run, a CUDA graph's recording): each one on
    the thread that steps is the ``compile`` phase of the step it lies in, carved out of its compute
    (Session.compiled, Session._own_compiles).  Its counter of compilations in progress is the process's:
    where two threads compile at once, the start is called on one and the end maybe on the other; such an
    interval, whose thread is not one, is dropped.  A handler of another shape is left alone."""
    h = getattr(module, "callback_handler", None)
    reg_start = getattr(h, "register_start_callback", None)
    reg_end = getattr(h, "register_end_callback", None)
    if not callable(reg_start) or not callable(reg_end):
        debug("torch._dynamo.callback has no callback_handler.register_start_callback / register_end_callback: "
              "torch.compile's compilation stays in compute")
        return False
    if any(getattr(cb, "_teye", False) for cb in getattr(h, "start_callbacks", ())):
        return False
    s = session
    began = [None]   # (thread, start_ns) of the compilation in progress

    def _teye_compile_start(args):
        began[0] = (_thread(), _ns())
        compiled[0] = True

    def _teye_compile_end(args):
        b = began[0]
        began[0] = None
        if b is None:
            return
        t = _thread()
        _config.compiled()
        if b[0] == t:
            try:
                s.compiled(b[1], _ns(), t)
            except Exception as e:  # never into the compilation
                debug("zero-code phases: a compilation: %s: %s" % (type(e).__name__, e))

    _teye_compile_start._teye = _teye_compile_end._teye = True
    reg_start(_teye_compile_start)
    reg_end(_teye_compile_end)
    return True


def count_optimizers(module):
    """Each optimizer made (``Optimizer.__init__``, which every optimizer calls) is told to the session, which
    holds the first optimizer's first steps while a second one is alive (Session.optimizer_made, _lead_step:
    a GAN's loop iteration is the optimizer that steps least).  Anything other than the function teye expects
    is left alone (the first optimizer to step then leads, as before)."""
    base = getattr(module, "Optimizer", None)
    init = getattr(base, "__dict__", {}).get("__init__")
    code = getattr(init, "__code__", None)
    if code is None or code.co_argcount < 2 or getattr(init, "_teye", False):
        return False   # silently: the steps are counted as before (the first optimizer to step leads)
    s = session

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        try:
            s.optimizer_made(self)
        except Exception as e:  # never into the training loop
            debug("zero-code phases: an optimizer made: %s: %s" % (type(e).__name__, e))

    base.__init__ = wrapper_of(__init__, init)
    return True
# -- the step's parts (issue 45; docs/zero-code.md "Inside the step") ---------------------------------------
FORWARD, BACKWARD, OPTIMIZER, H2D = 0, 1, 2, 3   # reporter.PARTS' order
_is_compiling = None   # torch.compiler.is_compiling, once torch has it
_PARTS_ON = __import__("os").environ.get("TEYE_STEP_PARTS", "1").strip() not in ("0", "false", "no", "off")


def _compiling():
    """Whether torch.compile is tracing this call (its tracer then reads True and leaves teye's bookkeeping out
    of the graph: the hooks below return before touching anything)."""
    global _is_compiling
    f = _is_compiling
    if f is None:
        f = getattr(getattr(sys.modules.get("torch"), "compiler", None), "is_compiling", None)
        if not callable(f):
            return False
        _is_compiling = f
    return f()


NARROW_AFTER = 3   # the leading optimizer's steps the global module hooks watch before they narrow (_Forwards)
compiled = [False]   # a torch.compile compilation began in this process (patch_compile): the hooks stay as they are
MAX_ROOTS = 8      # modules called outermost, at most, for the hooks to narrow to them


def _post_hook(register, fn):
    """register(fn, always_call=True): the post hook runs also when the forward raises; before always_call, a
    forward that raises leaves its part open until the next step."""
    try:
        return register(fn, always_call=True)
    except TypeError:
        return register(fn)


class _Forwards:
    """Where the forward is seen.  PyTorch's global module hooks run for every module's call, and while any is
    registered every module call takes nn.Module's slow path (hooks looked up and called): a cost per module,
    so per forward that grows with the model.  So they watch only the first NARROW_AFTER steps of the leading
    optimizer, learning which modules are called outermost (the model, a loss module: at most MAX_ROOTS), and
    then give way to hooks on those modules alone (``narrow``): the modules they call take the fast path
    again.  A step with no forward seen after that (the job called another module: a model swapped, wrapped
    or compiled later) brings the global hooks back to learn again (``widen``).  Once torch.compile compiled
    anything the hooks stay as they are: a compiled graph guards on the hook tables it read (dynamo's
    ``len(_global_forward_hooks)``), so changing them would recompile it (seen: 6 compilations instead of 4)."""

    def __init__(self, pre_fn, post_fn, register_pre, register_post):
        self.pre_fn, self.post_fn = pre_fn, post_fn
        self.register_pre, self.register_post = register_pre, register_post
        self.roots = {}          # id(module) -> weak reference: the modules called outermost while learning
        self.handles = ()        # the hooks registered now (global ones while learning)
        self.narrowed = False
        self.steps = 0           # leading steps seen while learning
        self.seen = False        # a forward began since the last leading step
        self.narrowings = 0      # (for tests: how often the hooks narrowed, and widened again)
        self.widenings = 0

    def install_global(self) -> None:
        self.handles = (self.register_pre(self.pre_fn), _post_hook(self.register_post, self.post_fn))

    def began(self, mod) -> None:
        """An outermost forward of ``mod`` began (the training thread, autograd on)."""
        self.seen = True
        if not self.narrowed and id(mod) not in self.roots and len(self.roots) <= MAX_ROOTS:
            try:
                self.roots[id(mod)] = _weakref(mod)
            except TypeError:
                self.roots[id(mod)] = None   # (no weak reference to it: the hooks stay global)

    def tick(self) -> None:
        """At each step of the leading optimizer."""
        seen, self.seen = self.seen, False
        if compiled[0]:
            self.roots = {}
            return
        if self.narrowed:
            if not seen:
                self._widen()
            return
        self.steps += 1
        if self.steps >= NARROW_AFTER:
            self._narrow()

    def _narrow(self) -> None:
        mods = [r() if r is not None else None for r in self.roots.values()]
        self.roots, self.steps = {}, 0
        if not mods or len(mods) > MAX_ROOTS or any(m is None for m in mods):
            return   # none, too many, or one gone or unreferenceable: learn again
        handles = []
        try:
            for m in mods:
                handles.append(m.register_forward_pre_hook(self.pre_fn))
                handles.append(_post_hook(m.register_forward_hook, self.post_fn))
        except Exception as e:  # never into the job: the global hooks stay
            for h in handles:
                h.remove()
            debug("zero-code phases: the forward hooks stay global: %s: %s" % (type(e).__name__, e))
            return
        for h in self.handles:
            h.remove()
        self.handles, self.narrowed = tuple(handles), True
        self.narrowings += 1

    def _widen(self) -> None:
        for h in self.handles:
            h.remove()
        self.narrowed = False
        self.install_global()
        self.widenings += 1


forwards = None   # the _Forwards of this process, once patch_modules ran


def patch_modules(module):
    """The forward part: the outermost ``nn.Module`` call with autograd on (a forward under ``torch.no_grad()``
    or ``inference_mode()`` is evaluation, not training's forward), through PyTorch's global module hooks
    (``register_module_forward_pre_hook`` / ``register_module_forward_hook(always_call=True)``: the post hook
    runs also when the forward raises), narrowed after a few steps to the modules called outermost (_Forwards).
    Modules called inside it (and inside a backward or an optimizer step, an activation checkpoint's
    recomputation, a closure) nest: only the outermost counts, on its thread."""
    global forwards
    pre = getattr(module, "register_module_forward_pre_hook", None)
    post = getattr(module, "register_module_forward_hook", None)
    if not _PARTS_ON:
        return False
    if not callable(pre) or not callable(post):
        debug("torch.nn.modules.module has no global forward hooks: the forward is not told apart")
        return False
    s = session

    def _teye_forward_pre(mod, args):
        if _compiling():
            return None
        if s.pdepth:
            if s.pthread == _thread():
                s.pdepth += 1
            return None
        if s.aside or not _grad_enabled():
            return None
        s.pbegin(FORWARD)
        fw.began(mod)
        return None

    def _teye_forward(mod, args, out):
        if s.pdepth and not _compiling() and s.pthread == _thread():
            if s.pdepth == 1:
                s.pend()
            else:
                s.pdepth -= 1
        return None

    _teye_forward_pre._teye = _teye_forward._teye = True
    s.work_source = OWN_WORK
    fw = forwards = _Forwards(_teye_forward_pre, _teye_forward, pre, post)
    fw.install_global()
    return True


def _outermost(kind, orig):
    """orig, timed as part ``kind`` where no part is in progress (else as it is)."""
    s = session

    def part(*args, **kwargs):
        if _compiling() or s.pdepth or s.aside:   # (tracing first: torch.compile reads none of teye's state)
            return orig(*args, **kwargs)
        s.pbegin(kind)
        try:
            return orig(*args, **kwargs)
        finally:   # also when it raises (a backward that fails mid-way: what it ran is the backward's)
            if s.pdepth and s.pthread == _thread():
                s.pend()

    return wrapper_of(part, orig)


def patch_backward(module):
    """The backward part: ``torch.autograd.backward`` (which ``Tensor.backward`` calls), outermost only.  DDP's
    exchange runs inside it: its exposed part is carved out as ``communication`` before the parts are taken
    from the compute (Session.release)."""
    if not _PARTS_ON:
        return False
    orig = module.__dict__.get("backward")
    if type(orig) is not type(patch_backward) or getattr(orig, "_teye", False):
        debug("torch.autograd.backward is not the function teye expects: the backward is not told apart")
        return False
    module.backward = _outermost(BACKWARD, orig)
    return True


def patch_copies(module):
    """The host-to-device copy: ``Tensor.to`` and ``Tensor.cuda`` called outside any other part (the batch moved
    to the GPU; the copies a forward makes are the forward's), counted where the result is on a CUDA device and
    the tensor was not.  On a CPU-only job there is none."""
    if not _PARTS_ON:
        return False
    cls = module.__dict__.get("Tensor")
    if not isinstance(cls, type):
        return False
    s = session
    done = False
    for name in ("to", "cuda"):
        orig = getattr(cls, name, None)
        if orig is None or getattr(orig, "_teye", False) or name in cls.__dict__:
            debug("torch.Tensor.%s is not the method teye expects: its copies are not told apart" % name)
            continue

        def copy(self, *args, _orig=orig, **kwargs):
            if _compiling() or s.pdepth or s.aside:
                return _orig(self, *args, **kwargs)
            t0 = _ns()
            dev = s.device
            ev = None
            if dev is not None:
                try:
                    ev = dev.record()
                except Exception as e:  # never into the job: the host clock from now on
                    s._device_lost(e)
                    dev = None
            out = _orig(self, *args, **kwargs)
            try:
                if out is not self and getattr(out, "is_cuda", False) and not self.is_cuda:
                    if dev is not None:
                        dev.pair(H2D, ev, dev.record())
                    else:
                        sp = s.pspans
                        if sp is None:
                            sp = s.pspans = []
                        sp.append((H2D, t0, _ns()))
            except Exception as e:  # never into the job: this copy is not counted
                debug("zero-code phases: a copy: %s: %s" % (type(e).__name__, e))
            return out

        setattr(cls, name, wrapper_of(copy, orig))
        done = True
    return done


def patch_optimizer_parts(module):
    """The optimizer part: ``register_optimizer_step_pre_hook`` to the post hook (teye's step hook ends it
    before it ends the step)."""
    register = getattr(module, "register_optimizer_step_pre_hook", None)
    if not _PARTS_ON or not callable(register):
        return False
    s = session

    def _teye_step_pre(optimizer, args, kwargs):
        if s.pdepth and s.pkind == OPTIMIZER and s.pthread == _thread():
            s.pdepth = 0   # the previous step raised (its post hook never ran): this one starts afresh
        if not s.pdepth and not s.aside:
            s.pbegin(OPTIMIZER)

    _teye_step_pre._teye = True
    register(_teye_step_pre)
    return True


def end_optimizer_part():
    """From teye's optimizer post hook: the optimizer part ends; a part left open by a forward that raised
    without the post hook (before always_call) is closed here, unrecorded; and where CUDA is in use the device
    door opens (Device) and the step's memory is read."""
    s = session
    if s.pdepth and s.pthread == _thread():
        if s.pkind == OPTIMIZER:
            if s.pdepth == 1:
                s.pend()
        else:
            s.pdepth = 0
    if s.device is None:
        if not _PARTS_ON:
            return
        cuda = sys.modules.get("torch.cuda")
        init = getattr(cuda, "is_initialized", None)
        if init is None or not init():
            return
        try:
            s.device = Device(cuda)
        except Exception as e:  # an unusual build: host clock parts, no device memory
            debug("zero-code phases: CUDA in use but its events cannot be made: %s: %s" % (type(e).__name__, e))
            s.device = None
            return
    s.device.memory_at_step(s.reporter)


class Device:
    """The one door to the GPU for the step's parts and memory (issue 45): CUDA events recorded on the current
    stream at a part's start and end, read later, once the device has passed them (``query()``), never
    synchronising the training stream; and the CUDA caching allocator's statistics at each step (allocated,
    reserved, and the peak allocated since the previous step: ``reset_peak_memory_stats`` each step).
    Tests hand it a fake ``torch.cuda`` (tests/client/test_parts.py)."""

    MAX_PENDING = 512     # pairs not yet read: a device this far behind loses the oldest (their time is other)
    POOL = 64

    def __init__(self, cuda):
        self.cuda = cuda
        self.Event = cuda.Event
        self.pending = []     # [kind, start event, end event] in the order recorded (the stream's)
        self.pool = []
        self.lost = 0
        self.record()         # an event can be made and recorded here: else the constructor raises

    def record(self):
        pool = self.pool
        ev = pool.pop() if pool else self.Event(enable_timing=True)
        ev.record()
        return ev

    def pair(self, kind, start, end):
        p = self.pending
        p.append((kind, start, end))
        if len(p) > self.MAX_PENDING:
            del p[:self.MAX_PENDING // 2]
            self.lost += self.MAX_PENDING // 2

    def ready(self):
        """[ns per part] of the pairs the device has passed since the last call, in stream order (the first one
        not passed stops the reading), or None where none has."""
        p = self.pending
        out = None
        n = 0
        for kind, a, b in p:
            if not b.query():
                break
            ns = int(a.elapsed_time(b) * 1e6)   # milliseconds, as float
            if out is None:
                out = [0, 0, 0, 0]
            if ns > 0:
                out[kind] += ns
            n += 1
        if n:
            pool = self.pool
            for _k, a, b in p[:n]:
                if len(pool) < self.POOL:
                    pool.append(a)
                    pool.append(b)
            del p[:n]
        return out

    def memory_at_step(self, rep):
        """The step's device memory to the reporter: allocated and reserved now, the peak allocated since the
        previous step (the peak counter reset for the next)."""
        if rep is None:
            return
        c = self.cuda
        try:
            peak = c.max_memory_allocated()
            c.reset_peak_memory_stats()
            rep.note_memory(c.memory_allocated(), c.memory_reserved(), peak)
        except Exception as e:  # never into the job: no device memory from this process
            debug("zero-code phases: CUDA memory statistics: %s: %s" % (type(e).__name__, e))
