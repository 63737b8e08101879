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
    # one subtraction per stretch between resets (last - first), never a sum of per-step differences: the
    # result is then the very float PromQL's `x - x offset d` (or `x` for a created series) gives
    total = 0.0
    base = 0.0 if created else pts[0][1]
    resets = 0
    for (_, a), (_, b) in zip(pts, pts[1:]):
        if b < a:          # a reset: the stretch before it ends at a; the new value counts from zero
            total += a - base
            base = 0.0
            resets += 1
    return total + (pts[-1][1] - base), resets


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


def bucket_bounds(q: float, buckets: Sequence[Tuple[float, float]]) -> Optional[Tuple[float, float]]:
    """The bucket the q-quantile falls in, over cumulative (upper bound, count) pairs: (lower, upper), upper
    ``inf`` above the last finite bound; None without observations.

    This is all a classic histogram knows: Prometheus' histogram_quantile interpolates linearly inside the
    bucket, a figure whose error is the bucket's width (a 109 ms loop read 175 ms), so the report gives the
    bounds and the exact mean (sum / count) instead (docs/report.md "Step times")."""
    b = sorted(buckets)
    if not b or b[-1][1] <= 0:
        return None
    rank = q * b[-1][1]
    lo = 0.0
    for le, c in b:
        if c >= rank and c > 0:
            return lo, le
        lo = le
    return lo, math.inf
