"""What a process did during one data_wait interval: pure functions over /proc samples.

The input probe (``agent.phases.procstat``) keeps cumulative readings of each sending
process every few tens of milliseconds: CPU seconds (all threads), bytes read, pressure
stall seconds.  The usage during a data_wait interval ``[s, e)`` is the difference of the
cumulative values at ``e`` and at ``s``, each linearly interpolated between the two samples
around it; an interval that the samples do not cover on both sides has no usage (None).
The error is bounded by what happens within one sample period at either end, so it
shrinks relative to the wait as waits get longer: exactly the waits that matter.
"""
from __future__ import annotations

import bisect
from typing import NamedTuple, Optional, Sequence

from .procstat import ProcSample


class WaitUsage(NamedTuple):
    cpu_s: float
    read_bytes: Optional[int]
    io_stall_s: Optional[float]
    cpu_stall_s: Optional[float]
    run_delay_s: Optional[float] = None


def value_at(samples: Sequence[ProcSample], times: Sequence[int], t_ns: int, field: int) -> Optional[float]:
    """Cumulative ``field`` of ``samples`` at ``t_ns``, interpolated; None outside them or where unknown."""
    i = bisect.bisect_left(times, t_ns)
    if i >= len(samples):
        return None
    b = samples[i]
    if b.t_ns == t_ns:
        return b[field]
    if i == 0:
        return None
    a = samples[i - 1]
    va, vb = a[field], b[field]
    if va is None or vb is None:
        return None
    return va + (vb - va) * (t_ns - a.t_ns) / (b.t_ns - a.t_ns)


def covered(samples: Sequence[ProcSample], start_ns: int, end_ns: int) -> bool:
    return bool(samples) and samples[0].t_ns <= start_ns and samples[-1].t_ns >= end_ns


def wait_usage(samples: Sequence[ProcSample], start_ns: int, end_ns: int,
               times: Optional[Sequence[int]] = None) -> Optional[WaitUsage]:
    """CPU seconds, bytes read and stall seconds of one process during [start_ns, end_ns).

    ``samples`` are one process's readings, oldest first; ``times`` their ``t_ns`` (pass them when
    measuring many waits on the same samples: a ring holds up to 1,200).  None when they do not
    cover the interval; a field is None when either end of it is unknown (e.g. /proc/<pid>/io
    unreadable).  Counters never run backwards, so a negative difference (a reset) counts as 0.
    """
    if not covered(samples, start_ns, end_ns):
        return None
    if times is None:
        times = [s.t_ns for s in samples]

    def delta(field: int) -> Optional[float]:
        a, b = value_at(samples, times, start_ns, field), value_at(samples, times, end_ns, field)
        return None if a is None or b is None else max(0.0, b - a)

    cpu = delta(1)
    rb = delta(2)
    return WaitUsage(cpu or 0.0, None if rb is None else int(round(rb)), delta(3), delta(4),
                     starved_delay(delta(5), delta(6), delta(7)))


def starved_delay(delay: Optional[float], woken: Optional[float], preempted: Optional[float]) -> Optional[float]:
    """The main thread's run-queue wait that counts as CPU demand: the share of it that followed a preemption
    (the thread was working: a decoder starved of CPU), not a wake-up from a wait (a thread that slept on
    a queue, a lock, a timer, then queued for a CPU behind the neighbours' work: their load, not the job's
    demand).  Each switch is taken to be followed by an equal wait (the counts are all /proc gives); with
    the counts unknown, or no switch in the interval, the whole delay counts, as before."""
    if delay is None or woken is None or preempted is None or woken + preempted <= 0:
        return delay
    return delay * preempted / (woken + preempted)
