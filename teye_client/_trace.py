"""`teye trace`, the job's side (issue 46): a trace of the next N steps when asked, through the zero-code hook.

Standard library only (the profiler is the framework's, found in ``sys.modules``).  The request is a small JSON
file, ``<request dir>/<job>.json``, that ``teye trace --train-job JOB`` (or the agent, for an alert) writes in a
directory only the job's uid and root may write (``/tmp/teye-<uid>/trace``, or ``TEYE_TRACE_REQUESTS``).  At
the end of each loop iteration the training thread looks at it, at most every CHECK_EVERY_NS (one ``stat``);
a new, valid, unexpired request is taken once per process:

- accepted at once (a status file ``<id>.<node>.rank<R>.pid<P>.json`` beside the request: the CLI counts the
  ranks that took it);
- at the first iteration end at or after the request's ``start_after`` (a wall-clock time) each process
  proposes a first step (counted from its own first step), ``START_MARGIN_S`` of its steps later, in its
  status; the ranks of a data-parallel job, in lockstep, may end that iteration on either side of
  ``start_after``, so each takes the largest proposal of the request's processes on this node before it starts
  (their statuses, read again at the step it would start at): every rank starts at the same step, which the
  status says; the profiler warms up one step, records ``steps`` steps (one ``ProfilerStep#N`` each)
  and, at the next step boundary (so that the writing is not in a traced step), writes them to ``<output>/<job>.<id>.<node>.rank<R>.pt.trace.json`` (TensorFlow: ``.tf.trace.json`` and
  its ``.xplane.pb``, _tftrace.py; mode 0600, in a directory that must be the job uid's own and closed to others);
- the status says ``done`` with the file, or ``failed`` with a one-line reason (a profiler that raises, an
  output directory that is not the job's own, a write that fails, a trace over the request's ``max_bytes``,
  DEFAULT_MAX_BYTES by default, which is removed): the job goes on either way.

Everything runs on the training thread at step boundaries: nothing of the job is touched between them.
"""
import atexit
import json
import os
import re
import socket
import time

from .reporter import dir_problem

ENV_DIR = "TEYE_TRACE_REQUESTS"
CHECK_EVERY_NS = 250 * 10**6          # how often the training thread looks for a request (one stat)
START_MARGIN_S = 0.5                  # a proposed first step is this much of the process's steps after start_after
MIN_MARGIN_STEPS, MAX_MARGIN_STEPS = 3, 10000
PEEK_EVERY_NS = 50 * 10**6            # how often, while waiting for the first step, the peers' proposals are read
MAX_STATUS_BYTES = 8192
MAX_REQUEST_BYTES = 4096
MAX_STEPS = 1000
DEFAULT_MAX_BYTES = 256 * 1024 * 1024  # a trace over a request's max_bytes (this by default) is removed, not kept
MAX_MAX_BYTES = 1 << 40               # (agent.trace.defaults.MAX_TRACE_BYTES: the summary reads up to this default)
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ns = time.monotonic_ns
_wall = time.time
_TRACERS = []                         # this process's Tracers: a request still running is closed at its exit


def close_all():
    """At the process's end (atexit, or ``Session.exit_flush`` before a multiprocessing child's ``os._exit``): each
    request still running gets its last word (Tracer.close), so that `teye trace` ends at once, not at its timeout."""
    for t in list(_TRACERS):
        try:
            t.close()
        except Exception:
            pass   # (never into the job's exit)


def request_dir(uid=None):
    """Where requests for jobs of ``uid`` (default: this process's) are written and read."""
    d = os.environ.get(ENV_DIR)
    if d:
        return d
    return os.path.join("/tmp", "teye-%d" % (os.geteuid() if uid is None else uid), "trace")


def agent_request_dir(socket_path, uid=None):
    """Where the agent beside the phase socket ``socket_path`` writes requests for jobs of ``uid`` (its trace
    webhook: agent/trace/webhook.py): ``<the socket's directory>/trace/<uid>``."""
    return os.path.join(os.path.dirname(socket_path), "trace", str(os.geteuid() if uid is None else uid))


def default_output(directory):
    """Where a request that names no output (the agent's) is written: ``traces`` beside the job's own request
    directory (``/tmp/teye-<uid>/traces``), made 0700 by the job."""
    return os.path.join(os.path.dirname(directory), "traces")


