"""Phase client: tell the teye agent what the training loop is doing (standard library only, Python 3.8+).

    from teye_client import Reporter          # (from workloads.phases import Reporter works too)
    rep = Reporter(train_job="resnet50-bs64")   # socket from TEYE_PHASE_SOCKET or the default
    with rep.phase("data_wait"):
        batch = next(it)
    with rep.phase("compute"):
        train_step(batch)
    rep.step(samples=64)

Records are buffered and sent to the agent (docs/phases.md: on a connection of the process's own, or, to an
agent without one, as datagrams to its Unix datagram socket) at most
once per ``flush_ms`` (default 100 ms), when ``max_batch`` records are buffered, and on exit.  The loop
sends its own: the first record it adds once the oldest buffered one is ``flush_ms`` old flushes.  A
background thread sends what waits where the loop does not: ``flush_ms`` after the oldest record, unless
the loop added one within the last ``flush_ms`` (it records faster than it flushes, so its next record
flushes), then ``BACKSTOP_NS`` (1 s) after it; so beside a fast loop the thread wakes a few times a second,
not twice a flush (each wake-up takes the GIL from the training thread).  So a loop of 1 ms steps sends 10
datagrams a second, not 1000, and the agent's view lags at most one flush while the loop records, and at most
a second once it stops.
``flush_ms=0`` sends every record at once.  The thread starts with the first record that
has to wait.

Steps shorter than the agent can resolve are summed (protocol version 2, docs/phases.md): a step that
lasts at least ``RESOLUTION_NS`` (10 ms), or has a phase that long, goes as its intervals, as always; a
shorter one joins a *window* (first start to last end at most ``RESOLUTION_NS``) sent as one sum record:
its steps, samples, step time, each phase's time (as reported and inside the steps) and the steps per
``STEP_BUCKETS`` bucket.  A slow step, a window that would grow past the resolution, a flush, an exit and
``close()`` close the window; a forked child starts without it.  Phases are held until the step that
closes them (a flush sends them as intervals, and their step then too), so a process sends at most about
1 / RESOLUTION_NS + 1000 / flush_ms records a second beside its slow steps, whatever its step rate.

The reporter never blocks and never raises into the training loop: with no agent, a bad
path, a full socket buffer or bad arguments it drops the records and counts them
(``dropped``, ``dropped_messages``), and the count travels with the next datagram that gets
through.  A full queue (another job floods the agent) is not a loss where it can wait without
blocking the loop: the background flush thread, ``close()`` and the exit flush wait up to
``FULL_WAIT_NS`` (200 ms) for room; records the loop's own flush could not send, and those the thread
could not send in its wait, go back into the buffer for the thread to try again a flush interval later, for
as long as the buffer stays within two batches (a flood that outlasts that loses the oldest records, counted).
Only ``close()`` and the exit flush drop what found no room in their wait.  Exceptions raised inside ``with rep.phase(...)`` propagate unchanged (the phase is
still recorded).  A forked child starts with an empty buffer and no socket or thread.
"""
from __future__ import annotations

import atexit
import bisect
import os
import re
import select
import socket
import sys
import tempfile
import threading
import time
import weakref
from json.encoder import encode_basestring_ascii as _json_str

__all__ = ["Reporter", "PHASES", "default_socket_path", "socket_choice"]

PHASES = ("data_wait", "compute", "host", "communication", "checkpoint", "eval", "compile")
VERSION = 2                  # the protocol version of a datagram with sum records (1 without: any agent takes it)
RESOLUTION_NS = 10_000_000   # = agent.phases.protocol.RESOLUTION_NS: steps shorter than this are summed
# the parts of a step's compute a datagram's "parts" carries, in this order (= agent.phases.protocol.PARTS)
PARTS = ("forward", "backward", "optimizer", "h2d_copy")
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)   # = the agent's
_N_BUCKETS = len(STEP_BUCKETS) + 1
_BAD_CHARS = re.compile(r"[^A-Za-z0-9_.:@+=-]")
_RESOLVE_EVERY_NS = 5 * 10**9
FULL_WAIT_NS = 200 * 10**6   # off the training thread, how long a datagram waits for room in a full agent queue
# While the loop sends its own records (it flushes once they are flush_ms old, at its next record), the flush
# thread waits this long after the oldest record before it looks: it is the backstop of a loop that stopped
# recording.  Each wake-up of the thread takes the GIL from the training thread; on a loaded machine giving it
# back can cost the training thread a time slice (benchmarks/loaded_cost.py, issue 47).
BACKSTOP_NS = 10**9
EXIT_LOCK_S = 0.5            # at os._exit, how long the flush waits for a lock another thread holds
# The agent listens for connections at its socket's path + SEQ_SUFFIX (= agent.phases.receiver.SEQ_SUFFIX): a
# connection is a queue of this process's own, where the datagram socket's is every sender's (a flood that
# keeps that one full makes everyone's datagrams find it full).  An agent without it (older, or a path too
# long) gets datagrams; one that refuses the connection (its limits) too, for SEQ_RETRY_NS.
SEQ_SUFFIX = ".seq"
SEQ_RETRY_NS = 30 * 10**9
_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)   # EPIPE, never SIGPIPE (Linux raises none for SEQPACKET: kept for safety)
_STALE = (FileNotFoundError, ConnectionError)     # (ConnectionRefused/Reset, BrokenPipe: an agent gone or restarted)
_LIVE = weakref.WeakSet()    # the process's reporters (flush_all at os._exit)
_monotonic_ns = time.monotonic_ns
QUOTED = {p: _json_str(p) for p in PHASES}  # phase name -> its JSON string


