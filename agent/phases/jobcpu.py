"""CPU time of each job's processes (issue 47: the job's own CPU where no cgroup of it is seen, as outside Slurm).

A job's CPU on this node is that of its training processes (the ranks that said their rank, else the first
process that sent its phases) with their families: the children they reaped (``cutime + cstime``) and their
live descendants (DataLoader workers, decoders, a Pool's processes), each with the children it reaped, read
through :class:`agent.phases.procstat.ProcReader` (the one door to ``/proc/<pid>``).  Each process counts from its
own start, so the model's construction before its first message is the job's too.

* At every collect, each process's stat (its own ``utime + stime`` and its reaped children's ``cutime +
  cstime``), then each of its live descendants' (their own and their reaped children's): a descendant reaped in
  between is in the parent's ``cutime`` and no longer readable, so it counts once (missing for one reading at
  worst, never twice).  Who the descendants are is looked up every ``family_every_s`` (5 s: listing every
  thread's children is the costly part); one started since counts from its start when found, one whose pid
  went to another process (its start time changed) is dropped.
* A process's figure never falls (a reading that misses a child holds the previous one); a process that exited
  keeps its last figure in the job's sum; a pid whose start time changed is a new process, counted beside it.
* A tracked process found among another's descendants (a rank started by another rank) counts once, as itself.
* The job's CPUs: the union of its training processes' ``Cpus_allowed_list`` (taskset, a cpuset): what the job
  may use, the denominator of its CPU efficiency in ``teye report`` outside Slurm.

Exported as ``teye_job_cpu_seconds_total`` and ``teye_job_cpus`` (agent/phases/source.py).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

from .procstat import Gone, ProcReader

log = logging.getLogger("teye.phases")

FAMILY_EVERY_S = 5.0
MAX_PROCS = 64          # processes kept per job (the job table's bound)


@dataclass(frozen=True)
class JobCpu:
    """One job's CPU on this node."""

    train_job: str
    seconds: Optional[float]             # cumulative, of every process of the job seen so far (module docstring);
    #                                      None: none of its processes could be read (another pid namespace)
    cpus: Optional[int]                  # CPUs its training processes may run on; None: not readable


class _Proc:
    __slots__ = ("start", "own", "family", "kids", "family_ns", "cpus", "gone")

    def __init__(self, start: int):
        self.start = start
        self.own = 0.0          # utime + stime, the highest read
        self.family = 0.0       # cutime + cstime + live descendants', the highest read
        self.kids: Dict[int, Optional[int]] = {}   # live descendants -> their start time (None: not read yet)
        self.family_ns: Optional[int] = None
        self.cpus: Optional[FrozenSet[int]] = None
        self.gone = False

    @property
    def total(self) -> float:
        return self.own + self.family


class CpuWatch:
    """Reads each live job's processes' CPU time at every collect (the module's rules)."""

    def __init__(self, reader: ProcReader, family_every_s: float = FAMILY_EVERY_S):
        self.reader = reader
        self.family_ns = int(family_every_s * 1e9)
        # (train job, job start) -> pid -> [its processes, the newest last]: a reused pid's older process stays
        self.jobs: Dict[Tuple[str, float], Dict[int, List[_Proc]]] = {}
        self.last: Dict[Tuple[str, float], JobCpu] = {}

    def observe(self, views: Iterable, now_ns: int) -> Tuple[JobCpu, ...]:
        out = []
        keep = set()
        for j in views:
            key = (j.train_job, j.start_time)
            keep.add(key)
            if j.ended:   # its processes exited: the last figure stays while the job is exported
                if key in self.last:
                    out.append(self.last[key])
                continue
            procs = self.jobs.setdefault(key, {})
            pids = j.training_pids
            tracked = set(pids)
            for pid in pids:
                self._read(procs, pid, tracked, now_ns)
            seconds = sum(p.total for lst in procs.values() for p in lst) if procs else None
            allowed: Set[int] = set()
            known = False
            for pid in pids:
                lst = procs.get(pid)
                if lst and lst[-1].cpus is not None:
                    allowed |= lst[-1].cpus
                    known = True
            fig = self.last[key] = JobCpu(j.train_job, None if seconds is None else round(seconds, 3),
                                          len(allowed) if known else None)
            out.append(fig)
        for key in [k for k in self.jobs if k not in keep]:
            del self.jobs[key]
        for key in [k for k in self.last if k not in keep]:
            del self.last[key]
        return tuple(out)

    def _read(self, procs: Dict[int, List[_Proc]], pid: int, tracked: Set[int], now_ns: int) -> None:
        lst = procs.get(pid)
        p = lst[-1] if lst else None
        try:
            own, reaped, start = self.reader.cpu(pid)
        except Gone as e:
            if p is not None and not p.gone:
                p.gone = True
                log.debug("job cpu: pid %d: %s (its last figure kept)", pid, e)
            return
        if p is None or p.start != start:    # a new process (or the pid reused by one)
            if p is None and sum(len(x) for x in procs.values()) >= MAX_PROCS:
                return
            p = _Proc(start)
            p.cpus = self.reader.cpus_allowed(pid)
            procs.setdefault(pid, []).append(p)
        p.gone = False
        p.own = max(p.own, own)
        if p.family_ns is None or now_ns - p.family_ns >= self.family_ns:   # who its descendants are now
            p.family_ns = now_ns
            p.kids = {k: p.kids.get(k) for k in self._descendants(pid, tracked)}
        # its reaped children (read above, in the same stat as its own) and its live descendants, after it: a
        # descendant reaped since is in its cutime and no longer readable, so it counts once
        family = reaped
        for k, k_start in list(p.kids.items()):
            try:
                k_own, k_reaped, k_now = self.reader.cpu(k)
            except Gone:
                del p.kids[k]
                continue
            if k_start is None:
                p.kids[k] = k_now
            elif k_now != k_start:    # the descendant exited and its pid went to another process
                del p.kids[k]
                continue
            family += k_own + k_reaped
        p.family = max(p.family, family)

    def _descendants(self, pid: int, tracked: Set[int]) -> List[int]:
        """Its live descendants, less the tracked processes among them and theirs (they count as themselves)."""
        kids = self.reader.descendants(pid)
        inner = [k for k in kids if k in tracked]
        if not inner:
            return kids
        drop = set(inner)
        for k in inner:
            drop.update(self.reader.descendants(k))
        return [k for k in kids if k not in drop]