def parse_request(raw, now_s):
    """The request in ``raw`` (bytes) as a dict, or a one-line reason it is refused."""
    if len(raw) > MAX_REQUEST_BYTES:
        return "the request is over %d bytes" % MAX_REQUEST_BYTES
    try:
        req = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        return "the request is not JSON (%s)" % e
    if not isinstance(req, dict):
        return "the request is not a JSON object"
    rid, steps, out = req.get("id"), req.get("steps"), req.get("output")
    if not isinstance(rid, str) or not _ID.match(rid):
        return "its id is not 1-64 letters, digits, '_' or '-'"
    if type(steps) is not int or not 1 <= steps <= MAX_STEPS:
        return "steps must be an integer from 1 to %d" % MAX_STEPS
    if out is not None and (not isinstance(out, str) or not out.startswith("/") or len(out) > 4096 or "\0" in out):
        return "output must be an absolute path (or null: the job's default)"
    times = [req.get(k) for k in ("start_after", "expires")]
    if any(type(t) not in (int, float) or t != t for t in times):
        return "start_after and expires must be numbers (Unix time)"
    if times[1] <= now_s:
        return "it expired"
    ranks = req.get("ranks")
    if ranks is not None and (not isinstance(ranks, list) or not all(type(r) is int for r in ranks)):
        return "ranks must be a list of integers"
    max_bytes = req.get("max_bytes", DEFAULT_MAX_BYTES)
    if type(max_bytes) is not int or not 1 <= max_bytes <= MAX_MAX_BYTES:
        return "max_bytes must be an integer from 1 to %d" % MAX_MAX_BYTES
    return {"id": rid, "steps": steps, "output": out, "start_after": float(times[0]),
            "expires": float(times[1]), "ranks": ranks, "max_bytes": max_bytes}


def _write_private(path, data):
    """Write ``data`` to ``path`` through a new file (0600, never following a link) renamed into place."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _read_small(path, most):
    """At most ``most`` bytes of the regular file ``path`` (never through a link, never blocking on a FIFO), or
    None where it cannot be read or is not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not os.fstat(f.fileno()).st_mode & 0o100000:
                return None
            return f.read(most)
    except OSError:
        return None


def output_problem(d):
    """Why the output directory ``d`` must not receive this uid's traces, or None: it must be a directory of
    this uid's that group and others can neither read nor write (a trace shows the job's code)."""
    try:
        st = os.lstat(d)
    except OSError as e:
        return "the output directory %s cannot be used (%s)" % (d, e.strerror or e)
    if st.st_mode & 0o170000 != 0o040000:
        return "the output %s is not a directory (or is a symbolic link)" % d
    if st.st_uid != os.geteuid():
        return "the output directory %s is owned by uid %d, not the job's uid %d" % (d, st.st_uid, os.geteuid())
    if st.st_mode & 0o077:
        return "the output directory %s is open to group or others (mode %04o)" % (d, st.st_mode & 0o7777)
    return None


class StoreExchange:
    """The largest first step proposed for a request, kept in a key/value store that every rank of the job reaches,
    on every node: the job's own rendezvous store (torch.distributed's default group's), one key per request.  A
    process's statuses are seen by the processes of its node only; through the store, the ranks on other nodes
    take the same largest proposal.  ``offer`` raises the key to a proposal (a compare-and-set loop, so that
    concurrent offers keep the largest) and returns what it then holds; ``peek`` reads it (0 where no rank has
    offered yet).  Each is one or a few round trips to the store, at step boundaries while a trace is starting."""

    TRIES = 16

    def __init__(self, store, job):
        self.store = store
        self.prefix = "teye/trace/%s/" % job

    def offer(self, rid, value):
        key, cur = self.prefix + rid, ""
        for _ in range(self.TRIES):
            got = self.store.compare_set(key, cur, str(value))   # set where the key holds cur ("": absent)
            held = int(got)
            if held >= value:
                return held
            cur = got.decode() if isinstance(got, bytes) else str(got)
        return None   # (offers kept racing past it: this process's own proposal stands)

    def peek(self, rid):
        key = self.prefix + rid
        if not self.store.check([key]):
            return 0
        return int(self.store.get(key))