def _candidates():
    out = ["/run/teye/phases.sock"]
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        out.append(os.path.join(xdg, "teye", "phases.sock"))
    out.append(os.path.join(tempfile.gettempdir(), f"teye-{os.getuid()}", "phases.sock"))
    return out


# Who may own the directory of a default socket path: the job's own uid, root, and the agent's documented
# uids (the systemd unit's user ``teye``, the Kubernetes DaemonSet's 65210, a site's own in TEYE_AGENT_UID).
AGENT_USER = "teye"
KUBERNETES_AGENT_UID = 65210
_said = set()                # refusals already said on stderr (TEYE_DEBUG=1), once per process


def _trusted_owner(uid: int) -> bool:
    if uid in (0, os.geteuid(), os.getuid(), KUBERNETES_AGENT_UID):
        return True
    extra = os.environ.get("TEYE_AGENT_UID", "").strip()
    if extra.isdigit() and int(extra) == uid:
        return True
    try:
        import pwd   # looked up only for an owner not known above (NSS may be slow)
        return pwd.getpwuid(uid).pw_name == AGENT_USER
    except (ImportError, KeyError):
        return False


def dir_problem(d: str):
    """Why the directory ``d`` of a default socket path is not to be trusted with the job's datagrams, or None.

    Trusted: a directory owned by the job's uid, root or the agent's uid (:func:`_trusted_owner`) that neither
    group nor others may write, as the agent requires of its own (docs/phases.md).  A symbolic link is followed
    only when the link itself belongs to root or the job's uid (only they can have placed it: in a sticky
    /tmp no one else can replace it) and where it leads passes the same checks."""
    try:
        st = os.lstat(d)
        if st.st_mode & 0o170000 == 0o120000:          # S_IFLNK
            if st.st_uid not in (0, os.geteuid(), os.getuid()):
                return "it is a symbolic link made by uid %d" % st.st_uid
            st = os.stat(d)
    except OSError as e:
        return "it cannot be checked (%s)" % (e.strerror or e)
    if st.st_mode & 0o170000 != 0o040000:              # S_IFDIR
        return "it is not a directory"
    if not _trusted_owner(st.st_uid):
        return "it is owned by uid %d, not this job's uid %d, root or the agent's" % (st.st_uid, os.geteuid())
    if st.st_mode & 0o022:
        return "group or others may write to it (mode %04o)" % (st.st_mode & 0o7777)
    return None


def socket_choice():
    """(path, refusal): TEYE_PHASE_SOCKET as given; else the first default location that exists in a trusted
    directory (:func:`dir_problem`); else, where one exists only in an untrusted directory, that path and why
    (nothing is sent there: "the directory D is not trusted: ..."); else the first default and None."""
    env = os.environ.get("TEYE_PHASE_SOCKET")
    if env:
        return env, None
    cands = _candidates()
    refused = None
    for p in cands:
        if os.path.exists(p):
            d = os.path.dirname(p)
            why = dir_problem(d)
            if why is None:
                return p, None
            if refused is None:
                refused = (p, "the directory %s is not trusted: %s" % (d, why))
    return refused or (cands[0], None)


def default_socket_path() -> str:
    """TEYE_PHASE_SOCKET, else the first default location that exists in a trusted directory (else the first
    default: a socket in a directory another user controls is never returned; :func:`socket_choice` says why)."""
    path, why = socket_choice()
    return _candidates()[0] if why else path


def _say_refused(path: str, why: str) -> None:
    if os.environ.get("TEYE_DEBUG") == "1" and (path, why) not in _said:
        _said.add((path, why))
        try:
            sys.stderr.write("teye: not sending phases to %s: %s (TEYE_PHASE_SOCKET=%s sends there anyway)\n"
                             % (path, why, path))
        except (OSError, ValueError):
            pass


# Where a launcher says which rank a process is: (rank variable, size variable), first match wins.
RANK_ENV = (("RANK", "WORLD_SIZE"),                               # torchrun, torch.distributed.launch
            ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),     # mpirun (Open MPI), horovodrun
            ("SLURM_PROCID", "SLURM_NTASKS"))                     # srun
MAX_RANK = 1 << 20


