"""The "phases" collector: training jobs' phase messages, GPU idle time per phase, the verdict.

The source owns the receiver thread (``close()`` stops it).  ``collect()``, called by the
sampler, credits GPU idle time to the intervals whose driver samples have arrived
(``ctx.timeline``), expires silent jobs and returns a frozen :class:`PhasesReading`.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Tuple

from ..errors import ConfigError, SourceUnavailable
from ..metrics import COUNTER, GAUGE, HISTOGRAM, Point, metric, point
from . import jobconfig
from .advice import points as advice_points
from .jobs import ATTRIBUTION_RESULTS, STEP_BUCKETS, JobTable, JobView
from .jobcpu import CpuWatch, JobCpu
from .memory import KINDS as MEMORY_KINDS, JobMemory, MemoryWatch
from .parts import EXPORTED as PART_NAMES
from .pods import PodResolver
from .procstat import InputProbe, ProcReader
from .protocol import RESULTS
from .receiver import DEFAULT_SOCKET, Receiver, bind_listener, bind_socket, check_own_dir, open_socket
from .links import COMMUNICATION_CAUSES
from .verdict import CAUSES, KINDS

log = logging.getLogger("teye.phases")

# seconds between the phases collector's reads while it is idle (no job, nothing received): the host
# collectors' default interval, whose slots it then shares
IDLE_PACE_S = 5.0

PHASE_SECONDS = metric("teye_job_phase_seconds_total", COUNTER,
                       "Seconds the training job spent in each phase (data_wait, compute, host, communication, "
                       "checkpoint, eval, compile, other), as reported by the job over the phase socket; each "
                       "process's overlapping intervals of a phase count once; compile (tracing a step function) "
                       "is in no share of the step time (docs/phases.md).",
                       ["train_job", "phase"])
STEPS = metric("teye_job_steps_total", COUNTER,
               "Training steps the job reported: global steps for a data-parallel job (a step of all its ranks "
               "counts once, when its first rank on this node completes it).", ["train_job"])
SAMPLES = metric("teye_job_samples_total", COUNTER, "Training samples the job reported (sum of step batch sizes).",
                 ["train_job"])
INPUT_BOUND = metric("teye_job_input_bound_ratio", GAUGE,
                     "Share of step time spent in data_wait over the sliding window (phases.window_seconds).",
                     ["train_job"])
GPU_IDLE = metric("teye_job_gpu_idle_seconds_total", COUNTER,
                  "GPU idle seconds overlapping each phase of the job: idle fraction of each driver utilization "
                  "sample times its overlap with the phase interval (credited once the samples arrive).",
                  ["train_job", "gpu", "phase"])
GPU_IDLE_RATIO = metric("teye_job_gpu_idle_ratio", GAUGE,
                        "Share of the job's observed GPU time (during its steps, or its phases when it reports no "
                        "steps) that its GPUs were idle, over the sliding window.", ["train_job"])
BOTTLENECK = metric("teye_job_bottleneck", GAUGE,
                    "1 for the job's current verdict (input, host, communication, compute, idle, not_observed: steps "
                    "only and no GPU samples, so the bottleneck is not observed), 0 for the others.",
                    ["train_job", "kind"])
INPUT_CAUSE = metric("teye_job_input_cause", GAUGE,
                     "For a job whose verdict is input: 1 for the cause of its input waits, 0 for the others: "
                     "storage (its processes wait with little CPU), host_cpu (their threads are busy decoding, "
                     "augmenting, in Python, or starved of CPU), unknown (not measurable: the process exited, another "
                     "pid namespace, /proc/<pid>/io unreadable). Absent for other verdicts.", ["train_job", "cause"])
COMM_CAUSE = metric("teye_job_communication_cause", GAUGE,
                    "For a job whose verdict is communication: 1 for the cause, 0 for the others: network_errors "
                    "(an interface that carried traffic had errors, drops or carrier changes), network_bandwidth "
                    "(the busiest interface is full at its speed or shaper rate while the job exchanges), "
                    "straggler (its ranks on this node differ in communication share: they wait for one), unknown. "
                    "Absent for other verdicts (docs/phases.md).", ["train_job", "cause"])
INPUT_WAIT_CPU = metric("teye_job_input_wait_cpu_ratio", GAUGE,
                        "CPU seconds the job's sending processes (all threads) used per second of their data_wait, "
                        "over the sliding window, from /proc/<pid>/stat sampled every "
                        "phases.input_sample_interval_seconds (1 = one core busy; above 1 with several threads).",
                        ["train_job"])
JOB_INFO = metric("teye_job_info", GAUGE,
                  "Always 1: who runs the job, from kernel credentials (pid is the first sending process), "
                  "and where its phases come from (source: client, torch, torch-forward, torch-steps, tf.data, "
                  "tf-steps, keras, other; docs/zero-code.md). With phases.pods (Kubernetes), namespace and pod name the sender's pod, from "
                  "its cgroup (pod: the pod uid where the kubelet's log directory does not name it; both empty "
                  "outside pods).",
                  ["train_job", "user", "uid", "pid", "source", "namespace", "pod"])
JOB_PROCESSES = metric("teye_job_processes", GAUGE, "Distinct processes that sent phases for the job (at most 64).",
                       ["train_job"])
START_TIME = metric("teye_job_start_time_seconds", GAUGE,
                    "Unix time this run of the job began on this node (its first message). A job name whose "
                    "processes all exited, reused by new processes, starts a new run: a new start time, counters "
                    "from zero (docs/phases.md).", ["train_job"], unit="seconds")
RUNNING = metric("teye_job_running", GAUGE,
                 "1 while a process of this run of the job runs, 0 once they have all exited (the run ended; its "
                 "series stay, unchanged, until phases.job_expiry_seconds or a new run of the name).", ["train_job"])
STEP_SECONDS = metric("teye_job_step_seconds", HISTOGRAM,
                      "Wall time of the job's training steps (global steps, as teye_job_steps_total).", ["train_job"],
                      buckets=STEP_BUCKETS)
LAST_AGE = metric("teye_job_last_message_age_seconds", GAUGE, "Seconds since the job's last phase message.",
                  ["train_job"])
CLIENT_DROPPED = metric("teye_job_client_dropped_total", COUNTER,
                        "Phase and step records the job's clients dropped (no agent, full socket buffer), "
                        "as they report it.", ["train_job"])
RANK_PHASE_SECONDS = metric("teye_job_rank_phase_seconds_total", COUNTER,
                            "Seconds each rank of a data-parallel job on this node spent in each phase, as reported, "
                            "its overlapping intervals of a phase counted once (ranks: the processes that said "
                            "theirs, at most 64 per job; docs/phases.md).",
                            ["train_job", "rank", "phase"])
RANK_STEP_SECONDS = metric("teye_job_rank_step_seconds_total", COUNTER,
                           "Wall time of each rank's training steps (the denominator of its phase shares).",
                           ["train_job", "rank"])
RANK_STEPS = metric("teye_job_rank_steps_total", COUNTER, "Training steps each rank of the job reported.",
                    ["train_job", "rank"])
RANK_INPUT_BOUND = metric("teye_job_rank_input_bound_ratio", GAUGE,
                          "Share of each rank's step time spent in data_wait over the sliding window "
                          "(phases.window_seconds).", ["train_job", "rank"])
SCALING = metric("teye_job_scaling_efficiency_ratio", GAUGE,
                 "Share of the job's step time not in communication (the exposed gradient exchange, and the waits "
                 "for other ranks in it) over the sliding window: 1 less the communication share, the mean of its "
                 "ranks' on this node. Absent for steps-only jobs and jobs without step time.", ["train_job"])
CRITICAL_RANK = metric("teye_job_critical_rank", GAUGE,
                       "The rank of the job on this node whose verdict is the job's: the one whose own input or "
                       "host wait holds the others back (docs/phases.md). Absent for jobs without ranks and where "
                       "the ranks are even.",
                       ["train_job"])
WORLD_SIZE = metric("teye_job_world_size", GAUGE,
                    "Ranks in the data-parallel job, as its launcher says (WORLD_SIZE, SLURM_NTASKS ...), over all "
                    "nodes. Absent where no rank said it.", ["train_job"])
SHED = metric("teye_job_shed_messages_total", COUNTER,
              "Datagrams of the job the agent discarded unread: the receiver's rate budget "
              "(phases.max_messages_per_second) was spent and the sending process or uid was over its share, "
              "so other jobs keep theirs.", ["train_job"])
TRACES = metric("teye_job_trace_processes_total", COUNTER,
                "Processes of the job that finished a trace on request (teye trace), by result: done (the trace "
                "written) or failed (its status file says why). Absent until one did (docs/trace.md).",
                ["train_job", "result"])
TRACE_TIME = metric("teye_job_trace_last_timestamp_seconds", GAUGE,
                    "When the job's latest trace on request was reported (Unix time): a dashboard's marker.",
                    ["train_job"])
TRACE_INFO = metric("teye_job_trace_info", GAUGE,
                    "1 for the job's latest trace on request, labelled by its id (the trace files on each node are "
                    "<output>/<train_job>.<id>.<node>.rank<R>.pt.trace.json, or .tf.trace.json for TensorFlow): one series per job.",
                    ["train_job", "id"])
TRACE_STEPS = metric("teye_job_trace_steps", GAUGE,
                     "Steps each process of the job traced in its latest trace on request.", ["train_job"])
STEP_PARTS = metric("teye_job_step_part_seconds_total", COUNTER,
                    "Seconds of the job's compute in each part of its steps (forward, backward, optimizer, "
                    "h2d_copy, other), as its zero-code PyTorch client times them (the device's time where CUDA is "
                    "in use, else the host's; the exposed gradient exchange is communication, not backward); other "
                    "is the rest of compute, so the parts add up to teye_job_phase_seconds_total{phase=\"compute\"}. "
                    "Absent for jobs whose client sends no parts (docs/phases.md).", ["train_job", "part"])
RANK_STEP_PARTS = metric("teye_job_rank_step_part_seconds_total", COUNTER,
                         "Seconds of each rank's compute in each part of its steps, as teye_job_step_part_seconds_total; "
                         "they add up to the rank's teye_job_rank_phase_seconds_total{phase=\"compute\"}.",
                         ["train_job", "rank", "part"])
MEMORY = metric("teye_job_memory_bytes", GAUGE,
                "Memory of the job's training processes on this node (the processes that send its steps, not their "
                "DataLoader workers), summed: host_resident (RSS, /proc/<pid>/statm), and where CUDA is in use "
                "device_allocated, device_reserved (CUDA's caching allocator at the latest step) and device_peak "
                "(the most allocated during the latest step, reset each step; summed over ranks).",
                ["train_job", "kind"], unit="bytes")
RANK_MEMORY = metric("teye_job_rank_memory_bytes", GAUGE,
                     "Memory of each rank's training process, by kind as teye_job_memory_bytes.",
                     ["train_job", "rank", "kind"], unit="bytes")
RANK_GPU = metric("teye_job_rank_gpu_info", GAUGE,
                  "Always 1 per GPU a rank of the job uses on this node (gpu as teye_gpu_info's): joins "
                  "teye_job_rank_memory_bytes to teye_gpu_memory_total_bytes (how close a rank is to running out).",
                  ["train_job", "rank", "gpu"])
JOB_CPU = metric("teye_job_cpu_seconds_total", COUNTER,
                 "CPU time (user and system) of the job's processes on this node, each since it started: its "
                 "training processes (its ranks, else the first process that sent its phases), the children they "
                 "reaped and their live descendants (DataLoader workers, decoders); read from /proc/<pid>. The "
                 "job's own figure where no cgroup of it is seen (outside Slurm; a Slurm job's cgroup figure is "
                 "teye_slurm_job_cpu_seconds_total).", ["train_job"], unit="seconds")
JOB_CPUS = metric("teye_job_cpus", GAUGE,
                  "CPUs the job's training processes may run on (the union of their Cpus_allowed_list: taskset, a "
                  "cpuset): the denominator of the job's CPU efficiency in teye report outside Slurm.",
                  ["train_job"])
MESSAGES = metric("teye_phase_messages_total", COUNTER,
                  "Phase datagrams received, by result: accepted, or the reason they were rejected.", ["result"])
ATTRIBUTED = metric("teye_phase_intervals_attributed_total", COUNTER,
                    "Phase intervals credited with GPU idle time: complete (samples covered them), late (waited "
                    "phases.attribution_max_delay_seconds, credited with what was there), overflow (pushed out "
                    "of the bounded queue, not credited).", ["result"])
CONNECTIONS = metric("teye_phase_connections", GAUGE,
                     "Clients connected to the phase socket's listener now (each sends on a queue of its own; the "
                     "others send datagrams to the shared socket).")
CONN_REFUSED = metric("teye_phase_connections_refused_total", COUNTER,
                      "Connections the agent refused (64 of one uid or 512 in all already, or a process in debt for "
                      "what its messages cost): what each had sent was handled, and its client sends datagrams.")
JOBS = metric("teye_phase_jobs", GAUGE, "Training jobs in the phase table: live runs, and ended runs until they expire "
              "or their name starts a new run.")
PENDING = metric("teye_phase_pending_intervals", GAUGE, "Phase intervals waiting for the GPU samples that cover them.")


@dataclass(frozen=True)
class PhasesReading:
    jobs: Tuple[JobView, ...]
    results: Tuple[Tuple[str, int], ...]
    attributed: Tuple[Tuple[str, int], ...]
    pending: int
    socket_path: str = ""
    config_results: Tuple[Tuple[str, int], ...] = ()   # configurations received, by result (jobconfig)
    memory: Tuple[JobMemory, ...] = ()   # per live job, its processes' memory (agent.phases.memory)
    cpu: Tuple[JobCpu, ...] = ()         # per job, its processes' CPU time (agent.phases.jobcpu)
    connections: int = 0                 # clients connected now, and connections refused since the start
    refused_connections: int = 0

    def job(self, train_job: str) -> Optional[JobView]:
        for j in self.jobs:
            if j.train_job == train_job:
                return j
        return None

    def points(self) -> Iterator[Point]:
        for result, n in self.results:
            yield point(MESSAGES, n, result)
        for result, n in self.attributed:
            yield point(ATTRIBUTED, n, result)
        yield from jobconfig.result_points(dict(self.config_results))
        yield point(CONNECTIONS, self.connections)
        yield point(CONN_REFUSED, self.refused_connections)
        yield point(JOBS, len(self.jobs))
        yield point(PENDING, self.pending)
        for j in self.jobs:
            name = j.train_job
            yield point(JOB_INFO, 1, name, j.user, j.uid, j.pid, j.source, j.namespace, j.pod)
            yield point(JOB_PROCESSES, j.processes, name)
            yield point(START_TIME, j.start_time, name)
            yield point(RUNNING, 0 if j.ended else 1, name)
            for phase, s in j.phase_seconds:
                yield point(PHASE_SECONDS, s, name, phase)
            yield point(STEPS, j.steps, name)
            yield point(SAMPLES, j.samples, name)
            yield point(STEP_SECONDS, j.step_hist, name)
            yield point(INPUT_BOUND, j.input_bound_ratio, name)
            yield point(SCALING, j.scaling_efficiency, name)
            for gpu, phase, s in j.gpu_idle_seconds:
                yield point(GPU_IDLE, s, name, gpu, phase)
            yield point(GPU_IDLE_RATIO, j.gpu_idle_ratio, name)
            for kind in KINDS:
                yield point(BOTTLENECK, 1 if kind == j.verdict.kind else 0, name, kind)
            if j.verdict.cause is not None and j.verdict.kind == "input":
                for c in CAUSES:
                    yield point(INPUT_CAUSE, 1 if c == j.verdict.cause else 0, name, c)
            elif j.verdict.cause is not None and j.verdict.kind == "communication":
                for c in COMMUNICATION_CAUSES:
                    yield point(COMM_CAUSE, 1 if c == j.verdict.cause else 0, name, c)
            yield point(INPUT_WAIT_CPU, j.input_wait_cpu_ratio, name)
            yield point(LAST_AGE, j.last_message_age_s, name)
            yield point(CLIENT_DROPPED, j.client_dropped, name)
            for r in j.ranks:
                rank = str(r.rank)
                for phase, sec in r.phase_seconds:
                    yield point(RANK_PHASE_SECONDS, sec, name, rank, phase)
                yield point(RANK_STEP_SECONDS, r.step_seconds, name, rank)
                yield point(RANK_STEPS, r.steps, name, rank)
                yield point(RANK_INPUT_BOUND, r.input_bound_ratio, name, rank)
            if j.critical_rank is not None:
                yield point(CRITICAL_RANK, j.critical_rank, name)
            if j.world_size is not None:
                yield point(WORLD_SIZE, j.world_size, name)
            yield point(SHED, j.shed, name)
            yield from jobconfig.points(name, j.config)
            yield from advice_points(name, j.verdict.tips)
            yield from _inside_points(j)
            yield from _trace_points(j)
        for m in self.memory:
            yield from _memory_points(m)
        for c in self.cpu:
            yield point(JOB_CPU, c.seconds, c.train_job)
            yield point(JOB_CPUS, c.cpus, c.train_job)


def _inside_points(j: JobView) -> Iterator[Point]:
    name = j.train_job
    for r in j.ranks:
        for gpu in r.gpus:
            yield point(RANK_GPU, 1, name, str(r.rank), gpu)
    ins = j.inside
    if ins is None:
        return
    for part, sec in ins.part_seconds:
        yield point(STEP_PARTS, sec, name, part)
    for p in ins.processes:
        if p.rank is not None and any(sec for _p, sec in p.part_seconds):
            for part, sec in p.part_seconds:
                yield point(RANK_STEP_PARTS, sec, name, str(p.rank), part)


def _trace_points(j: JobView) -> Iterator[Point]:
    t = j.trace
    if t is None:
        return
    name = j.train_job
    for result, n in t.totals:
        yield point(TRACES, n, name, result)
    yield point(TRACE_TIME, t.time, name)
    yield point(TRACE_INFO, 1, name, t.id)
    yield point(TRACE_STEPS, t.steps, name)


def _memory_points(m: JobMemory) -> Iterator[Point]:
    for kind in MEMORY_KINDS:
        yield point(MEMORY, m.total(kind), m.train_job, kind)
    for p in m.processes:
        if p.rank is not None:
            for kind, v in p.values:
                yield point(RANK_MEMORY, v, m.train_job, str(p.rank), kind)


class PhaseSource:
    name = "phases"

    def __init__(self, phases_cfg, ctx, socket_path: Optional[str] = None, record_intervals: int = 0,
                 procfs: str = "/proc", sysfs: str = "/sys", pod_log_dir: Optional[str] = "/var/log/pods"):
        """Bind the socket (ConfigError for a bad explicit path) and start the receiver thread (and the
        input probe, which samples the senders of data_wait under ``procfs``/``sysfs``)."""
        self.ctx = ctx
        interval = phases_cfg["input_sample_interval_seconds"]
        self.probe = InputProbe(ProcReader(procfs, sysfs), interval, ctx.clock) if interval > 0 else None
        pods = PodResolver(procfs, pod_log_dir) if phases_cfg.get("pods") else None
        self.table = JobTable(phases_cfg, ctx, record_intervals=record_intervals, probe=self.probe, pods=pods)
        self.memory = MemoryWatch(ProcReader(procfs, sysfs))
        self.cpu = CpuWatch(ProcReader(procfs, sysfs))
        # what host collectors (hardware counters) offer as evidence, cited when the host is the limit
        self.table.extra_evidence = lambda: ctx.host_notes
        configured = socket_path if socket_path is not None else phases_cfg["socket"]
        self._default_dir = not configured      # a default location: its directory is checked again on a rebind
        self._cfg = phases_cfg
        self._last = None   # (the table's quiet counters, the reading) of the last read, while it was idle
        self._hurry: Optional[Callable[[], None]] = None   # the sampler's: read me at my configured interval
        self._hurried = False
        sock, path, ident = open_socket(configured)
        self.path = path
        self.rebinds = 0
        self.receiver = self._receiver(sock, ident)
        if self.probe is not None:
            self.probe.start()
        log.info("receiving training-job phases on %s (protocol versions 1 and 2)", path)

    def _receiver(self, sock, ident) -> Receiver:
        r = Receiver(sock, self.path, ident, self._handle_batch, self._cfg["max_message_bytes"],
                     self._cfg["max_messages_per_second"], shed=self.table.shed, listener=bind_listener(self.path))
        r.on_activity = self._activity
        r.start()
        return r

    def _rebind(self) -> str:
        """Bind the path again after the socket file went or was replaced; what happened, for the reason."""
        try:
            if self._default_dir:
                check_own_dir(os.path.dirname(self.path), run_dir=self.path == DEFAULT_SOCKET)
            sock, ident = bind_socket(self.path)
        except (ConfigError, OSError) as e:
            return "cannot bind it again: " + str(e).replace("config key 'phases.socket': ", "")
        self.receiver.release_listener()   # (its connections go on until it closes, below)
        old, self.receiver = self.receiver, self._receiver(sock, ident)
        old.close()
        self.rebinds += 1
        log.warning("phase socket %s bound again", self.path)
        return "bound it again"

    # -- idle pace (issue 49) ------------------------------------------------------------------
    # While no job nor ended run is known and nothing came, a read hands out the same reading again: the sampler
    # need not wake for it every second.  The source then asks for IDLE_PACE_S between reads (on the slots of the
    # host collectors' default interval, so one wake-up serves them all), and the receiver's first round after
    # (a message, a connection made or closed) brings the next read back to the configured interval's next slot.

    def next_interval_s(self, configured: float) -> float:
        last = self._last
        if last is None or configured >= IDLE_PACE_S or self._quiet() != last[0]:
            return configured
        return IDLE_PACE_S

    def _handle_batch(self, batch) -> None:
        """The receiver's hand-off.  While idle the table is read only every IDLE_PACE_S, and a read is where it
        learns the GPUs the agent samples (a datagram's CUDA_VISIBLE_DEVICES is resolved against them as it is
        handled): a new job's first datagrams learn them first, or they would be credited to no GPU."""
        if self._last is not None:
            self.table.learn_gpus()
        self.table.handle_batch(batch)

    def set_hurry(self, hurry: Callable[[], None]) -> None:
        self._hurry = hurry

    def _activity(self) -> None:
        """The receiver thread, after each round: the first one after an idle read asks the sampler for a read at
        the configured interval's next slot."""
        if self._last is not None and not self._hurried and self._hurry is not None:
            self._hurried = True
            self._hurry()

    def collect(self, force: bool = False) -> PhasesReading:
        self._hurried = False
        why = self.receiver.socket_state()
        if why is not None:   # this pass says so (teye_collector_up 0); the next one reads the new socket
            raise SourceUnavailable(f"{why}; {self._rebind()}")
        last = self._last
        if not force and last is not None:   # idle: nothing came since a read that found no job (issue 49)
            self.table.learn_gpus()
            quiet = self._quiet()
            if quiet[0] is not None and quiet == last[0]:
                return last[1]
        quiet = self._quiet()   # (before the views: a datagram handled meanwhile makes the next read whole)
        now = self.ctx.clock()
        self.table.attribute(now, force=force)
        views, results, attributed, pending = self.table.views(now)
        memory = self.memory.observe(views, now)
        cpu = self.cpu.observe(views, now)
        creeps = {m.train_job: m.creep for m in memory if m.creep is not None}
        if creeps:   # the verdict's evidence says it (whatever the verdict: a leak kills any job)
            views = tuple(dataclasses.replace(j, verdict=dataclasses.replace(
                j.verdict, evidence=f"{j.verdict.evidence}; memory creeps: {creeps[j.train_job].sentence()}"))
                if j.train_job in creeps else j for j in views)
        reading = PhasesReading(views, results, attributed, pending, self.path,
                                config_results=tuple(self.table.config_results.items()), memory=memory, cpu=cpu,
                                connections=quiet[1], refused_connections=quiet[2])
        # an idle read (no job nor ended run: so nothing pending, no memory or CPU figures) is handed out again,
        # the same object, until a datagram comes
        self._last = (quiet, reading) if quiet[0] is not None and not views else None
        return reading

    def _quiet(self):
        """What only the socket moves: the table's counters (None: time-driven work, see JobTable.quiet), the
        connections now and those refused (a client that connects, or leaves, without a message moves none)."""
        r = self.receiver
        return self.table.quiet(), r.connections, r.refused_connections

    def close(self) -> None:
        self.receiver.close()
        if self.probe is not None:
            self.probe.close()


def from_config(cfg, ctx) -> PhaseSource:
    return PhaseSource(cfg["phases"], ctx, procfs=cfg["procfs"], sysfs=cfg["sysfs"],
                       pod_log_dir=cfg["jobs"]["pod_log_dir"])


__all__ = ["PhaseSource", "PhasesReading", "from_config", "RESULTS", "ATTRIBUTION_RESULTS"]
