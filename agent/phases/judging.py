"""From a job's sums to what is exported: GPU idle credited to intervals once the driver's samples
cover them, data waits credited with what the processes did meanwhile (/proc), the evidence over the
window per job and per rank, the verdict (the critical rank's where the job has ranks) and the JobView.
A mixin of ``agent.phases.jobs.JobTable``; called under the table's lock."""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional

from ..metrics import histogram_value
from . import attribution, cause, ranks
from .protocol import PHASES, STEP_BUCKETS, SAMPLES_UNSEEN_SOURCES, STEPS_ONLY_SOURCES
from .verdict import Evidence, InputWait, decide
from .jobstate import COMPUTE, IN_KINDS, IN_STEP, JobView, NP, RankView, STEP, WAIT_COVER_NS, _Job, _Rank


class Judging:
    """JobTable's judging: GPU idle and data waits credited, evidence, verdicts and views."""

    def learn_gpus(self) -> None:
        """The GPUs the agent samples, for the next datagrams' CUDA_VISIBLE_DEVICES (intake): every read of the
        phases collector learns them, its idle reads too (the first datagrams of a new job are credited to its
        GPUs only if they are known by then)."""
        known = frozenset(self.ctx.timeline.gpus())
        if known != self._known_gpus:
            with self._lock:
                self._known_gpus = known

    def attribute(self, now_ns: int, force: bool = False) -> None:
        """Credit GPU idle time to the intervals whose GPU samples have arrived (or waited too long)."""
        tl = self.ctx.timeline
        known = frozenset(tl.gpus())
        with self._lock:
            self._known_gpus = known
            for job in (*self._jobs.values(), *self._ended.values()):
                if job.waits:
                    self._measure_waits(job, now_ns, force)
                if not job.pending:
                    continue
                ready, late = attribution.take_ready(job.pending, tl.covered_until, now_ns, self.max_delay_ns, force)
                if not ready:
                    continue
                # count the reported intervals, not the in-step pieces queued for the verdict
                n_late = sum(1 for p in late if p.key[0] < IN_STEP)
                self.attributed["late"] += n_late
                self.attributed["complete"] += sum(1 for p in ready if p.key[0] < IN_STEP) - n_late
                ring = job.ring
                for ((kind, end), gpu), (idle, obs) in attribution.attribute_pending(ready, tl.window).items():
                    slot = ring.slot(end, now_ns)
                    if kind == STEP:
                        if slot is not None:
                            ring.step_idle[slot] += idle
                            ring.step_obs[slot] += obs
                            ring.step_attr[slot] = True
                        continue
                    if kind >= IN_STEP:
                        if slot is not None:
                            ring.kind_idle[slot][kind - IN_STEP] += idle
                        continue
                    job.gpu_idle[(gpu, kind)] = job.gpu_idle.get((gpu, kind), 0.0) + idle / attribution.IDLE_UNIT
                    if slot is not None:
                        ring.idle[slot][kind] += idle
                        ring.obs[slot][kind] += obs

    def _measure_waits(self, job: _Job, now_ns: int, force: bool) -> None:
        """Credit the job's data_wait intervals with what its processes did meanwhile (/proc samples)."""
        seen: Dict[int, tuple] = {}
        waits = job.waits
        while waits:
            pid, s, e, ns = waits[0]
            got = seen.get(pid)
            if got is None:  # once per pid, not per wait: 10,000 waits a second would each copy the ring's times
                samples, problem, gone = self.probe.samples(pid)
                got = seen[pid] = samples, problem, gone, [x.t_ns for x in samples]
            samples, problem, gone, times = got
            u = cause.wait_usage(samples, s, e, times)
            if u is None and not (gone or force or now_ns - e > WAIT_COVER_NS) and (
                    not samples or samples[0].t_ns <= s):
                break  # the sample after its end is not there yet
            waits.popleft()
            if u is None:
                if gone or not samples:
                    job.wait_problem = problem or f"no /proc sample of pid {pid}"
                continue  # (or the wait began before sampling started)
            if ns != e - s:   # a window's data_wait: its share of what the process did over the window
                u = _scaled_usage(u, ns / (e - s))
            slot = job.ring.slot(e, now_ns)
            if slot is not None:
                job.ring.wait[slot].add(ns, u)
            rk = job.ranks.get(pid) if job.ranks else None
            if rk is not None:
                rslot = rk.ring.slot(e, now_ns)
                if rslot is not None:
                    rk.ring.wait[rslot].add(ns, u)
            job.wait_problem = problem

    def _rank_evidence(self, job: _Job, rk: _Rank, now_ns: int) -> Evidence:
        """One rank's evidence over the window: its phase times and input waits (no GPU figures: those
        are the job's, see agent.phases.ranks)."""
        ring = rk.ring
        in_step = [0] * NP
        phase = [0] * NP
        step_ns = steps = 0
        waits = []
        for i in ring.live(now_ns):
            for k in range(NP):
                in_step[k] += ring.in_step[i][k]
                phase[k] += ring.phase[i][k]
            step_ns += ring.step_ns[i]
            steps += ring.steps[i]
            if ring.wait[i].n:
                waits.append(ring.wait[i])
        times = in_step if step_ns > 0 else phase
        return Evidence(
            window_s=min(self.window_ns, max(0, now_ns - job.created_ns)) / 1e9,
            phase_seconds={p: times[k] / 1e9 for k, p in enumerate(PHASES) if times[k]},
            step_seconds=step_ns / 1e9, steps=steps,
            silent_s=max(0.0, (now_ns - rk.last_ns) / 1e9),
            input_wait=self._input_wait(job, waits),
            extra=self.extra_evidence() if self.extra_evidence is not None else (),
            source=job.source, exchange_observed=_exchange_observed(job),
            config=job.configs.merged(), cpus=self.cpus)

    def _evidence(self, job: _Job, now_ns: int) -> Evidence:
        ring = job.ring
        live = ring.live(now_ns)
        phase = [0] * NP
        in_step = [0] * NP
        idle = [0] * NP
        obs = [0] * NP
        kind_idle = [0] * len(IN_KINDS)
        step_ns = step_idle = step_obs = 0
        steps = 0
        step_attr = False
        waits = []
        for i in live:
            for k in range(NP):
                phase[k] += ring.phase[i][k]
                in_step[k] += ring.in_step[i][k]
                idle[k] += ring.idle[i][k]
                obs[k] += ring.obs[i][k]
            for k in range(len(IN_KINDS)):
                kind_idle[k] += ring.kind_idle[i][k]
            w = ring.wait[i]
            if w.n:
                waits.append(w)
            step_ns += ring.step_ns[i]
            steps += ring.steps[i]
            step_idle += ring.step_idle[i]
            step_obs += ring.step_obs[i]
            step_attr = step_attr or ring.step_attr[i]
        # With steps, shares count only the phase time inside them; without, the phases themselves.
        times = in_step if step_ns > 0 else phase
        unit = attribution.IDLE_UNIT
        # Without steps, observed time is summed per phase like the idle time (same order, same
        # rounding), so the idle sum cannot round above it.
        phase_obs = sum(obs[k] / 1e9 for k in range(NP) if idle[k] or obs[k])
        return Evidence(
            window_s=min(self.window_ns, max(0, now_ns - job.created_ns)) / 1e9,
            phase_seconds={p: times[k] / 1e9 for k, p in enumerate(PHASES) if times[k]},
            step_seconds=step_ns / 1e9,
            steps=steps,
            gpu_idle_seconds={p: idle[k] / unit for k, p in enumerate(PHASES) if idle[k]},
            gpu_observed_seconds=step_obs / 1e9 if step_attr else phase_obs,
            gpu_step_idle_seconds=step_idle / unit if step_attr else None,
            gpu_idle_by_kind={name: kind_idle[k] / unit for k, (name, _) in enumerate(IN_KINDS)} if step_attr else None,
            silent_s=max(0.0, (now_ns - job.last_ns) / 1e9),
            input_wait=self._input_wait(job, waits),
            extra=self.extra_evidence() if self.extra_evidence is not None else (),
            source=job.source,
            exchange_observed=_exchange_observed(job),
            config=job.configs.merged(), cpus=self.cpus,
        )

    def _links(self, job: _Job, now_ns: int):
        """The node's interfaces over the job's window, from its first message where that is later and to its
        last (its share of time in the exchange is of that span), None where not sampled.  Read only for a
        job judged communication-bound (_view): no other verdict uses it."""
        hist = getattr(self.ctx, "links", None)
        if hist is None or not hist.sampled:
            return None
        return tuple(hist.window(max(now_ns - self.window_ns, job.created_ns), min(now_ns, job.last_ns)))

    def _input_wait(self, job: _Job, sums) -> Optional[InputWait]:
        if self.probe is None:
            return None
        n = sum(w.n for w in sums)
        if not n:
            return InputWait(problem=job.wait_problem)
        io_n, cst_n, rd_n = sum(w.io_n for w in sums), sum(w.cst_n for w in sums), sum(w.rd_n for w in sums)
        return InputWait(
            wait_s=sum(w.wait_ns for w in sums) / 1e9, cpu_s=sum(w.cpu_s for w in sums),
            read_bytes=None if any(w.no_io for w in sums) else sum(w.read_bytes for w in sums),
            io_stall_s=sum(w.io_s for w in sums) if io_n == n else None,
            cpu_stall_s=sum(w.cst_s for w in sums) if cst_n == n else None,
            run_delay_s=sum(w.rd_s for w in sums) if rd_n == n else None,
            problem=job.wait_problem)

    def _judge(self, job: _Job, job_ev: Evidence, evs):
        """(verdict, critical rank or None, the evidence judged): the critical rank's where the job has ranks
        (agent.phases.ranks; a single process is its own rank, with the job's GPU figures), else the job's."""
        if job.ranks:
            notes = self.ctx.gpu_notes
            crit = ranks.judge([ranks.RankEvidence(rk.rank, pid, rk.gpus, evs[pid],
                                                   "; ".join(f"GPU {g}: {notes[g]}" for g in rk.gpus if g in notes))
                                for pid, rk in job.ranks.items()], self.thresholds, untracked=len(job.untracked))
            if crit is not None:
                return crit.verdict, crit.rank.rank if crit.named else None, crit.rank.evidence   # even: nobody
        return decide(job_ev, self.thresholds), None, job_ev

    def _view(self, job: _Job, now_ns: int, ended: bool = False) -> JobView:
        ev = job_ev = self._evidence(job, now_ns)
        # a steps-only source cannot see input waits: its input-bound ratio is absent, not 0 (_input_ratio);
        # the four usual phases start at 0 for a job that reports phases (a counter born at 0 loses no
        # increase); a steps-only job reports none, so its phase counters are absent, as are its samples
        # while it has counted none (a steps-only source may not know its batch size)
        steps_only = job_ev.source in STEPS_ONLY_SOURCES
        evs = {pid: job_ev if len(job.pids) == 1 else self._rank_evidence(job, rk, now_ns)
               for pid, rk in job.ranks.items()}
        verdict, critical, ev = self._judge(job, job_ev, evs)
        if verdict.kind == "communication":
            # its cause reads the node's interfaces over the job's window: only now, for this verdict
            links = self._links(job, now_ns)
            if links is not None:
                job_ev = dataclasses.replace(job_ev, network=links)
                evs = {pid: job_ev if len(job.pids) == 1 else dataclasses.replace(e, network=links)
                       for pid, e in evs.items()}
                verdict, critical, ev = self._judge(job, job_ev, evs)
        rank_views = tuple(sorted((RankView(
            rank=rk.rank, pid=pid,
            phase_seconds=tuple((p, rk.phase_s[k]) for k, p in enumerate(PHASES)
                                if rk.phase_s[k] or (k < 4 and not steps_only)),
            steps=rk.steps, step_seconds=rk.step_s,
            input_bound_ratio=_input_ratio(evs[pid]), gpus=rk.gpus) for pid, rk in job.ranks.items()),
            key=lambda r: r.rank))
        ratio = _input_ratio(ev)
        efficiency = _scaling_efficiency([evs[pid] for pid in job.ranks] if job.ranks else [job_ev])
        return JobView(
            train_job=job.label, user=job.user, uid=job.uid, pid=job.first_pid, processes=len(job.pids),
            phase_seconds=tuple((p, job.phase_s[k]) for k, p in enumerate(PHASES)
                                if job.phase_s[k] or (k < 4 and not steps_only)),
            steps=job.steps, samples=None if (steps_only or job_ev.source in SAMPLES_UNSEEN_SOURCES) and not job.samples
            else job.samples,
            step_hist=histogram_value(STEP_BUCKETS, job.hist, job.hist_sum),
            input_bound_ratio=ratio,
            gpu_idle_seconds=tuple((g, PHASES[k], v) for (g, k), v in sorted(job.gpu_idle.items())),
            gpu_idle_ratio=job_ev.gpu_idle_ratio,
            last_message_age_s=ev.silent_s,
            client_dropped=sum(job.pids.values()),
            verdict=verdict,
            evidence=ev,
            ranks=rank_views,
            critical_rank=critical,
            world_size=job.world,
            shed=job.shed,
            start_time=job.start_time,
            ended=ended,
            namespace=job.namespace,
            pod=job.pod,
            scaling_efficiency=efficiency,
            config=job_ev.config,
            inside=job.inside.view(job.phase_s[COMPUTE], {pid: rk.rank for pid, rk in job.ranks.items()},
                                   {pid: rk.phase_s[COMPUTE] for pid, rk in job.ranks.items()}),
            trace=job.traces.view(),
        )


