"""Memory per training process (issue 45; docs/phases.md "Memory and creep"): the resident memory of each
process that sends a job's steps (read here, ``/proc/<pid>/statm`` through :class:`ProcReader`) and the device
memory its zero-code client sent at its latest step (``JobView.inside``: CUDA's allocated, reserved, and the
peak allocated during the step), and whether one of them creeps.

Creep, the criterion (the same as the ``TeyeJobMemoryCreep`` rule's, deploy/prometheus/rules/teye-jobs-memory.yml):
over the last ``window_s`` (30 minutes), cut in three thirds, a process's memory of one kind

* grew by at least ``min_growth`` bytes (256 MiB) from the window's start to its end,
* rose from each third to the next by at least an eighth of that (their means),
* moved inside each third by at least a sixteenth of it (a one-time jump is flat on either side), and
* never fell back: each third's lowest is at least the previous third's highest, less a sixteenth of it.

Warm-up and a cache that fills once rise in one third and then stay: no creep (the next third's mean does not
rise); a sawtooth that returns drops somewhere in the window, below an earlier third's highest: no creep, whatever
its period (the drop is seen in every sample, not only at the thirds' edges).  A rise that lasts longer than the
window looks like a leak until it returns: the alert's ``for`` adds 15 minutes.  The sentence says how much, over how many steps, and per
step ("rank 0's resident memory grew 1.9 GB over 600 steps, 3.2 MB a step").
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, Iterable, Optional, Tuple

from .procstat import Gone, ProcReader

log = logging.getLogger("teye.phases")

KINDS = ("host_resident", "device_allocated", "device_reserved", "device_peak")
WORDS = {"host_resident": "resident memory", "device_allocated": "allocated GPU memory",
         "device_reserved": "reserved GPU memory", "device_peak": "peak GPU memory"}
WINDOW_S = 1800.0
EVERY_S = 10.0
MIN_GROWTH = 256 * 2**20
MAX_PROCS = 256                 # processes followed at once (the job table's bound is 64 per job)


@dataclass(frozen=True)
class ProcMemory:
    """One process of a job: its memory by kind (absent kinds left out), bytes."""

    rank: Optional[int]
    pid: int
    values: Tuple[Tuple[str, int], ...]


@dataclass(frozen=True)
class Creep:
    """A process's memory that grew steadily over the window."""

    rank: Optional[int]
    pid: int
    kind: str
    grew_bytes: int
    steps: int
    seconds: float

    def sentence(self, who: Optional[str] = None) -> str:
        """In words; ``who`` (the subject, possessive: "the job's") where not this rank's or pid's."""
        if who is None:
            who = f"rank {self.rank}'s" if self.rank is not None else f"pid {self.pid}'s"
        per = (f", {_size(self.grew_bytes / self.steps)} a step" if self.steps > 0 else "")
        steps = f"{self.steps} steps" if self.steps > 0 else f"{self.seconds / 60:.0f} minutes"
        return f"{who} {WORDS[self.kind]} grew {_size(self.grew_bytes)} over {steps}{per}"


@dataclass(frozen=True)
class JobMemory:
    train_job: str
    processes: Tuple[ProcMemory, ...]
    creep: Optional[Creep] = None

    def total(self, kind: str) -> Optional[int]:
        """The kind summed over the job's processes on this node (None: none has it)."""
        vals = [v for p in self.processes for k, v in p.values if k == kind]
        return sum(vals) if vals else None


def _size(b: float) -> str:
    for unit, n in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= n:
            return f"{b / n:.1f} {unit}"
    return f"{b:.0f} B"


class _History:
    __slots__ = ("samples", "last_ns")

    def __init__(self, n: int):
        self.samples: Deque[Tuple[int, int, Dict[str, int]]] = deque(maxlen=n)   # (t_ns, steps, kind -> bytes)
        self.last_ns = 0


