"""Data-parallel jobs: the ranks of a job on this node and the one that holds the others back.

In synchronous data-parallel training every rank runs at the pace of the slowest: the others wait
for it inside the gradient all-reduce (inside ``backward()`` for DDP, where teye sees it as
``compute``; in ``communication`` where the job calls the collectives from Python).  Summing the
ranks averages a straggler away, so a job whose processes say their rank (the ``rank`` of the
protocol, docs/phases.md) is judged by its **critical rank**:

1. Ranks that reported no step time in the window (a parameter server, a rank that died or has not
   started) and ranks silent for ``stall_seconds`` are not candidates: they set nobody's pace.
2. The critical rank is the candidate whose *own* wait, input (``data_wait``) plus ``host``, is the
   largest share of its step time: that wait is what the others wait for.  It must reach its
   threshold (``input_bound_threshold``, ``host_threshold``) and, with other candidates, exceed the
   least own wait among them by ``RANK_SPREAD`` (10 points of a step): ranks that all wait alike
   (every one input-bound) hold nobody back.
3. Otherwise, the candidate with the least ``communication`` share is the one the others
   wait for in their collectives (a slow GPU, more work), where the most any candidate spends there
   exceeds that least by ``communication_threshold`` or more (a spread of a few points between ranks
   that all exchange alike names nobody).
4. Otherwise the ranks are **even**: no rank is named (``Critical.named`` False: no
   ``teye_job_critical_rank``), the evidence says so, and the verdict is judged on rule 2's largest
   own wait (ties: the lowest rank), which is the job's whether it is named or not.
5. The job's verdict is ``verdict.decide()`` on the critical rank's own evidence; the evidence names
   it and the ranks that wait for it.  A waiting rank's verdict is never the job's: its ``compute``
   holds the wait for the straggler.  A rank named by rule 3 (it computes longer) gets advice about
   itself: its node, its data shard, its clocks (``agent.phases.advice``), never about the exchange.

Where the critical rank's GPU is slowed (clocks held down by power or heat, XID errors: the GPU
source's ``AgentContext.gpu_notes``), the evidence says so.  Each rank's evidence has phase times only: the GPU idle time is the job's on this node, summed over
its GPUs, and a waiting rank's GPU idles in the collective, which would read as host time.  This
module is pure: the job table keeps the per-rank sums (``agent.phases.jobs``).
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, List, NamedTuple, Optional, Sequence, Tuple

from .advice import RankFacts
from .verdict import Evidence, Thresholds, Verdict, advice, decide


class RankEvidence(NamedTuple):
    """One rank on this node over the window."""

    rank: int
    pid: int
    gpus: Tuple[str, ...]
    evidence: Evidence
    gpu_note: str = ""        # what slows its GPUs now (clock events, XID: AgentContext.gpu_notes)


class Critical(NamedTuple):
    rank: RankEvidence
    verdict: Verdict          # decide() on its evidence, its evidence text naming it and the waiting ranks
    waiting: Tuple[int, ...]  # the other candidate ranks (they wait for it)
    named: bool = True        # False: the ranks are even (rule 4), no rank holds the others back


RANK_SPREAD = 0.1   # rule 2: how much more of its step the critical rank waits on its own than the least waiting


def own_wait(ev: Evidence) -> float:
    """The share of a rank's step time it waits on its own input and host work."""
    return ev.share("data_wait") + ev.share("host")


def candidates(ranks: Iterable[RankEvidence], th: Thresholds) -> List[RankEvidence]:
    """Rule 1: the ranks that set the pace (step time in the window, not stalled), by rank."""
    return sorted((r for r in ranks if r.evidence.step_seconds > 0 and r.evidence.silent_s < th.stall_seconds),
                  key=lambda r: r.rank)


OWN_WAIT, COMMUNICATION, NONE_WAITS = "own_wait", "communication", "none_waits"  # which rule chose it


def choose(ranks: Sequence[RankEvidence], th: Thresholds = Thresholds()) -> Optional[Tuple[RankEvidence, str]]:
    """Rules 2 and 3: the critical rank among the candidates and the rule that chose it (None: no candidate)."""
    cands = candidates(ranks, th)
    if not cands:
        return None
    waits = [own_wait(r.evidence) for r in cands]
    best = max(range(len(cands)), key=lambda i: (waits[i], -i))  # ties: the lowest rank
    ev = cands[best].evidence
    if (ev.share("data_wait") >= th.input_bound or ev.share("host") >= th.host) and (
            len(cands) == 1 or waits[best] - min(waits) >= RANK_SPREAD):
        return cands[best], OWN_WAIT
    comm = [r.evidence.share("communication") for r in cands]
    if len(cands) > 1 and max(comm) - min(comm) >= th.communication:
        return cands[min(range(len(cands)), key=lambda i: (comm[i], i))], COMMUNICATION
    return cands[best], NONE_WAITS


