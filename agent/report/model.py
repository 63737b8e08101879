"""What the report's modules share: the request, the conditions and their exit statuses, counter sums and the
small arithmetic every figure uses."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ..phases import definitions
from . import series as S

# exit statuses for the jobs' conditions, most severe first (docs/report.md)
EXIT_UNKNOWN = 7
EXIT_NODE_VANISHED = 8
EXIT_CLOCK_SKEW = 9
EXIT_COUNTER_RESET = 10
EXIT_RUNNING = 11
EXIT_NO_PHASES = 12

PHASES = ("data_wait", "compute", "host", "communication", "checkpoint", "eval", "compile", "other")
DEFAULT_LOOKBACK_S = 7 * 86400


@dataclass
class Request:
    slurm_jobs: Sequence[str] = ()
    train_jobs: Sequence[str] = ()
    user: Optional[str] = None
    since: Optional[float] = None
    until: Optional[float] = None
    step: Optional[float] = None          # round-2 step; default: about one scrape interval
    cpus: Optional[int] = None             # cores allocated per job (Slurm's NumCPUs), for CPU efficiency
    mem_bytes: Optional[float] = None      # memory requested per job, for the "requested far above use" note
    grafana_url: Optional[str] = None


@dataclass
class Condition:
    code: int
    kind: str
    message: str

    def as_dict(self):
        return {"code": self.code, "kind": self.kind, "message": self.message}


class _Acc:
    """Counter increases summed over several series, with the resets seen."""

    def __init__(self):
        self.total = 0.0
        self.seen = False
        self.resets = 0

    def add(self, pts, a, b, from_zero=True):
        v, r = S.increase(pts, a, b, from_zero)
        if v is not None:
            self.total += v
            self.seen = True
            self.resets += r

    @property
    def value(self):
        return self.total if self.seen else None


def share_base(phases, step_seconds=None) -> float:
    """What a phase's share of a run is taken of: the training steps' compile-free wall time
    (``teye_job_step_seconds_sum``), never below a training phase's seconds; without steps, the training
    phases' seconds. ``eval`` and ``compile`` are beside training, in no share (agent.phases.definitions:
    the agent's own definition)."""
    return definitions.step_time(step_seconds, phases)


def _ratio(a, b):
    return None if a is None or not b else a / b


def _r(x, nd=6):
    return None if x is None else round(x, nd)


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _sum(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) if xs else None


def _iso(t: float) -> str:
    import datetime
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