def rank_from_env(environ=None):
    """(rank, world, why): the process's rank in a data-parallel job from its launcher's variables
    (RANK_ENV), world None where the size is not set; rank None (and why, in words) where there is none
    or it makes no sense.  A job of one rank has none: it is not a data-parallel job."""
    env = os.environ if environ is None else environ
    for rank_var, size_var in RANK_ENV:
        raw = env.get(rank_var)
        if raw is None:
            if env.get(size_var) is not None and rank_var == "RANK":
                return None, None, "WORLD_SIZE is set without RANK: no rank"
            continue
        try:
            rank = int(raw.strip())
        except ValueError:
            return None, None, "%s=%r is not an integer: no rank" % (rank_var, raw[:40])
        world = None
        raw_w = env.get(size_var)
        if raw_w is not None:
            try:
                world = int(raw_w.strip())
            except ValueError:
                return None, None, "%s=%r is not an integer: no rank" % (size_var, raw_w[:40])
        if not 0 <= rank < MAX_RANK or (world is not None and not rank < world <= MAX_RANK):
            return None, None, "%s=%s, %s=%s: not a rank of the job: no rank" % (rank_var, raw, size_var, raw_w)
        if world == 1:
            return None, None, "%s=1: one rank, not a data-parallel job" % size_var
        return rank, world, "%s=%d" % (rank_var, rank) + ("" if world is None else ", %s=%d" % (size_var, world))
    if env.get("TF_CONFIG"):
        return rank_from_tf_config(env["TF_CONFIG"])
    return None, None, "no launcher rank variable set"


def rank_from_tf_config(raw):
    """(rank, world, why) of a TensorFlow multi-worker task (MultiWorkerMirroredStrategy's TF_CONFIG): the
    chief first, then the workers by index; a parameter server or evaluator has none."""
    import json
    try:
        cfg = json.loads(raw)
        cluster, task = cfg.get("cluster") or {}, cfg.get("task") or {}
        chiefs, workers = len(cluster.get("chief") or ()), len(cluster.get("worker") or ())
        kind, index = task.get("type"), int(task.get("index", 0))
    except (ValueError, TypeError, AttributeError):
        return None, None, "TF_CONFIG is not the JSON TensorFlow reads: no rank"
    world = chiefs + workers
    if kind == "chief":
        rank = index
    elif kind == "worker":
        rank = chiefs + index
    else:
        return None, None, "TF_CONFIG task type %r: not a training rank" % (str(kind)[:20],)
    if world == 1:
        return None, None, "TF_CONFIG: one task, not a data-parallel job"
    if not 0 <= rank < world <= MAX_RANK:
        return None, None, "TF_CONFIG task %s %d: not a rank of its cluster (%d tasks)" % (kind, index, world)
    return rank, world, "TF_CONFIG %s %d of %d tasks" % (kind, index, world)


