"""The traces a job's processes took on request (`teye trace`, issue 46), as their zero-code clients report them.

Each process that finished a trace sends, with its next datagram, ``"trace": [result, first_step, steps, id]``
(result 1: written, 2: failed).  The job keeps the latest trace (the one whose id was reported last, by any
of its processes) with how many processes wrote or failed it, and totals over the run; exported as
``teye_job_trace_*`` (agent.phases.source): a dashboard marks when the latest trace was taken and names it,
the files themselves stay where the job wrote them (only its user can read them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

DONE, FAILED = 1, 2
RESULTS = {DONE: "done", FAILED: "failed"}


@dataclass(frozen=True)
class TraceView:
    """A job's latest trace and its totals, as exported."""

    id: str
    time: float                     # Unix time its first process's report arrived
    steps: int                      # steps each process traced
    first_step: int                 # the step it began at (counted from each process's first step)
    done: int                       # processes that wrote it
    failed: int                     # processes whose trace failed
    totals: Tuple[Tuple[str, int], ...]   # (result, processes) over the run: done, failed


class Traces:
    """One job's traces.  ``note`` from the job table's intake (one report per process and trace)."""

    __slots__ = ("id", "time", "steps", "first_step", "done", "failed", "total_done", "total_failed")

    def __init__(self):
        self.id: Optional[str] = None
        self.time = 0.0
        self.steps = self.first_step = self.done = self.failed = 0
        self.total_done = self.total_failed = 0

    def note(self, result: int, first_step: int, steps: int, trace_id: str, now_s: float) -> None:
        if trace_id != self.id:
            self.id, self.time, self.steps, self.first_step = trace_id, now_s, steps, first_step
            self.done = self.failed = 0
        if result == DONE:
            self.done += 1
            self.total_done += 1
        else:
            self.failed += 1
            self.total_failed += 1

    def view(self) -> Optional[TraceView]:
        if self.id is None:
            return None
        return TraceView(self.id, self.time, self.steps, self.first_step, self.done, self.failed,
                         (("done", self.total_done), ("failed", self.total_failed)))
