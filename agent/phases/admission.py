"""Which jobs the job table holds, for whom and for how long: new runs and their labels, the per-uid
and table caps with max-min fair eviction, refused jobs (counted and logged per uid), datagrams the
receiver shed charged to their job, runs that ended, jobs and ranks that expired.  A mixin of
``agent.phases.jobs.JobTable`` (it uses the table's attributes); called under the table's lock."""
from __future__ import annotations

import logging
from typing import Mapping, Optional, Tuple

from ..gpu.procinfo import user_name
from .jobstate import MAX_REFUSED_UIDS, MAX_UNCLAIMED, REFUSED_LOG_NS, RUN_END_SILENCE_NS, _Job, _ranked

log = logging.getLogger("teye.phases")


class Admission:
    """JobTable's admission: which jobs and runs it holds, for whom, for how long."""

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

    def _expire_ranks(self, now_ns: int) -> None:
        """Forget ranks silent for job_expiry_seconds (a rank that died: its series disappear)."""
        for job in self._jobs.values():
            if job.ranks:
                for pid in [p for p, r in job.ranks.items() if now_ns - r.last_ns >= self.expiry_ns]:
                    del job.ranks[pid]
                    self.rank_pids.discard(pid)
                    job.inside.forget(pid)
