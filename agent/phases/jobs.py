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

The table's parts, one module each: ``jobstate`` (the bounded state and the views), ``admission``
(which jobs it holds, for whom, for how long), ``intake`` (a message applied), ``judging``
(GPU idle and waits credited, evidence, verdicts, views).  ``JobTable`` joins them and owns the
lock; this module re-exports their names.
"""
from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict, deque
from typing import Callable, Deque, Dict, FrozenSet, Mapping, Optional, Tuple

from ..logutil import RateLimitedLog
from . import jobconfig
from .protocol import ACCEPTED, RESULTS, STEP_BUCKETS, Limits, Rejected, decode, identity_of
from .verdict import Thresholds
from .admission import Admission
from .intake import Intake, _add_counts
from .judging import Judging
# the parts' names, re-exported: callers import them from here
from .jobstate import (ATTRIBUTION_RESULTS, COMPILE, COMPUTE, COVER_SPANS, DATA_WAIT, IN_KINDS, IN_KIND_INDEXES,
    IN_STEP, JobView, MAX_PIDS, MAX_REFUSED_UIDS, MAX_UNCLAIMED, MAX_UNTRACKED, MAX_WAITS, NP, OPEN_PER_PID,
    PHASE_INDEX, REFUSED_LOG_NS, RING_SLOTS, RUN_END_SILENCE_NS, RankView, STEP, WAIT_COVER_NS, WINDOWS, _Covered,
    _Job, _Rank, _Ring, _WaitSums, _ranked)

log = logging.getLogger("teye.phases")


class JobTable(Admission, Intake, Judging):
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

    def quiet(self):
        """The table's counters (results, attribution results, configuration results), which only a datagram
        moves; None while ``views()`` has time-driven work besides its jobs (shed datagrams to claim or expire,
        refusals to log).  Two equal answers around a ``views()`` that found no job: it would return the same
        again (the phases collector's idle read, issue 49)."""
        with self._lock:
            if self._unclaimed or self.refused:
                return None
            return tuple(self.results.values()), tuple(self.attributed.values()), tuple(self.config_results.values())

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
