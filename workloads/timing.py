"""Per-step phase timing for training loops (standard library only; no TensorFlow).

One small interface, :class:`PhaseTimer`, is used by the custom training loop
(``workloads.train``) and by the Keras callback (``workloads.callbacks``)::

    timer = PhaseTimer(sink=reporter)          # sink: optional, e.g. workloads.phases.Reporter
    with timer.phase("data_wait"):
        batch = next(it)
    with timer.phase("compute"):
        loss = train_step(batch).numpy()       # until the result is ready
    with timer.phase("host"):
        progress.update(...)
    timer.step(samples=64)

Every phase is timed with ``time.monotonic_ns()`` (CLOCK_MONOTONIC, the clock the
teye agent uses), kept locally for the end-of-run summary, and forwarded as
``sink.record_phase(name, start_ns, end_ns)``; every step is forwarded as
``sink.step(samples=n, start_ns=s, end_ns=e)``.  Steps are contiguous: a step
starts where the previous one ended (the first one at its first phase), so
anything the loop does between phases is inside some step's wall time.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

__all__ = ["PHASES", "PhaseTimer", "StepRecord", "Summary", "percentile"]

#: The phases the training loop reports, in loop order.
PHASES = ("data_wait", "compute", "host")


@dataclass(frozen=True)
class StepRecord:
    """One finished step: its wall-clock interval (ns), samples and time per phase (ns)."""

    index: int
    start_ns: int
    end_ns: int
    samples: int
    phases_ns: Tuple[Tuple[str, int], ...]

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    def phase_seconds(self, name: str) -> float:
        return sum(ns for n, ns in self.phases_ns if n == name) / 1e9


@dataclass(frozen=True)
class Summary:
    """Throughput and step-time statistics over the measured (post-warm-up) steps.

    Units: seconds, samples per second, and ``input_wait_fraction`` as a ratio 0-1 of
    the measured wall time spent in ``data_wait``.
    """

    steps: int
    warmup_steps: int
    samples: int
    wall_s: float
    samples_per_s: float
    step_time_p50_s: float
    step_time_p95_s: float
    input_wait_fraction: float
    phase_seconds: Dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "measured_steps": self.steps,
            "warmup_steps": self.warmup_steps,
            "samples": self.samples,
            "wall_s": self.wall_s,
            "samples_per_s": self.samples_per_s,
            "step_time_p50_s": self.step_time_p50_s,
            "step_time_p95_s": self.step_time_p95_s,
            "input_wait_fraction": self.input_wait_fraction,
            "phase_seconds": dict(self.phase_seconds),
        }


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between order statistics
    (numpy's default method); NaN for an empty sequence."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class PhaseTimer:
    """Times the phases of each training step and forwards them to an optional sink.

    ``sink`` is any object with ``record_phase(name, start_ns, end_ns)`` and
    ``step(samples=..., start_ns=..., end_ns=...)`` (``workloads.phases.Reporter``).
    ``clock`` returns integer nanoseconds (injectable for tests).
    """

    def __init__(self, sink=None, clock=time.monotonic_ns):
        self.sink = sink
        self._clock = clock
        self._step_start: Optional[int] = None
        self._current: Dict[str, int] = {}
        self._order: List[str] = []
        self.steps: List[StepRecord] = []

    # -- recording --------------------------------------------------------------------------
    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the enclosed block as phase ``name``; exceptions propagate (the phase is kept)."""
        start = self._clock()
        try:
            yield
        finally:
            self.record_phase(name, start, self._clock())

    def record_phase(self, name: str, start_ns: int, end_ns: int) -> None:
        """Record an already-timed interval (CLOCK_MONOTONIC nanoseconds)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"phase name must be a non-empty string, got {name!r}")
        start_ns = int(start_ns)
        end_ns = int(end_ns)
        if end_ns < start_ns:
            raise ValueError(f"phase {name!r} ends before it starts ({start_ns} > {end_ns})")
        if self._step_start is None:
            self._step_start = start_ns
        if name not in self._current:
            self._order.append(name)
        self._current[name] = self._current.get(name, 0) + (end_ns - start_ns)
        if self.sink is not None:
            self.sink.record_phase(name, start_ns, end_ns)

    def step(self, samples: int) -> StepRecord:
        """Close the current step (it ends now) with ``samples`` training samples."""
        samples = int(samples)
        if samples < 0:
            raise ValueError(f"samples must be >= 0, got {samples}")
        end = self._clock()
        start = self._step_start if self._step_start is not None else end
        rec = StepRecord(
            index=len(self.steps),
            start_ns=start,
            end_ns=end,
            samples=samples,
            phases_ns=tuple((n, self._current[n]) for n in self._order),
        )
        self.steps.append(rec)
        self._step_start = end
        self._current = {}
        self._order = []
        if self.sink is not None:
            self.sink.step(samples=samples, start_ns=start, end_ns=end)
        return rec

    def restart(self) -> None:
        """Forget the open step's boundary: the next step starts at its first phase
        (call after a pause that should not count, e.g. evaluation or a checkpoint)."""
        self._step_start = None
        self._current = {}
        self._order = []

    # -- results ----------------------------------------------------------------------------
    def summary(self, warmup_steps: int = 0) -> Summary:
        """Statistics over the steps after the first ``warmup_steps`` (tracing, pipeline fill)."""
        warmup_steps = max(0, min(int(warmup_steps), len(self.steps)))
        measured = self.steps[warmup_steps:]
        if not measured:
            return Summary(0, warmup_steps, 0, 0.0, math.nan, math.nan, math.nan, math.nan, {})
        wall = sum(s.end_ns - s.start_ns for s in measured) / 1e9
        samples = sum(s.samples for s in measured)
        phases: Dict[str, float] = {}
        for s in measured:
            for n, ns in s.phases_ns:
                phases[n] = phases.get(n, 0.0) + ns / 1e9
        times = [s.seconds for s in measured]
        return Summary(
            steps=len(measured),
            warmup_steps=warmup_steps,
            samples=samples,
            wall_s=wall,
            samples_per_s=samples / wall if wall > 0 else math.nan,
            step_time_p50_s=percentile(times, 50),
            step_time_p95_s=percentile(times, 95),
            input_wait_fraction=(phases.get("data_wait", 0.0) / wall) if wall > 0 else math.nan,
            phase_seconds=phases,
        )