class MemoryWatch:
    """Reads each live job's processes' resident memory at every collect, keeps a sample per process every
    ``every_s`` over ``window_s``, and judges creep (the module's criterion)."""

    def __init__(self, reader: ProcReader, window_s: float = WINDOW_S, every_s: float = EVERY_S,
                 min_growth: int = MIN_GROWTH):
        self.reader = reader
        self.window_ns = int(window_s * 1e9)
        self.every_ns = int(every_s * 1e9)
        self.min_growth = min_growth
        self.hist: Dict[Tuple[str, int], _History] = {}

    def observe(self, views: Iterable, now_ns: int) -> Tuple[JobMemory, ...]:
        out = []
        seen = set()
        for j in views:
            if j.ended:
                continue
            device = {p.pid: p.device for p in j.inside.processes} if j.inside is not None else {}
            ranks = {r.pid: (r.rank, r.steps) for r in j.ranks}
            procs = []
            creep = None
            for pid in j.training_pids:
                rank, steps = ranks.get(pid, (None, j.steps))
                vals = {}
                try:
                    vals["host_resident"] = self.reader.resident(pid)
                except Gone as e:
                    log.debug("job %s: no resident memory for pid %d: %s", j.train_job, pid, e)
                dev = device.get(pid)
                if dev is not None:
                    vals["device_allocated"], vals["device_reserved"], vals["device_peak"] = dev
                if not vals:
                    continue
                procs.append(ProcMemory(rank, pid, tuple((k, vals[k]) for k in KINDS if k in vals)))
                key = (j.train_job, pid)
                seen.add(key)
                c = self._note(key, now_ns, steps, vals, rank, pid)
                if c is not None and (creep is None or c.grew_bytes > creep.grew_bytes):
                    creep = c
            out.append(JobMemory(j.train_job, tuple(procs), creep))
        for key in [k for k in self.hist if k not in seen]:
            del self.hist[key]
        return tuple(out)

    def _note(self, key, now_ns: int, steps: int, vals: Dict[str, int], rank, pid) -> Optional[Creep]:
        h = self.hist.get(key)
        if h is None:
            if len(self.hist) >= MAX_PROCS:
                return None
            h = self.hist[key] = _History(int(self.window_ns // max(self.every_ns, 1)) + 2)
        if not h.samples or now_ns - h.last_ns >= self.every_ns:
            h.samples.append((now_ns, steps, dict(vals)))
            h.last_ns = now_ns
        return self.judge(h.samples, rank, pid)

    def judge(self, samples, rank=None, pid=0) -> Optional[Creep]:
        """The creep of the samples (t_ns, steps, kind -> bytes), oldest first, by the module's criterion."""
        if len(samples) < 6:
            return None
        t_end = samples[-1][0]
        if t_end - samples[0][0] < self.window_ns:
            return None
        start = t_end - self.window_ns
        third = self.window_ns / 3
        inside = [s for s in samples if s[0] >= start]
        first = inside[0]
        g = self.min_growth
        worst = None
        for kind in KINDS:
            parts = [[], [], []]
            for t, _n, vals in inside:
                v = vals.get(kind)
                if v is None:
                    break
                parts[min(int((t - start) // third), 2)].append(v)
            else:
                if not all(parts):
                    continue
                avg = [sum(p) / len(p) for p in parts]
                grew = inside[-1][2][kind] - first[2][kind]
                if (grew >= g
                        and all(avg[k + 1] - avg[k] >= g / 8 for k in range(2))
                        and all(max(p) - min(p) >= g / 16 for p in parts)
                        and all(min(parts[k + 1]) >= max(parts[k]) - g / 16 for k in range(2))):
                    c = Creep(rank, pid, kind, grew, inside[-1][1] - first[1], (inside[-1][0] - first[0]) / 1e9)
                    if worst is None or c.grew_bytes > worst.grew_bytes:
                        worst = c
        return worst
