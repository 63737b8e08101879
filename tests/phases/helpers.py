"""Shared helpers for the phase tests: config, fake clocks, ground-truth integration."""
from __future__ import annotations

import copy
import os
import pwd
import random
import tempfile
import time
from typing import Dict, List, Sequence, Tuple

from agent.config import defaults
from agent.context import AgentContext, UtilSample

MS = 1_000_000
S = 1_000_000_000
NOBODY = pwd.getpwnam("nobody").pw_uid     # real uids of the machine (issue 36's flooders)
DAEMON = pwd.getpwnam("daemon").pw_uid


def wait_for(cond, timeout: float = 5.0) -> bool:
    """Poll cond every 10 ms until it holds or timeout seconds passed; its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def phases_cfg(**over) -> dict:
    cfg = copy.deepcopy(defaults()["phases"])
    cfg.update(over)
    return cfg


class FakeClock:
    def __init__(self, t_ns: int = 1000 * S):
        self.t = t_ns

    def __call__(self) -> int:
        return self.t


def ctx_with_clock(t_ns: int = 1000 * S) -> Tuple[AgentContext, FakeClock]:
    clock = FakeClock(t_ns)
    return AgentContext(clock=clock), clock


def shared_tmpdir() -> str:
    """A directory other users (nobody) can reach: pytest's tmp_path is 0700."""
    d = tempfile.mkdtemp(prefix="teye-test-", dir="/tmp")
    os.chmod(d, 0o755)
    return d


Q = 10_000  # ground-truth times are multiples of 10 µs (readable numbers; the oracle is exact anyway)


def _q(x: float) -> int:
    return max(Q, int(x) // Q * Q)


def random_samples(rng: random.Random, t0: int, t1: int, period_ns: int) -> List[UtilSample]:
    """Driver samples of irregular length (period +- 40 %) with random busy ratios, covering [t0, t1)."""
    out, t = [], t0
    while t < t1:
        d = _q(period_ns * rng.uniform(0.6, 1.4))
        busy = rng.choice([0.0, 1.0, rng.random()])
        out.append(UtilSample(t, min(t + d, t1), busy))
        t += d
    return out


def random_phases(rng: random.Random, t0: int, t1: int, names: Sequence[str]) -> List[Tuple[str, int, int]]:
    """Back-to-back phase intervals of 3-80 ms with random names, like a training loop's."""
    out, t = [], t0
    while True:
        d = _q(rng.uniform(3, 80) * MS)
        if t + d > t1:
            break
        out.append((rng.choice(names), t, t + d))
        t += d
    return out


def oracle_idle(samples: Sequence[UtilSample], phases: Sequence[Tuple[str, int, int]], t0: int = 0, t1: int = 0,
                ) -> Dict[str, float]:
    """Idle seconds per phase by an independent sweep over every boundary (not the code under test).

    The timeline is cut at every sample and phase boundary; on each elementary segment the
    busy ratio is constant (the sample containing its midpoint, or none) and so is the set of
    phases containing it.  Exact; phases may overlap.
    """
    cuts = sorted({s.start_ns for s in samples} | {s.end_ns for s in samples}
                  | {a for _, a, _ in phases} | {b for _, _, b in phases})
    by_start = sorted(samples, key=lambda s: s.start_ns)
    ph = sorted(phases, key=lambda p: p[1])
    out: Dict[str, float] = {}
    si = 0
    active: List[Tuple[str, int, int]] = []
    pi = 0
    for a, b in zip(cuts, cuts[1:]):
        mid = (a + b) / 2
        while si < len(by_start) and by_start[si].end_ns <= mid:
            si += 1
        busy = None
        if si < len(by_start) and by_start[si].start_ns <= mid:
            busy = by_start[si].busy
        while pi < len(ph) and ph[pi][1] <= mid:
            active.append(ph[pi])
            pi += 1
        active = [p for p in active if p[2] > mid]
        if busy is None:
            continue
        for name, _, _ in active:
            out[name] = out.get(name, 0.0) + (1.0 - busy) * (b - a) / S
    return out