def per_step(ev: Evidence, phase: str) -> float:
    """A phase's seconds per step of the window (0 without steps)."""
    return ev.phase_seconds.get(phase, 0.0) / ev.steps if ev.steps else 0.0


def _secs(s: float) -> str:
    return f"{s:.2f} s" if s >= 1 else f"{1000 * s:.0f} ms" if s >= 0.0095 else f"{1000 * s:.1f} ms"


def ranges(ranks: Sequence[int]) -> str:
    """'0–2, 5' for [0, 1, 2, 5]."""
    out, i, rs = [], 0, sorted(ranks)
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}–{rs[j]}" if j > i + 1 else f"{rs[i]}, {rs[j]}")
        i = j + 1
    return ", ".join(out)


def describe(r: RankEvidence) -> str:
    """'rank 3 (pid 4242, GPU 3)'."""
    gpu = f", GPU {','.join(r.gpus)}" if r.gpus else ""
    return f"rank {r.rank} (pid {r.pid}{gpu})"


def judge(ranks: Sequence[RankEvidence], th: Thresholds = Thresholds(), untracked: int = 0) -> Optional[Critical]:
    """The job's verdict from its critical rank (None: no rank sets the pace; judge the job's sums);
    ``untracked``: ranks on this node beyond the per-job process limit, named in the evidence."""
    chosen = choose(ranks, th)
    if chosen is None:
        return None
    crit, rule = chosen
    comm = [r.evidence.share("communication") for r in candidates(ranks, th)]
    crit = crit._replace(evidence=dataclasses.replace(crit.evidence, comm_spread=max(comm) - min(comm)))
    v = decide(crit.evidence, th)
    waiting = tuple(r.rank for r in candidates(ranks, th) if r.rank != crit.rank)
    ev = crit.evidence
    who = ("rank " if len(waiting) == 1 else "ranks ") + ranges(waiting)
    verb = "waits" if len(waiting) == 1 else "wait"
    if not waiting:
        lead = f"{describe(crit)} is the only rank of the job on this node that steps"
    elif rule == OWN_WAIT:
        what = (f"waits {100 * ev.share('data_wait'):.0f} % of its step on input"
                if ev.share("data_wait") >= ev.share("host") else
                f"spends {100 * ev.share('host'):.0f} % of its step in host work")
        lead = f"{describe(crit)} {what}; {who} {verb} for it"
    elif rule == COMMUNICATION:
        others = [r.evidence for r in candidates(ranks, th) if r.rank != crit.rank]
        waited = sum(per_step(o, "communication") for o in others) / len(others)
        # the others wait for it: advice about this rank, not about the exchange (agent.phases.advice, rule 4)
        facts = RankFacts(crit.rank, per_step(ev, "compute"),
                          sum(per_step(o, "compute") for o in others) / len(others), crit.gpu_note)
        v = dataclasses.replace(v, recommendation=advice(v.kind, v.cause, ev.source, ev.config, ev.cpus, facts))
        lead = (f"{describe(crit)} computes {_secs(per_step(ev, 'compute'))} per step and spends the least of its "
                f"step in communication ({100 * ev.share('communication'):.0f} %); {who} {verb} for it in "
                f"{'its' if len(waiting) == 1 else 'their'} collectives, {_secs(waited)} per step")
    else:
        waits = [own_wait(r.evidence) for r in candidates(ranks, th)]
        lo, hi = 100 * min(waits), 100 * max(waits)
        alike = f"{hi:.0f} %" if round(lo) == round(hi) else f"{lo:.0f}–{hi:.0f} %"
        if ev.share("data_wait") >= th.input_bound or ev.share("host") >= th.host:
            lead = f"every rank waits on its own input or host work alike ({alike} of its step)"
        else:
            lead = f"no rank waits on its own input or host work ({alike} of its step)"
        lead += (f" and their communication shares differ by less than {100 * th.communication:.0f} points: the "
                 f"{len(waiting) + 1} ranks on this node are even, none holds the others back")
    if crit.gpu_note and rule != NONE_WAITS:
        lead += f"; its {crit.gpu_note}"
    if untracked:
        lead += f" ({untracked} more ranks on this node beyond the limit of {len(ranks)} per job are not judged)"
    named = rule != NONE_WAITS or not waiting
    return Critical(crit, dataclasses.replace(v, evidence=f"{lead}; {v.evidence}"), waiting, named)