def _close(prof):
    """Let a profile remove what it keeps aside (TensorFlow's private directory), where it has a ``close``."""
    close = getattr(prof, "close", None)
    if close is not None:
        try:
            close()
        except Exception:
            pass


class TorchProfile:
    """torch.profiler for ``steps`` steps after one warm-up step; ``export(path, bound)`` once they are recorded
    (a profile writes the trace at ``path``, and returns ``{suffix: file}`` for other files it wrote to keep
    beside it, or None; ``SUFFIX``: the trace file's)."""

    SUFFIX = ".pt.trace.json"

    def __init__(self, torch, steps):
        prof_mod = torch.profiler
        acts = [prof_mod.ProfilerActivity.CPU]
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_available():
            acts.append(prof_mod.ProfilerActivity.CUDA)
        self.ready = False
        self.prof = prof_mod.profile(activities=acts, on_trace_ready=self._ready,
                                     schedule=prof_mod.schedule(wait=0, warmup=1, active=steps, repeat=1))
        self.prof.start()

    def _ready(self, prof):
        self.ready = True

    def step(self):
        """A step ended; True once the recorded steps are complete."""
        self.prof.step()
        return self.ready

    def export(self, path, bound):
        self.prof.export_chrome_trace(path)

    def stop(self):
        self.prof.stop()


