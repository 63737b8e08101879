"""GPU idle time per training phase: pure functions over driver samples and phase intervals.

The GPU source publishes each driver utilization sample as an interval
``[start_ns, end_ns)`` with a busy ratio (``agent.context.UtilSample``).  The GPU idle
time overlapping a phase interval ``[s, e)`` is

    sum over samples k of  (1 - busy_k) * |[start_k, end_k) ∩ [s, e)|

and the *observed* time is the same sum without the ``(1 - busy_k)`` factor (the part
of the interval that driver samples cover at all).  Phases that overlap each other
(e.g. communication overlapping compute) each get their full overlap: the split is
"idle while this phase was running", not a partition.

Idle time is summed exactly, in integers (busy ratios are taken in units of 2**-30,
times nanoseconds), so the idle time of any set of intervals inside a step is never
larger than the step's own idle time, not even by a rounding error: a share of GPU idle
time computed from these sums cannot exceed 1.

Attribution is incremental: a phase interval usually reaches the agent before the GPU
samples that cover it (the driver's ring is read once a second).  :func:`take_ready`
picks the intervals whose GPUs are covered up to their end, or that waited too long.

A window of fast steps (protocol version 2) is a Pending with ``ns`` >= 0: ``ns`` nanoseconds of a phase
spread uniformly over [start_ns, end_ns) (at most the resolution, 10 ms).  It gets ``ns / (end - start)`` of
the idle time of that span, so a window spanning a GPU sample boundary is split between the samples in
proportion to its overlap with each (:func:`spread_units`).
"""
from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Callable, Deque, Dict, FrozenSet, Hashable, Iterable, List, NamedTuple, Sequence, Tuple

NS = 1e9
BUSY_ONE = 1 << 30                  # busy ratio 1.0 in the integer units used for exact sums
IDLE_UNIT = float(BUSY_ONE) * NS    # integer idle units per idle second


class Pending(NamedTuple):
    """A phase (or step) interval waiting for the GPU samples that cover it."""

    key: Hashable          # what the result is credited to, e.g. (job, phase)
    start_ns: int
    end_ns: int
    gpus: Tuple[str, ...]  # GPUs the sending process uses
    ns: int = -1           # >= 0: a window's phase time, spread uniformly over [start_ns, end_ns) (see above)


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
    idle, observed = _idle_units(samples, ends, start_ns, end_ns)
    return idle / IDLE_UNIT, observed / NS


def _idle_units(samples: Sequence, ends: List[int], start_ns: int, end_ns: int) -> Tuple[int, int]:
    """(idle in BUSY_ONE x ns units, observed ns): exact integers."""
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
            idle += (BUSY_ONE - round(smp.busy * BUSY_ONE)) * ov
        i += 1
    return idle, observed


def attribute(intervals: Iterable[Tuple[Hashable, int, int]], samples: Sequence) -> Dict[Hashable, Tuple[float, float]]:
    """Sum (idle s, observed s) per key for intervals ``(key, start_ns, end_ns)`` on one GPU's samples."""
    return {k: (i / IDLE_UNIT, o / NS) for k, (i, o) in attribute_units(intervals, samples).items()}


def attribute_units(intervals: Iterable[Tuple[Hashable, int, int]], samples: Sequence) -> Dict[Hashable, Tuple[int, int]]:
    """As :func:`attribute`, in exact integer units (idle: BUSY_ONE x ns, observed: ns)."""
    ends = [s.end_ns for s in samples]
    out: Dict[Hashable, List[int]] = defaultdict(lambda: [0, 0])
    for key, s, e in intervals:
        idle, obs = _idle_units(samples, ends, s, e)
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
                      ) -> Dict[Tuple[Hashable, str], Tuple[int, int]]:
    """(idle, observed) per (key, gpu) for ready intervals in exact integer units (see
    :func:`attribute_units`), one timeline query per GPU."""
    by_gpu: Dict[str, List[Tuple[Hashable, int, int]]] = defaultdict(list)
    spread: Dict[str, List[Pending]] = defaultdict(list)
    for p in ready:
        for g in p.gpus:
            if p.ns < 0:
                by_gpu[g].append((p.key, p.start_ns, p.end_ns))
            else:
                spread[g].append(p)
    out: Dict[Tuple[Hashable, str], Tuple[int, int]] = {}
    for g in set(by_gpu) | set(spread):
        ivs = by_gpu.get(g, [])
        wins = spread.get(g, [])
        lo = min([s for _, s, _ in ivs] + [p.start_ns for p in wins])
        hi = max([e for _, _, e in ivs] + [p.end_ns for p in wins])
        samples = window(g, lo, hi)
        if ivs:
            for key, val in attribute_units(ivs, samples).items():
                out[(key, g)] = val
        if wins:
            ends = [s.end_ns for s in samples]
            for p in wins:
                idle, obs = spread_units(samples, ends, p.start_ns, p.end_ns, p.ns)
                got = out.get((p.key, g))
                out[(p.key, g)] = (idle, obs) if got is None else (got[0] + idle, got[1] + obs)
    return out


def spread_units(samples: Sequence, ends: List[int], start_ns: int, end_ns: int, ns: int) -> Tuple[int, int]:
    """(idle, observed) in exact units for ``ns`` of phase time spread uniformly over [start_ns, end_ns): the
    span's own figures times ns / span, idle rounded down and observed up, so that idle never exceeds observed
    and a part (fewer ns over the same span) never exceeds its whole.  A span of 0 ns holds no time."""
    span = end_ns - start_ns
    if span <= 0 or ns <= 0:
        return 0, 0
    idle, obs = _idle_units(samples, ends, start_ns, end_ns)
    return idle * ns // span, -(-obs * ns // span)


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


def merged(intervals: Iterable[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """The union of half-open intervals as disjoint, sorted intervals."""
    out: List[List[int]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1][1] = b
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def clip_to_step(phases: Iterable[Tuple[int, int, int]], start_ns: int, end_ns: int
                 ) -> Dict[int, List[Tuple[int, int]]]:
    """Per phase key, the disjoint pieces of ``phases`` ``(key, s, e)`` inside the step [start_ns, end_ns).

    The pieces of one key are merged, so their total length never exceeds the step's:
    a phase's share of step time computed from them is at most 1 by construction, even
    when a client reports overlapping phases or phases outside its steps.
    """
    by_key: Dict[int, List[Tuple[int, int]]] = {}
    repeated = False
    for k, a, b in phases:
        if a < start_ns:
            a = start_ns
        if b > end_ns:
            b = end_ns
        if b > a:
            got = by_key.get(k)
            if got is None:
                by_key[k] = [(a, b)]
            else:
                got.append((a, b))
                repeated = True
    if repeated:  # one piece per key (the usual step) is already merged
        for k, v in by_key.items():
            if len(v) > 1:
                by_key[k] = merged(v)
    return by_key
