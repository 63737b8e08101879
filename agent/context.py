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
from typing import Callable, Deque, Dict, FrozenSet, Iterable, List, NamedTuple, Optional, Tuple


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
        self.waits = 0

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

    def add_many(self, gpu: str, intervals: Iterable[Tuple[int, int, float]]) -> None:
        """``add(gpu, start, end, busy)`` for each interval in order, under one lock: one GPU's ring read (about 30
        samples every 5 s) is one call (issue 49: the 8-GPU replay's idle cost)."""
        with self._lock:
            dq = self._data.get(gpu)
            last = None
            for start_ns, end_ns, busy in intervals:
                if end_ns <= start_ns:
                    continue
                if dq is None:
                    dq = self._data[gpu] = deque(maxlen=self._max)
                if dq and start_ns < dq[-1].end_ns:  # never overlap the previous sample
                    start_ns = dq[-1].end_ns
                    if end_ns <= start_ns:
                        continue
                dq.append(UtilSample(start_ns, end_ns, min(1.0, max(0.0, busy))))
                last = end_ns
            if last is not None:   # (the ends only grow: trimming once, by the last, is trimming after each)
                cutoff = last - self._horizon_ns
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
        """End of the newest sample for gpu (0 when none).  Each call is counted in ``waits``: the phase
        path asks only while an interval waits for the samples that cover it, which is when the GPU
        source reads its ring at its faster pace."""
        self.waits += 1
        with self._lock:
            dq = self._data.get(gpu)
            return dq[-1].end_ns if dq else 0


class LinkWindow(NamedTuple):
    """One network interface over a window: what the network, netclass and qdisc sources read."""

    device: str
    seconds: float                  # the span its byte counters cover
    rx_bps: float                   # bytes per second received
    tx_bps: float                   # bytes per second sent
    errors: int                     # receive and transmit errors and drops (/proc/net/dev)
    carrier_changes: int            # the link went down or up
    qdisc_drops: int                # packets its root qdisc dropped
    overlimits: int                 # packets its shaper held back (root qdisc over its rate)
    speed_bps: Optional[float]      # negotiated link speed, bytes per second (None: not reported)
    shaper_bps: Optional[float]     # the rate its root qdisc shapes it to (tbf), bytes per second
    shaper: str = ""                # that qdisc's kind


class LinkHistory:
    """Per interface, the counter readings of the last ``horizon_s`` (written by the network, netclass and
    qdisc sources at their own intervals; read by the phase verdicts for a communication-bound job's network
    cause).  At most ``max_devices`` interfaces are kept (the first seen; a node with hundreds of pod veths
    keeps its first 32); each counter keeps at most ``max_points`` readings."""

    COUNTERS = ("rx_bytes", "tx_bytes", "errors", "carrier_changes", "qdisc_drops", "shaper_overlimits")

    def __init__(self, horizon_s: float = 130.0, max_points: int = 160, max_devices: int = 32):
        self._horizon_ns = int(horizon_s * 1e9)
        self._max = max_points
        self._max_devices = max_devices
        self._data: Dict[str, Dict[str, Deque[Tuple[int, float]]]] = {}
        self._gauges: Dict[str, Dict[str, Deque[Tuple[int, Optional[float], Optional[str]]]]] = {}
        self._lock = threading.Lock()
        self.sampled = False   # set by the network source: the interfaces are read (else None: not sampled)

    def _dev(self, dev: str):
        d = self._data.get(dev)
        if d is None:
            if len(self._data) >= self._max_devices:
                return None
            d = self._data[dev] = {}
            self._gauges[dev] = {}
        return d

    def add(self, dev: str, name: str, t_ns: int, value: float) -> None:
        """A cumulative counter's reading."""
        with self._lock:
            d = self._dev(dev)
            if d is None:
                return
            dq = d.get(name)
            if dq is None:
                dq = d[name] = deque(maxlen=self._max)
            dq.append((t_ns, value))
            cutoff = t_ns - self._horizon_ns
            while len(dq) > 2 and dq[1][0] < cutoff:
                dq.popleft()

    def set(self, dev: str, name: str, t_ns: int, value: Optional[float], what: Optional[str] = None) -> None:
        """A gauge's reading (a speed, a shaper's rate; None: not reported), kept while it lasts: a window
        reads the value of its end (a link shaped after a job ended was not shaped for that job)."""
        with self._lock:
            if self._dev(dev) is None:
                return
            dq = self._gauges[dev].get(name)
            if dq is None:
                dq = self._gauges[dev][name] = deque(maxlen=self._max)
            if dq and dq[-1][1:] == (value, what):
                return            # unchanged: the reading that set it stands
            dq.append((t_ns, value, what))
            cutoff = t_ns - self._horizon_ns
            while len(dq) > 1 and dq[1][0] < cutoff:
                dq.popleft()

    def window(self, start_ns: int, end_ns: int) -> List[LinkWindow]:
        """Each interface over [start_ns, end_ns]: counters differenced between the last reading at or before
        the start (else the first after it) and the last at or before the end; an interface whose byte
        counters cover less than a second of it is left out."""
        out = []
        with self._lock:
            items = [(dev, {k: list(v) for k, v in d.items()},
                      {k: list(v) for k, v in self._gauges.get(dev, {}).items()}) for dev, d in self._data.items()]
        for dev, d, g in items:
            def span(name):
                pts = [p for p in d.get(name, ()) if p[0] <= end_ns]
                if not pts:
                    return None
                before = [p for p in pts if p[0] <= start_ns]
                first = before[-1] if before else pts[0]
                last = pts[-1]
                return first, last

            def delta(name):
                sp = span(name)
                return 0 if sp is None else max(0, int(sp[1][1] - sp[0][1]))
            rx, tx = span("rx_bytes"), span("tx_bytes")
            if rx is None or tx is None:
                continue
            secs = (rx[1][0] - rx[0][0]) / 1e9
            if secs < 1.0:
                continue
            def gauge(name):
                pts = g.get(name) or [(0, None, None)]
                at_end = [p for p in pts if p[0] <= end_ns]
                return (at_end[-1] if at_end else pts[0])[1:]
            speed = gauge("speed_bps")[0]
            shaper, kind = gauge("shaper_bps")
            out.append(LinkWindow(dev, secs, max(0.0, rx[1][1] - rx[0][1]) / secs,
                                  max(0.0, tx[1][1] - tx[0][1]) / secs, delta("errors"), delta("carrier_changes"),
                                  delta("qdisc_drops"), delta("shaper_overlimits"), speed, shaper, kind or ""))
        return out


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
    # network interfaces' counters over the last minutes (network, netclass and qdisc sources), for the
    # network cause of a communication-bound job (agent.phases.links)
    links: LinkHistory = field(default_factory=LinkHistory)
