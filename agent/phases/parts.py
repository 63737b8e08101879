"""The parts of a job's step compute and its processes' device memory, as the zero-code client sends them
(issue 45; protocol ``parts`` and ``mem``; docs/phases.md "Inside the step").

A message's ``parts`` are the ns of forward, backward, optimizer and host-to-device copy inside the compute of
the steps it carries.  They are taken where they fit in the compute the message added (the job table's count,
its overlaps merged): a message whose parts exceed it (a client of another version, a bug) adds none, and its
compute is all ``other``.  So, per job and per rank, the parts never exceed the compute, and ``other`` (the
compute less the parts: zero_grad, the loss, a scheduler, Python between them) makes them add up to it.

Kept by the job table beside each job (``_Job.inside``), exported through ``JobView.inside``.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from .protocol import PARTS

log = logging.getLogger("teye.phases")

EXPORTED = PARTS + ("other",)    # the part label's values
NPARTS = len(PARTS)
SLACK_S = 1e-6                   # rounding of ns summed as float seconds
_LOG_EVERY_NS = 60 * 10**9


@dataclass(frozen=True)
class RankInside:
    """One process's parts and device memory, as exported (rank None: a process that said no rank)."""

    rank: Optional[int]
    pid: int
    part_seconds: Tuple[Tuple[str, float], ...]        # EXPORTED order, other last
    device: Optional[Tuple[int, int, int]] = None      # allocated, reserved, peak bytes at its latest step


@dataclass(frozen=True)
class InsideView:
    """A job's parts (summed over its processes) and its processes' (by rank, then pid)."""

    part_seconds: Tuple[Tuple[str, float], ...]
    processes: Tuple[RankInside, ...] = ()


class _Proc:
    __slots__ = ("parts", "compute", "device")

    def __init__(self):
        self.parts = [0.0] * NPARTS
        self.compute = 0.0       # compute seconds the process's messages with parts added (other's share)
        self.device = None


class Inside:
    """A job's parts and device memory, per process (bounded by the job table's MAX_PIDS: it is called for
    known pids only)."""

    __slots__ = ("procs", "refused", "_logged_ns", "_other")

    def __init__(self):
        self.procs: Dict[int, _Proc] = {}
        self._other: Dict[Optional[int], float] = {}   # pid (None: the job) -> the other exported last
        self.refused = 0          # messages whose parts exceeded the compute they came with
        self._logged_ns = 0

    def apply(self, pid: int, parts, mem, compute_added_s: float) -> None:
        """A message of pid's: its parts, where they fit in the compute it added; its device memory."""
        p = self.procs.get(pid)
        if p is None:
            p = self.procs[pid] = _Proc()
        if mem is not None:
            p.device = mem
        if parts is None:
            return
        add = [x / 1e9 for x in parts]
        excess = sum(add) - compute_added_s
        if excess > SLACK_S:
            self.refused += 1
            now = time.monotonic_ns()
            if now - self._logged_ns >= _LOG_EVERY_NS:
                self._logged_ns = now
                log.warning("pid %d: step parts of %.6f s in a message that added %.6f s of compute: not taken "
                            "(%d such messages so far; its compute counts as other)", pid, sum(add),
                            compute_added_s, self.refused)
            return
        if excess > 0:   # rounding: taken from the last parts, so that they never exceed the compute
            for i in range(NPARTS - 1, -1, -1):
                cut = min(add[i], excess)
                add[i] -= cut
                excess -= cut
        pp = p.parts
        for i in range(NPARTS):
            pp[i] += add[i]
        p.compute += compute_added_s

    def forget(self, pid: int) -> None:
        self.procs.pop(pid, None)
        self._other.pop(pid, None)

    def view(self, job_compute_s: float, ranks: Dict[int, Optional[int]], rank_compute: Dict[int, float]
             ) -> Optional[InsideView]:
        """The job's parts (``other``: its compute less the parts) and its processes': those in ``ranks``
        (pid -> rank), each with its own compute (``rank_compute``), or, for a job without ranks, its processes
        (other: what the parts leave of the compute their messages came with).  None: no process sent parts or
        memory."""
        if not self.procs:
            return None
        total = [0.0] * NPARTS
        procs = []
        for pid, p in self.procs.items():
            for i in range(NPARTS):
                total[i] += p.parts[i]
            compute = rank_compute.get(pid, p.compute)
            procs.append(RankInside(ranks.get(pid), pid, self._with_other(pid, p.parts, compute), p.device))
        procs.sort(key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0, r.pid))
        sent_parts = any(any(p.parts) or p.compute for p in self.procs.values())
        return InsideView(self._with_other(None, total, job_compute_s) if sent_parts else (), tuple(procs))

    def _with_other(self, key, parts, compute_s: float) -> Tuple[Tuple[str, float], ...]:
        """The parts and ``other``, the compute less them: a counter, so never below what was exported
        (float sums of the same intervals in another order differ in their last bits)."""
        other = max(compute_s - sum(parts), self._other.get(key, 0.0), 0.0)
        self._other[key] = other
        return tuple(zip(PARTS, parts)) + (("other", other),)
