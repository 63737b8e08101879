"""What the zero-code instrumentors share (docs/zero-code.md): the per-process ``Session`` (the input waits
since the last step, the reporter made at the first step, evaluation apart, DDP's held step) and the helpers
they use (``debug``, ``warn``, ``batch_size``, ``wrapper_of``, ``job_name`` ...).

The import hook (``teye_client.auto``) and the instrumentors it loads (``teye_client._torch``,
``teye_client._tf``) both import this module; it imports neither (one way: auto -> instrumentors ->
_common), and the reporter only lazily, at the first step.  Standard library only, Python 3.8+.
"""
import atexit
import os
import sys
import threading
import time
import weakref

_DEBUG = os.environ.get("TEYE_DEBUG") == "1"
_C = '"compute"'    # phase names as the reporter's flat buffers hold them (JSON-quoted)
_W = '"data_wait"'
_M = '"communication"'
_K = '"compile"'
_ns = time.monotonic_ns
_thread = threading.get_ident

def debug(msg):
    """One line on stderr when TEYE_DEBUG=1 (never otherwise: the job's output stays its own)."""
    if _DEBUG:
        try:
            sys.stderr.write("teye: %s\n" % msg)
        except (OSError, ValueError):
            pass


def warn(msg):
    """One line on stderr whatever TEYE_DEBUG says: where what teye does is not what the job asked for."""
    try:
        sys.stderr.write("teye: warning: %s\n" % msg)
    except (OSError, ValueError):
        pass


def batch_size(batch):
    """The sample count of a batch a data loader yields: the first dimension of its first tensor (of a
    tuple, list or dict), 0 where unknown (the count is optional; an unusual batch never raises)."""
    try:
        t = type(batch)
        if t is tuple or t is list:
            batch = batch[0] if batch else None
        elif t is dict:
            batch = next(iter(batch.values()), None)
        shape = getattr(batch, "shape", None)
        n = shape[0] if shape is not None and len(shape) else 0
        return int(n) if n is not None else 0
    except Exception:  # a nested structure, an unknown dimension: the sample count is optional
        return 0


def _sample_rate(environ=None):
    raw = (os.environ if environ is None else environ).get("TEYE_DDP_SAMPLE_RATE", "1")
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        debug("TEYE_DDP_SAMPLE_RATE=%r is not a positive integer: 1" % raw[:40])
        return 1
    return n


DDP_SAMPLE_RATE = _sample_rate()


def carve(phases, a, b, as_=_M):
    """The flat phases (name, start, end, ...) with their ``compute`` inside [a, b] made ``communication`` (or
    ``as_``: ``data_wait`` for the loop's own data work, Session._data_work)."""
    out = []
    for k in range(0, len(phases), 3):
        name, x, y = phases[k], phases[k + 1], phases[k + 2]
        if name != _C or y <= a or x >= b:
            out += (name, x, y)
            continue
        if x < a:
            out += (_C, x, a)
        out += (as_, max(x, a), min(y, b))
        if y > b:
            out += (_C, b, y)
    return out


def wrapper_of(fn, orig):
    """fn, marked as teye's wrapper of orig: orig's name and doc, __wrapped__, and _teye (never wrapped twice)."""
    fn.__name__ = orig.__name__
    fn.__qualname__ = getattr(orig, "__qualname__", orig.__name__)
    fn.__doc__ = orig.__doc__
    fn.__wrapped__ = orig
    fn._teye = True
    return fn


def from_signal_handler(exc):
    """Whether a Python signal handler of the process raised exc (one of the frames it went through runs a
    handler's code: the interpreter calls a handler from whatever frame the main thread was in)."""
    try:
        import signal
        codes = set()
        for n in signal.valid_signals():
            try:
                h = signal.getsignal(n)
            except (ValueError, OSError):
                continue
            code = getattr(h, "__code__", None)
            if code is not None:
                codes.add(code)
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code in codes:
                return True
            tb = tb.tb_next
    except Exception as e:  # never into the training loop: then it is teye's
        debug("zero-code phases: looking for a signal handler: %s: %s" % (type(e).__name__, e))
    return False


def job_name(environ=None, argv=None):
    """The job name when none is given: TEYE_TRAIN_JOB, else Slurm, else a Kubernetes pod, else the script."""
    env = os.environ if environ is None else environ
    argv = sys.argv if argv is None else argv
    name = env.get("TEYE_TRAIN_JOB")
    if name:
        return name
    if env.get("SLURM_JOB_ID"):
        if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
            name = "slurm-%s_%s" % (env["SLURM_ARRAY_JOB_ID"], env["SLURM_ARRAY_TASK_ID"])
        else:
            name = "slurm-%s" % env["SLURM_JOB_ID"]
        step = env.get("SLURM_STEP_ID")
        if step:
            name += "." + step
        return name
    if env.get("KUBERNETES_SERVICE_HOST"):
        pod = env.get("TEYE_POD_NAME") or env.get("POD_NAME") or env.get("HOSTNAME")
        if pod:
            return pod
    script = argv[0] if argv else ""
    if not script or script in ("-c", "-m", "-"):
        return "python"
    base = os.path.basename(script)
    if base.endswith(".py"):
        base = base[:-3]
    if base == "__main__":  # python -m pkg: the package's name
        base = os.path.basename(os.path.dirname(script)) or "python"
    return base or "python"