class Tracer:
    """The request watch and the trace of one process.  ``tick()`` at each loop iteration's end, on the
    training thread; ``profile(steps)`` makes the framework's profile (TorchProfile's interface)."""

    def __init__(self, train_job, rank, profile, directory=None, report=None, agent_dir=None, exchange=None):
        self.job = train_job
        self.exchange_of = exchange    # () -> the job's own store of proposals across nodes (StoreExchange), or None
        self.exchange = None           # ... made when a request is taken
        self.rank_of = rank            # the rank, or what says it when a request is taken
        self.rank = None if callable(rank) else rank
        self.report = report           # report(done, first_step, steps, id): to the agent (Reporter.note_trace)
        self.profile = profile
        self.dir = directory or request_dir()
        self.path = os.path.join(self.dir, train_job + ".json")
        # (the agent's requests, for its webhook: a directory of the agent's uid; statuses stay in the job's own)
        self.agent_path = os.path.join(agent_dir, train_job + ".json") if agent_dir else None
        self.node = socket.gethostname().split(".")[0] or "node"
        self.pid = os.getpid()         # (made in the process whose training thread ticks it)
        self.step_n = 0                # loop iterations ended in this process
        self.next_check = 0
        self.seen = {}                 # per request file, the last read: (inode, mtime, size)
        self.done_ids = set()
        self.req = None                # the request taken, while it runs
        self.prof = None
        self.recorded = False          # the steps asked for are recorded (written at the next boundary)
        self.first_step = None
        self.taken_at = None           # (step, monotonic ns) when the request was taken: the step rate since
        self.start_step = None         # the first step traced: the largest proposal seen (its own, its peers')
        self.proposed = self.margin = 0   # its own proposal, and the margin it took (steps)
        self.next_peek = 0
        if not _TRACERS:
            atexit.register(close_all)
        _TRACERS.append(self)

    def tick(self, now_ns=None):
        self.step_n += 1
        if self.req is None:
            now_ns = _ns() if now_ns is None else now_ns
            if now_ns < self.next_check:
                return
            self.next_check = now_ns + CHECK_EVERY_NS
            self._look(self.path, now_ns)
            if self.req is None and self.agent_path is not None:
                self._look(self.agent_path, now_ns)
            return
        try:
            if self.prof is None:
                if self.start_step is None:
                    if _wall() >= self.req["start_after"]:
                        self._propose(_ns() if now_ns is None else now_ns)
                    return
                now_ns = _ns() if now_ns is None else now_ns
                due = self.step_n + 2 >= self.start_step   # the one after this is the warm-up step
                if due or now_ns >= self.next_peek:   # (always just before it starts: a late peer's proposal)
                    self.next_peek = now_ns + PEEK_EVERY_NS
                    self.start_step = max(self.start_step, self._peers_start(self.proposed))
                    due = self.step_n + 2 >= self.start_step
                if due:
                    self.first_step = self.step_n + 2
                    self.prof = self.profile(self.req["steps"])
                    self._status("tracing")
            elif self.recorded:
                self._finish()   # a boundary later: what writing it takes is in a step after the traced ones
            elif self.prof.step():
                self.recorded = True
        except Exception as e:  # never into the training loop: the trace fails, the job goes on
            self._fail("the profiler raised %s: %s" % (type(e).__name__, str(e)[:300]))

    # -- the request ---------------------------------------------------------------------------
    def _look(self, path, now_ns):
        try:
            st = os.stat(path)
        except OSError:
            return
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key == self.seen.get(path):
            return
        self.seen[path] = key
        d = os.path.dirname(path)
        if dir_problem(d) is not None or dir_problem(os.path.dirname(d)) is not None:
            return   # a directory another user could write: its requests are not the job's user's
        raw = _read_small(path, MAX_REQUEST_BYTES + 1)
        if raw is None:
            return
        req = parse_request(raw, _wall())
        if isinstance(req, str) or req["id"] in self.done_ids:
            return   # (the CLI checks what it writes: a bad request is another writer's, and not answered)
        self.done_ids.add(req["id"])
        if callable(self.rank_of):
            self.rank = self.rank_of()   # (a rank torch.distributed says is known only once it is initialised)
        if req["ranks"] is not None and self.rank not in req["ranks"]:
            return
        if req["output"] is None:   # the agent's request: the job's own default, made here
            req["output"] = default_output(self.dir)
            try:
                os.makedirs(os.path.dirname(req["output"]), 0o700, exist_ok=True)
                os.mkdir(req["output"], 0o700)
            except FileExistsError:
                pass
            except OSError:
                pass   # (output_problem says why)
        self.req = req
        self.taken_at, self.start_step, self.first_step, self.next_peek = (self.step_n, now_ns), None, None, 0
        if self.exchange is None and self.exchange_of is not None:
            try:
                self.exchange = self.exchange_of()
            except Exception:
                self.exchange_of = None   # (this node's statuses still agree)
        why = output_problem(req["output"])
        if why:
            self._fail(why)
        else:
            self._status("accepted")

    # -- the first step, agreed with the request's other processes on this node ----------------------
    def _propose(self, now_ns):
        """At the first iteration end at or after start_after: propose a first step START_MARGIN_S of this
        process's steps (their rate since it took the request) ahead, at least MIN_MARGIN_STEPS, in the status."""
        step0, ns0 = self.taken_at or (self.step_n, now_ns)
        rate = (self.step_n - step0) / max(now_ns - ns0, 1) * 1e9   # steps a second
        self.margin = min(MAX_MARGIN_STEPS, max(MIN_MARGIN_STEPS, int(rate * START_MARGIN_S + 0.999)))
        self.proposed = self.step_n + 2 + self.margin
        self.start_step = max(self.proposed, self._peers_start(self.proposed, offer=True))
        self.next_peek = now_ns + PEEK_EVERY_NS
        self._status("starting", start_step=self.start_step)

    def _peers_start(self, own, offer=False):
        """The largest first step the request's other processes on this node proposed or started at, up to one
        margin past this process's own proposal ``own`` (0: none).  A process further ahead is not in lockstep
        with this one (another job's process, or one that started later): waiting for it would not make them
        trace the same steps, and the CLI says they did not.  Their statuses are in this directory, which only
        this uid may write (a bad one is skipped).  Where the job has a store every rank reaches (``exchange``:
        its ranks on other nodes), the largest proposal there too; ``offer``: this process's is put there first."""
        limit = own + self.margin
        best = 0
        ex = self.exchange
        if ex is not None:
            try:
                v = ex.offer(self.req["id"], own) if offer else ex.peek(self.req["id"])
            except Exception:
                self.exchange = v = None   # (a store that fails is not asked again: this node's statuses agree)
            if type(v) is int and v <= limit:
                best = v
        prefix = "%s.%s." % (self.job, self.req["id"])
        mine = ".pid%d.status.json" % self.pid
        try:
            names = os.listdir(self.dir)
        except OSError:
            return 0
        for name in names:
            if not name.startswith(prefix) or not name.endswith(".status.json") or name.endswith(mine):
                continue
            raw = _read_small(os.path.join(self.dir, name), MAX_STATUS_BYTES + 1)
            try:
                rec = json.loads(raw.decode("utf-8")) if raw is not None and len(raw) <= MAX_STATUS_BYTES else None
            except (ValueError, UnicodeDecodeError):
                continue
            if not isinstance(rec, dict) or rec.get("id") != self.req["id"]:
                continue
            for key in ("start_step", "first_step"):
                v = rec.get(key)
                if type(v) is int and best < v <= limit:
                    best = v
        return best

    # -- the trace ------------------------------------------------------------------------------
    def _trace_path(self, suffix):
        """``<output>/<job>.<id>.<node>.rank<R>`` and ``suffix`` (the profile's: ``.pt.trace.json`` for PyTorch)."""
        rank = "rank%d" % self.rank if self.rank is not None else "pid%d" % os.getpid()
        return os.path.join(self.req["output"], "%s.%s.%s.%s%s" % (self.job, self.req["id"], self.node, rank, suffix))

    def _finish(self):
        prof, self.prof, self.recorded = self.prof, None, False
        suffix = getattr(prof, "SUFFIX", TorchProfile.SUFFIX)
        path = self._trace_path(suffix)
        stem = path[:-len(suffix)]
        kept = {}
        try:
            prof.stop()
            why = output_problem(self.req["output"])
            if why:
                return self._fail(why)
            tmp = "%s.%d.tmp" % (path, os.getpid())
            bound = self.req["max_bytes"]
            # the trace, and files the profile wrote besides it (TensorFlow's XSpace), kept as <stem><suffix>
            extra = prof.export(tmp, bound) or {}
            os.chmod(tmp, 0o600)
            size = os.stat(tmp).st_size + sum(os.stat(f).st_size for f in extra.values())
            if size > bound:   # removed, not kept: a bound on what a request leaves on the job's disk
                os.unlink(tmp)
                return self._fail("the trace is %d bytes, over the request's bound of %d (trace fewer steps, or "
                                  "give a larger --max-bytes)" % (size, bound))
            if extra:
                import shutil   # (here: every training process imports this module at its first step)
            for sfx, f in sorted(extra.items()):
                kept[sfx] = stem + sfx
                shutil.move(f, kept[sfx])
                os.chmod(kept[sfx], 0o600)
            os.replace(tmp, path)
        except Exception as e:
            return self._fail("writing the trace failed: %s: %s" % (type(e).__name__, str(e)[:300]))
        finally:
            _close(prof)
        self._status("done", trace=path, **({"raw": sorted(kept.values())} if kept else {}))
        self._report(True)
        self.req = self.start_step = None

    def close(self):
        """The process ends with the request still running (the job's last step came before the traced ones, or
        during them): steps all recorded are written as at the next boundary; otherwise the status says
        ``failed``, with the step the process ended at (before it, a CLI waited for its timeout, two minutes by
        default, for a process that was gone).  Only in the process that took the request (a forked child's
        copy is not its)."""
        if self.req is None or os.getpid() != self.pid:
            return
        if self.recorded:
            return self._finish()
        if self.prof is None:
            at = ("at step %d" % self.start_step) if self.start_step is not None else "not yet agreed"
            why = "the process ended after step %d, before its first traced step (%s)" % (self.step_n, at)
        else:
            why = ("the process ended after step %d, during its trace (from step %d): the steps recorded are "
                   "not kept" % (self.step_n, self.first_step))
        self._fail(why)

    def _fail(self, why):
        prof, self.prof, self.recorded = self.prof, None, False
        if prof is not None:
            try:
                prof.stop()
            except Exception:
                pass
            _close(prof)
        self._status("failed", reason=why)
        self._report(False)
        self.req = self.start_step = None

    def _report(self, done):
        if self.report is not None:
            try:
                self.report(done, self.first_step or 0, self.req["steps"], self.req["id"])
            except Exception:
                pass   # the agent's figures only

    def _status(self, state, **extra):
        req = self.req
        rec = {"id": req["id"], "state": state, "train_job": self.job, "node": self.node, "pid": self.pid,
               "rank": self.rank, "steps": req["steps"], "first_step": self.first_step,
               "start_step": self.start_step, "time": _wall()}
        rec.update(extra)
        name = "%s.%s.%s.pid%d.status.json" % (self.job, req["id"], self.node, self.pid)
        try:
            _write_private(os.path.join(self.dir, name), json.dumps(rec).encode())
        except OSError:
            pass   # the request directory went away: the CLI says the rank never answered
