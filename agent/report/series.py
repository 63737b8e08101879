"""Pure arithmetic over range-query series: counter increases with resets, presence windows, quantiles.

A series is a sorted list of ``(unix seconds, value)`` points on the query's step grid; the value at
a grid point is the newest sample at or before it (Prometheus' instant-vector rule), so consecutive
differences of a counter are exact differences between scrapes, with no extrapolation.
"""
from __future__ import annotations

import bisect
import math
from typing import Iterable, List, Optional, Sequence, Tuple

Points = Sequence[Tuple[float, float]]


def window(points: Points, t_from: float, t_to: float) -> List[Tuple[float, float]]:
    """The points with t_from <= t <= t_to."""
    ts = [t for t, _ in points]
    lo = bisect.bisect_left(ts, t_from - 1e-6)
    hi = bisect.bisect_right(ts, t_to + 1e-6)
    return list(points[lo:hi])


def increase(points: Points, t_from: float, t_to: float, from_zero: bool = True) -> Tuple[Optional[float], int]:
    """(increase of a counter over [t_from, t_to], resets seen); (None, 0) with fewer than one point.

    The first point in the window is the baseline, except that a series that starts inside the window
    (created there: a job's first message, an agent's first scrape) counts from zero.  A value below
    its predecessor is a reset (the agent restarted): the new value is what was added since.  Counters
    that do not start with the agent (``from_zero=False``: the driver's energy) always start from their
    first value."""
    pts = window(points, t_from, t_to)
    if not pts:
        return None, 0
    created = from_zero and bool(points) and points[0][0] > t_from + 1e-6
    total = pts[0][1] if created else 0.0
    resets = 0
    for (_, a), (_, b) in zip(pts, pts[1:]):
        if b >= a:
            total += b - a
        else:
            total += b
            resets += 1
    return total, resets


def present(points: Points) -> Tuple[Optional[float], Optional[float]]:
    """(first, last) timestamp of a presence series; (None, None) when empty."""
    if not points:
        return None, None
    return points[0][0], points[-1][0]


def first_last_change(points: Points, t_from: float, t_to: float) -> Tuple[Optional[float], Optional[float]]:
    """First and last grid time in [t_from, t_to] at which the counter moved (or appeared non-zero)."""
    pts = window(points, t_from, t_to)
    first = last = None
    prev = None if (points and points[0][0] > t_from + 1e-6) else (pts[0][1] if pts else None)
    for t, v in pts:
        moved = (prev is None and v > 0) or (prev is not None and v != prev)
        if moved:
            first = t if first is None else first
            last = t
        prev = v
    return first, last


def gaps(grid: Iterable[float], have: Iterable[float], t_from: float, t_to: float, step: float
         ) -> List[Tuple[float, float]]:
    """Stretches of the grid in [t_from, t_to] without a point in ``have``: [(from, to)]."""
    have_set = {round(t, 3) for t in have}
    out: List[Tuple[float, float]] = []
    cur = None
    for t in grid:
        if t < t_from - 1e-6 or t > t_to + 1e-6:
            continue
        if round(t, 3) in have_set:
            if cur is not None:
                out.append((cur, t))
                cur = None
        elif cur is None:
            cur = t - step
    if cur is not None:
        out.append((cur, t_to))
    return out


def bucket_quantile(q: float, buckets: Sequence[Tuple[float, float]]) -> Optional[float]:
    """histogram_quantile over cumulative (upper bound, count) pairs, Prometheus' interpolation."""
    b = sorted(buckets)
    if not b or b[-1][1] <= 0:
        return None
    total = b[-1][1]
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in b:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return b[-1][0]
