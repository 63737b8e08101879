"""The job table: what the agent knows about each live training job, in bounded memory.

Jobs are keyed by the sender's kernel-supplied uid and the claimed name, ``(uid, name)``,
so a message from uid B naming a job of uid A lands in B's own job, never in A's.  The
exported ``train_job`` label is the name as sent for trusted uids (the agent's own uid
and ``phases.trusted_uids``) and ``USER/NAME`` for everyone else: another user can
neither add to nor squat on a trusted user's job name.

Memory per job is fixed: per-phase totals (7 phases), a 30-slot ring of sums over the
sliding window, a step-time histogram, at most 64 pids, at most ``max_pending_intervals``
intervals waiting for GPU samples, and GPU idle totals per (GPU, phase) for the GPUs the
agent samples.  At most ``max_jobs`` jobs (and ``max_jobs_per_user`` per uid) are live;
a job silent for ``job_expiry_seconds`` expires and its series disappear.
"""
from __future__ import annotations

import logging
import os
import threading
from bisect import bisect_left
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Deque, Dict, FrozenSet, Mapping, Optional, Tuple

from ..gpu.procinfo import user_name
from ..logutil import RateLimitedLog
from ..metrics import HistogramValue, histogram_value
from . import attribution
from .protocol import ACCEPTED, PHASES, RESULTS, Limits, Message, Rejected, decode
from .verdict import Evidence, Thresholds, Verdict, decide

log = logging.getLogger("teye.phases")

NP = len(PHASES)
PHASE_INDEX = {p: i for i, p in enumerate(PHASES)}
STEP = -1                       # pending-interval key of a step (phases use their index)
RING_SLOTS = 30
MAX_PIDS = 64
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ATTRIBUTION_RESULTS = ("complete", "late", "overflow")


