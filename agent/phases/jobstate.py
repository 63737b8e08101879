"""The job table's bounded state: per job and per rank, totals, a ring of sums over the sliding window,
what each process already reported (``_Covered``) and what its data waits cost (``_WaitSums``); and the
immutable views the exporters read (``JobView``, ``RankView``).  The sizes are the module's constants
(see agent.phases.jobs for what they bound)."""
from __future__ import annotations

import logging
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, List, Optional, Tuple

from ..metrics import HistogramValue
from . import attribution, cause, jobconfig, parts, traces
from .protocol import PHASES, STEP_BUCKETS
from .verdict import Evidence, Verdict

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
    trace: Optional[traces.TraceView] = None   # its latest trace on request and the totals (phases.traces)

    @property
    def training_pids(self) -> List[int]:
        """The job's training processes on this node: its ranks', else the first process that sent its phases
        (the processes whose memory and CPU are the job's: agent.phases.memory, agent.phases.jobcpu)."""
        return [r.pid for r in self.ranks] or [self.pid]

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
                 "pod", "configs", "inside", "traces")

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
        self.traces = traces.Traces()             # the traces its processes took on request (teye trace)


def _ranked(job: _Job):
    """The pids of a job that said their rank: its ranks' and the untracked ranks'."""
    return (*job.ranks, *job.untracked)
