"""One definition of each job figure, for every view that shows it (issue 47): the agent's gauges and
verdict (agent.phases.verdict.Evidence), `teye profile` (which reads the agent's own views over the whole
run) and `teye report` (agent.report.figures, from the counters Prometheus stored); the recording rules
(deploy/prometheus/rules/teye-recording.yml) write the same formulas in PromQL, and
tests/report/test_one_truth_e2e.py reads one job through all of them.

- **Step time**: the wall time of the job's training steps, but ``compile`` (tracing and compiling a
  step function: a one-time cost, docs/phases.md). The step histogram's sum
  (``teye_job_step_seconds_sum``) and ``teye_job_rank_step_seconds_total`` are that time already: the
  agent takes a step's compile out of them where a client sent it inside the step.
- **Training phases**: what a step is made of; ``eval`` (evaluation, between steps) and ``compile`` are
  shown beside training and are in no share of it.
- **A phase's share** (the input-bound share is ``data_wait``'s): its seconds inside steps over the step
  time; without steps (a client that never calls ``step()``), over the training phases' seconds.
- **Samples per second**: samples over step time.
- **Mean step time**: step time over steps.
"""
from __future__ import annotations

from typing import Mapping, Optional

NOT_IN_STEP_TIME = ("compile",)          # in no step time and no share
NOT_TRAINING = ("eval", "compile")       # shown beside training, never in its shares


def training_phase_seconds(phase_seconds: Mapping[str, float]) -> float:
    """The seconds of the phases a training step is made of (all but eval and compile)."""
    return sum(v for p, v in phase_seconds.items() if p not in NOT_TRAINING and v)


def step_time(step_seconds: Optional[float], phase_seconds: Mapping[str, float],
              compile_in_steps: float = 0.0) -> float:
    """The step time the shares are taken of. ``step_seconds``: the steps' wall time (None or 0: the job
    reports no steps, and the training phases' seconds are the time); ``compile_in_steps``: the compile
    seconds still inside that wall time (the agent's window sums; 0 for the exported step seconds, which
    are compile-free). Never below a training phase's seconds, so no share exceeds 1."""
    phases = [v for p, v in phase_seconds.items() if p not in NOT_TRAINING and v]
    if step_seconds:
        return max([step_seconds - compile_in_steps] + phases)
    return sum(phases)


def share(seconds: Optional[float], base: float) -> Optional[float]:
    """A phase's share of the step time (None where there is no step time)."""
    if base <= 0:
        return None
    return (seconds or 0.0) / base


def input_bound(phase_seconds: Mapping[str, float], step_seconds: Optional[float]) -> Optional[float]:
    """The input-bound share: data_wait over the step time (from exported, compile-free step seconds)."""
    return share(phase_seconds.get("data_wait", 0.0), step_time(step_seconds, phase_seconds))


def samples_per_second(samples: Optional[float], step_seconds: Optional[float]) -> Optional[float]:
    """Samples over the steps' (compile-free) wall time; None without either."""
    return samples / step_seconds if samples is not None and step_seconds else None


def mean_step(step_seconds: Optional[float], steps: Optional[float]) -> Optional[float]:
    """Mean step time: the steps' (compile-free) wall time over their count."""
    return step_seconds / steps if step_seconds is not None and steps else None