class _Ring:
    """Sums over a sliding window in RING_SLOTS time slots (fixed size)."""

    __slots__ = ("width", "idx", "phase", "step_s", "steps", "idle", "obs", "step_idle", "step_obs", "step_attr")

    def __init__(self, window_ns: int):
        self.width = max(1, window_ns // RING_SLOTS)
        n = RING_SLOTS
        self.idx = [-1] * n
        self.phase = [[0.0] * NP for _ in range(n)]
        self.step_s = [0.0] * n
        self.steps = [0] * n
        self.idle = [[0.0] * NP for _ in range(n)]   # GPU idle overlapping each phase (summed over GPUs)
        self.obs = [0.0] * n                          # GPU observed time during phases
        self.step_idle = [0.0] * n                    # GPU idle during steps
        self.step_obs = [0.0] * n                     # GPU observed time during steps
        self.step_attr = [False] * n                  # whether any step was attributed to GPUs here

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
            self.phase[i] = [0.0] * NP
            self.idle[i] = [0.0] * NP
            self.step_s[i] = self.obs[i] = self.step_idle[i] = self.step_obs[i] = 0.0
            self.steps[i] = 0
            self.step_attr[i] = False
        return i

    def live(self, now_ns: int):
        cur = now_ns // self.width
        return [i for i in range(RING_SLOTS) if cur - RING_SLOTS < self.idx[i] <= cur]


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
    samples: int
    step_hist: HistogramValue
    input_bound_ratio: Optional[float]
    gpu_idle_seconds: Tuple[Tuple[str, str, float], ...]   # (gpu, phase, seconds)
    gpu_idle_ratio: Optional[float]
    last_message_age_s: float
    client_dropped: int
    verdict: Verdict
    evidence: Evidence


class _Job:
    __slots__ = ("key", "label", "user", "uid", "first_pid", "pids", "created_ns", "last_ns", "phase_s", "steps", "samples",
                 "hist", "hist_sum", "gpu_idle", "pending", "ring")

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


class JobTable:
    """Applies validated messages and turns them into JobViews; thread-safe (one lock)."""

    def __init__(self, cfg: Mapping, ctx, own_uid: Optional[int] = None, record_intervals: int = 0):
        """``cfg`` is the ``phases`` config section; ``ctx`` an AgentContext (clock, timeline, gpu_pids).

        ``record_intervals`` > 0 keeps the newest that many raw intervals (for `teye profile`'s timeline).
        """
        self.ctx = ctx
        self.max_jobs = cfg["max_jobs"]
        self.max_per_user = cfg["max_jobs_per_user"]
        self.expiry_ns = int(cfg["job_expiry_seconds"] * 1e9)
        self.window_ns = int(cfg["window_seconds"] * 1e9)
        self.max_pending = cfg["max_pending_intervals"]
        self.max_delay_ns = int(cfg["attribution_max_delay_seconds"] * 1e9)
        self.limits = Limits(cfg["max_message_bytes"], cfg["max_records_per_message"], self.expiry_ns)
        self.thresholds = Thresholds.from_config(cfg)
        own = os.getuid() if own_uid is None else own_uid
        self.trusted = frozenset([own, *cfg["trusted_uids"]])
        self.results: Dict[str, int] = {r: 0 for r in RESULTS}
        self.attributed: Dict[str, int] = {r: 0 for r in ATTRIBUTION_RESULTS}
        self.recorded: Optional[Deque] = deque(maxlen=record_intervals) if record_intervals else None
        self._jobs: "OrderedDict[Tuple[int, str], _Job]" = OrderedDict()
        self._labels: Dict[str, Tuple[int, str]] = {}
        self._per_uid: Dict[int, int] = {}
        self._users: Dict[int, str] = {}
        self._known_gpus: FrozenSet[str] = frozenset()
        self._lock = threading.Lock()
        self._rlog = RateLimitedLog(log)

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
        with self._lock:
            result = self._apply(msg, pid, uid, now)
            self.results[result] += 1
        if result != ACCEPTED:
            self._rlog.warning(f"reject:{result}", "phase message from pid %d uid %d for job %r rejected: %s "
                               "(%d jobs live, limit %d, %d per user)", pid, uid, msg.job, result,
                               len(self._jobs), self.max_jobs, self.max_per_user)
        return result

    def _user(self, uid: int) -> str:
        name = self._users.get(uid)
        if name is None:
            if len(self._users) > 4096:
                self._users.clear()
            name = self._users[uid] = user_name(uid)
        return name

    def _label(self, uid: int, name: str) -> str:
        if uid in self.trusted:
            label = name
            if label not in self._labels:
                return label
        label = f"{self._user(uid)}/{name}"
        if label in self._labels:  # two uids with the same user name (or a trusted name clash)
            label = f"uid{uid}/{name}"
        return label

    def _new_job(self, key, pid: int, uid: int, now_ns: int) -> Optional[_Job]:
        if len(self._jobs) >= self.max_jobs or self._per_uid.get(uid, 0) >= self.max_per_user:
            self._expire(now_ns)
        if len(self._jobs) >= self.max_jobs or self._per_uid.get(uid, 0) >= self.max_per_user:
            return None
        label = self._label(uid, key[1])
        job = _Job(key, label, self._user(uid), uid, pid, now_ns, self.window_ns, self.max_pending)
        self._jobs[key] = job
        self._labels[label] = key
        self._per_uid[uid] = self._per_uid.get(uid, 0) + 1
        return job

    def _apply(self, msg: Message, pid: int, uid: int, now: int) -> str:
        key = (uid, msg.job)
        job = self._jobs.get(key)
        if job is None:
            job = self._new_job(key, pid, uid, now)
            if job is None:
                return "job_limit"
        else:
            self._jobs.move_to_end(key)
        job.last_ns = now
        if pid in job.pids or len(job.pids) < MAX_PIDS:
            job.pids[pid] = max(job.pids.get(pid, 0), msg.dropped)
        gpus = ()
        if msg.phases or msg.steps:
            gpus = attribution.resolve_gpus(pid, msg.cvd, self.ctx.gpu_pids, self._known_gpus)
        ring = job.ring
        rec = self.recorded
        phase_s = job.phase_s
        # records ending in the current ring slot (nearly all of them) skip ring.slot()
        width = ring.width
        cur = now // width
        cur_slot = ring.slot(now, now)
        for phase, s, e in msg.phases:
            i = PHASE_INDEX[phase]
            d = (e - s) / 1e9
            phase_s[i] += d
            slot = cur_slot if e // width >= cur else ring.slot(e, now)
            if slot is not None:
                ring.phase[slot][i] += d
            if gpus:
                self._queue(job, attribution.Pending((i, e), s, e, gpus))
            if rec is not None:
                rec.append((job.label, phase, s, e))
        for s, e, samples in msg.steps:
            d = (e - s) / 1e9
            job.steps += 1
            job.samples += samples
            job.hist_sum += d
            job.hist[bisect_left(STEP_BUCKETS, d)] += 1  # first bucket with d <= le
            slot = cur_slot if e // width >= cur else ring.slot(e, now)
            if slot is not None:
                ring.step_s[slot] += d
                ring.steps[slot] += 1
            if gpus:
                self._queue(job, attribution.Pending((STEP, e), s, e, gpus))
            if rec is not None:
                rec.append((job.label, "step", s, e))
        return ACCEPTED

    def _queue(self, job: _Job, p: attribution.Pending) -> None:
        if len(job.pending) == job.pending.maxlen:
            self.attributed["overflow"] += 1  # the oldest waiting interval is pushed out unattributed
        job.pending.append(p)

    # -- periodic work (the sampler's thread) ------------------------------------------------
    def _expire(self, now_ns: int) -> None:
        while self._jobs:
            key, job = next(iter(self._jobs.items()))
            if now_ns - job.last_ns < self.expiry_ns:
                break
            self._drop(key)

    def _drop(self, key) -> None:
        job = self._jobs.pop(key)
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
            for job in self._jobs.values():
                if not job.pending:
                    continue
                ready, late = attribution.take_ready(job.pending, tl.covered_until, now_ns, self.max_delay_ns, force)
                if not ready:
                    continue
                self.attributed["late"] += len(late)
                self.attributed["complete"] += len(ready) - len(late)
                ring = job.ring
                for ((kind, end), gpu), (idle, obs) in attribution.attribute_pending(ready, tl.window).items():
                    slot = ring.slot(end, now_ns)
                    if kind == STEP:
                        if slot is not None:
                            ring.step_idle[slot] += idle
                            ring.step_obs[slot] += obs
                            ring.step_attr[slot] = True
                        continue
                    job.gpu_idle[(gpu, kind)] = job.gpu_idle.get((gpu, kind), 0.0) + idle
                    if slot is not None:
                        ring.idle[slot][kind] += idle
                        ring.obs[slot] += obs

    def views(self, now_ns: int):
        """Expire silent jobs, then return (JobViews, message counts, attribution counts, pending)."""
        with self._lock:
            self._expire(now_ns)
            views = tuple(self._view(j, now_ns) for j in self._jobs.values())
            pending = sum(len(j.pending) for j in self._jobs.values())
            return views, tuple(self.results.items()), tuple(self.attributed.items()), pending

    def _evidence(self, job: _Job, now_ns: int) -> Evidence:
        ring = job.ring
        live = ring.live(now_ns)
        phase = [0.0] * NP
        idle = [0.0] * NP
        step_s = obs = step_idle = step_obs = 0.0
        steps = 0
        step_attr = False
        for i in live:
            for k in range(NP):
                phase[k] += ring.phase[i][k]
                idle[k] += ring.idle[i][k]
            step_s += ring.step_s[i]
            steps += ring.steps[i]
            obs += ring.obs[i]
            step_idle += ring.step_idle[i]
            step_obs += ring.step_obs[i]
            step_attr = step_attr or ring.step_attr[i]
        return Evidence(
            window_s=min(self.window_ns, max(0, now_ns - job.created_ns)) / 1e9,
            phase_seconds={p: phase[k] for k, p in enumerate(PHASES) if phase[k]},
            step_seconds=step_s,
            steps=steps,
            gpu_idle_seconds={p: idle[k] for k, p in enumerate(PHASES) if idle[k]},
            gpu_observed_seconds=step_obs if step_attr else obs,
            gpu_step_idle_seconds=step_idle if step_attr else None,
            silent_s=max(0.0, (now_ns - job.last_ns) / 1e9),
        )

    def _view(self, job: _Job, now_ns: int) -> JobView:
        ev = self._evidence(job, now_ns)
        t = ev.step_time
        ratio = min(1.0, ev.phase_seconds.get("data_wait", 0.0) / t) if t > 0 else None
        return JobView(
            train_job=job.label, user=job.user, uid=job.uid, pid=job.first_pid, processes=len(job.pids),
            phase_seconds=tuple((p, job.phase_s[k]) for k, p in enumerate(PHASES) if job.phase_s[k] or k < 4),
            steps=job.steps, samples=job.samples,
            step_hist=histogram_value(STEP_BUCKETS, job.hist, job.hist_sum),
            input_bound_ratio=ratio,
            gpu_idle_seconds=tuple((g, PHASES[k], v) for (g, k), v in sorted(job.gpu_idle.items())),
            gpu_idle_ratio=ev.gpu_idle_ratio,
            last_message_age_s=ev.silent_s,
            client_dropped=sum(job.pids.values()),
            verdict=decide(ev, self.thresholds),
            evidence=ev,
        )