def rank_from_torch():
    """(rank, world) from torch.distributed once the job has initialised its process group, else None.
    Never imports torch: a process that has not imported it has no process group."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        rank, world = int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # noqa: BLE001 (a half-torn-down group, an unusual build: no rank, never an error in the job)
        return None
    return (rank, world) if 0 <= rank < world <= MAX_RANK and world > 1 else None


def _job_name(name) -> str:
    """A valid protocol job name from anything (never raises)."""
    if not name:
        name = os.environ.get("TEYE_TRAIN_JOB") or os.path.splitext(os.path.basename(sys.argv[0] or ""))[0] or "job"
    name = _BAD_CHARS.sub("_", str(name))[:128]
    if not name[:1].isalnum() or not name[:1].isascii():
        name = ("j" + name)[:128]
    return name


class _Phase:
    __slots__ = ("_rep", "_name", "_start")

    def __init__(self, rep: "Reporter", name: str):
        self._rep = rep
        self._name = name
        self._start = 0

    def __enter__(self):
        self._start = _monotonic_ns()
        return self

    def __exit__(self, exc_type, exc, tb):
        self._rep.record_phase(self._name, self._start, _monotonic_ns())
        return False  # never swallow the training loop's exceptions


class Reporter:
    """Buffers phase and step records and sends them to the teye agent; never blocks, never raises."""

    def __init__(self, train_job: str = None, socket_path: str = None, *, flush_ms: float = 100.0,
                 max_batch: int = 512, source: str = None, max_delay_s: float = None, rank: int = None,
                 world_size: int = None, sum_steps: bool = None):
        """``source`` (optional): where the phases come from, sent once per connection (``src``);
        ``rank``/``world_size``: the process's rank in a data-parallel job and the ranks in it (default:
        from the launcher's variables, RANK_ENV, else torch.distributed once initialised), sent once per
        connection; ``max_delay_s``: the former name of ``flush_ms`` (in seconds), still accepted;
        ``sum_steps=False`` (default: True unless ``TEYE_SUM_STEPS=0`` in the environment, which reaches the
        zero-code instrumentors' reporter too): send every step as its intervals, however short (version 1
        only, as before issue 38: a process stepping thousands of times a second then sends thousands of
        records)."""
        self.train_job = _job_name(train_job)
        self._explicit = socket_path or None
        self.refused = None         # why nothing is sent: the default socket's directory is not trusted
        if socket_path:
            self.socket_path = socket_path
        else:
            self.socket_path, self.refused = socket_choice()
        if max_delay_s is not None:
            flush_ms = max_delay_s * 1000.0
        self.flush_ms = max(0.0, float(flush_ms))
        self._flush_ns = int(self.flush_ms * 1e6)
        self.max_batch = max(1, int(max_batch))
        self._max_items = 3 * self.max_batch  # the buffers are flat: 3 items per record
        self.source = source
        self._src_due = source is not None  # send src in the next datagram (the first after each connect)
        self.rank = self.world_size = None
        self.rank_why = ""          # where the rank came from, or why there is none
        if rank is not None:
            try:
                r, w = int(rank), (None if world_size is None else int(world_size))
                ok = 0 <= r < MAX_RANK and (w is None or r < w <= MAX_RANK)
            except (TypeError, ValueError, OverflowError):
                ok = False
            if ok:
                self.rank, self.world_size, self.rank_why = r, w, "given"
            else:
                self.rank_why = "rank=%r, world_size=%r: not a rank of the job: no rank" % (rank, world_size)
        else:
            self.rank, self.world_size, self.rank_why = rank_from_env()
        self._ask_torch = self.rank is None and rank is None  # look for a process group at each flush until one
        self._src_due = source is not None or self.rank is not None
        self._cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        self._cfg_frag = None       # the process's configuration as sent (teye_client._config), and its version
        self._cfg_sent = 0
        self._phases = []           # flat: JSON-quoted name, start_ns, end_ns, ... (no tuple per record)
        self._steps = []            # flat: start_ns, end_ns, samples, ...
        self._held = []             # flat as _phases: the phases of the step not yet closed (see _close_step)
        self._held_sent = False     # a flush sent some of the open step's phases: that step goes as intervals
        self._sums = []             # closed windows, each its JSON array
        self._parts = None          # the buffered steps' parts: ns of PARTS (record_step), or None
        self._mem = None            # the latest device memory (note_memory): [allocated, reserved, peak] bytes
        self._trace = None          # a trace finished on request (note_trace), sent with the next datagram
        self._sum_records = 0       # the phase and step records the closed windows stand for
        self._win = None            # the open window: _Window
        if sum_steps is None:
            sum_steps = os.environ.get("TEYE_SUM_STEPS", "1").strip() not in ("0", "false", "no", "off")
        self._sum_steps = bool(sum_steps)
        self._oldest_ns = 0         # when the oldest buffered record was added (CLOCK_MONOTONIC ns)
        self._step_start = None     # where the next step starts: the previous step's end ...
        self._open_start = None     # ... or, before the first step, the earliest phase since (never the buffer)
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._wake = threading.Event()    # set while the buffer holds records (the thread then sleeps on _kick)
        self._kick = threading.Event()    # the thread's turn at once (records to retry, a flush it must make)
        self._last_add_ns = 0             # when the loop last added a record (see BACKSTOP_NS)
        self._thread = None
        self._sock = None
        self._seq_after_ns = 0      # a connection is tried (not datagrams) from then on
        self._resolved_ns = _monotonic_ns()
        self._pid = os.getpid()
        self.sent = 0               # datagrams sent
        self.sent_records = 0
        self.dropped = 0            # records dropped (phases + steps)
        self.dropped_messages = 0   # datagrams that could not be sent
        self.last_error = None      # why the last datagram was dropped (an errno name), for debugging
        # one training job per process: the job's own Reporter wins over zero-code phases (teye_client.auto,
        # loaded only under `teye run` & co.; looked up, never imported here)
        auto = sys.modules.get("teye_client.auto")
        if auto is not None:
            auto.session.explicit_client(self)
        ref = weakref.ref(self)
        _LIVE.add(self)
        atexit.register(_flush_ref, ref)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=lambda: _reinit_ref(ref))

    # -- recording ---------------------------------------------------------------------------
    def phase(self, name: str) -> _Phase:
        """Context manager timing one phase with CLOCK_MONOTONIC."""
        return _Phase(self, name)

    def record_phase(self, name: str, start_ns: int, end_ns: int) -> None:
        """Record an already-timed phase (CLOCK_MONOTONIC ns, e.g. from time.monotonic_ns())."""
        try:
            s = int(start_ns)
            e = int(end_ns)
            name = name if type(name) is str else str(name)
            if len(name) > 64:
                name = name[:64]
        except (TypeError, ValueError, OverflowError):
            self._count_drop(1, "bad-argument")
            return
        if e < s or s < 0:
            self._count_drop(1, "bad-interval")
            return
        if self._step_start is None and (self._open_start is None or s < self._open_start):
            self._open_start = s
        self._add(self._held, _quoted(name), s, e)

    def step(self, samples: int = 0, start_ns: int = None, end_ns: int = None) -> None:
        """Close one training step (default: from the previous step's end, or the first phase, to now)."""
        try:
            e = _monotonic_ns() if end_ns is None else int(end_ns)
            if start_ns is not None:
                s = int(start_ns)
            elif self._step_start is not None:
                s = self._step_start
            elif self._open_start is not None:  # phases already flushed still belong to this step
                s = min(self._open_start, e)
            else:
                s = e
            n = int(samples)
        except (TypeError, ValueError, OverflowError):
            self._count_drop(1, "bad-argument")
            return
        self._step_start = e
        self._open_start = None
        if e < s or n < 0:
            self._count_drop(1, "bad-interval")
            return
        now = _monotonic_ns()
        with self._lock:
            if self._empty():
                self._oldest_ns = now
            self._last_add_ns = now
            self._close_step(s, e, n, None)
            due = now - self._oldest_ns >= self._flush_ns or self._items() >= self._max_items
        self._after_add(due)

    def record_step(self, phases, start_ns: int, end_ns: int, samples: int = 0, parts=None) -> None:
        """Add a finished step and its phases in one go: ``phases`` is flat, (quoted name, start_ns, end_ns)
        after one another, names JSON-quoted (``QUOTED``), times valid ints.  ``parts``: the step's parts
        (``PARTS``: ns of forward, backward, optimizer, h2d_copy inside its compute), summed into the datagram
        that carries the step (so that the agent finds them beside their compute).

        The fast path of instrumentation that timed everything itself (teye_client.auto): one lock,
        no per-record checks beyond what the agent checks anyway, no object per record.
        """
        self._step_start = end_ns
        self._open_start = None
        with self._lock:
            if self._empty():
                self._oldest_ns = end_ns
            self._last_add_ns = end_ns
            self._close_step(start_ns, end_ns, samples, phases)
            if parts is not None:
                p = self._parts
                if p is None:
                    self._parts = list(parts)
                else:
                    p[0] += parts[0]
                    p[1] += parts[1]
                    p[2] += parts[2]
                    p[3] += parts[3]
            due = end_ns - self._oldest_ns >= self._flush_ns or self._items() >= self._max_items
        self._after_add(due)

    def note_memory(self, allocated: int, reserved: int, peak: int) -> None:
        """The process's device memory at a step's end (bytes): allocated and reserved then, and the peak
        allocated during the step; sent with the next datagram (the latest two, the highest peak)."""
        with self._lock:
            m = self._mem
            if m is None or peak > m[2]:
                self._mem = [allocated, reserved, peak]
            else:
                m[0] = allocated
                m[1] = reserved

    def note_trace(self, done: bool, first_step: int, steps: int, trace_id: str) -> None:
        """A trace on request (`teye trace`) finished, written or failed: sent with the next datagram."""
        with self._lock:
            self._trace = '[%d,%d,%d,%s]' % (1 if done else 2, first_step, steps, _json_str(trace_id))

    def _add(self, buf, a, b, c) -> None:
        now = _monotonic_ns()
        with self._lock:
            if self._empty():
                self._oldest_ns = now
            self._last_add_ns = now
            buf.append(a)
            buf.append(b)
            buf.append(c)
            due = now - self._oldest_ns >= self._flush_ns or self._items() >= self._max_items
        self._after_add(due)

    def _after_add(self, due: bool) -> None:
        if due:
            self.flush()
        elif self._thread is None:
            self._start_thread()
        elif not self._wake.is_set():
            self._wake.set()

    # -- summing fast steps (under self._lock) -----------------------------------------------
    def _empty(self) -> bool:
        return not (self._phases or self._steps or self._held or self._sums or self._win is not None)

    def _items(self) -> int:
        """The buffer's size in flat items, 3 per record as it will be sent: a window of one step as that
        step's records, a window of more as one."""
        w = self._win
        n = len(self._phases) + len(self._steps) + len(self._held) + 3 * len(self._sums)
        return n if w is None else n + (3 * w.records if w.steps == 1 else 3)

    def _close_step(self, s: int, e: int, n: int, given) -> None:
        """A step [s, e] of n samples, with the held phases and ``given`` (flat, or None): summed into the open
        window when it and all its phases are shorter than RESOLUTION_NS and the window stays within it,
        else sent as intervals (closing the window)."""
        held = self._held
        phases = held if given is None else (held + list(given) if held else given)
        lo, hi = s, e
        fast = e - s < RESOLUTION_NS and not self._held_sent and self._sum_steps
        if fast:
            for k in range(1, len(phases), 3):
                a = phases[k]
                b = phases[k + 1]
                if a < lo:
                    lo = a
                if b > hi:
                    hi = b
            fast = hi - lo < RESOLUTION_NS
        if fast:
            w = self._win
            if w is not None and (max(hi, w.end) - min(lo, w.start) > RESOLUTION_NS or len(w.phases) >= 32):
                self._close_window()
                w = None
            if w is None:
                w = self._win = _Window(lo, hi)
            else:
                if lo < w.start:
                    w.start = lo
                if hi > w.end:
                    w.end = hi
            w.add(s, e, n, phases)
        else:
            if self._win is not None:
                self._close_window()
            self._phases.extend(phases)
            self._steps.append(s)
            self._steps.append(e)
            self._steps.append(n)
        if held:
            self._held = []
        self._held_sent = False

    def _close_window(self) -> None:
        """Send the open window: as a sum record, or as its step's intervals where it holds one step (a job
        stepping slower than once per RESOLUTION_NS never has two in a window: its intervals stay exact)."""
        w, self._win = self._win, None
        if w.steps == 1:
            s, e, n, phases = w.first
            self._phases.extend(phases)
            self._steps.append(s)
            self._steps.append(e)
            self._steps.append(n)
            return
        self._sums.append(w.encode())
        self._sum_records += w.records

    # -- the flusher thread ------------------------------------------------------------------
    def _start_thread(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            t = self._thread = threading.Thread(target=_flusher, args=(weakref.ref(self), self._wake, self._kick),
                                                name="teye-phase-flush", daemon=True)
        self._wake.set()
        try:
            t.start()
        except RuntimeError:  # interpreter shutting down: the atexit flush sends what is left
            pass

    def _due_in_ns(self):
        """ns until the buffer is due for the flush thread (<= 0: now), or None when it is empty: flush_ms after
        its oldest record; BACKSTOP_NS after it where the loop added a record within the last flush_ms (it
        records faster than it flushes, so its next record flushes: the thread would only take the GIL)."""
        with self._lock:
            if self._empty():
                return None
            now = _monotonic_ns()
            due = self._oldest_ns + self._flush_ns
            if due <= now and now - self._last_add_ns < self._flush_ns:
                due = self._oldest_ns + max(self._flush_ns, BACKSTOP_NS)
            return due - now

    # -- sending -----------------------------------------------------------------------------
    def flush(self, _may_wait: bool = False, _retry: bool = False) -> None:
        """Send what is buffered now (one datagram)."""
        # One flush at a time: the exit's flush waits for the thread's send in progress, which would
        # otherwise die with the interpreter, its records taken from the buffer and never sent.
        if _may_wait:
            with self._flush_lock:
                self._flush(True, _retry)
            return
        # The training loop's flush never waits for the lock: the thread may be waiting for room in a
        # full agent queue (up to FULL_WAIT_NS); it sends these records next.
        if not self._flush_lock.acquire(blocking=False):
            self._wake.set()
            self._kick.set()
            return
        try:
            self._flush(False)
        finally:
            self._flush_lock.release()

    def _flush(self, may_wait: bool = False, again: bool = False) -> None:
        """``again`` (the flush thread): records that found no room in the wait go back into the buffer, as
        the loop's own do, for the thread's next try."""
        with self._lock:
            if self._win is not None:
                self._close_window()
            if self._held:   # the open step's phases go now, as intervals, and so will its step
                self._phases.extend(self._held)
                self._held = []
                self._held_sent = True
            phases, steps, sums = self._phases, self._steps, self._sums
            if not phases and not steps and not sums:
                return
            self._phases, self._steps, self._sums = [], [], []
            parts, mem = self._parts, self._mem
            self._parts = self._mem = None
            trace, self._trace = self._trace, None
            n_sums, self._sum_records = self._sum_records, 0
            dropped = self.dropped
            if self._ask_torch:
                self._rank_from_torch()
            cfg_v = self._config_due()
            src = self.source if self._src_due else None
            ident = self._ident() if self._src_due else None
        n = (len(phases) + len(steps)) // 3 + n_sums
        if self.refused is not None:   # a socket in a directory another user controls: nothing goes there
            _say_refused(self.socket_path, self.refused)
            self._count_drop(n, "untrusted_dir", messages=1)
            self._maybe_resolve()
            return
        try:
            data = _encode_flat(self.train_job, phases, steps, self._cvd, dropped, src, ident, sums, parts, mem,
                                trace)
        except (TypeError, ValueError):
            self._count_drop(n, "encode")
            return
        # The socket is connected once (a send then skips the kernel's path lookup); an agent that
        # restarted refuses the old connection, so connect again to its new socket and retry once.
        for retry in (False, True):
            try:
                sock = self._sock
                if sock is None:
                    sock = self._sock = self._connect()
                    if ident is None and (self.source is not None or self.rank is not None or self._cfg_frag):
                        # a new connection: maybe a new agent, that has to learn who we are
                        src, ident = self.source, self._ident()
                        data = _encode_flat(self.train_job, phases, steps, self._cvd, dropped, src, ident, sums,
                                            parts, mem, trace)
                _send(sock, data, may_wait)
            except _STALE as e:
                stale, self._sock = self._sock, None
                if stale is not None:
                    if stale.type == socket.SOCK_SEQPACKET:   # refused, or the agent went: datagrams for a while
                        self._seq_after_ns = _monotonic_ns() + SEQ_RETRY_NS
                    stale.close()
                    if not retry:
                        continue
                self._count_drop(n, type(e).__name__, messages=1)
                self._maybe_resolve()
            except OSError as e:  # BlockingIOError (queue full), PermissionError, EMSGSIZE, bad path ...
                if isinstance(e, BlockingIOError) and (again or not may_wait) and self._requeue(
                        phases, steps, sums, n_sums, parts, mem, kick=not may_wait):
                    with self._lock:
                        if self._trace is None:
                            self._trace = trace
                    return   # the training loop's own flush never waits: the flush thread retries, waiting
                self._count_drop(n, type(e).__name__, messages=1)
            else:
                self.sent += 1
                self.sent_records += n
                if src is not None or ident is not None:
                    self._src_due = False
                    if cfg_v and self._cfg_frag is not None:
                        self._cfg_sent = cfg_v
            return

    def _connect(self) -> socket.socket:
        """A connection to the agent (a queue of this process's own), else its datagram socket: connected, non-
        blocking; raises what connecting to the datagram socket raised."""
        if _monotonic_ns() >= self._seq_after_ns:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                sock.setblocking(False)
                sock.connect(self.socket_path + SEQ_SUFFIX)
                return sock
            except OSError:   # no such socket (an older agent), refused, a full backlog: datagrams
                sock.close()
                self._seq_after_ns = _monotonic_ns() + SEQ_RETRY_NS
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        return sock

    def _ident(self):
        """The rank part of the datagram that says who we are, and the process's configuration (None: neither)."""
        cfg = self._cfg_frag
        if self.rank is None:
            return cfg
        return (',"rank":%d' % self.rank + ("" if self.world_size is None else ',"world":%d' % self.world_size)
                + (cfg or ""))

    def _config_due(self) -> int:
        """The version of the process's configuration (``teye_client._config``, where the zero-code hook loaded
        it; this module never imports it) now; one the agent has not had yet makes the next datagram say who
        we are, with it (sent with the identity: once per connection and whenever it changes)."""
        mod = sys.modules.get("teye_client._config")
        if mod is None:
            return 0
        v, frag = mod.payload()   # (never raises: teye_client._config guards what it reads of the job)
        self._cfg_frag = frag
        if frag is not None and v != self._cfg_sent:
            self._src_due = True
        return v

    def _rank_from_torch(self) -> None:
        got = rank_from_torch()
        if got is not None:
            self.rank, self.world_size = got
            self.rank_why = "torch.distributed.get_rank()"
            self._ask_torch = False
            self._src_due = True  # say it in the next datagram

    def _requeue(self, phases: list, steps: list, sums: list = (), n_sums: int = 0, parts=None, mem=None,
                 kick: bool = False) -> bool:
        """Put records the agent's full queue refused back in front of the buffer, for the flush thread to
        send (it may wait for room: at once where ``kick``, the loop's own flush refused, else flush_ms on); False
        (the caller drops them) where the buffer would exceed two batches."""
        with self._lock:
            if len(phases) + len(steps) + 3 * len(sums) + self._items() > 2 * self._max_items:
                return False
            if parts is not None:   # they go with their steps' compute
                p = self._parts
                self._parts = parts if p is None else [x + y for x, y in zip(parts, p)]
            if mem is not None and self._mem is None:
                self._mem = mem
            self._phases = phases + self._phases
            self._steps = steps + self._steps
            self._sums = list(sums) + self._sums
            self._sum_records += n_sums
            self._oldest_ns = _monotonic_ns()   # due again in flush_ms: the thread's turn, not the loop's
        if self._thread is None:
            self._start_thread()
        else:
            self._wake.set()
            if kick:
                self._kick.set()
        return True

    def _maybe_resolve(self) -> None:
        """No agent at the path: look for it again now and then (it may start later)."""
        if self._explicit:
            return
        now = _monotonic_ns()
        if now - self._resolved_ns >= _RESOLVE_EVERY_NS:
            self._resolved_ns = now
            self.socket_path, self.refused = socket_choice()

    def _count_drop(self, records: int, why: str, messages: int = 0) -> None:
        self.dropped += records
        self.dropped_messages += messages
        self.last_error = why
        if messages and (self.source is not None or self.rank is not None):
            self._src_due = True  # the agent may not have seen it (or restarted): say it again

    def _exit_flush(self) -> None:
        """Send what is buffered, from a process that is leaving without its atexit hooks (os._exit): as the
        exit flush, but never stuck on a lock a thread holds (os._exit called from a signal handler that
        interrupted record_step): then the records are lost, as they were before."""
        if self._pid != os.getpid() and self._empty():
            return
        if not self._flush_lock.acquire(timeout=EXIT_LOCK_S):
            return
        try:
            if not self._lock.acquire(timeout=EXIT_LOCK_S):
                return
            self._lock.release()
            self._flush(True)
        finally:
            self._flush_lock.release()

    def close(self) -> None:
        """Send what is buffered and release the socket (the reporter stays usable: it reopens)."""
        self.flush(True)
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def __del__(self):
        # A reporter dropped with records still buffered (a loop's local, freed before exit) sends them:
        # its atexit flush holds only a weak reference.  Nothing may escape a destructor into the job's
        # output ("Exception ignored in ..."), whatever state the interpreter is in.
        try:
            if getattr(self, "_pid", None) != os.getpid():
                return  # a forked child's copy: the parent's records are the parent's to send
            if not self._empty():
                self.flush()
            sock, self._sock = self._sock, None
            if sock is not None:
                sock.close()
        except Exception:  # noqa: BLE001 (see above: a destructor must stay silent)
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class _Window:
    """Fast steps being summed: [start, end] (at most RESOLUTION_NS), steps, samples, step time, per phase
    (its JSON-quoted name) [ns as reported, ns inside the steps], steps per STEP_BUCKETS bucket."""

    __slots__ = ("start", "end", "steps", "samples", "step_ns", "phases", "hist", "records", "first")

    def __init__(self, start: int, end: int):
        self.start = start
        self.end = end
        self.steps = self.samples = self.step_ns = self.records = 0
        self.phases = {}
        self.hist = [0] * _N_BUCKETS
        self.first = None   # the first step as (s, e, n, phases): sent as intervals if no other joins it

    def add(self, s: int, e: int, n: int, phases) -> None:
        if self.first is None:
            self.first = (s, e, n, phases)
        d = e - s
        self.steps += 1
        self.samples += n
        self.step_ns += d
        self.hist[bisect.bisect_left(STEP_BUCKETS, d / 1e9)] += 1   # as the agent buckets a step
        got = self.phases
        for k in range(0, len(phases), 3):
            a = phases[k + 1]
            b = phases[k + 2]
            inside = (b if b < e else e) - (a if a > s else s)   # the phase clipped to its step
            acc = got.get(phases[k])
            if acc is None:
                got[phases[k]] = [b - a, inside if inside > 0 else 0]
            else:
                acc[0] += b - a
                if inside > 0:
                    acc[1] += inside
        self.records += 1 + len(phases) // 3

    def encode(self) -> str:
        hist = self.hist
        last = _N_BUCKETS
        while last > 1 and not hist[last - 1]:
            last -= 1
        return "[%d,%d,%d,%d,%d,[%s],[%s]]" % (
            self.start, self.end, self.steps, self.samples, self.step_ns,
            ",".join("[%s,%d,%d]" % (q, v[0], v[1]) for q, v in self.phases.items()),
            ",".join(map(str, hist[:last])))


def _flusher(ref, wake, kick) -> None:
    """The background flush: sends a buffer once it has waited flush_ms (BACKSTOP_NS while the loop flushes by
    itself), at once when kicked; sleeps while it is empty."""
    while True:
        wake.wait()
        rep = ref()
        if rep is None:
            return
        kicked = kick.is_set()
        kick.clear()
        wait = rep._due_in_ns()
        if wait is None:
            wake.clear()
            if rep._due_in_ns() is not None:  # a record came between the test and the clear
                wake.set()
            del rep
            continue
        if wait > 0 and not kicked:
            del rep
            kick.wait(wait / 1e9)
            continue
        rep.flush(True, True)   # off the training thread: may wait for room in a full agent queue, and again
        del rep


def _send(sock, data: bytes, may_wait: bool) -> None:
    """sock.send(data); where ``may_wait`` (the flush thread, close, exit: never the training loop's own
    flush) and the agent's queue is full (another job floods it), wait up to FULL_WAIT_S for room and
    retry; BlockingIOError when there was none."""
    try:
        sock.send(data, _NOSIGNAL)
        return
    except BlockingIOError:
        if not may_wait:
            raise
    deadline = _monotonic_ns() + FULL_WAIT_NS
    while True:
        left = deadline - _monotonic_ns()
        if left <= 0:
            raise BlockingIOError("the agent's queue stayed full")
        select.select((), (sock,), (), left / 1e9)   # writable: the agent's queue has room
        try:
            sock.send(data, _NOSIGNAL)
            return
        except BlockingIOError:
            continue


def _encode(job: str, phases, steps, cvd, dropped: int, src: str = None) -> bytes:
    """The datagram for [name, start_ns, end_ns] and [start_ns, end_ns, samples] records: byte for byte what
    ``json.dumps(obj, separators=(",", ":"))`` writes (tests/phases/test_wire_bytes.py checks it)."""
    flat_ph = []
    for name, a, b in phases:
        flat_ph += (_quoted(name), a, b)
    flat_st = []
    for rec in steps:
        flat_st += rec
    return _encode_flat(job, flat_ph, flat_st, cvd, dropped, src)


def _encode_flat(job: str, phases: list, steps: list, cvd, dropped: int, src: str = None, ident: str = None,
                 sums=None, parts=None, mem=None, trace=None) -> bytes:
    """The datagram from the reporter's flat buffers, with one %-format per list (no object per record):
    version 1 without sum records (any agent takes it), VERSION with them."""
    n_ph = len(phases) // 3
    n_st = len(steps) // 3
    out = ['{"v":%d,"job":%s,"phases":[' % (VERSION if sums else 1, _json_str(job)),
           ("[%s,%d,%d]," * n_ph)[:-1] % tuple(phases) if n_ph else "",
           '],"steps":[',
           ("[%d,%d,%d]," * n_st)[:-1] % tuple(steps) if n_st else "",
           "]"]
    if sums:
        out.append(',"sums":[' + ",".join(sums) + "]")
    if cvd is not None:
        out.append(',"cvd":' + _json_str(cvd))
    if dropped:
        out.append(',"dropped":%d' % dropped)
    if parts is not None:
        out.append(',"parts":[%d,%d,%d,%d]' % tuple(parts))
    if mem is not None:
        out.append(',"mem":[%d,%d,%d]' % tuple(mem))
    if trace is not None:
        out.append(',"trace":' + trace)
    if src is not None:
        out.append(',"src":' + _json_str(src))
    if ident is not None:
        out.append(ident)
    out.append("}")
    return "".join(out).encode()


def _quoted(name: str) -> str:
    """The JSON string of a phase name (cached: a loop uses a handful)."""
    q = QUOTED.get(name)
    if q is None:
        q = _json_str(name)
        if len(QUOTED) < 256:
            QUOTED[name] = q
    return q


def flush_all() -> None:
    """Flush every reporter of the process (called before os._exit by teye_client.auto; never raises)."""
    for rep in list(_LIVE):
        try:
            rep._exit_flush()
        except Exception:  # noqa: BLE001 (the process is leaving)
            pass


def _flush_ref(ref) -> None:
    rep = ref()
    if rep is not None:
        rep.close()  # close() handles every OSError itself


def _reinit_ref(ref) -> None:
    rep = ref()
    if rep is not None:  # a forked child must not inherit a lock held by another thread, nor the buffer
        rep._lock = threading.Lock()
        rep._flush_lock = threading.Lock()
        rep._phases, rep._steps = [], []
        rep._held, rep._sums, rep._sum_records, rep._win, rep._held_sent = [], [], 0, None, False  # the parent's
        rep._parts = rep._mem = None
        rep._step_start = rep._open_start = None
        rep._sock = None
        rep._wake = threading.Event()
        rep._kick = threading.Event()
        rep._thread = None

