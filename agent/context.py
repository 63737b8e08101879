"""State shared between sources inside one agent process.

The GPU source publishes every driver utilization sample it integrates into
``timeline`` (CLOCK_MONOTONIC intervals); the phase correlator reads it to split
GPU idle time by training phase.  ``gpu_pids`` maps process ids to the GPUs they
hold (from NVML's process list), for attributing phase messages to GPUs.
"""
from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, FrozenSet, List, NamedTuple, Tuple


class UtilSample(NamedTuple):
    """One driver utilization sample mapped to CLOCK_MONOTONIC: [start_ns, end_ns) at busy ratio 0-1."""

    start_ns: int
    end_ns: int
    busy: float


class UtilTimeline:
    """Per-GPU bounded history of utilization samples, appended in time order by one writer."""

    def __init__(self, horizon_s: float = 300.0, max_samples: int = 20000):
        self._horizon_ns = int(horizon_s * 1e9)
        self._max = max_samples
        self._data: Dict[str, Deque[UtilSample]] = {}
        self._lock = threading.Lock()

    def add(self, gpu: str, start_ns: int, end_ns: int, busy: float) -> None:
        if end_ns <= start_ns:
            return
        with self._lock:
            dq = self._data.get(gpu)
            if dq is None:
                dq = self._data[gpu] = deque(maxlen=self._max)
            if dq and start_ns < dq[-1].end_ns:  # never overlap the previous sample
                start_ns = dq[-1].end_ns
                if end_ns <= start_ns:
                    return
            dq.append(UtilSample(start_ns, end_ns, min(1.0, max(0.0, busy))))
            cutoff = end_ns - self._horizon_ns
            while dq and dq[0].end_ns < cutoff:
                dq.popleft()

    def gpus(self) -> List[str]:
        with self._lock:
            return sorted(self._data)

    def window(self, gpu: str, start_ns: int, end_ns: int) -> List[UtilSample]:
        """Samples overlapping [start_ns, end_ns), oldest first."""
        with self._lock:
            dq = list(self._data.get(gpu, ()))
        ends = [s.end_ns for s in dq]
        i = bisect.bisect_right(ends, start_ns)
        out = []
        for s in dq[i:]:
            if s.start_ns >= end_ns:
                break
            out.append(s)
        return out

    def covered_until(self, gpu: str) -> int:
        """End of the newest sample for gpu (0 when none)."""
        with self._lock:
            dq = self._data.get(gpu)
            return dq[-1].end_ns if dq else 0


@dataclass
class AgentContext:
    clock: Callable[[], int] = time.monotonic_ns
    wall_clock: Callable[[], float] = time.time      # Unix time, for what is exported as a date (a run's start)
    timeline: UtilTimeline = field(default_factory=UtilTimeline)
    # pid -> GPU labels it holds (updated by the GPU source each poll)
    gpu_pids: Dict[int, FrozenSet[str]] = field(default_factory=dict)
    # GPU (and MIG instance) UUID -> its label ('0', '2/1'), replaced whole by the GPU source each poll;
    # empty while no GPU source answers
    gpu_labels: Dict[str, str] = field(default_factory=dict)
    # (topic, note) pairs that host collectors offer as evidence to the verdicts (the pmu source:
    # CPI, GFLOP/s, memory and PCIe bandwidth over its last poll); replaced whole by one writer
    host_notes: Tuple[Tuple[str, str], ...] = ()
    # GPU label -> what slows that GPU now (clock events that hold its clocks down, XID errors, lost), from
    # the GPU source each poll; cited for a data-parallel job's critical rank; replaced whole by one writer
    gpu_notes: Dict[str, str] = field(default_factory=dict)