def _scaled_usage(u: "cause.WaitUsage", f: float) -> "cause.WaitUsage":
    """What a process did over a window, times the share f of the window its data_wait took."""
    return cause.WaitUsage(u.cpu_s * f, None if u.read_bytes is None else int(u.read_bytes * f),
                           None if u.io_stall_s is None else u.io_stall_s * f,
                           None if u.cpu_stall_s is None else u.cpu_stall_s * f,
                           None if u.run_delay_s is None else u.run_delay_s * f)


UNTIMED_EXCHANGE_SOURCES = frozenset({"tf.data", "tf-steps", "keras"})   # zero-code TensorFlow: its collectives


def _exchange_observed(job: _Job) -> bool:
    """False for a data-parallel job (ranks, or a world size said) whose framework's gradient exchange teye
    cannot time: TensorFlow's, inside its step functions."""
    return not (job.source in UNTIMED_EXCHANGE_SOURCES and (job.ranks or (job.world or 0) > 1))


def _scaling_efficiency(evs) -> Optional[float]:
    """The share of step time not lost to the exchange or to waiting for other ranks in it: 1 less the
    ``communication`` share, over the window, the mean of the job's ranks on this node (each rank's own
    share: a rank's waits are its own); None without step time or from a source that cannot see the
    exchange (steps only)."""
    shares = [e.share("communication") for e in evs
              if e.step_time > 0 and e.source not in STEPS_ONLY_SOURCES and e.exchange_observed]
    return 1.0 - sum(shares) / len(shares) if shares else None


def _input_ratio(ev: Evidence) -> Optional[float]:
    """The data_wait share of step time; None without step time or from a steps-only source (which cannot
    see input waits: absent, not 0)."""
    return ev.share("data_wait") if ev.step_time > 0 and ev.source not in STEPS_ONLY_SOURCES else None
