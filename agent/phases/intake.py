"""Applying one validated message to its job: a process's intervals merged with what it already
reported, its steps closing its open phases, version 2's windows of fast steps, the rank a process says,
and the intervals queued for GPU attribution.  A mixin of ``agent.phases.jobs.JobTable``; called under
the table's lock.  This is the hot path (benchmarks/phases.py): the usual cases are inlined."""
from __future__ import annotations

import logging
from bisect import bisect_left
from typing import Deque, Dict, List, Optional, Tuple

from . import attribution
from .protocol import (ACCEPTED, FAST_EDGE_NS, MIN_STEP_NS, NO_IDENTITY, RESOLUTION_NS, STEP_BUCKETS, Identity,
    Message, Window)
from .jobstate import (COMPILE, COMPUTE, COVER_SPANS, DATA_WAIT, IN_KINDS, IN_KIND_INDEXES, IN_STEP, MAX_PIDS,
    MAX_UNTRACKED, NP, OPEN_PER_PID, PHASE_INDEX, STEP, WINDOWS, _Covered, _Job, _Rank)

log = logging.getLogger("teye.phases")


class Intake:
    """JobTable's intake: one validated message applied to its job."""

    def _rank(self, job: _Job, pid: int, ident: Identity, now_ns: int) -> Optional[_Rank]:
        """The rank state of pid, made when it first says its rank (bounded by MAX_PIDS per job); a new
        pid with a known rank (a restarted rank) replaces the old one: one series per rank."""
        rk = job.ranks.get(pid)
        if ident.world is not None:
            job.world = ident.world
        if rk is not None:
            if rk.rank == ident.rank:
                return rk
            del job.ranks[pid]  # the process now says another rank: start it again
        for other, r in list(job.ranks.items()):
            if r.rank == ident.rank:
                del job.ranks[other]
                self.rank_pids.discard(other)
        if len(job.ranks) >= MAX_PIDS:
            if not job.untracked:
                log.warning("job %s: more than %d ranks on this node; rank %d (pid %d) and later ones are not "
                            "judged per rank", job.label, MAX_PIDS, ident.rank, pid)
            if len(job.untracked) < MAX_UNTRACKED:
                job.untracked.add(pid)
                self.rank_pids.add(pid)
            return None
        rk = job.ranks[pid] = _Rank(ident.rank, pid, self.window_ns, now_ns)
        self.rank_pids.add(pid)
        return rk

    def _apply(self, msg: Message, pid: int, uid: int, now: int, ident: Identity = NO_IDENTITY, cfg=None) -> str:
        """One validated message of process ``pid`` (uid ``uid``) applied to its job: the job found or made
        (_job_of), the process's state in it (_process_of), its phases (_add_phases) and the steps that close
        them (_add_steps), its windows of fast steps (_apply_sums), its identity, parts and memory."""
        job = self._job_of(msg, pid, uid, now)
        if job is None:
            return "job_limit"
        known, opened, covers = self._process_of(job, msg, pid, ident, cfg)
        gpus = ()
        if (msg.phases or msg.steps or msg.sums) and (msg.cvd and self._known_gpus or pid in self.ctx.gpu_pids):
            gpus = attribution.resolve_gpus(pid, msg.cvd, self.ctx.gpu_pids, self._known_gpus)
        rk = None
        if ident.rank is not None:
            rk = self._rank(job, pid, ident, now)
        elif job.ranks:
            rk = job.ranks.get(pid)
        if rk is not None:
            rk.last_ns = now
            if gpus:
                rk.gpus = gpus
        ring = job.ring
        waited = False
        compute0 = job.phase_s[COMPUTE]
        # records ending in the current ring slot (nearly all of them) skip ring.slot()
        cur = now // ring.width
        if ring.cur_b == cur:
            cur_slot = ring.cur_i
        else:
            cur_slot = ring.cur_i = ring.slot(now, now)
            ring.cur_b = cur
        # phases first, then the steps that close them; a datagram with more phases than a process may keep
        # open (OPEN_PER_PID) is taken step by step instead, so that none is pushed out before its step
        chunks = _by_step(msg.phases, msg.steps) if len(msg.phases) > OPEN_PER_PID and msg.steps else (
            (msg.phases, msg.steps),)
        for ph_chunk, st_chunk in chunks:
            if ph_chunk and self._add_phases(job, ph_chunk, pid, opened, covers, gpus, rk, now, cur_slot, cur):
                waited = True
            if st_chunk:
                self._add_steps(job, st_chunk, pid, opened, gpus, rk, now, cur_slot, cur)
        if msg.sums and self._apply_sums(job, msg.sums, pid, covers, gpus, rk, now, cur_slot, cur):
            waited = True
        if waited:
            self.probe.track(pid, uid, now)
        if ident.src is not None:
            job.source = ident.src
        if (msg.parts is not None or msg.mem is not None) and known:
            job.inside.apply(pid, msg.parts, msg.mem, job.phase_s[COMPUTE] - compute0)
        if msg.trace is not None:
            job.traces.note(*msg.trace, self.ctx.wall_clock())
        return ACCEPTED

    def _job_of(self, msg: Message, pid: int, uid: int, now: int) -> Optional[_Job]:
        """The sender's job, ``(uid, name)`` (and its pod's uid, with pods), made where new (None: refused
        over the limits), marked as just heard from."""
        key = (uid, msg.job)
        if self.pods is not None:
            pod = self.pods.of(pid, now)
            if pod:
                key = (uid, msg.job, pod)
        job = self._jobs.get(key)
        if job is None:
            job = self._new_job(key, pid, uid, now)
            if job is None:
                return None
        else:
            self._jobs.move_to_end(key)
        job.last_ns = now
        return job

    def _process_of(self, job: _Job, msg: Message, pid: int, ident: Identity, cfg):
        """(known, opened, covers) of process ``pid`` in ``job``: whether the job tracks it (at most MAX_PIDS
        processes; the drops it says it had are kept), its phases waiting for their step (None: untracked),
        and per phase what it already reported (processes beyond MAX_PIDS share one set); its configuration
        noted."""
        known = pid in job.pids or len(job.pids) < MAX_PIDS
        if known:
            job.pids[pid] = max(job.pids.get(pid, 0), msg.dropped)
        if cfg is not None:
            job.configs.note(pid, ident.rank, cfg, known)
        opened = job.open.get(pid)
        if opened is None and known:
            opened = job.open[pid] = []
        covers = job.cover.get(pid if known else -1)
        if covers is None:
            covers = job.cover[pid if known else -1] = [None] * (NP + 1)   # + WINDOWS: its windows' spans
        return known, opened, covers

    def _add_phases(self, job: _Job, phases, pid: int, opened, covers, gpus, rk: Optional[_Rank], now: int,
                    cur_slot, cur) -> bool:
        """A message's phase intervals: each kept open for the step that closes it, and what the process had
        not reported of its phase yet (its overlaps merged) added to the job's, its rank's and the window's
        sums and queued for GPU attribution.  True where a data wait was added (the input probe tracks it).
        The hot path: _Covered.add's usual case inline."""
        ring, rec, phase_s, width = job.ring, self.recorded, job.phase_s, job.ring.width
        waited = False
        for phase, s, e in phases:
            i = PHASE_INDEX[phase]
            if opened is not None:
                if len(opened) >= OPEN_PER_PID:
                    del opened[0]  # the oldest phase still waiting for its step
                opened.append((i, s, e))
            if rec is not None:
                rec.append((job.label, phase, s, e))
            # only what the process had not reported of this phase yet counts (its overlaps merged)
            c = covers[i]
            if c is None:
                c = covers[i] = _Covered()
            ends = c.ends
            if ends and s >= ends[-1] and e > s:   # _Covered.add's usual case, inline: after all so far
                if s == ends[-1]:
                    ends[-1] = e
                else:
                    c.starts.append(s)
                    ends.append(e)
                    if len(ends) > COVER_SPANS:
                        c.forget()
                new = ((s, e),)
            else:
                new = c.add(s, e)
            for a, b in new:
                phase_s[i] += (b - a) / 1e9
                if i == DATA_WAIT and self.probe is not None:
                    job.waits.append((pid, a, b, b - a))
                    waited = True
                slot = cur_slot if b // width >= cur else ring.slot(b, now)
                if slot is not None:
                    ring.phase[slot][i] += b - a
                if rk is not None:
                    rk.phase_s[i] += (b - a) / 1e9
                    rslot = rk.ring.slot(b, now)
                    if rslot is not None:
                        rk.ring.phase[rslot][i] += b - a
                if gpus:
                    self._queue(job, attribution.Pending((i, b), a, b, gpus))
        return waited

    def _add_steps(self, job: _Job, steps, pid: int, opened, gpus, rk: Optional[_Rank], now: int, cur_slot,
                   cur) -> None:
        """A message's steps: each closes the process's open phases inside it (their time inside the step,
        merged, is the step's), counts once for the job (a data-parallel job's global step: when its first
        rank completes it), its compile-free time into the step histogram, and goes to GPU attribution with
        its phases by kind."""
        ring, rec, width = job.ring, self.recorded, job.ring.width
        for s, e, samples in steps:
            d = (e - s) / 1e9
            # per phase index, the ns of the process's open phases inside this step (merged)
            inside = None if gpus or not opened else self._close_step_sums(opened, s, e)
            if inside is None:
                pieces = self._close_step(opened, s, e) if opened else {}
                inside = [(i, sum(b - a for a, b in iv)) for i, iv in pieces.items()]
            job.samples += samples
            # the exported step time is compile-free (agent.phases.definitions): a compile the client
            # sent inside this step leaves it, as it leaves the shares
            d = max(0.0, d - sum(ns for i, ns in inside if i == COMPILE) / 1e9)
            if rk is not None:
                # one global step per step of the ranks: counted when the first rank completes it
                rk.steps += 1
                rk.step_s += d
                rslot = rk.ring.slot(e, now)
                if rslot is not None:
                    rk.ring.step_ns[rslot] += e - s
                    rk.ring.steps[rslot] += 1
                    rrow = rk.ring.in_step[rslot]
                    for i, ns in inside:
                        rrow[i] += ns
            if (rk is None or rk.steps > job.rank_steps) and not (job.untracked and pid in job.untracked):
                if rk is not None:
                    job.rank_steps = rk.steps
                job.steps += 1
                job.hist_sum += d
                job.hist[bisect_left(STEP_BUCKETS, d)] += 1  # first bucket with d <= le
            slot = cur_slot if e // width >= cur else ring.slot(e, now)
            if slot is not None:
                ring.step_ns[slot] += e - s
                ring.steps[slot] += 1
                row = ring.in_step[slot]
                for i, ns in inside:
                    row[i] += ns
            if gpus:
                group = [attribution.Pending((STEP, e), s, e, gpus)]
                for n, (_kind, names) in enumerate(IN_KINDS):
                    for a, b in attribution.merged(iv for p in names for iv in pieces.get(PHASE_INDEX[p], ())):
                        group.append(attribution.Pending((IN_STEP + n, e), a, b, gpus))
                self._queue_step(job, group)
            if rec is not None:
                rec.append((job.label, "step", s, e))

    def _apply_sums(self, job: _Job, sums, pid: int, covers, gpus, rk: Optional[_Rank], now: int, cur_slot,
                    cur) -> bool:
        """Version 2's windows of fast steps (protocol.Window): what _apply does with a step and its phases,
        from their sums.  A window's phases are spread uniformly over it for GPU idle (attribution.Pending
        with ns) and for the input probe; its in-step time is the client's own clipping, at most the steps'.
        Each phase of a window counts at most the window's span (protocol._window holds it there), and its
        steps' time too (held here).  A window is not an interval: it is merged with the process's earlier
        windows only (``covers[WINDOWS]``, a _Covered of their spans), not with its intervals; a window whose
        span they partly cover counts the uncovered share of it (_part), a copy of one counts nothing.
        Returns whether a data_wait was queued for the probe."""
        ring = job.ring
        rec = self.recorded
        waited = False
        untracked = bool(job.untracked) and pid in job.untracked
        spans = covers[WINDOWS]
        if spans is None:
            spans = covers[WINDOWS] = _Covered()
        for w in sums:
            w = _uncovered(spans, w)
            if w is None:   # all of it counted already: a copy
                continue
            s, e = w.start_ns, w.end_ns
            n, step_ns = w.steps, w.step_ns
            if step_ns > e - s:   # steps of one process do not overlap: their time is at most the span
                step_ns = e - s
            # the exported step time (histogram sum, rank step seconds) is compile-free, as in _apply
            export_ns = max(0, step_ns - sum(inside for p, _, inside in w.phases if p == "compile"))
            slot = cur_slot if e // ring.width >= cur else ring.slot(e, now)
            rslot = rk.ring.slot(e, now) if rk is not None else None
            kinds, wait = self._window_phases(job, w, pid, slot, rk, rslot, gpus)
            waited = waited or wait
            self._window_steps(job, w, step_ns, export_ns, slot, rk, rslot, untracked)
            if gpus:
                group = [attribution.Pending((STEP, e), s, e, gpus, step_ns)]
                for k, ns in enumerate(kinds):
                    if ns:
                        group.append(attribution.Pending((IN_STEP + k, e), s, e, gpus, min(ns, step_ns)))
                self._queue_step(job, group)
            if rec is not None:
                rec.append((job.label, "step", s, e))
        return waited

    def _window_phases(self, job: _Job, w, pid: int, slot, rk: Optional[_Rank], rslot, gpus) -> Tuple[list, bool]:
        """A window's phases into the job's (and rank's) sums and rings, its data_wait for the probe, each phase
        queued for GPU idle spread over the window, the timeline's pieces; (in-step ns per IN_KINDS, whether a
        data_wait was queued)."""
        ring, phase_s, rec = job.ring, job.phase_s, self.recorded
        s, e = w.start_ns, w.end_ns
        kinds = [0] * len(IN_KINDS)
        waited = False
        cursor = s
        for phase, ns, inside in w.phases:
            i = PHASE_INDEX[phase]
            phase_s[i] += ns / 1e9
            if slot is not None:
                ring.phase[slot][i] += ns
                ring.in_step[slot][i] += inside
            if rk is not None:
                rk.phase_s[i] += ns / 1e9
                if rslot is not None:
                    rk.ring.phase[rslot][i] += ns
                    rk.ring.in_step[rslot][i] += inside
            for k, names in enumerate(IN_KIND_INDEXES):
                if i in names:
                    kinds[k] += inside
            if i == DATA_WAIT and self.probe is not None and ns and e > s:
                job.waits.append((pid, s, e, ns))
                waited = True
            if gpus and ns:
                self._queue(job, attribution.Pending((i, e), s, e, gpus, ns))
            if rec is not None:   # the timeline: the window's phases one after another, in proportion
                end = cursor + (ns * (e - s) // max(e - s, sum(p[1] for p in w.phases)))
                rec.append((job.label, phase, cursor, end))
                cursor = end
        return kinds, waited

    @staticmethod
    def _window_steps(job: _Job, w, step_ns: int, export_ns: int, slot, rk: Optional[_Rank], rslot,
                      untracked: bool) -> None:
        """A window's steps and samples: the job's (global steps, where ranks report: see _apply), the rank's,
        the rings'."""
        n = w.steps
        job.samples += w.samples
        counted = n
        if rk is not None:
            # global steps: those of this rank's steps that no rank had made yet (see _apply)
            before = rk.steps
            rk.steps += n
            rk.step_s += export_ns / 1e9
            if rslot is not None:
                rk.ring.step_ns[rslot] += step_ns
                rk.ring.steps[rslot] += n
            counted = rk.steps - max(before, job.rank_steps)
            if counted > 0:
                job.rank_steps = rk.steps
        if counted > 0 and not untracked:
            job.steps += counted
            job.hist_sum += export_ns / 1e9 * (counted / n)
            _add_counts(job.hist, w.hist, counted, n)
        if slot is not None:
            job.ring.step_ns[slot] += step_ns
            job.ring.steps[slot] += n

    @staticmethod
    def _close_step_sums(opened: List[Tuple[int, int, int]], s: int, e: int) -> Optional[list]:
        """The usual step, where each phase index occurs once among the open phases: [(index, ns
        inside [s, e))], and those ending by e forgotten.  None (nothing changed) when an index
        repeats: its pieces need merging (_close_step)."""
        out = []
        seen = 0
        straddles = False
        for k, a, b in opened:
            if b > e:
                straddles = True
                b = e
            if a < s:
                a = s
            if b > a:
                bit = 1 << k
                if seen & bit:
                    return None
                seen |= bit
                out.append((k, b - a))
        if straddles:
            Intake._forget_closed(opened, e)
        else:
            opened.clear()
        return out

    @staticmethod
    def _forget_closed(opened: List[Tuple[int, int, int]], e: int) -> None:
        """Drop the open phases that end by e; a phase straddling the step's end belongs to the next one too."""
        keep = [p for p in opened if p[2] > e]
        opened.clear()
        opened.extend(keep)

    @staticmethod
    def _close_step(opened: List[Tuple[int, int, int]], s: int, e: int) -> Dict[int, list]:
        """The merged pieces of the process's open phases inside its step [s, e); forget those that end by e."""
        pieces = attribution.clip_to_step(opened, s, e)
        Intake._forget_closed(opened, e)
        return pieces

    def _queue(self, job: _Job, p: attribution.Pending) -> None:
        q = job.pending
        if len(q) == q.maxlen:
            self._push_out(q)
        q.append(p)

    def _queue_step(self, job: _Job, group) -> None:
        """Queue a step with its in-step pieces, together: no part without its whole (a verdict's
        idle by kind can never exceed the idle of its steps).  A step whose pieces do not fit in
        the whole queue is not queued (counted as overflow)."""
        q = job.pending
        if len(group) > q.maxlen:
            self.attributed["overflow"] += 1
            return
        while len(q) + len(group) > q.maxlen:
            self._push_out(q)
        q.extend(group)

    def _push_out(self, q: Deque[attribution.Pending]) -> None:
        """Drop the oldest waiting interval unattributed; a step goes with its pieces (queued right after it)."""
        old = q.popleft()
        if old.key[0] < IN_STEP:
            self.attributed["overflow"] += 1
        if old.key[0] == STEP:
            while q and q[0].key[0] >= IN_STEP and q[0].key[1] == old.key[1]:
                q.popleft()   # internal pieces, not reported intervals: not counted


def _by_step(phases, steps):
    """(phases, steps) chunks in the order a process lived them: before each step, the phases (as sent) up to
    the first that starts at or after its end; the rest at the end."""
    out, i, n = [], 0, len(phases)
    for st in steps:
        j = i
        while j < n and phases[j][1] < st[1]:
            j += 1
        out.append((phases[i:j], (st,)))
        i = j
    if i < n:
        out.append((phases[i:], ()))
    return out


def _add_counts(hist: List[int], counts: Tuple[int, ...], m: int, n: int) -> None:
    """Add m of a window's n steps, whose bucket counts are ``counts``, to ``hist``: all of them, or (a rank
    whose window other ranks had partly counted already) m spread over its buckets in proportion, largest
    remainders first, so that exactly m are added."""
    if m >= n:
        for i, c in enumerate(counts):
            hist[i] += c
        return
    shares = [(c * m // n, c * m % n, i) for i, c in enumerate(counts)]
    left = m - sum(q for q, _, _ in shares)
    for q, _, i in shares:
        hist[i] += q
    for _, _, i in sorted(shares, key=lambda x: -x[1])[:left]:
        hist[i] += 1


def _uncovered(spans: "_Covered", w):
    """The window to count, given the process's earlier windows' spans (which it joins): itself, the share of
    it they had not covered (_part), or None where they covered all of it (a copy).  Only what this process's
    windows had not covered yet counts (issue 39); a window stands for at least MIN_STEP_NS (its steps' least
    time, issue 48), so that a copy of a window of no span is a copy, and windows 1 ns apart cannot add steps
    faster than one per MIN_STEP_NS."""
    s, e = w.start_ns, w.end_ns
    span = e - s if e - s >= MIN_STEP_NS else MIN_STEP_NS
    ends = spans.ends
    if not ends or s >= ends[-1]:   # the usual case, as _apply inlines it: after all the earlier windows
        if ends and s == ends[-1]:
            ends[-1] = s + span
        else:
            spans.starts.append(s)
            ends.append(s + span)
            if len(ends) > COVER_SPANS:
                spans.forget()
        return w
    new = sum(b - a for a, b in spans.add(s, s + span))
    if new >= span:
        return w
    return _part(w, new, span) if new else None


def _part(w: "Window", new: int, span: int) -> "Window":
    """The share new / span of a window (0 < new < span): what it adds where the process's earlier windows
    covered the rest of its span.  Its phases' time (as reported and inside the steps) and its steps' time in
    proportion, rounded down (never more than time); its steps in proportion, rounded to the nearest (a window
    overlapping the last by a few ns loses no step; a sliver of less than half a step's share adds none),
    spread over its buckets as _add_counts spreads them; its samples in proportion to the steps counted."""
    n = w.steps
    m = (2 * n * new + span) // (2 * span)
    hist = [0] * len(w.hist)
    if m:
        _add_counts(hist, w.hist, m, n)
    step_ns = min(w.step_ns, span) * new // span
    # the part's buckets agree with its step time, as protocol._possible holds a window's (issue 48): a step over
    # 5 ms the part's time cannot hold counts under 5 ms; time its steps cannot hold is dropped (never added)
    if len(hist) > 1 and hist[1] * (FAST_EDGE_NS + 1) > step_ns:
        hist[0] += hist[1]
        hist[1] = 0
    step_ns = min(step_ns, hist[0] * FAST_EDGE_NS + (hist[1] * (RESOLUTION_NS - 1) if len(hist) > 1 else 0))
    return Window(w.start_ns, w.end_ns, m, (2 * w.samples * m + n) // (2 * n), step_ns,
                  tuple((p, ns * new // span, inside * new // span) for p, ns, inside in w.phases), tuple(hist))
