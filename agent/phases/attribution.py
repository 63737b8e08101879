"""GPU idle time per training phase: pure functions over driver samples and phase intervals.

The GPU source publishes each driver utilization sample as an interval
``[start_ns, end_ns)`` with a busy ratio (``agent.context.UtilSample``).  The GPU idle
time overlapping a phase interval ``[s, e)`` is

    sum over samples k of  (1 - busy_k) * |[start_k, end_k) ∩ [s, e)|

and the *observed* time is the same sum without the ``(1 - busy_k)`` factor (the part
of the interval that driver samples cover at all).  Phases that overlap each other
(e.g. communication overlapping compute) each get their full overlap: the split is
"idle while this phase was running", not a partition.

Attribution is incremental: a phase interval usually reaches the agent before the GPU
samples that cover it (the driver's ring is read once a second).  :func:`take_ready`
picks the intervals whose GPUs are covered up to their end, or that waited too long.
"""
from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Callable, Deque, Dict, FrozenSet, Hashable, Iterable, List, NamedTuple, Sequence, Tuple

NS = 1e9


class Pending(NamedTuple):
    """A phase (or step) interval waiting for the GPU samples that cover it."""

    key: Hashable          # what the result is credited to, e.g. (job, phase)
    start_ns: int
    end_ns: int
    gpus: Tuple[str, ...]  # GPUs the sending process uses


def overlap_ns(a0: int, a1: int, b0: int, b1: int) -> int:
    """Length of [a0, a1) ∩ [b0, b1) in ns (0 when disjoint)."""
    return max(0, min(a1, b1) - max(a0, b0))


def idle_observed(samples: Sequence, start_ns: int, end_ns: int) -> Tuple[float, float]:
    """(idle seconds, observed seconds) of one GPU over [start_ns, end_ns).

    ``samples`` are non-overlapping and sorted by time (UtilSample: start_ns, end_ns, busy).
    """
    ends = [s.end_ns for s in samples]
    return _idle_observed(samples, ends, start_ns, end_ns)


def _idle_observed(samples: Sequence, ends: List[int], start_ns: int, end_ns: int) -> Tuple[float, float]:
    idle = observed = 0
    i = bisect.bisect_right(ends, start_ns)
    n = len(samples)
    while i < n:
        smp = samples[i]
        if smp.start_ns >= end_ns:
            break
        ov = min(end_ns, smp.end_ns) - max(start_ns, smp.start_ns)
        if ov > 0:
            observed += ov
            idle += (1.0 - smp.busy) * ov
        i += 1
    return idle / NS, observed / NS


def attribute(intervals: Iterable[Tuple[Hashable, int, int]], samples: Sequence) -> Dict[Hashable, Tuple[float, float]]:
    """Sum (idle s, observed s) per key for intervals ``(key, start_ns, end_ns)`` on one GPU's samples."""
    ends = [s.end_ns for s in samples]
    out: Dict[Hashable, List[float]] = defaultdict(lambda: [0.0, 0.0])
    for key, s, e in intervals:
        idle, obs = _idle_observed(samples, ends, s, e)
        acc = out[key]
        acc[0] += idle
        acc[1] += obs
    return {k: (v[0], v[1]) for k, v in out.items()}


def take_ready(pending: Deque[Pending], covered_until: Callable[[str], int], now_ns: int,
               max_delay_ns: int, force: bool = False) -> Tuple[List[Pending], List[Pending]]:
    """Pop the intervals that can be attributed now, oldest first.

    An interval is ready when every one of its GPUs has samples up to its end, or when it
    ended more than ``max_delay_ns`` ago (then it is attributed with whatever samples
    exist), or when ``force`` is set (end of a profile).  Intervals arrive in time order
    per process, so the scan stops at the first one that must still wait: the cost is
    the number of ready intervals, not the queue length.

    Returns (ready, timed_out): timed_out is the subset that did not wait for full coverage.
    """
    ready: List[Pending] = []
    late: List[Pending] = []
    cache: Dict[str, int] = {}
    while pending:
        p = pending[0]
        covered = True
        for g in p.gpus:
            c = cache.get(g)
            if c is None:
                c = cache[g] = covered_until(g)
            if c < p.end_ns:
                covered = False
                break
        if covered:
            ready.append(pending.popleft())
        elif force or now_ns - p.end_ns > max_delay_ns:
            late.append(pending.popleft())
            ready.append(late[-1])
        else:
            break
    return ready, late


def attribute_pending(ready: Sequence[Pending], window: Callable[[str, int, int], Sequence]
                      ) -> Dict[Tuple[Hashable, str], Tuple[float, float]]:
    """(idle s, observed s) per (key, gpu) for ready intervals, one timeline query per GPU."""
    by_gpu: Dict[str, List[Tuple[Hashable, int, int]]] = defaultdict(list)
    for p in ready:
        for g in p.gpus:
            by_gpu[g].append((p.key, p.start_ns, p.end_ns))
    out: Dict[Tuple[Hashable, str], Tuple[float, float]] = {}
    for g, ivs in by_gpu.items():
        lo = min(s for _, s, _ in ivs)
        hi = max(e for _, _, e in ivs)
        samples = window(g, lo, hi)
        for key, val in attribute(ivs, samples).items():
            out[(key, g)] = val
    return out


def resolve_gpus(pid: int, cvd: Tuple[str, ...], gpu_pids, known_gpus: FrozenSet[str]) -> Tuple[str, ...]:
    """GPUs a sending process uses: NVML's process list first, else its CUDA_VISIBLE_DEVICES.

    CUDA_VISIBLE_DEVICES entries count only when they name a GPU the agent samples (an
    index or a label the GPU source uses), so a message cannot invent GPU labels.
    """
    held = gpu_pids.get(pid)
    if held:
        return tuple(sorted(held))
    if not cvd or not known_gpus:
        return ()
    return tuple(sorted({c for c in cvd if c in known_gpus}))
