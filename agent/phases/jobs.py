"""The job table: what the agent knows about each live training job, in bounded memory.

Jobs are keyed by the sender's kernel-supplied uid and the claimed name, ``(uid, name)``,
so a message from uid B naming a job of uid A lands in B's own job, never in A's.  The
exported ``train_job`` label is the name as sent for trusted uids (the agent's own uid
and ``phases.trusted_uids``) and ``USER/NAME`` for everyone else: another user can
neither add to nor squat on a trusted user's job name.

Memory per job is fixed: per-phase totals (8 phases), a 30-slot ring of sums over the
sliding window, a step-time histogram, at most 64 pids (each with at most 128 phases
waiting for the step that closes them, and per phase at most COVER_SPANS spans of what it reported,
against which its new intervals are merged: _Covered; as many of its windows' spans), at most ``max_pending_intervals``
intervals waiting for GPU samples, and GPU idle totals per (GPU, phase) for the GPUs the
agent samples.  At most ``max_jobs`` jobs (and ``max_jobs_per_user`` per uid) are held, live or
ended; a job silent for ``job_expiry_seconds`` expires and its series disappear.  A full table makes
room from the uid over its fair share (``_evict_for``: max-min shares, a trusted uid's first job), never
from a newcomer's first job; refusals are logged per uid (``_note_refused``).  With ``pods`` (a
PodResolver, Kubernetes), a sender in a pod keys its job by ``(uid, name, pod uid)``.

One run per run: a job whose processes have all exited (or are zombies) and that has been silent
for RUN_END_SILENCE_NS has *ended* (``_end_runs``, on the sampler's pass).  An ended run stays
exported, unchanged, until it expires (or gives way, once exported as ended for
``ended_run_keep_seconds``), but leaves the table's lookup (``_jobs``), so the next message under its name starts a new run (``_new_job``): counters from
zero, ``teye_job_info`` with the new run's pid, a new ``teye_job_start_time_seconds``.  A late datagram
of one of the ended run's own processes reopens it instead.

A process that says its rank in a data-parallel job (protocol ``rank``, once per connection) gets
per-rank sums beside the job's (``_Rank``: totals and a window, at most MAX_PIDS per job); the job counts global steps (a step counts when its first rank makes it), and the job's verdict is
its critical rank's (``agent.phases.ranks``).

Shares of step time are computed from the phase time *inside* the reported steps
(each phase's intervals clipped to the step of the same process and merged), in integer
nanoseconds, and GPU idle shares from the GPU idle time inside steps: a share can never
exceed 1, whatever the client sends.
"""
from __future__ import annotations

import dataclasses

import functools
import logging
import os
import threading
from bisect import bisect_left
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable, Deque, Dict, FrozenSet, List, Mapping, Optional, Tuple

from ..gpu.procinfo import user_name
from ..logutil import RateLimitedLog
from ..metrics import HistogramValue, histogram_value
from . import attribution, cause, jobconfig, parts, ranks
from .protocol import (ACCEPTED, FAST_EDGE_NS, MIN_STEP_NS, NO_IDENTITY, PHASES, RESOLUTION_NS, RESULTS, STEP_BUCKETS,
                       SAMPLES_UNSEEN_SOURCES, STEPS_ONLY_SOURCES, Identity, Limits,
                       Message, Rejected, Window, decode, identity_of)
from .verdict import Evidence, InputWait, Thresholds, Verdict, decide

log = logging.getLogger("teye.phases")

NP = len(PHASES)
PHASE_INDEX = {p: i for i, p in enumerate(PHASES)}
STEP = -1                       # pending-interval key of a step (phases use their index)
IN_STEP = 100                   # pending-interval keys IN_STEP + i: GPU idle inside steps, per IN_KINDS[i]
# The GPU idle the verdict weighs, inside steps: which phases each kind's (merged) time covers.
IN_KINDS = (("input", ("data_wait",)), ("communication", ("communication",)), ("host", ("host", "compute")),
            ("explained", ("data_wait", "communication", "host", "compute", "checkpoint", "eval", "compile")))
IN_KIND_INDEXES = tuple(frozenset(PHASE_INDEX[p] for p in names) for _, names in IN_KINDS)
OPEN_PER_PID = 128              # phases kept per process until the step that closes them arrives
COVER_SPANS = 16                # spans per process and phase remembered to merge new intervals with (_Covered)
WINDOWS = NP                    # a process's covers: one per phase index, then this one, its windows' spans
MAX_WAITS = 1024                # data_wait intervals per job waiting for the /proc samples that cover them
WAIT_COVER_NS = 2 * 10**9       # ... at most this long after they ended
DATA_WAIT = 0                   # PHASES.index("data_wait")
COMPILE = PHASES.index("compile")
COMPUTE = 1                     # PHASES.index("compute")
RING_SLOTS = 30
MAX_PIDS = 64
MAX_UNTRACKED = 4 * MAX_PIDS    # ranks beyond MAX_PIDS whose steps are kept out of the job's global steps
MAX_UNCLAIMED = 4096            # senders whose shed datagrams wait for a job that holds them
RUN_END_SILENCE_NS = 2 * 10**9  # a job all of whose processes exited has ended once silent this long
MAX_REFUSED_UIDS = 64           # uids named in the refused-jobs log line (the rest counted together)
REFUSED_LOG_NS = 10 * 10**9     # at most one refused-jobs log line this often
ATTRIBUTION_RESULTS = ("complete", "late", "overflow")