class Session:
    """One process's zero-code state: input waits since the last step, and the reporter (made at the first step)."""

    MAX_WAITS = 4096
    MAX_EVALS = 256
    MAX_LOADERS = 256
    MAX_TRAIN_KEYS = 64
    MAX_DDP = 16
    # compilations among comms ([start_ns, end_ns, -2, thread]: see compiled()); a class default, so that a
    # process that never compiles has the instance attributes it had (two more per instance cost 5 % more
    # client CPU per step in benchmarks/zero_code.py's client loop, one 2 %: CPython 3.11 shares an instance
    # dict's keys only up to 30 names)
    compiles = 0
    # Several optimizers (a GAN's discriminator and generator): the job's step is the loop iteration, the
    # optimizer that steps least (docs/zero-code.md "Several optimizers").  Class defaults, for the same
    # reason as ``compiles``: a loop with one optimizer never writes them.
    multi = False        # two or more optimizers are alive (optimizer_made): the first steps are held
    optimizers = ()      # a WeakSet of the optimizers made, once one is (optimizer_made)
    lead_held = ()       # the first optimizer's first steps, (phases, start, end, samples), held (_lead_step)
    lead_done = False    # the iteration's optimizer is settled: nothing is held any more
    per_iter = 0         # steps another optimizer makes per iteration (a GAN's 2 discriminator steps)
    other_n = 0          # steps the other optimizer made since the leader's last one
    LEAD_HOLD = 8        # the first optimizer's steps held at most, waiting for a second one to step
    opt_made_ns = 0      # when the latest optimizer was made: a first step read off-thread starts no earlier
    backlog = ()         # samples of batches read ahead by another thread, not yet consumed (_consumed)
    own_gen = False      # a training step took batches read inside a generator of the job's own: steps only
    gen_keys = ()        # the loaders first read inside a generator of the job's own (_torch._job_generator)
    # the step's parts (issue 45; docs/zero-code.md "Inside the step"): the part in progress on the thread that
    # began it (pdepth: its nesting, 0 none; a forward inside a backward, a step's closure, is the outer part's),
    # and the outermost parts' intervals since the last step (pspans: [kind, start_ns, end_ns], host clock), or,
    # where CUDA is in use, the device door (``device``: _torch.Device) that times them with CUDA events
    pdepth = 0
    pkind = 0
    pstart = 0
    pthread = None
    pev = None
    pspans = None
    device = None
    pcarry = 0           # device ns read beyond the compute of the step that read them (see _parts_of)
    # the training thread's own data work (issue 47; _data_work): the host time before each outermost forward
    # since the last outermost part other than a copy ended on its thread (pgaps: [from_ns or None, to_ns,
    # thread], None: from the step's start), the copies' host intervals (pcopies: compute, h2d_copy), and
    # the last part's end (plast: (thread, ns))
    pgaps = None
    pcopies = None
    plast = None
    work_source = None   # the source of steps whose input is that data work (set where the forward is seen)
    work_from = 0        # no data work before this (ns): the end of teye's own bookkeeping at the first step

    def __init__(self):
        self.waits = []          # [start_ns, end_ns, samples, loader] since the last step
        self.comms = []          # [start_ns, end_ns, -1, None] in collectives called from Python since the last step
        self.in_comm = 0         # collectives in progress (one inside another is timed once)
        self.step_start = None   # the previous step's end
        self.reporter = None
        self.wait_source = None  # what can observe input waits (set by the instrumentors when they patch)
        self.source = None       # ... once it has observed one (None: steps only)
        self.step_source = None  # what ends the steps
        self.leader = None       # the optimizer whose steps are the job's steps (see step())
        self.leader_ref = None   # ... a weak reference to it, where the instrumentor gives one (see lead())
        self.other = None
        self.disabled = False
        self.starting = False    # making its own Reporter (see explicit_client)
        self.aside = False       # the process has its own Reporter: zero-code phases stand aside
        self.train_keys = []     # the loaders (iterators) whose batches were followed by a step, newest last
        self.refs = {}           # loader number -> weak reference to its iterator (None: cannot tell), until it trains
        self.made = {}           # loader number -> when its iterator was made (where the instrumentor tells), until its first step
        self.carried = 0         # samples of the training waits before an evaluation, counted by the step (_before)
        self.ended = set()       # loaders whose end (StopIteration) was waited for since the last step
        self.nograd = set()      # loaders read with autograd off since the last step (where the instrumentor tells)
        self.exit_hook = False   # finish() registered at exit (once an evaluation was seen)
        self.wait_thread = None  # the thread of the latest input wait (where the instrumentor tells)
        self.off_thread = False  # input waits came from a thread other than the one that steps: steps only
        self.evals = []          # [start_ns, end_ns] of evaluations the framework declared (see evaluation())
        self.evaluating = 0      # evaluation() calls in progress (one inside another counts once)
        self.ddp = []            # [weak reference, last iteration read] of each DistributedDataParallel (_torch)
        self.held = None         # a DDP job's last step, (phases, start, end, samples): sent at the next (hold())
        self.ahead = 0           # inside a read-ahead wrapper (accelerate's DataLoaderShard): see consumed()

    def explicit_client(self, rep):
        """A Reporter made by the job itself (not by this session): the process is that client's job, so the
        zero-code session stands aside for good (one training job per process; the explicit client wins).
        A zero-code reporter already made stops sending (its job expires on the agent)."""
        if self.starting or self.aside:
            return
        self.aside = self.disabled = True
        self._name_differs(rep)
        mine = self.reporter
        self.reporter = None
        del self.waits[:]
        del self.comms[:]
        self.held = None
        debug("zero-code phases stand aside in pid %d: the process reports its own phases (job %r)"
              % (os.getpid(), getattr(rep, "train_job", "?")))
        if mine is not None:
            try:
                mine.close()
            except Exception as e:  # never into the training loop
                debug("closing the zero-code reporter: %s: %s" % (type(e).__name__, e))

    @staticmethod
    def _name_differs(rep, environ=None):
        """The job's own Reporter names its job (``Reporter(train_job=...)`` wins over ``teye run --job`` /
        TEYE_TRAIN_JOB, which a Reporter without a name takes): say so once per process where they differ."""
        asked = (os.environ if environ is None else environ).get("TEYE_TRAIN_JOB")
        got = getattr(rep, "train_job", None)
        if not asked or got is None:
            return False
        norm = getattr(sys.modules.get(type(rep).__module__), "_job_name", None)
        try:
            same = got in (asked, norm(asked) if callable(norm) else asked)
        except Exception:  # a Reporter of another shape: compare the names as they are
            same = got == asked
        if same:
            return False
        warn("pid %d reports as job %r, its own Reporter's name, not %r (teye run --job / TEYE_TRAIN_JOB)"
             % (os.getpid(), got, asked))
        return True

    def reset(self):
        """In a forked child: nothing of the parent's (its buffer, socket and thread belong to the parent, its
        pending waits to the parent's step); the patches stay, inherited with the modules, and so do the
        sources they set (the child's waits are observed as the parent's were).  A process that reports its
        own phases keeps standing aside in its children (they inherit its Reporter)."""
        wait_source, step_source, aside = self.wait_source, self.step_source, self.aside
        for k in ("lead_held", "lead_done", "per_iter", "other_n", "backlog", "own_gen", "gen_keys",   # the parent's stay the parent's
                  "pdepth", "pkind", "pstart", "pthread", "pev", "pspans", "device", "pcarry",   # no part in progress, no CUDA
                  "pgaps", "pcopies", "plast", "work_from"):
            self.__dict__.pop(k, None)
        self.__init__()
        self.wait_source, self.step_source = wait_source, step_source
        self.aside = self.disabled = aside

    def wait(self, start_ns, end_ns, samples, loader=None):
        """An input wait; ``loader``: which iterator it came from, where the instrumentor tells (see
        _evaluation: waits of a loader whose batches no step follows are evaluation, not training)."""
        if self.aside:
            return
        if self.source is None:
            self.source = self.wait_source
        if self.ahead and samples > 0:
            samples = 0   # fetched ahead of the job: its samples count when the wrapper hands it on (consumed())
        w = self.waits
        w.append((start_ns, end_ns, samples, loader))
        if loader is not None and not self.exit_hook and self.train_keys and loader not in self.train_keys:
            # a loader that has not trained yet, after training began (an evaluation): its waits may be the
            # last (a final test pass), reported as eval at exit; registered after the reporter's exit flush,
            # so it runs first.  Only then: a job that never evaluates keeps its exit as it was.
            self.exit_hook = True
            atexit.register(self._finish_guarded)
        if len(w) > self.MAX_WAITS:  # a loop that reads batches and never steps (evaluation): keep the newest
            del w[:self.MAX_WAITS // 2]

    def consumed(self, samples):
        """A batch that a read-ahead wrapper (accelerate's DataLoaderShard, which Hugging Face's Trainer and
        Lightning-less accelerate loops read: it fetches batch k+1 before it hands on batch k, to know which is
        the last) hands to the job: its samples count now, with the wait that fetched ahead, so that a run
        stopped mid-epoch (max_steps) counts the batches it trained, not the one fetched ahead of its end.
        (No wait observed since the last step: the loader under it is not one teye times, whose samples
        were never counted.)"""
        w = self.waits
        if self.aside or samples <= 0 or not w:
            return
        a, b, n, k = w[-1]
        w[-1] = (a, b, n + samples, k)

    def loader(self, key, it, made=None):
        """A new loader (iterator) numbered ``key``: kept by a weak reference, so that a step can tell one still
        in use (a second loader the step consumes) from one already dropped (a probe, a validation pass).
        ``made``: when the iterator began to be made (its DataLoader workers start then), where the instrumentor
        knows it: an evaluation ends there when the training iterator was made after it (_evaluation)."""
        refs = self.refs
        try:
            refs[key] = weakref.ref(it)
        except TypeError:
            refs[key] = None
        if len(refs) > self.MAX_LOADERS:  # iterators that never trained: keep the newest
            for k in list(refs)[:self.MAX_LOADERS // 2]:
                del refs[k]
        if made is not None:
            m = self.made
            m[key] = made
            if len(m) > self.MAX_LOADERS:
                for k in list(m)[:self.MAX_LOADERS // 2]:
                    del m[k]

    def comm(self, start_ns, end_ns):
        c = self.comms
        c.append((start_ns, end_ns, -1, None))
        if len(c) > self.MAX_WAITS:
            del c[:self.MAX_WAITS // 2]

    def compiled(self, start_ns, end_ns, thread):
        """A compilation (torch.compile's, _torch.patch_compile) ran on ``thread`` from start_ns to end_ns: kept
        with the collectives (samples -2), so that the step it lies in carves it out of its compute as the
        ``compile`` phase (_step).  One on another thread than the one that steps is dropped there."""
        if self.aside:
            return
        self.compiles += 1
        c = self.comms
        c.append((start_ns, end_ns, -2, thread))
        if len(c) > self.MAX_WAITS:
            del c[:self.MAX_WAITS // 2]

    # -- the step's parts (issue 45) ------------------------------------------------------------
    def pbegin(self, kind):
        """The outermost part of kind ``kind`` (PARTS' index) begins on this thread (the caller checked that
        none is in progress: pdepth 0)."""
        self.pdepth = 1
        self.pkind = kind
        self.pthread = _thread()
        dev = self.device
        if dev is not None:
            try:
                self.pev = dev.record()
            except Exception as e:  # never into the job's forward: the host clock times the parts from now on
                self._device_lost(e)
        self.pstart = now = _ns()
        if kind == 0:   # a forward: the thread's time before it, since its last part, may be the loop's data work
            last, t = self.plast, self.pthread
            g = self.pgaps
            if g is None:
                g = self.pgaps = []
            g.append((last[1] if last is not None and last[0] == t else None, now, t))
            if len(g) > self.MAX_WAITS:   # forwards and never a step (inference): keep the newest
                del g[:self.MAX_WAITS // 2]

    def pend(self):
        """The outermost part in progress ends (its depth is back to 0): its interval is kept for the step
        that holds it (host clock), or its pair of CUDA events handed to the device door."""
        end = _ns()
        self.pdepth = 0
        if self.pkind == 3:   # a copy to the device: compute (h2d_copy) inside the time before a forward
            c = self.pcopies
            if c is None:
                c = self.pcopies = []
            c.append((self.pstart, end))
            if len(c) > self.MAX_WAITS:
                del c[:self.MAX_WAITS // 2]
        else:
            self.plast = (self.pthread, end)
        dev = self.device
        if dev is not None:
            ev = self.pev
            self.pev = None
            if ev is not None:
                try:
                    dev.pair(self.pkind, ev, dev.record())
                except Exception as e:  # never into the job
                    self._device_lost(e)
            return
        sp = self.pspans
        if sp is None:
            sp = self.pspans = []
        sp.append((self.pkind, self.pstart, end))
        if len(sp) > self.MAX_WAITS:   # a loop that runs forwards and never steps (inference): keep the newest
            del sp[:self.MAX_WAITS // 2]

    def _device_lost(self, e):
        self.device = None
        self.pev = None
        debug("zero-code phases: CUDA events failed (%s: %s): the parts are timed by the host clock" % (
            type(e).__name__, e))

    def _forget_data_work(self):
        """The step took what it needed of the forwards' gaps: the next step's begin afresh."""
        self.pgaps = self.pcopies = self.plast = None
        self.work_from = 0

    def _data_work(self, start, end_ns):
        """The training thread's own data work in the step [start, end_ns] (issue 47; docs/phases.md "Data work
        on the training thread"): its time before each outermost forward since its last other part (the step's
        start for the first), less the copies to the device in it (h2d_copy: compute), on the thread that
        steps.  [] where no forward was seen on it (the parts off, a model that is not an nn.Module, inference
        only): the step stays steps only."""
        gaps, copies, floor = self.pgaps, self.pcopies, self.work_from
        self._forget_data_work()
        if not gaps:
            return []
        me = _thread()
        out = []
        for a, b, t in gaps:
            if t != me:
                continue
            if a is None or a < start:
                a = start
            if a < floor:
                a = floor
            if b > end_ns:
                b = end_ns
            if b <= a:
                continue
            for x, y in (copies or ()):
                if y <= a or x >= b:
                    continue
                if x > a:
                    out.append((a, x))
                a = y
                if a >= b:
                    break
            if b > a:
                out.append((a, b))
        return out

    def _take_spans(self):
        """The parts' intervals since the last step (a part still in progress at a step is left to the next:
        a step inside a forward, an optimizer's closure, is the outer part's)."""
        sp = self.pspans
        if sp is None:
            return None
        self.pspans = None
        return sp

    def _record(self, rep, phases, start, end, samples, spans):
        """Send a step with its parts: the time of each in the step's ``compute`` (what the parts' intervals
        cover of it; the rest is the agent's ``other``), never more than that compute."""
        parts = None
        if self.device is not None or spans:
            try:
                parts = self._parts_of(phases, spans)
            except Exception as e:  # never into the training loop: this step goes without its parts
                debug("zero-code phases: the step's parts: %s: %s" % (type(e).__name__, e))
        if parts is None:
            rep.record_step(phases, start, end, samples)
        else:
            rep.record_step(phases, start, end, samples, parts)

    def _parts_of(self, phases, spans):
        """[forward, backward, optimizer, h2d_copy] ns of a step whose flat phases are ``phases``: on the host
        clock, each outermost part's interval intersected with the step's compute intervals (merged in time
        order first: parts seen on two threads never count twice); on a GPU, the device's times of the parts
        whose events have completed since (_torch.Device.ready()), capped at the step's compute, the excess
        carried to the next step (the device runs behind the host; the totals over a run agree).  None: no
        part in the step."""
        dev = self.device
        comp = []
        for k in range(0, len(phases), 3):
            if phases[k] == _C:
                comp.append((phases[k + 1], phases[k + 2]))
        if dev is not None:
            got = dev.ready()
            total = sum(c[1] - c[0] for c in comp)
            carry = self.pcarry
            if got is None and not carry:
                return None
            out = [0, 0, 0, 0]
            if got is not None:
                for i in range(4):
                    out[i] = got[i]
            have = sum(out) + carry
            if have > total:
                # what does not fit waits for the next step's compute (at most two steps' worth: a device far
                # behind the host loses its oldest time rather than piling it up)
                over = have - total
                self.pcarry = min(over, 2 * total)
                for i in range(3, -1, -1):   # take the excess from the last parts first (h2d, optimizer ...)
                    cut = min(out[i], over)
                    out[i] -= cut
                    over -= cut
            else:
                self.pcarry = 0
            return out if any(out) else None
        if not spans:
            return None
        if len(spans) > 1:
            spans = sorted(spans, key=lambda x: x[1])
        out = [0, 0, 0, 0]
        t = None
        for kind, a, b in spans:
            if t is not None and a < t:
                a = t
            if b <= a:
                continue
            t = b
            for x, y in comp:
                lo = a if a > x else x
                hi = b if b < y else y
                if hi > lo:
                    out[kind] += hi - lo
        return out if any(out) else None

    def lead(self, optimizer):
        """A weak reference to the leading optimizer, where ``optimizer`` leads: once the job drops it (a new
        model and optimizer per task, per fold, per trial), the next optimizer leads from its first step."""
        ref = self.leader_ref
        if ref is None or ref() is not optimizer:
            try:
                self.leader_ref = weakref.ref(optimizer)
            except TypeError:
                self.leader_ref = None

    def step(self, end_ns, owner=None, begun_ns=None, compiled=False):
        """A training step ended at end_ns; ``compiled``: the call that ended it, begun at begun_ns, traced and
        compiled its graph (_tf): the step ends where the call began, and the call is the ``compile`` phase
        between that step and the next, outside any step's time, up to the end of this bookkeeping (at the
        first step it makes the reporter: teye's own one-time cost, left out of the steps as well)."""
        if not compiled or begun_ns is None or not begun_ns <= end_ns:
            return self._step(end_ns, owner, begun_ns)
        self._step(begun_ns, owner, begun_ns)
        rep = self.reporter
        if rep is not None and self.step_start == begun_ns:  # the step was taken (not another optimizer's)
            end_ns = max(end_ns, _ns())
            rep.record_phase("compile", begun_ns, end_ns)
            self.step_start = end_ns

    def _step(self, end_ns, owner=None, begun_ns=None):
        """A training step ended at end_ns.  With several optimizers (a GAN's two), the job's step is the
        first one's: another one's steps count only once it steps twice without the first in between.
        ``begun_ns``: when the call that ends the step began, where the instrumentor knows it (the first
        step of a process starts there, not at its end, when no input wait came before it)."""
        merge = None
        if owner != self.leader:
            if owner is not None:
                taken, merge = self._lead(owner)
                if not taken:
                    return
        elif self.other is not None:
            self.other = None
            self.other_n = 0
        rep = self.reporter
        if rep is None:
            if self.disabled:
                return
            rep = self._start()
            if rep is None:
                return
        if self.held is not None:
            self.release(rep)
        waits = self.waits
        start = self.step_start
        after = start is not None   # a step came before this one
        if start is None:
            start = first = waits[0][0] if waits else (begun_ns if begun_ns is not None else end_ns)
            if not waits and self.pgaps and self.opt_made_ns and self.opt_made_ns < start:
                # a loop whose own data work comes before its first forward (get_batch): its first step began
                # no earlier than its optimizer was made, and no later than that work
                start = first = self.opt_made_ns
        self.step_start = end_ns
        comms = self.comms
        if self.evals:
            start = self._declared(start, rep)
        if waits and waits[-1][3] is not None:
            start = self._evaluation(waits, start, rep, after)
        carried = self.carried
        if carried:
            self.carried = 0
        if self.gen_keys and not self.own_gen and any(w[3] in self.gen_keys for w in waits):
            self.own_gen = True   # a training step took batches a generator of the job's own read
        if self.off_thread or self.own_gen:
            return self._unsplit(rep, start, end_ns, after, carried, merge)
        if self.source is None:  # no input wait can be observed: steps only, no made-up split
            return self._unobserved(rep, start, end_ns, carried, merge)
        if comms:  # waits, collectives and compilations in time order (their samples are -1, -2)
            if self.compiles:
                # ``first``: the first step's start, before any evaluation moved it (set where ``after`` is not)
                comms = self._own_compiles(comms, None if after else first, rep)
            waits = sorted(waits + comms, key=lambda w: (w[0], w[1]))
            self.waits.clear()
            del comms[:]
        phases, samples = _split(waits, start, end_ns)
        waits.clear()
        samples += carried
        if self.source != rep.source:
            rep.source = self.source
            rep._src_due = True
        self._forget_data_work()   # (a DataLoader's waits are the step's input: the forwards' gaps go unread)
        self._send(rep, phases, start, end_ns, samples, merge)

    def _lead(self, owner):
        """Another optimizer than the leading one stepped: (whether this is the job's step, the leading
        optimizer's held steps to merge into it or None).  The second optimizer's first step after the first
        stepped k >= 2 times makes it the leader (it steps least: the loop iteration is its); one stepping as
        often is not the job's step."""
        gone = self.leader_ref is not None and self.leader_ref() is None
        if self.leader is not None and not gone and self.lead_held and len(self.lead_held) >= 2:
            # a second optimizer's first step after the first one stepped k >= 2 times: the loop
            # iteration is this one's (it steps least); the held steps are this iteration's
            merge, self.lead_held, self.lead_done = self.lead_held, (), True
            self.per_iter = len(merge)
            self.leader = owner
            self.other = None
            self.other_n = 0
            return True, merge
        if self.leader is None or gone or (self.other == owner and self.other_n + 1 > max(1, self.per_iter)):
            self.leader = owner
            self.other = None
            self.other_n = 0
            return True, None
        if self.lead_held:   # a second optimizer stepping as often: the first one leads
            self._flush_lead()
        self.lead_done = True
        self.other_n = self.other_n + 1 if self.other == owner else 1
        self.other = owner
        return False, None

    def _unsplit(self, rep, start, end_ns, after, carried, merge):
        """A step whose batches are read in other threads than the training loop's (prefetching threads: their
        waits overlap its compute and its own wait is not seen, so no split; the samples read since the last
        step still count, taken from the front only: a reading thread may append meanwhile), or through a
        generator of the job's own (the work it does on the training thread between the batches is the loop's
        data work, which teye cannot place without the forward's start, issue 47): steps only, never compute,
        unless the forwards' starts place that work."""
        waits = self.waits
        n = len(waits)
        if self.off_thread and not after and self.opt_made_ns and start < self.opt_made_ns < end_ns:
            # the training thread's first step cannot begin before its optimizer was made: the reading
            # thread's first fetch (a producer started before the model was built) is not its start
            start = self.opt_made_ns
        samples = self._consumed(waits[:n], start) + carried
        del waits[:n]
        del self.comms[:]
        work = self._data_work(start, end_ns)
        if work:   # the forward's start places the loop's own data work: the rest of the step is compute
            self._own_work(rep, work, start, end_ns, samples, merge)
            return
        if rep.source != self.step_source:
            debug("zero-code phases: batches read %s: steps and samples only" % (
                "outside the thread that steps" if self.off_thread else "through a generator of the job's own"))
            rep.source = self.step_source
            rep._src_due = True
        rep.record_step((), start, end_ns, samples)
        self._take_spans()

    def _unobserved(self, rep, start, end_ns, carried, merge):
        """A step of a loop whose input wait teye cannot observe: the loop's own data work where the forwards'
        starts place it (a get_batch loop), else steps only; a data-parallel job's exposed exchange is timed
        all the same."""
        work = self._data_work(start, end_ns)
        if work:   # ... unless the forward's start places the loop's own data work (a get_batch loop)
            del self.comms[:]
            self._own_work(rep, work, start, end_ns, carried, merge)
            return
        if rep.source != self.step_source:
            rep.source = self.step_source
            rep._src_due = True
        del self.comms[:]
        if self.ddp:
            # a data-parallel job whatever feeds it (tensors in memory, a get_batch loop): its exposed
            # gradient exchange is timed all the same (issue 47), sent as its only phase (release())
            self.hold(rep, (), start, end_ns, 0)   # (takes the parts' spans, as every held step)
            return
        rep.record_step((), start, end_ns, 0)
        self._take_spans()

    def _send(self, rep, phases, start, end_ns, samples, merge):
        if merge is not None:   # the iteration: the held steps of the other optimizer, then this one's
            start = merge[0][1]
            phases = tuple(x for m in merge for x in m[0]) + tuple(phases)
            samples += sum(m[3] for m in merge)
        if self.ddp:
            self.hold(rep, phases, start, end_ns, samples)
        elif self.multi and not self.lead_done:
            self._lead_step(phases, start, end_ns, samples)
        else:
            self._record(rep, phases, start, end_ns, samples, self._take_spans())

    def _own_work(self, rep, work, start, end_ns, samples, merge):
        """A step whose input teye saw only as the training thread's time before its forwards (no DataLoader on
        that thread: a generator of the job's own, a producer's queue, get_batch): that time is ``data_wait``,
        the rest ``compute`` (a data-parallel job's exposed exchange carved out of it at release()), sent
        with the source that says so."""
        phases = [_C, start, end_ns]
        for a, b in work:
            phases = carve(phases, a, b, _W)
        src = self.work_source or self.step_source
        if rep.source != src:
            debug("zero-code phases: the input is the training thread's time before each forward (%s)" % src)
            rep.source = src
            rep._src_due = True
        self._send(rep, tuple(phases), start, end_ns, samples, merge)

    def _consumed(self, waits, start):
        """The samples a step consumed where another thread reads the batches (a producer filling a queue):
        the batches read while it ran stand for the ones it took (a bounded queue is refilled as it is
        emptied); the ones read ahead of it (the queue's fill, before the first step) are a backlog, taken one
        batch per step that read none (the queue drained at the end).  Totals stay exact; a step is never
        credited with another's batches read ahead."""
        ahead = [w[2] for w in waits if w[2] > 0 and w[1] <= start]
        new = [w[2] for w in waits if w[2] > 0 and w[1] > start]
        backlog = self.backlog
        if ahead:
            if backlog == ():
                backlog = self.backlog = []
            backlog.extend(ahead)
            if len(backlog) > self.MAX_WAITS:
                del backlog[:len(backlog) - self.MAX_WAITS]
        if new:
            return sum(new)
        return backlog.pop(0) if backlog else 0

    def generator_loader(self, key):
        """Loader ``key`` was first read inside a generator of the job's own (_torch._job_generator): its
        generator may do the loop's data work on the training thread; once a training step takes its batches,
        the process reports steps only (an evaluation read that way, a generator expression over a
        validation loader, leaves training as it is)."""
        keys = self.gen_keys
        if keys == ():
            keys = self.gen_keys = set()
        if len(keys) < self.MAX_LOADERS:
            keys.add(key)

    def optimizer_made(self, optimizer):
        """An optimizer was made (_torch.count_optimizers): with two alive, the first one's first steps are
        held until it is known which one steps least (_lead_step)."""
        self.opt_made_ns = _ns()
        opts = self.optimizers
        if opts == ():
            opts = self.optimizers = weakref.WeakSet()
        try:
            opts.add(optimizer)
        except TypeError:
            return
        if len(opts) > 1 and not self.multi:
            self.multi = True

    def _lead_step(self, phases, start, end_ns, samples):
        """A step of the first optimizer while another one is alive and has not stepped: held (at most
        LEAD_HOLD), so that a second optimizer whose first step comes after two or more of these makes them
        one loop iteration with it (_step's merge); sent as steps once LEAD_HOLD are held or at exit."""
        held = self.lead_held
        if held == ():
            held = self.lead_held = []
            atexit.register(self._flush_lead)   # after the reporter's own: runs before it
        held.append((phases, start, end_ns, samples))
        if len(held) >= self.LEAD_HOLD:
            self._flush_lead()

    def _flush_lead(self):
        """The held steps sent as they were: the first optimizer leads (or the job ends)."""
        held, self.lead_held, self.lead_done = self.lead_held, (), True
        rep = self.reporter
        if rep is None or not held:
            return
        try:
            for phases, start, end_ns, samples in held:
                rep.record_step(phases, start, end_ns, samples)
        except Exception as e:  # never into the training loop or its exit
            debug("zero-code phases: held steps: %s: %s" % (type(e).__name__, e))

    def _own_compiles(self, comms, first, rep):
        """comms, less the compilations (samples -2) that are not this step's: those of another thread than
        the one that steps (this one: it overlaps the loop's own work, which a carve would take from it), and,
        at the first step (``first``: its start), those that ended before it (a warm-up call before the first
        batch is read: sent as ``compile`` apart from the step, as a compiling call between two steps is)."""
        self.compiles = 0
        me = _thread()
        out = []
        for c in comms:
            if c[2] == -2:
                if c[3] != me:
                    continue
                if first is not None and c[1] <= first:
                    rep.record_phase("compile", c[0], c[1])
                    continue
            out.append(c)
        del comms[:]
        return out

    def hold(self, rep, phases, start, end_ns, samples):
        """A step of a process with DistributedDataParallel modules: kept until the next step ends, when DDP
        has timed this one's gradient exchange (its logger sets a backward's figures at the next forward:
        exchange()), then sent with the exposed exchange as ``communication`` (release())."""
        if not self.exit_hook:
            self.exit_hook = True
            atexit.register(self._finish_guarded)   # after the reporter's: runs first, the held step goes out
        self.held = (phases, start, end_ns, samples, self._take_spans())

    def release(self, rep, settle=False):
        """Send the held step, its exposed gradient exchange carved out of its compute where DDP timed it
        (``settle``: at exit, see exchange()); its parts are what is left of them in its compute after the carve."""
        phases, start, end, samples, spans = self.held
        self.held = None
        if end - start >= self.DDP_MIN_STEP_NS:
            only = not phases   # a steps-only step: nothing else of it is known, it gets the exchange alone
            for a, b in self.exchange(settle):
                a, b = max(a, start), min(b, end)
                if b > a:
                    phases = tuple(phases) + (_M, a, b) if only else carve(phases, a, b)
        self._record(rep, phases, start, end, samples, spans)

    DDP_MIN_STEP_NS = 500 * 10**3   # shorter steps are not split: reading DDP's logger costs about 4 µs

    def exchange(self, settle=False):
        """[start_ns, end_ns] (monotonic) of the exposed gradient exchange of each DDP module's latest backward
        that DDP's logger has timed since the last call: from the end of its local backward computation
        (``backward_compute_time_end``) to the end of its exchange (``backward_comm_time_end``), i.e. the
        exchange's time less its overlap with the computation.  DDP stamps those with the wall clock (CPU
        timers) or times them with CUDA events (durations only: the interval then ends where the wall-clock
        stamp says, as near as DDP's host side knows it).

        ``settle`` (at exit, for the held step): a module whose logger has set nothing new since the last
        call (no forward with gradients followed the held step: the job's normal end) has it set now
        (settle_ddp()).  One that has (a forward followed, then the job ended: an error in the next backward,
        a rank that died mid-exchange, os._exit) already holds the held step's figures; setting them again
        would mix in the unfinished backward's (DDP keeps an event's previous figure where it has no new one)."""
        out = []
        off = None
        keep = []
        for entry in self.ddp:
            m = entry[0]()
            if m is None:
                continue
            keep.append(entry)
            try:
                d = m.logger._get_ddp_logging_data().ints_map   # its figures only: about 4 µs (8 with strings)
                it = d.get("iteration")
                if settle and (not it or it == entry[1]):
                    self.settle_ddp(m)
                    d = m.logger._get_ddp_logging_data().ints_map
                    it = d.get("iteration")
            except Exception as e:  # DDP's logger changed: the exchange stays in compute, the rest goes on
                debug("DDP's logger cannot be read (%s: %s): its gradient exchange is not timed" % (type(e).__name__, e))
                del self.ddp[:]
                return out
            if not it or it == entry[1]:
                continue
            entry[1] = it
            comm, overlap, end = (d.get("backward_comm_time"), d.get("backward_compute_comm_overlap_time"),
                                  d.get("backward_comm_time_end"))
            if not (isinstance(comm, int) and isinstance(overlap, int) and isinstance(end, int)) or end <= 0:
                continue
            exposed = comm - overlap
            if exposed <= 0:
                continue
            if off is None:
                off = time.time_ns() - _ns()
            out.append((end - off - exposed, end - off))
        if len(keep) != len(self.ddp):
            self.ddp[:] = keep
        return out

    @staticmethod
    def settle_ddp(module):
        """At exit: DDP sets a backward's figures at the next forward, which the last step never has; have the
        module's logger set them now (the job is over: DDP's own running averages count that iteration twice,
        at worst, if a forward with gradients follows after all)."""
        logger = getattr(module, "logger", None)
        if logger is not None:
            try:
                logger.set_runtime_stats_and_log()
            except Exception as e:  # the last step's exchange then stays in compute
                debug("DDP's logger: the last step's figures: %s: %s" % (type(e).__name__, e))

    def track_ddp(self, module):
        """A new DistributedDataParallel module: its logger set to time every iteration (DDP's default: the
        first 10, then one in 100; ``TEYE_DDP_SAMPLE_RATE``), read at each step (exchange()).  A module over a
        process group of one rank exchanges nothing: DDP's timers would see only its own bucket work (2 to 17 %
        of 1 ms steps measured at world size 1), so it is left as it is and its steps go out unheld."""
        pg = getattr(module, "process_group", None)
        size = getattr(pg, "size", None)
        if callable(size) and size() == 1:
            debug("DDP over a process group of one rank: nothing to exchange, nothing timed")
            return
        module._set_ddp_runtime_logging_sample_rate(DDP_SAMPLE_RATE)
        self.ddp.append([weakref.ref(module), None])
        if len(self.ddp) > self.MAX_DDP:
            del self.ddp[0]

    def _evaluation(self, waits, start, rep, after=True):
        """Evaluation apart from training.  Every loader (iterator) whose batches were read between two
        optimizer steps on the stepping thread is training input (semi-supervised, contrastive, multi-task
        steps read two or three), in whatever order and however often each is read: the one the step
        consumed last, those that trained before, and those still in use at the step.  A loader that never
        trained is evaluation where its end was reached before the step (a validation or test pass), it was
        read with autograd off (under torch.no_grad() or inference_mode(), as Lightning's validation reads its
        batches through an iterator it keeps, stopping at the loader's length), or the job already dropped it (a probe like next(iter(loader)), a pass cut short with break): from the first
        of its waits to the training wait that follows the last of them is reported as the ``eval`` phase,
        and the step starts there (its time, samples and histogram count training only).  What came before
        the evaluation since the previous step is training where the evaluation's loader is one the
        instrumentor registered (PyTorch's; _before: Lightning makes a validation's iterator, its DataLoader
        workers started, before its on_validation_start, and its clock counts that as training); a tf.data
        loop's making of its validation iterator stays in neither.  A training iterator made after the
        evaluation's last wait (Lightning's, after its sanity check; a plain loop's next epoch) ends the
        evaluation where it began to be made: its workers' start-up is training's, in the step (``after``: a
        step came before), or before the first step in neither (the run starts at its first training wait,
        as a job's without evaluation does).  Returns the step's start; removes the evaluation's waits."""
        keys, refs, ended, nograd = self.train_keys, self.refs, self.ended, self.nograd
        last = waits[-1][3]
        first = final = -1
        decided = {}
        for i, w in enumerate(waits):
            k = w[3]
            train = decided.get(k)
            if train is None:
                if k == last or k is None or k in keys:
                    train = True
                elif k in ended or k in nograd:
                    train = False
                elif k in refs:   # a loader the instrumentor registered (PyTorch's)
                    ref = refs[k]
                    train = ref is None or ref() is not None   # cannot tell: training
                else:             # one it did not (tf.data's) or long forgotten: the step consumed another's
                    train = False
                decided[k] = train
                if train and k is not None and k not in keys:
                    keys.append(k)
                    refs.pop(k, None)
                    if len(keys) > self.MAX_TRAIN_KEYS:
                        del keys[0]
            if not train:
                final = i
                if first < 0:
                    first = i
        ended.clear()
        nograd.clear()
        if first < 0:
            return start
        a, nxt = max(waits[first][0], start), waits[final + 1]   # the training wait after it (the step's last is)
        b = nxt[0]
        made = self.made.pop(nxt[3], None)
        fresh = made is not None and waits[final][1] <= made < b
        e = made if fresh else b
        if e > a:
            rep.record_phase("eval", a, e)
        if a > start and waits[first][3] in refs:   # a PyTorch loader's (tf.data's: neither, as before)
            self._before(waits, first, start, a, rep)
        del waits[:final + 1]
        return max(start, made if fresh and after else b)

    def _before(self, waits, first, start, a, rep):
        """The part of a step before its evaluation, [start, a]: training (its loaders' waits ``data_wait``,
        the rest ``compute``, their samples the step's), outside the step's own interval, which starts after
        the evaluation (so the step histogram does not hold it; the phase seconds do)."""
        t = start
        for w in waits[:first]:
            x, y = max(w[0], t), min(w[1], a)
            if y <= x:
                continue
            if x > t:
                rep.record_phase("compute", t, x)
            rep.record_phase("data_wait", x, y)
            if w[2] > 0:
                self.carried += w[2]
            t = y
        if a > t:
            rep.record_phase("compute", t, a)

    def evaluation(self, fn, *args, **kwargs):
        """Call fn, a framework's evaluation (Keras' evaluate, predict, test_on_batch, predict_on_batch): the
        framework says it is not training, so its whole call is the ``eval`` phase, reported before the next
        step (which starts where it ended) or at exit, and the input waits observed inside it are not
        training's.  A call inside which an optimizer steps trains, by definition: it is left as it is."""
        if self.evaluating or self.aside:
            return fn(*args, **kwargs)
        self.evaluating += 1
        before = self.step_start
        t0 = _ns()
        try:
            return fn(*args, **kwargs)
        finally:
            self.evaluating -= 1
            if self.step_start == before:
                self._evaluated(t0, _ns())

    def _evaluated(self, start_ns, end_ns):
        try:
            waits = self.waits
            if waits and waits[-1][1] > start_ns:  # the input waits inside it are evaluation's, not training's
                waits[:] = [w for w in waits if w[1] <= start_ns]
            ev = self.evals
            ev.append((start_ns, end_ns))
            if len(ev) > self.MAX_EVALS:  # a process that evaluates and never trains: keep the newest
                del ev[:self.MAX_EVALS // 2]
            if self.reporter is not None and not self.exit_hook:  # it may be the last (a final evaluate)
                self.exit_hook = True
                atexit.register(self._finish_guarded)
        except Exception as e:  # never into the job
            self.disabled = True
            debug("zero-code phases off after an error: %s: %s" % (type(e).__name__, e))

    def _declared(self, start, rep):
        """The evaluations declared since the previous step, reported as ``eval``; returns the step's start
        (the end of the last of them, where that is later)."""
        for a, b in self.evals:
            rep.record_phase("eval", a, b)
            if b > start:
                start = b
        del self.evals[:]
        return start

    def finish(self):
        """At exit: evaluations no step followed (a final evaluate or predict, a final test loop) are reported
        as ``eval``: the declared ones (evaluation()) and the waits of loaders that never trained."""
        waits, rep = self.waits, self.reporter
        if self.disabled or rep is None:
            return
        if self.held is not None:
            self.release(rep, settle=True)
        if self.evals:
            self._declared(0, rep)
        if not waits or waits[-1][3] is None:
            return
        ev = [w for w in waits if w[3] not in self.train_keys]
        if ev:
            rep.record_phase("eval", max(ev[0][0], self.step_start or 0), ev[-1][1])
        del waits[:]

    def exit_flush(self):
        """Before os._exit (a forked or multiprocessing child ends that way, atexit never runs): what the exit
        hooks would have done: the final evaluation reported, a trace request still running closed and every
        reporter of the process flushed."""
        if self.exit_hook or self.held is not None:
            self._finish_guarded()
        tr = sys.modules.get("teye_client._trace")
        if tr is not None:
            tr.close_all()   # a trace request still running gets its last word (before the reporters' flush)
        rep = sys.modules.get("teye_client.reporter")
        if rep is not None:
            rep.flush_all()

    def step_guarded(self, end_ns, owner=None, begun_ns=None, compiled=False):
        """step(), called from a framework's hook: a bug of teye's must not end a training run, so an
        error switches zero-code phases off for the process (one line with TEYE_DEBUG=1).  An error a
        signal handler raised while step() ran is the job's, not teye's (PyTorch's SIGCHLD handler
        raises "DataLoader worker exited unexpectedly" wherever the main thread is): it goes on as it
        would have without teye."""
        try:
            self.step(end_ns, owner, begun_ns, compiled)
        except Exception as e:  # never into the training loop
            if from_signal_handler(e):
                raise
            self.disabled = True
            debug("zero-code phases off after an error: %s: %s" % (type(e).__name__, e))
        if self.pgaps is None:
            # the loop's own data work for the next step begins once teye's bookkeeping is done: the job's clock
            # has that inside its optimizer step (its compute; the first step's making of the reporter too)
            self.work_from = _ns()

    def _finish_guarded(self):
        try:
            self.finish()
        except Exception as e:  # never into the job's exit
            debug("zero-code phases: the final evaluation: %s: %s" % (type(e).__name__, e))

    def _start(self):
        self.starting = True
        try:
            from .reporter import Reporter
            rep = Reporter(train_job=job_name(), source=self.source or self.step_source)
        except Exception as e:  # never into the training loop
            self.disabled = True
            debug("zero-code phases off: cannot make the reporter: %s: %s" % (type(e).__name__, e))
            return None
        finally:
            self.starting = False
        self.reporter = rep
        debug("zero-code phases: job %r, pid %d, agent socket %s%s, rank: %s" % (
            rep.train_job, os.getpid(), rep.socket_path,
            " (not sending: %s)" % rep.refused if rep.refused else "", rep.rank_why))
        return rep




TRACE_LOOK_NS = 250 * 10**6   # how often the hook looks for a request before one came (= _trace.CHECK_EVERY_NS)


def trace_request_paths(job, socket_path):
    """Where `teye trace` requests for ``job`` appear (_trace.request_dir and _trace.agent_request_dir say the same,
    tests/trace/test_request.py holds them to it): the job's own request directory (TEYE_TRACE_REQUESTS, or
    /tmp/teye-<uid>/trace), and the agent's beside its phase socket, for its webhook."""
    uid = os.geteuid()
    d = os.environ.get("TEYE_TRACE_REQUESTS") or os.path.join("/tmp", "teye-%d" % uid, "trace")
    paths = [os.path.join(d, job + ".json")]
    if socket_path:
        paths.append(os.path.join(os.path.dirname(socket_path), "trace", str(uid), job + ".json"))
    return paths


class TraceHook:
    """`teye trace`'s request watch for one framework; ``tick()`` at the end of each loop iteration.  Until a
    request file exists it only looks for one, one ``stat`` per path every TRACE_LOOK_NS: the request module
    (``_trace``) is imported, and its ``Tracer`` made, only then (a training process that is never traced never
    imports it: 1.5 ms at the first step of a small TensorFlow loop).  ``make(_trace, steps)`` makes the
    framework's profile (``_trace.TorchProfile``, ``_tftrace.TfProfile``); ``exchange(_trace, job)``, where
    given, the store the job's ranks on every node reach (``_trace.StoreExchange``) or None, when a request is
    taken.  ``TEYE_TRACE=0`` turns it off; so does anything that fails while it is made (never into the
    training loop)."""

    def __init__(self, make, exchange=None):
        self.make = make
        self.exchange = exchange
        self.tracer = None
        self.on = os.environ.get("TEYE_TRACE", "1").strip() not in ("0", "false", "no", "off")
        self.steps = 0        # loop iterations ended (with a reporter) before the Tracer was made: it counts on
        self.next_look = 0
        self.paths = None

    @property
    def step_n(self):
        """Loop iterations ended in this process (with a reporter), as the Tracer counts them."""
        return self.tracer.step_n if self.tracer is not None else self.steps

    def tick(self):
        t = self.tracer
        if t is None:
            if not self.on or session.disabled:
                return
            rep = session.reporter
            if rep is None:
                return   # (before the session's first step made its reporter)
            self.steps += 1
            now = _ns()
            if now < self.next_look:
                return
            self.next_look = now + TRACE_LOOK_NS
            try:
                if self.paths is None:
                    self.paths = trace_request_paths(rep.train_job, rep.socket_path)
                if not any(os.path.exists(p) for p in self.paths):
                    return
                from . import _trace
                job = rep.train_job
                make, exchange = self.make, self.exchange
                t = _trace.Tracer(job, lambda: rep.rank, lambda steps: make(_trace, steps), report=rep.note_trace,
                                  agent_dir=_trace.agent_request_dir(rep.socket_path) if rep.socket_path else None,
                                  exchange=(lambda: exchange(_trace, job)) if exchange else None)
                t.step_n = self.steps - 1   # (its tick below counts this iteration, and looks at once)
                self.tracer = t
            except Exception as e:  # never into the training loop
                self.on = False
                debug("zero-code phases: teye trace is off: %s: %s" % (type(e).__name__, e))
                return
        t.tick()


session = Session()


def _split(waits, start, end_ns):
    """A step's phases from its waits (input waits, and collectives and compilations: samples -1, -2) in time
    order, clipped to [start, end_ns), the time between them compute: (phases as (kind, a, b, ...), samples).
    The usual step, one batch inside it, without the loop."""
    if len(waits) == 1 and waits[0][2] >= 0 and waits[0][0] >= start and waits[0][1] <= end_ns:  # one batch
        a, b, samples, _ = waits[0]
        if a > start:
            return (_C, start, a, _W, a, b, _C, b, end_ns), samples
        return (_W, a, b, _C, b, end_ns), samples
    phases = []
    t = start
    samples = 0
    for a, b, n, _ in waits:
        if b <= t or a >= end_ns:
            continue
        if a < t:
            a = t
        if a > t:
            phases += (_C, t, a)
        if b > end_ns:
            b = end_ns
        if n < 0:
            phases += (_M if n == -1 else _K, a, b)
        else:
            phases += (_W, a, b)
            samples += n
        t = b
    if end_ns > t:
        phases += (_C, t, end_ns)
    return phases, samples