class _Ring:
    """Sums over a sliding window in RING_SLOTS time slots (fixed size)."""

    __slots__ = ("width", "idx", "phase", "in_step", "step_ns", "steps", "idle", "obs", "step_idle", "step_obs",
                 "kind_idle", "step_attr", "wait", "cur_b", "cur_i")

    # Times are integers (ns; GPU idle in attribution units) so that a part never sums above its whole.
    def __init__(self, window_ns: int):
        self.width = max(1, window_ns // RING_SLOTS)
        n = RING_SLOTS
        self.idx = [-1] * n
        self.phase = [[0] * NP for _ in range(n)]     # ns per phase, as reported
        self.in_step = [[0] * NP for _ in range(n)]   # ns per phase inside the reported steps
        self.step_ns = [0] * n
        self.steps = [0] * n
        self.idle = [[0] * NP for _ in range(n)]      # GPU idle overlapping each phase (summed over GPUs)
        self.obs = [[0] * NP for _ in range(n)]       # GPU observed time during each phase
        self.step_idle = [0] * n                      # GPU idle during steps
        self.step_obs = [0] * n                       # GPU observed time during steps
        self.kind_idle = [[0] * len(IN_KINDS) for _ in range(n)]  # GPU idle inside steps per IN_KINDS
        self.step_attr = [False] * n                  # whether any step was attributed to GPUs here
        # what the processes did during their data_wait (see _WaitSums)
        self.wait = [_WaitSums() for _ in range(n)]
        # the current time slot and its index, cached by the message path (slot() of the newest time
        # never resets a slot twice, and older times map to other indices)
        self.cur_b = -1
        self.cur_i: Optional[int] = None

    def slot(self, t_ns: int, now_ns: int) -> Optional[int]:
        cur = now_ns // self.width
        b = t_ns // self.width
        if b >= cur:
            b = cur
        elif b <= cur - RING_SLOTS:
            return None  # older than the window
        i = b % RING_SLOTS
        if self.idx[i] != b:
            self.idx[i] = b
            self.phase[i] = [0] * NP
            self.in_step[i] = [0] * NP
            self.idle[i] = [0] * NP
            self.obs[i] = [0] * NP
            self.kind_idle[i] = [0] * len(IN_KINDS)
            self.step_ns[i] = self.step_idle[i] = self.step_obs[i] = 0
            self.steps[i] = 0
            self.step_attr[i] = False
            self.wait[i] = _WaitSums()
        return i

    def live(self, now_ns: int):
        cur = now_ns // self.width
        return [i for i in range(RING_SLOTS) if cur - RING_SLOTS < self.idx[i] <= cur]


class _Covered:
    """The time one process already reported of one phase: sorted disjoint spans [starts[k], ends[k]), at most
    COVER_SPANS of them, and a floor before which everything counts as covered (the spans forgotten to keep
    the set bounded).  :meth:`add` returns the pieces of a new interval not covered yet and covers them, so
    that the process's counter of the phase grows by at most the wall time that passes (issue 39)."""

    __slots__ = ("starts", "ends", "floor")

    def __init__(self):
        self.starts: List[int] = []
        self.ends: List[int] = []
        self.floor = 0

    def add(self, s: int, e: int) -> List[Tuple[int, int]]:
        if s < self.floor:
            s = self.floor
        if e <= s:
            return []
        starts, ends = self.starts, self.ends
        n = len(ends)
        if not n or s >= ends[-1]:   # the usual case: after everything so far
            if n and s == ends[-1]:
                ends[-1] = e
            else:
                starts.append(s)
                ends.append(e)
                if n >= COVER_SPANS:
                    self.forget()
            return [(s, e)]
        # spans k in [i, j) touch or overlap [s, e): the new pieces are the gaps between them
        i = bisect_left(ends, s)
        new = []
        pos = s
        j = i
        while j < n and starts[j] <= e:
            if starts[j] > pos:
                new.append((pos, starts[j]))
            if ends[j] > pos:
                pos = ends[j]
            j += 1
        if pos < e:
            new.append((pos, e))
        if new:
            lo = starts[i] if i < j and starts[i] < s else s
            hi = ends[j - 1] if i < j and ends[j - 1] > e else e
            starts[i:j] = [lo]
            ends[i:j] = [hi]
            if len(ends) > COVER_SPANS:
                self.forget()
        return new

    def forget(self) -> None:
        """Forget the oldest span: what lies before its end counts as covered from now on."""
        self.floor = self.ends[0]
        del self.starts[0], self.ends[0]


class _WaitSums:
    """Sums over the data_wait intervals that /proc samples covered (one ring slot)."""

    __slots__ = ("n", "wait_ns", "cpu_s", "read_bytes", "no_io", "io_s", "io_n", "cst_s", "cst_n", "rd_s", "rd_n")

    def __init__(self):
        self.n = self.wait_ns = self.read_bytes = self.no_io = self.io_n = self.cst_n = self.rd_n = 0
        self.cpu_s = self.io_s = self.cst_s = self.rd_s = 0.0

    def add(self, wait_ns: int, u: "cause.WaitUsage") -> None:
        self.n += 1
        self.wait_ns += wait_ns
        self.cpu_s += u.cpu_s
        if u.read_bytes is None:
            self.no_io += 1
        else:
            self.read_bytes += u.read_bytes
        if u.io_stall_s is not None:
            self.io_s += u.io_stall_s
            self.io_n += 1
        if u.cpu_stall_s is not None:
            self.cst_s += u.cpu_stall_s
            self.cst_n += 1
        if u.run_delay_s is not None:
            self.rd_s += u.run_delay_s
            self.rd_n += 1


@dataclass(frozen=True)
class JobView:
    """One job as exported (immutable)."""

    train_job: str
    user: str
    uid: int
    pid: int                                   # first process seen
    processes: int                             # distinct pids seen (at most 64)
    phase_seconds: Tuple[Tuple[str, float], ...]
    steps: int
    samples: Optional[int]                     # None: a steps-only job that counted none
    step_hist: HistogramValue
    input_bound_ratio: Optional[float]
    gpu_idle_seconds: Tuple[Tuple[str, str, float], ...]   # (gpu, phase, seconds)
    gpu_idle_ratio: Optional[float]
    last_message_age_s: float
    client_dropped: int
    verdict: Verdict
    evidence: Evidence
    ranks: Tuple["RankView", ...] = ()         # the job's ranks on this node (processes that sent one), by rank
    critical_rank: Optional[int] = None        # the rank whose verdict is the job's (agent.phases.ranks)
    world_size: Optional[int] = None           # ranks in the job, as its launcher says (None: not said)
    shed: int = 0                              # its datagrams the receiver discarded (over its share of the budget)
    start_time: Optional[float] = None         # Unix time this run of the job began on this node (its first message)
    ended: bool = False                        # all its processes exited: a new message under its name starts a new run
    namespace: str = ""                        # its pod's namespace (phases.pods; '' outside pods or not named)
    pod: str = ""                              # its pod's name (or uid where not named; '' outside pods)
    scaling_efficiency: Optional[float] = None  # share of step time not in communication (_scaling_efficiency)
    config: Tuple[Tuple[str, str], ...] = ()   # what it is configured with (agent.phases.jobconfig)
    inside: Optional[parts.InsideView] = None  # its step's parts and processes' device memory (phases.parts)

    @property
    def source(self) -> str:
        """Where the job's phases come from (protocol.SOURCES: client, torch, tf.data ...)."""
        return self.evidence.source

    @property
    def input_wait_cpu_ratio(self) -> Optional[float]:
        """CPU seconds the job's processes used per second of data_wait (None: not measured)."""
        w = self.evidence.input_wait
        return None if w is None else w.cpu_ratio


@dataclass(frozen=True)
class RankView:
    """One rank of a job on this node, as exported."""

    rank: int
    pid: int
    phase_seconds: Tuple[Tuple[str, float], ...]   # cumulative, as reported
    steps: int
    step_seconds: float                            # cumulative wall time of its steps
    input_bound_ratio: Optional[float]             # data_wait share of its step time over the window
    gpus: Tuple[str, ...] = ()


class _Rank:
    """What one rank (a sending process that said its rank) did: totals and a window, in Python only
    (the job table keeps them beside the job's)."""

    __slots__ = ("rank", "pid", "phase_s", "steps", "step_s", "ring", "gpus", "last_ns")

    def __init__(self, rank: int, pid: int, window_ns: int, now_ns: int):
        self.rank = rank
        self.pid = pid
        self.phase_s = [0.0] * NP
        self.steps = 0
        self.step_s = 0.0
        self.ring = _Ring(window_ns)
        self.gpus: Tuple[str, ...] = ()
        self.last_ns = now_ns


class _Job:
    __slots__ = ("key", "label", "user", "uid", "first_pid", "pids", "created_ns", "last_ns", "phase_s", "steps",
                 "samples", "hist", "hist_sum", "gpu_idle", "pending", "ring", "open", "cover", "waits", "wait_problem",
                 "source",
                 "ranks", "rank_steps", "world", "untracked", "shed", "start_time", "ended_ns", "namespace",
                 "pod", "configs", "inside")

    def __init__(self, key, label, user, uid, pid, now_ns, window_ns, max_pending):
        self.key = key
        self.label = label
        self.user = user
        self.uid = uid
        self.first_pid = pid
        self.pids: Dict[int, int] = {}            # pid -> client-reported dropped records
        self.created_ns = self.last_ns = now_ns
        self.phase_s = [0.0] * NP
        self.steps = 0
        self.samples = 0
        self.hist = [0] * (len(STEP_BUCKETS) + 1)
        self.hist_sum = 0.0
        self.gpu_idle: Dict[Tuple[str, int], float] = {}
        self.pending: Deque[attribution.Pending] = deque(maxlen=max_pending)
        self.ring = _Ring(window_ns)
        self.open: Dict[int, List[Tuple[int, int, int]]] = {}  # pid -> (phase index, s, e) not yet in a step
        self.cover: Dict[int, List[Optional[_Covered]]] = {}   # pid (-1: beyond MAX_PIDS) -> per phase index
        self.waits: Deque[Tuple[int, int, int]] = deque(maxlen=MAX_WAITS)  # (pid, s, e) awaiting /proc samples
        self.wait_problem = ""                    # why the last unmeasurable waits could not be measured
        self.source = "client"                    # where its phases come from (protocol.SOURCES)
        self.ranks: Dict[int, _Rank] = {}         # pid -> its rank's sums (processes that said their rank)
        self.rank_steps = 0                       # the most steps one rank made: the global steps counted
        self.world: Optional[int] = None          # ranks in the job, as the launcher says
        self.untracked: set = set()               # pids of ranks beyond MAX_PIDS: not judged, their steps not counted
        self.shed = 0                             # datagrams the receiver discarded over its share (fair budget)
        self.start_time = 0.0                     # Unix time of its first message (set by JobTable._new_job)
        self.ended_ns = 0                         # when its run ended (JobTable._end_runs); 0 while live
        self.namespace = self.pod = ""            # its pod (phases.pods), '' outside pods
        self.configs = jobconfig.JobConfigs()     # what its processes are configured with (issue 45)
        self.inside = parts.Inside()              # its step's parts and device memory (agent.phases.parts)


class JobTable:
    """Applies validated messages and turns them into JobViews; thread-safe (one lock)."""

    def __init__(self, cfg: Mapping, ctx, own_uid: Optional[int] = None, record_intervals: int = 0, probe=None,
                 alive: Optional[Callable[[int], bool]] = None, pods=None):
        """``cfg`` is the ``phases`` config section; ``ctx`` an AgentContext (clock, timeline, gpu_pids).

        ``record_intervals`` > 0 keeps the newest that many raw intervals (for `teye profile`'s timeline).
        ``probe`` (an ``agent.phases.procstat.InputProbe``) samples the senders of data_wait phases,
        to name the cause of input-bound jobs; None: the cause is ``unknown``.
        ``alive(pid)``: whether a sending process still runs (default: :func:`process_alive`), to end runs.
        ``pods`` (an ``agent.phases.pods.PodResolver``): key jobs by the sender's pod too.
        """
        self.pods = pods
        self.alive = process_alive if alive is None else alive
        self.ctx = ctx
        self.probe = probe
        # Optional further evidence for every job's verdict, () -> ((topic, note), ...): e.g. memory
        # bandwidth from hardware counters, cited when the host is the limit (see verdict.Evidence.extra).
        self.extra_evidence: Optional[Callable[[], Tuple[Tuple[str, str], ...]]] = None
        self.max_jobs = cfg["max_jobs"]
        self.max_per_user = cfg["max_jobs_per_user"]
        self.expiry_ns = int(cfg["job_expiry_seconds"] * 1e9)
        self.ended_keep_ns = int(cfg.get("ended_run_keep_seconds", 30.0) * 1e9)
        self.window_ns = int(cfg["window_seconds"] * 1e9)
        self.max_pending = cfg["max_pending_intervals"]
        self.max_delay_ns = int(cfg["attribution_max_delay_seconds"] * 1e9)
        self.limits = Limits(cfg["max_message_bytes"], cfg["max_records_per_message"], self.expiry_ns)
        self.thresholds = Thresholds.from_config(cfg)
        own = os.getuid() if own_uid is None else own_uid
        self.trusted = frozenset([own, *cfg["trusted_uids"]])
        self.results: Dict[str, int] = {r: 0 for r in RESULTS}
        self.config_results: Dict[str, int] = {r: 0 for r in jobconfig.CONFIG_RESULTS}
        self.cpus = os.cpu_count()   # the node's CPUs, for the input advice (agent.phases.advice)
        self.attributed: Dict[str, int] = {r: 0 for r in ATTRIBUTION_RESULTS}
        self.recorded: Optional[Deque] = deque(maxlen=record_intervals) if record_intervals else None
        self._jobs: "OrderedDict[Tuple[int, str], _Job]" = OrderedDict()
        # runs that ended (all their processes exited), exported until they expire or their name starts a new run
        self._ended: "OrderedDict[Tuple[int, str], _Job]" = OrderedDict()
        # datagrams shed before any job held their sender: (uid, pid) -> (count, first seen)
        self._unclaimed: Dict[Tuple[int, int], Tuple[int, int]] = {}
        self._labels: Dict[str, Tuple[int, str]] = {}
        self._per_uid: Dict[int, int] = {}
        self._users: Dict[int, str] = {}
        self._known_gpus: FrozenSet[str] = frozenset()
        # pids of processes that said their rank (and ranks beyond MAX_PIDS), while their job lives
        self.rank_pids: set = set()
        self._lock = threading.Lock()
        self._rlog = RateLimitedLog(log)
        # new jobs refused over the limits, per uid, since the last log line naming them (REFUSED_LOG_NS)
        self.refused: Dict[int, int] = {}
        self._refused_logged: Optional[int] = None

    # -- receiving ---------------------------------------------------------------------------
    def count(self, result: str) -> None:
        with self._lock:
            self.results[result] += 1

    def handle(self, data: bytes, pid: Optional[int], uid: Optional[int], now_ns: Optional[int] = None) -> str:
        """Validate and apply one datagram from (pid, uid); returns the result it was counted as."""
        now = self.ctx.clock() if now_ns is None else now_ns
        if pid is None or uid is None:
            self.count("no_credentials")
            return "no_credentials"
        try:
            msg = decode(data, now, self.limits)
        except Rejected as r:
            self.count(r.reason)
            self._rlog.warning(f"reject:{r.reason}", "phase message from pid %d uid %d rejected: %s", pid, uid, r)
            return r.reason
        ident = identity_of(data)
        cfg = jobconfig.taken(data, self.config_results, self._rlog, pid, uid)
        with self._lock:
            result = self._apply(msg, pid, uid, now, ident, cfg)   # (sets the job's source)
            self.results[result] += 1
            if result == "job_limit":
                self._note_refused(uid, now)   # logged per uid, rate-limited (one line names every uid)
                return result
        if result != ACCEPTED:
            self._rlog.warning(f"reject:{result}", "phase message from pid %d uid %d for job %r rejected: %s "
                               "(%d jobs live, limit %d, %d per user)", pid, uid, msg.job, result,
                               len(self._jobs), self.max_jobs, self.max_per_user)
        return result

    def handle_batch(self, batch: list) -> None:
        """handle() for each (data, pid, uid) of one receive, in the order received."""
        for data, pid, uid in batch:
            self.handle(data, pid, uid)

    def shed(self, counts: Mapping[Tuple[int, int], int]) -> None:
        """Charge datagrams the receiver discarded unread, {(uid, pid): n}, to the job of that sender (the
        live job of that uid the pid sent for), and count them all as ``shed``."""
        with self._lock:
            for (uid, pid), n in counts.items():
                self.results["shed"] += n
                if not self._charge(uid, pid, n):
                    # its first datagrams were all shed: no job holds the pid yet.  Kept (bounded) until one
                    # does, on the sampler's pass (_claim_shed): the job that caused them is charged
                    got = self._unclaimed.get((uid, pid))
                    if got is not None:
                        self._unclaimed[(uid, pid)] = (got[0] + n, got[1])
                    elif len(self._unclaimed) < MAX_UNCLAIMED:
                        self._unclaimed[(uid, pid)] = (n, self.ctx.clock())
                    self._rlog.warning("shed", "phase socket: %d datagrams of pid %d uid %d (no job yet) shed "
                                       "over the rate budget", n, pid, uid)

    def _charge(self, uid: int, pid: int, n: int) -> bool:
        for job in (*self._jobs.values(), *self._ended.values()):
            if job.uid == uid and pid in job.pids:
                job.shed += n
                return True
        return False

    def _claim_shed(self, now_ns: int) -> None:
        """Charge shed datagrams kept for a sender no job held to its job, now that one does; forget those
        still unclaimed after job_expiry_seconds."""
        for (uid, pid), (n, since) in list(self._unclaimed.items()):
            if self._charge(uid, pid, n) or now_ns - since >= self.expiry_ns:
                del self._unclaimed[(uid, pid)]

    def _rank(self, job: _Job, pid: int, ident: Identity, now_ns: int) -> Optional[_Rank]:
        """The rank state of pid, made when it first says its rank (bounded by MAX_PIDS per job); a new
        pid with a known rank (a restarted rank) replaces the old one: one series per rank."""
        rk = job.ranks.get(pid)
        if ident.world is not None:
            job.world = ident.world
        if rk is not None:
            if rk.rank == ident.rank:
                return rk
            del job.ranks[pid]  # the process now says another rank: start it again
        for other, r in list(job.ranks.items()):
            if r.rank == ident.rank:
                del job.ranks[other]
                self.rank_pids.discard(other)
        if len(job.ranks) >= MAX_PIDS:
            if not job.untracked:
                log.warning("job %s: more than %d ranks on this node; rank %d (pid %d) and later ones are not "
                            "judged per rank", job.label, MAX_PIDS, ident.rank, pid)
            if len(job.untracked) < MAX_UNTRACKED:
                job.untracked.add(pid)
                self.rank_pids.add(pid)
            return None
        rk = job.ranks[pid] = _Rank(ident.rank, pid, self.window_ns, now_ns)
        self.rank_pids.add(pid)
        return rk

    def _user(self, uid: int) -> str:
        name = self._users.get(uid)
        if name is None:
            if len(self._users) > 4096:
                self._users.clear()
            name = self._users[uid] = user_name(uid)
        return name

    def _label(self, uid: int, name: str, namespace: str = "", pod: str = "") -> str:
        if pod:   # the pod is the tenant (phases.pods): NAMESPACE/POD/NAME, or pod:UID/NAME where not named
            base = label = f"{namespace}/{pod}/{name}" if namespace else f"pod:{pod}/{name}"
        else:
            if uid in self.trusted and name not in self._labels:
                return name
            base = label = f"{self._user(uid)}/{name}"
            if label in self._labels:  # two uids with the same user name (or a trusted name clash)
                label = f"uid{uid}/{name}"
        n = 2
        while label in self._labels:   # (a third clash, or a pod's name another sender took first)
            label = f"{base}#{n}"
            n += 1
        return label

    def _new_job(self, key, pid: int, uid: int, now_ns: int) -> Optional[_Job]:
        old = self._ended.get(key)
        if old is not None:
            if pid in old.pids and old.pids:
                # a late datagram of the ended run's own process (queued before it exited): the run goes on
                del self._ended[key]
                self._jobs[key] = old
                self.rank_pids.update(_ranked(old))   # its ranked processes are live again
                return old
            self._drop(key)   # the name starts a new run: the ended one's series give way to it
        if self._full(uid):
            self._expire(now_ns)
        # the uid's own cap: only its own ended runs (exported for ended_run_keep_seconds) give way
        while self._per_uid.get(uid, 0) >= self.max_per_user:
            if not self._drop_ended(now_ns, uid):
                return None
        # the table's: an ended run exported long enough gives way; else the uid over its fair share
        while len(self._jobs) + len(self._ended) >= self.max_jobs:
            if not (self._drop_ended(now_ns, None) or self._evict_for(uid, now_ns)):
                return None
        namespace = pod = ""
        if len(key) > 2:
            namespace, pod = self.pods.names(key[2], now_ns)
        label = self._label(uid, key[1], namespace, pod)
        job = _Job(key, label, self._user(uid), uid, pid, now_ns, self.window_ns, self.max_pending)
        job.namespace, job.pod = namespace, pod
        job.start_time = self.ctx.wall_clock()   # now: the message that makes it was just received
        self._jobs[key] = job
        self._labels[label] = key
        self._per_uid[uid] = self._per_uid.get(uid, 0) + 1
        return job

    def _full(self, uid: int) -> bool:
        return (len(self._jobs) + len(self._ended) >= self.max_jobs
                or self._per_uid.get(uid, 0) >= self.max_per_user)

    def _drop_ended(self, now_ns: int, uid: Optional[int]) -> bool:
        """Forget the oldest ended run (of ``uid``, or of anyone) whose series have been exported for
        ended_run_keep_seconds; False where there is none."""
        for key, job in self._ended.items():
            if now_ns - job.ended_ns < self.ended_keep_ns:
                return False   # in the order they ended: the rest ended later
            if uid is None or job.uid == uid:
                self._drop(key)
                return True
        return False

    def _evict_for(self, uid: int, now_ns: int) -> bool:
        """Make room for a new job of ``uid`` in a full table at the expense of the uid holding the most
        jobs, if that one is over its fair share: it holds at least two more than ``uid`` (max-min
        fairness: a uid's first job always finds room while another uid holds two), or ``uid`` is trusted
        (the agent's own or phases.trusted_uids) and has no job yet while an untrusted uid holds one.
        The holder's least recently active live job goes (else its oldest ended run).  False: no such
        holder, ``uid`` is refused."""
        mine = self._per_uid.get(uid, 0)
        first_trusted = mine == 0 and uid in self.trusted
        victim, most = None, 0
        for v, n in self._per_uid.items():
            if v != uid and n > most and not (first_trusted and v in self.trusted):
                victim, most = v, n
        if victim is None or not (most > mine + 1 or first_trusted):
            return False
        for key, job in (*self._jobs.items(), *self._ended.items()):
            if job.uid == victim:
                self._drop(key)
                self._rlog.warning("evict", "phase jobs: job %r of uid %d dropped (uid %d held %d of %d jobs, over "
                                   "its share) to make room for a job of uid %d, which held %d", job.label, victim,
                                   victim, most, self.max_jobs, uid, mine)
                return True
        return False

    def _note_refused(self, uid: int, now_ns: int) -> None:
        """Count a datagram whose new job was refused, per uid (at most MAX_REFUSED_UIDS named, the rest
        together), and log the counts at most every REFUSED_LOG_NS."""
        refused = self.refused
        key = uid if uid in refused or len(refused) < MAX_REFUSED_UIDS else -1
        refused[key] = refused.get(key, 0) + 1
        self._log_refused(now_ns)

    def _log_refused(self, now_ns: int) -> None:
        if not self.refused or (self._refused_logged is not None and now_ns - self._refused_logged < REFUSED_LOG_NS):
            return
        self._refused_logged = now_ns
        by = sorted(((n, u) for u, n in self.refused.items()), key=lambda x: (-x[0], x[1]))
        held = sorted(((n, u) for u, n in self._per_uid.items()), key=lambda x: (-x[0], x[1]))[:8]
        log.warning("phase jobs refused over the limits (phases.max_jobs %d, max_jobs_per_user %d; %d jobs in "
                    "the table): %s; most held by %s", self.max_jobs, self.max_per_user,
                    len(self._jobs) + len(self._ended),
                    ", ".join(f"uid {u}: {n} datagrams" if u >= 0 else f"other uids: {n} datagrams" for n, u in by),
                    ", ".join(f"uid {u}: {n} jobs" for n, u in held) or "nobody")
        self.refused.clear()

    def _apply(self, msg: Message, pid: int, uid: int, now: int, ident: Identity = NO_IDENTITY, cfg=None) -> str:
        key = (uid, msg.job)
        if self.pods is not None:
            pod = self.pods.of(pid, now)
            if pod:
                key = (uid, msg.job, pod)
        job = self._jobs.get(key)
        if job is None:
            job = self._new_job(key, pid, uid, now)
            if job is None:
                return "job_limit"
        else:
            self._jobs.move_to_end(key)
        job.last_ns = now
        known = pid in job.pids or len(job.pids) < MAX_PIDS
        if known:
            job.pids[pid] = max(job.pids.get(pid, 0), msg.dropped)
        if cfg is not None:
            job.configs.note(pid, ident.rank, cfg, known)
        opened = job.open.get(pid)
        if opened is None and known:
            opened = job.open[pid] = []
        # per phase, what this process already reported (processes beyond MAX_PIDS share one set)
        covers = job.cover.get(pid if known else -1)
        if covers is None:
            covers = job.cover[pid if known else -1] = [None] * (NP + 1)   # + WINDOWS: its windows' spans
        gpus = ()
        if (msg.phases or msg.steps or msg.sums) and (msg.cvd and self._known_gpus or pid in self.ctx.gpu_pids):
            gpus = attribution.resolve_gpus(pid, msg.cvd, self.ctx.gpu_pids, self._known_gpus)
        rk = None
        if ident.rank is not None:
            rk = self._rank(job, pid, ident, now)
        elif job.ranks:
            rk = job.ranks.get(pid)
        if rk is not None:
            rk.last_ns = now
            if gpus:
                rk.gpus = gpus
        ring = job.ring
        rec = self.recorded
        waited = False
        phase_s = job.phase_s
        compute0 = phase_s[COMPUTE]
        # records ending in the current ring slot (nearly all of them) skip ring.slot()
        width = ring.width
        cur = now // width
        if ring.cur_b == cur:
            cur_slot = ring.cur_i
        else:
            cur_slot = ring.cur_i = ring.slot(now, now)
            ring.cur_b = cur
        # phases first, then the steps that close them; a datagram with more phases than a process may keep
        # open (OPEN_PER_PID) is taken step by step instead, so that none is pushed out before its step
        chunks = _by_step(msg.phases, msg.steps) if len(msg.phases) > OPEN_PER_PID and msg.steps else (
            (msg.phases, msg.steps),)
        for ph_chunk, st_chunk in chunks:
            for phase, s, e in ph_chunk:
                i = PHASE_INDEX[phase]
                if opened is not None:
                    if len(opened) >= OPEN_PER_PID:
                        del opened[0]  # the oldest phase still waiting for its step
                    opened.append((i, s, e))
                if rec is not None:
                    rec.append((job.label, phase, s, e))
                # only what the process had not reported of this phase yet counts (its overlaps merged)
                c = covers[i]
                if c is None:
                    c = covers[i] = _Covered()
                ends = c.ends
                if ends and s >= ends[-1] and e > s:   # _Covered.add's usual case, inline: after all so far
                    if s == ends[-1]:
                        ends[-1] = e
                    else:
                        c.starts.append(s)
                        ends.append(e)
                        if len(ends) > COVER_SPANS:
                            c.forget()
                    new = ((s, e),)
                else:
                    new = c.add(s, e)
                for a, b in new:
                    phase_s[i] += (b - a) / 1e9
                    if i == DATA_WAIT and self.probe is not None:
                        job.waits.append((pid, a, b, b - a))
                        waited = True
                    slot = cur_slot if b // width >= cur else ring.slot(b, now)
                    if slot is not None:
                        ring.phase[slot][i] += b - a
                    if rk is not None:
                        rk.phase_s[i] += (b - a) / 1e9
                        rslot = rk.ring.slot(b, now)
                        if rslot is not None:
                            rk.ring.phase[rslot][i] += b - a
                    if gpus:
                        self._queue(job, attribution.Pending((i, b), a, b, gpus))
            for s, e, samples in st_chunk:
                d = (e - s) / 1e9
                # per phase index, the ns of the process's open phases inside this step (merged)
                inside = None if gpus or not opened else self._close_step_sums(opened, s, e)
                if inside is None:
                    pieces = self._close_step(opened, s, e) if opened else {}
                    inside = [(i, sum(b - a for a, b in iv)) for i, iv in pieces.items()]
                job.samples += samples
                # the exported step time is compile-free (agent.phases.definitions): a compile the client
                # sent inside this step leaves it, as it leaves the shares
                d = max(0.0, d - sum(ns for i, ns in inside if i == COMPILE) / 1e9)
                if rk is not None:
                    # one global step per step of the ranks: counted when the first rank completes it
                    rk.steps += 1
                    rk.step_s += d
                    rslot = rk.ring.slot(e, now)
                    if rslot is not None:
                        rk.ring.step_ns[rslot] += e - s
                        rk.ring.steps[rslot] += 1
                        rrow = rk.ring.in_step[rslot]
                        for i, ns in inside:
                            rrow[i] += ns
                if (rk is None or rk.steps > job.rank_steps) and not (job.untracked and pid in job.untracked):
                    if rk is not None:
                        job.rank_steps = rk.steps
                    job.steps += 1
                    job.hist_sum += d
                    job.hist[bisect_left(STEP_BUCKETS, d)] += 1  # first bucket with d <= le
                slot = cur_slot if e // width >= cur else ring.slot(e, now)
                if slot is not None:
                    ring.step_ns[slot] += e - s
                    ring.steps[slot] += 1
                    row = ring.in_step[slot]
                    for i, ns in inside:
                        row[i] += ns
                if gpus:
                    group = [attribution.Pending((STEP, e), s, e, gpus)]
                    for n, (_kind, names) in enumerate(IN_KINDS):
                        for a, b in attribution.merged(iv for p in names for iv in pieces.get(PHASE_INDEX[p], ())):
                            group.append(attribution.Pending((IN_STEP + n, e), a, b, gpus))
                    self._queue_step(job, group)
                if rec is not None:
                    rec.append((job.label, "step", s, e))
        if msg.sums and self._apply_sums(job, msg.sums, pid, covers, gpus, rk, now, cur_slot, cur):
            waited = True
        if waited:
            self.probe.track(pid, uid, now)
        if ident.src is not None:
            job.source = ident.src
        if (msg.parts is not None or msg.mem is not None) and known:
            job.inside.apply(pid, msg.parts, msg.mem, phase_s[COMPUTE] - compute0)
        return ACCEPTED

    def _apply_sums(self, job: _Job, sums, pid: int, covers, gpus, rk: Optional[_Rank], now: int, cur_slot,
                    cur) -> bool:
        """Version 2's windows of fast steps (protocol.Window): what _apply does with a step and its phases,
        from their sums.  A window's phases are spread uniformly over it for GPU idle (attribution.Pending
        with ns) and for the input probe; its in-step time is the client's own clipping, at most the steps'.
        Each phase of a window counts at most the window's span (protocol._window holds it there), and its
        steps' time too (held here).  A window is not an interval: it is merged with the process's earlier
        windows only (``covers[WINDOWS]``, a _Covered of their spans), not with its intervals; a window whose
        span they partly cover counts the uncovered share of it (_part), a copy of one counts nothing.
        Returns whether a data_wait was queued for the probe."""
        ring = job.ring
        width = ring.width
        phase_s = job.phase_s
        rec = self.recorded
        waited = False
        untracked = bool(job.untracked) and pid in job.untracked
        spans = covers[WINDOWS]
        if spans is None:
            spans = covers[WINDOWS] = _Covered()
        for w in sums:
            s, e = w.start_ns, w.end_ns
            # only what this process's windows had not covered yet counts (issue 39); a window stands for at
            # least MIN_STEP_NS (its steps' least time, issue 48), so that a copy of a window of no span is a
            # copy, and windows 1 ns apart cannot add steps faster than one per MIN_STEP_NS
            span = e - s if e - s >= MIN_STEP_NS else MIN_STEP_NS
            ends = spans.ends
            if not ends or s >= ends[-1]:   # the usual case, as _apply inlines it: after all the earlier windows
                if ends and s == ends[-1]:
                    ends[-1] = s + span
                else:
                    spans.starts.append(s)
                    ends.append(s + span)
                    if len(ends) > COVER_SPANS:
                        spans.forget()
            else:
                new = sum(b - a for a, b in spans.add(s, s + span))
                if new < span:
                    if not new:   # all of it counted already: a copy
                        continue
                    w = _part(w, new, span)
            n, step_ns = w.steps, w.step_ns
            if step_ns > e - s:   # steps of one process do not overlap: their time is at most the span
                step_ns = e - s
            # the exported step time (histogram sum, rank step seconds) is compile-free, as in _apply
            export_ns = max(0, step_ns - sum(inside for p, _, inside in w.phases if p == "compile"))
            slot = cur_slot if e // width >= cur else ring.slot(e, now)
            rslot = rk.ring.slot(e, now) if rk is not None else None
            kinds = [0] * len(IN_KINDS)
            cursor = s
            for phase, ns, inside in w.phases:
                i = PHASE_INDEX[phase]
                phase_s[i] += ns / 1e9
                if slot is not None:
                    ring.phase[slot][i] += ns
                    ring.in_step[slot][i] += inside
                if rk is not None:
                    rk.phase_s[i] += ns / 1e9
                    if rslot is not None:
                        rk.ring.phase[rslot][i] += ns
                        rk.ring.in_step[rslot][i] += inside
                for k, names in enumerate(IN_KIND_INDEXES):
                    if i in names:
                        kinds[k] += inside
                if i == DATA_WAIT and self.probe is not None and ns and e > s:
                    job.waits.append((pid, s, e, ns))
                    waited = True
                if gpus and ns:
                    self._queue(job, attribution.Pending((i, e), s, e, gpus, ns))
                if rec is not None:   # the timeline: the window's phases one after another, in proportion
                    end = cursor + (ns * (e - s) // max(e - s, sum(p[1] for p in w.phases)))
                    rec.append((job.label, phase, cursor, end))
                    cursor = end
            job.samples += w.samples
            counted = n
            if rk is not None:
                # global steps: those of this rank's steps that no rank had made yet (see _apply)
                before = rk.steps
                rk.steps += n
                rk.step_s += export_ns / 1e9
                if rslot is not None:
                    rk.ring.step_ns[rslot] += step_ns
                    rk.ring.steps[rslot] += n
                counted = rk.steps - max(before, job.rank_steps)
                if counted > 0:
                    job.rank_steps = rk.steps
            if counted > 0 and not untracked:
                job.steps += counted
                job.hist_sum += export_ns / 1e9 * (counted / n)
                _add_counts(job.hist, w.hist, counted, n)
            if slot is not None:
                ring.step_ns[slot] += step_ns
                ring.steps[slot] += n
            if gpus:
                group = [attribution.Pending((STEP, e), s, e, gpus, step_ns)]
                for k, ns in enumerate(kinds):
                    if ns:
                        group.append(attribution.Pending((IN_STEP + k, e), s, e, gpus, min(ns, step_ns)))
                self._queue_step(job, group)
            if rec is not None:
                rec.append((job.label, "step", s, e))
        return waited

    @staticmethod
    def _close_step_sums(opened: List[Tuple[int, int, int]], s: int, e: int) -> Optional[list]:
        """The usual step, where each phase index occurs once among the open phases: [(index, ns
        inside [s, e))], and those ending by e forgotten.  None (nothing changed) when an index
        repeats: its pieces need merging (_close_step)."""
        out = []
        seen = 0
        straddles = False
        for k, a, b in opened:
            if b > e:
                straddles = True
                b = e
            if a < s:
                a = s
            if b > a:
                bit = 1 << k
                if seen & bit:
                    return None
                seen |= bit
                out.append((k, b - a))
        if straddles:
            JobTable._forget_closed(opened, e)
        else:
            opened.clear()
        return out

    @staticmethod
    def _forget_closed(opened: List[Tuple[int, int, int]], e: int) -> None:
        """Drop the open phases that end by e; a phase straddling the step's end belongs to the next one too."""
        keep = [p for p in opened if p[2] > e]
        opened.clear()
        opened.extend(keep)

    @staticmethod
    def _close_step(opened: List[Tuple[int, int, int]], s: int, e: int) -> Dict[int, list]:
        """The merged pieces of the process's open phases inside its step [s, e); forget those that end by e."""
        pieces = attribution.clip_to_step(opened, s, e)
        JobTable._forget_closed(opened, e)
        return pieces

    def _queue(self, job: _Job, p: attribution.Pending) -> None:
        q = job.pending
        if len(q) == q.maxlen:
            self._push_out(q)
        q.append(p)

    def _queue_step(self, job: _Job, group) -> None:
        """Queue a step with its in-step pieces, together: no part without its whole (a verdict's
        idle by kind can never exceed the idle of its steps).  A step whose pieces do not fit in
        the whole queue is not queued (counted as overflow)."""
        q = job.pending
        if len(group) > q.maxlen:
            self.attributed["overflow"] += 1
            return
        while len(q) + len(group) > q.maxlen:
            self._push_out(q)
        q.extend(group)

    def _push_out(self, q: Deque[attribution.Pending]) -> None:
        """Drop the oldest waiting interval unattributed; a step goes with its pieces (queued right after it)."""
        old = q.popleft()
        if old.key[0] < IN_STEP:
            self.attributed["overflow"] += 1
        if old.key[0] == STEP:
            while q and q[0].key[0] >= IN_STEP and q[0].key[1] == old.key[1]:
                q.popleft()   # internal pieces, not reported intervals: not counted

    # -- periodic work (the sampler's thread) ------------------------------------------------
    def _expire(self, now_ns: int) -> None:
        while self._jobs:   # in the order of their last message
            key, job = next(iter(self._jobs.items()))
            if now_ns - job.last_ns < self.expiry_ns:
                break
            self._drop(key)
        for key in [k for k, job in self._ended.items() if now_ns - job.last_ns >= self.expiry_ns]:
            self._drop(key)   # (in the order they ended: a few, all looked at)

    def _end_runs(self, now_ns: int) -> None:
        """Move the jobs whose processes have all exited, silent for RUN_END_SILENCE_NS, to ``_ended``."""
        for key, job in list(self._jobs.items()):
            if now_ns - job.last_ns < RUN_END_SILENCE_NS:
                break   # in the order of their last message: the rest spoke later
            if not job.pids or any(pid <= 0 or self.alive(pid) for pid in job.pids):
                continue   # a process still runs, or one the agent cannot see (another pid namespace)
            del self._jobs[key]
            job.ended_ns = now_ns   # exported as ended from this pass on; kept at least ended_keep_ns
            self._ended[key] = job
            self.rank_pids.difference_update(_ranked(job))

    def _drop(self, key) -> None:
        job = self._jobs.pop(key, None) or self._ended.pop(key)
        self.rank_pids.difference_update(_ranked(job))
        self._labels.pop(job.label, None)
        n = self._per_uid.get(job.uid, 1) - 1
        if n > 0:
            self._per_uid[job.uid] = n
        else:
            self._per_uid.pop(job.uid, None)

    def attribute(self, now_ns: int, force: bool = False) -> None:
        """Credit GPU idle time to the intervals whose GPU samples have arrived (or waited too long)."""
        tl = self.ctx.timeline
        known = frozenset(tl.gpus())
        with self._lock:
            self._known_gpus = known
            for job in (*self._jobs.values(), *self._ended.values()):
                if job.waits:
                    self._measure_waits(job, now_ns, force)
                if not job.pending:
                    continue
                ready, late = attribution.take_ready(job.pending, tl.covered_until, now_ns, self.max_delay_ns, force)
                if not ready:
                    continue
                # count the reported intervals, not the in-step pieces queued for the verdict
                n_late = sum(1 for p in late if p.key[0] < IN_STEP)
                self.attributed["late"] += n_late
                self.attributed["complete"] += sum(1 for p in ready if p.key[0] < IN_STEP) - n_late
                ring = job.ring
                for ((kind, end), gpu), (idle, obs) in attribution.attribute_pending(ready, tl.window).items():
                    slot = ring.slot(end, now_ns)
                    if kind == STEP:
                        if slot is not None:
                            ring.step_idle[slot] += idle
                            ring.step_obs[slot] += obs
                            ring.step_attr[slot] = True
                        continue
                    if kind >= IN_STEP:
                        if slot is not None:
                            ring.kind_idle[slot][kind - IN_STEP] += idle
                        continue
                    job.gpu_idle[(gpu, kind)] = job.gpu_idle.get((gpu, kind), 0.0) + idle / attribution.IDLE_UNIT
                    if slot is not None:
                        ring.idle[slot][kind] += idle
                        ring.obs[slot][kind] += obs

    def _measure_waits(self, job: _Job, now_ns: int, force: bool) -> None:
        """Credit the job's data_wait intervals with what its processes did meanwhile (/proc samples)."""
        seen: Dict[int, tuple] = {}
        waits = job.waits
        while waits:
            pid, s, e, ns = waits[0]
            got = seen.get(pid)
            if got is None:  # once per pid, not per wait: 10,000 waits a second would each copy the ring's times
                samples, problem, gone = self.probe.samples(pid)
                got = seen[pid] = samples, problem, gone, [x.t_ns for x in samples]
            samples, problem, gone, times = got
            u = cause.wait_usage(samples, s, e, times)
            if u is None and not (gone or force or now_ns - e > WAIT_COVER_NS) and (
                    not samples or samples[0].t_ns <= s):
                break  # the sample after its end is not there yet
            waits.popleft()
            if u is None:
                if gone or not samples:
                    job.wait_problem = problem or f"no /proc sample of pid {pid}"
                continue  # (or the wait began before sampling started)
            if ns != e - s:   # a window's data_wait: its share of what the process did over the window
                u = _scaled_usage(u, ns / (e - s))
            slot = job.ring.slot(e, now_ns)
            if slot is not None:
                job.ring.wait[slot].add(ns, u)
            rk = job.ranks.get(pid) if job.ranks else None
            if rk is not None:
                rslot = rk.ring.slot(e, now_ns)
                if rslot is not None:
                    rk.ring.wait[rslot].add(ns, u)
            job.wait_problem = problem

    def views(self, now_ns: int):
        """Expire silent jobs, then return (JobViews, message counts, attribution counts, pending)."""
        with self._lock:
            self._expire(now_ns)
            self._expire_ranks(now_ns)
            self._end_runs(now_ns)
            if self._unclaimed:
                self._claim_shed(now_ns)
            self._log_refused(now_ns)
            views = tuple(self._view(j, now_ns, ended=True) for j in self._ended.values()) + tuple(
                self._view(j, now_ns) for j in self._jobs.values())
            pending = sum(len(j.pending) for j in (*self._jobs.values(), *self._ended.values()))
            return views, tuple(self.results.items()), tuple(self.attributed.items()), pending

    def _expire_ranks(self, now_ns: int) -> None:
        """Forget ranks silent for job_expiry_seconds (a rank that died: its series disappear)."""
        for job in self._jobs.values():
            if job.ranks:
                for pid in [p for p, r in job.ranks.items() if now_ns - r.last_ns >= self.expiry_ns]:
                    del job.ranks[pid]
                    self.rank_pids.discard(pid)
                    job.inside.forget(pid)

    def _rank_evidence(self, job: _Job, rk: _Rank, now_ns: int) -> Evidence:
        """One rank's evidence over the window: its phase times and input waits (no GPU figures: those
        are the job's, see agent.phases.ranks)."""
        ring = rk.ring
        in_step = [0] * NP
        phase = [0] * NP
        step_ns = steps = 0
        waits = []
        for i in ring.live(now_ns):
            for k in range(NP):
                in_step[k] += ring.in_step[i][k]
                phase[k] += ring.phase[i][k]
            step_ns += ring.step_ns[i]
            steps += ring.steps[i]
            if ring.wait[i].n:
                waits.append(ring.wait[i])
        times = in_step if step_ns > 0 else phase
        return Evidence(
            window_s=min(self.window_ns, max(0, now_ns - job.created_ns)) / 1e9,
            phase_seconds={p: times[k] / 1e9 for k, p in enumerate(PHASES) if times[k]},
            step_seconds=step_ns / 1e9, steps=steps,
            silent_s=max(0.0, (now_ns - rk.last_ns) / 1e9),
            input_wait=self._input_wait(job, waits),
            extra=self.extra_evidence() if self.extra_evidence is not None else (),
            source=job.source, exchange_observed=_exchange_observed(job),
            config=job.configs.merged(), cpus=self.cpus)

    def _evidence(self, job: _Job, now_ns: int) -> Evidence:
        ring = job.ring
        live = ring.live(now_ns)
        phase = [0] * NP
        in_step = [0] * NP
        idle = [0] * NP
        obs = [0] * NP
        kind_idle = [0] * len(IN_KINDS)
        step_ns = step_idle = step_obs = 0
        steps = 0
        step_attr = False
        waits = []
        for i in live:
            for k in range(NP):
                phase[k] += ring.phase[i][k]
                in_step[k] += ring.in_step[i][k]
                idle[k] += ring.idle[i][k]
                obs[k] += ring.obs[i][k]
            for k in range(len(IN_KINDS)):
                kind_idle[k] += ring.kind_idle[i][k]
            w = ring.wait[i]
            if w.n:
                waits.append(w)
            step_ns += ring.step_ns[i]
            steps += ring.steps[i]
            step_idle += ring.step_idle[i]
            step_obs += ring.step_obs[i]
            step_attr = step_attr or ring.step_attr[i]
        # With steps, shares count only the phase time inside them; without, the phases themselves.
        times = in_step if step_ns > 0 else phase
        unit = attribution.IDLE_UNIT
        # Without steps, observed time is summed per phase like the idle time (same order, same
        # rounding), so the idle sum cannot round above it.
        phase_obs = sum(obs[k] / 1e9 for k in range(NP) if idle[k] or obs[k])
        return Evidence(
            window_s=min(self.window_ns, max(0, now_ns - job.created_ns)) / 1e9,
            phase_seconds={p: times[k] / 1e9 for k, p in enumerate(PHASES) if times[k]},
            step_seconds=step_ns / 1e9,
            steps=steps,
            gpu_idle_seconds={p: idle[k] / unit for k, p in enumerate(PHASES) if idle[k]},
            gpu_observed_seconds=step_obs / 1e9 if step_attr else phase_obs,
            gpu_step_idle_seconds=step_idle / unit if step_attr else None,
            gpu_idle_by_kind={name: kind_idle[k] / unit for k, (name, _) in enumerate(IN_KINDS)} if step_attr else None,
            silent_s=max(0.0, (now_ns - job.last_ns) / 1e9),
            input_wait=self._input_wait(job, waits),
            extra=self.extra_evidence() if self.extra_evidence is not None else (),
            source=job.source,
            exchange_observed=_exchange_observed(job),
            config=job.configs.merged(), cpus=self.cpus,
        )

    def _links(self, job: _Job, now_ns: int):
        """The node's interfaces over the job's window, from its first message where that is later and to its
        last (its share of time in the exchange is of that span), None where not sampled.  Read only for a
        job judged communication-bound (_view): no other verdict uses it."""
        hist = getattr(self.ctx, "links", None)
        if hist is None or not hist.sampled:
            return None
        return tuple(hist.window(max(now_ns - self.window_ns, job.created_ns), min(now_ns, job.last_ns)))

    def _input_wait(self, job: _Job, sums) -> Optional[InputWait]:
        if self.probe is None:
            return None
        n = sum(w.n for w in sums)
        if not n:
            return InputWait(problem=job.wait_problem)
        io_n, cst_n, rd_n = sum(w.io_n for w in sums), sum(w.cst_n for w in sums), sum(w.rd_n for w in sums)
        return InputWait(
            wait_s=sum(w.wait_ns for w in sums) / 1e9, cpu_s=sum(w.cpu_s for w in sums),
            read_bytes=None if any(w.no_io for w in sums) else sum(w.read_bytes for w in sums),
            io_stall_s=sum(w.io_s for w in sums) if io_n == n else None,
            cpu_stall_s=sum(w.cst_s for w in sums) if cst_n == n else None,
            run_delay_s=sum(w.rd_s for w in sums) if rd_n == n else None,
            problem=job.wait_problem)

    def _judge(self, job: _Job, job_ev: Evidence, evs):
        """(verdict, critical rank or None, the evidence judged): the critical rank's where the job has ranks
        (agent.phases.ranks; a single process is its own rank, with the job's GPU figures), else the job's."""
        if job.ranks:
            notes = self.ctx.gpu_notes
            crit = ranks.judge([ranks.RankEvidence(rk.rank, pid, rk.gpus, evs[pid],
                                                   "; ".join(f"GPU {g}: {notes[g]}" for g in rk.gpus if g in notes))
                                for pid, rk in job.ranks.items()], self.thresholds, untracked=len(job.untracked))
            if crit is not None:
                return crit.verdict, crit.rank.rank if crit.named else None, crit.rank.evidence   # even: nobody
        return decide(job_ev, self.thresholds), None, job_ev

    def _view(self, job: _Job, now_ns: int, ended: bool = False) -> JobView:
        ev = job_ev = self._evidence(job, now_ns)
        # a steps-only source cannot see input waits: its input-bound ratio is absent, not 0 (_input_ratio);
        # the four usual phases start at 0 for a job that reports phases (a counter born at 0 loses no
        # increase); a steps-only job reports none, so its phase counters are absent, as are its samples
        # while it has counted none (a steps-only source may not know its batch size)
        steps_only = job_ev.source in STEPS_ONLY_SOURCES
        evs = {pid: job_ev if len(job.pids) == 1 else self._rank_evidence(job, rk, now_ns)
               for pid, rk in job.ranks.items()}
        verdict, critical, ev = self._judge(job, job_ev, evs)
        if verdict.kind == "communication":
            # its cause reads the node's interfaces over the job's window: only now, for this verdict
            links = self._links(job, now_ns)
            if links is not None:
                job_ev = dataclasses.replace(job_ev, network=links)
                evs = {pid: job_ev if len(job.pids) == 1 else dataclasses.replace(e, network=links)
                       for pid, e in evs.items()}
                verdict, critical, ev = self._judge(job, job_ev, evs)
        rank_views = tuple(sorted((RankView(
            rank=rk.rank, pid=pid,
            phase_seconds=tuple((p, rk.phase_s[k]) for k, p in enumerate(PHASES)
                                if rk.phase_s[k] or (k < 4 and not steps_only)),
            steps=rk.steps, step_seconds=rk.step_s,
            input_bound_ratio=_input_ratio(evs[pid]), gpus=rk.gpus) for pid, rk in job.ranks.items()),
            key=lambda r: r.rank))
        ratio = _input_ratio(ev)
        efficiency = _scaling_efficiency([evs[pid] for pid in job.ranks] if job.ranks else [job_ev])
        return JobView(
            train_job=job.label, user=job.user, uid=job.uid, pid=job.first_pid, processes=len(job.pids),
            phase_seconds=tuple((p, job.phase_s[k]) for k, p in enumerate(PHASES)
                                if job.phase_s[k] or (k < 4 and not steps_only)),
            steps=job.steps, samples=None if (steps_only or job_ev.source in SAMPLES_UNSEEN_SOURCES) and not job.samples
            else job.samples,
            step_hist=histogram_value(STEP_BUCKETS, job.hist, job.hist_sum),
            input_bound_ratio=ratio,
            gpu_idle_seconds=tuple((g, PHASES[k], v) for (g, k), v in sorted(job.gpu_idle.items())),
            gpu_idle_ratio=job_ev.gpu_idle_ratio,
            last_message_age_s=ev.silent_s,
            client_dropped=sum(job.pids.values()),
            verdict=verdict,
            evidence=ev,
            ranks=rank_views,
            critical_rank=critical,
            world_size=job.world,
            shed=job.shed,
            start_time=job.start_time,
            ended=ended,
            namespace=job.namespace,
            pod=job.pod,
            scaling_efficiency=efficiency,
            config=job_ev.config,
            inside=job.inside.view(job.phase_s[COMPUTE], {pid: rk.rank for pid, rk in job.ranks.items()},
                                   {pid: rk.phase_s[COMPUTE] for pid, rk in job.ranks.items()}),
        )


def _by_step(phases, steps):
    """(phases, steps) chunks in the order a process lived them: before each step, the phases (as sent) up to
    the first that starts at or after its end; the rest at the end."""
    out, i, n = [], 0, len(phases)
    for st in steps:
        j = i
        while j < n and phases[j][1] < st[1]:
            j += 1
        out.append((phases[i:j], (st,)))
        i = j
    if i < n:
        out.append((phases[i:], ()))
    return out


def _add_counts(hist: List[int], counts: Tuple[int, ...], m: int, n: int) -> None:
    """Add m of a window's n steps, whose bucket counts are ``counts``, to ``hist``: all of them, or (a rank
    whose window other ranks had partly counted already) m spread over its buckets in proportion, largest
    remainders first, so that exactly m are added."""
    if m >= n:
        for i, c in enumerate(counts):
            hist[i] += c
        return
    shares = [(c * m // n, c * m % n, i) for i, c in enumerate(counts)]
    left = m - sum(q for q, _, _ in shares)
    for q, _, i in shares:
        hist[i] += q
    for _, _, i in sorted(shares, key=lambda x: -x[1])[:left]:
        hist[i] += 1


def _part(w: "Window", new: int, span: int) -> "Window":
    """The share new / span of a window (0 < new < span): what it adds where the process's earlier windows
    covered the rest of its span.  Its phases' time (as reported and inside the steps) and its steps' time in
    proportion, rounded down (never more than time); its steps in proportion, rounded to the nearest (a window
    overlapping the last by a few ns loses no step; a sliver of less than half a step's share adds none),
    spread over its buckets as _add_counts spreads them; its samples in proportion to the steps counted."""
    n = w.steps
    m = (2 * n * new + span) // (2 * span)
    hist = [0] * len(w.hist)
    if m:
        _add_counts(hist, w.hist, m, n)
    step_ns = min(w.step_ns, span) * new // span
    # the part's buckets agree with its step time, as protocol._possible holds a window's (issue 48): a step over
    # 5 ms the part's time cannot hold counts under 5 ms; time its steps cannot hold is dropped (never added)
    if len(hist) > 1 and hist[1] * (FAST_EDGE_NS + 1) > step_ns:
        hist[0] += hist[1]
        hist[1] = 0
    step_ns = min(step_ns, hist[0] * FAST_EDGE_NS + (hist[1] * (RESOLUTION_NS - 1) if len(hist) > 1 else 0))
    return Window(w.start_ns, w.end_ns, m, (2 * w.samples * m + n) // (2 * n), step_ns,
                  tuple((p, ns * new // span, inside * new // span) for p, ns, inside in w.phases), tuple(hist))


def _scaled_usage(u: "cause.WaitUsage", f: float) -> "cause.WaitUsage":
    """What a process did over a window, times the share f of the window its data_wait took."""
    return cause.WaitUsage(u.cpu_s * f, None if u.read_bytes is None else int(u.read_bytes * f),
                           None if u.io_stall_s is None else u.io_stall_s * f,
                           None if u.cpu_stall_s is None else u.cpu_stall_s * f,
                           None if u.run_delay_s is None else u.run_delay_s * f)


def _ranked(job: _Job):
    """The pids of a job that said their rank: its ranks' and the untracked ranks'."""
    return (*job.ranks, *job.untracked)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` (in the agent's pid namespace) runs: it exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass   # another user's: it exists
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        return stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3] != b"Z"
    except (OSError, ValueError):
        return True   # it existed a moment ago; /proc may not be mounted as the agent's


UNTIMED_EXCHANGE_SOURCES = frozenset({"tf.data", "tf-steps", "keras"})   # zero-code TensorFlow: its collectives


def _exchange_observed(job: _Job) -> bool:
    """False for a data-parallel job (ranks, or a world size said) whose framework's gradient exchange teye
    cannot time: TensorFlow's, inside its step functions."""
    return not (job.source in UNTIMED_EXCHANGE_SOURCES and (job.ranks or (job.world or 0) > 1))


def _scaling_efficiency(evs) -> Optional[float]:
    """The share of step time not lost to the exchange or to waiting for other ranks in it: 1 less the
    ``communication`` share, over the window, the mean of the job's ranks on this node (each rank's own
    share: a rank's waits are its own); None without step time or from a source that cannot see the
    exchange (steps only)."""
    shares = [e.share("communication") for e in evs
              if e.step_time > 0 and e.source not in STEPS_ONLY_SOURCES and e.exchange_observed]
    return 1.0 - sum(shares) / len(shares) if shares else None


def _input_ratio(ev: Evidence) -> Optional[float]:
    """The data_wait share of step time; None without step time or from a steps-only source (which cannot
    see input waits: absent, not 0)."""
    return ev.share("data_wait") if ev.step_time > 0 and ev.source not in STEPS_ONLY_SOURCES else None


