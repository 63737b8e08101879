"""Name the bottleneck of a training job: the rules, in one readable place.

Input: the :class:`Evidence` of one job over the sliding window (``phases.window_seconds``):
wall time of its steps, seconds per phase, and, when the agent samples the job's GPUs,
the GPU idle time overlapping each phase.  Output: a :class:`Verdict` with one kind of
``KINDS``, the measured evidence in words, and a recommendation drawn from the studies
(the TensorFlow profiler guide and the Inspur FaceNet case).

The rules (thresholds from the ``phases`` config section):

1. ``idle``: the job reported nothing for ``stall_seconds`` (stalled, finished without
   exiting, or doing unreported work).
2. For each of input (``data_wait``), communication (``communication``) and host
   (``host``) the *lost share* is the larger of
     - the phase's share of step time (step time = wall time of the reported steps, or
       the sum of phase time when the job reports no steps), and
     - the GPU idle time overlapping the phase as a share of the observed GPU time.
   The kind is a candidate when the step-time share reaches its threshold
   (``input_bound_threshold``, ``communication_threshold``, ``host_threshold``), or when
   the GPUs idle at least ``gpu_idle_min_ratio`` of the time and the phase holds at
   least ``idle_dominant_share`` of that idle time ("most GPU idle time falls in
   data_wait").  GPU idle *inside* ``compute`` counts for host: the device waits while
   the host is supposed to be launching kernels (launch overhead, small batches, Python
   between ops), the profiler's "kernel launch" and "host compute" time; since a few
   gaps between kernels are normal, that rule also needs the lost share to reach
   ``host_threshold``.
3. ``idle`` is also a candidate when the GPUs idle at least ``gpu_idle_min_ratio`` and
   most of that idle time lies outside every reported phase (or in ``other``).
4. The candidate with the largest lost share wins (ties: input, communication, host,
   idle); with no candidate the step is ``compute``-bound: the device does the work,
   and what is left is making that work cheaper.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Tuple

KINDS = ("input", "host", "communication", "compute", "idle")

RECOMMENDATIONS: Dict[str, str] = {
    "input": (
        "The training loop waits for its input. Prepare the next batch while the current step trains: "
        "build the pipeline with tf.data, parallelize map (num_parallel_calls=tf.data.AUTOTUNE), end it with "
        "prefetch(tf.data.AUTOTUNE), cache() decoded data that fits in memory, shard early on several GPUs "
        "(shard the file list, not the records), avoid from_generator / py_function in the hot path, and "
        "consider NVIDIA DALI when CPU cycles run short (PyTorch: DataLoader num_workers, pin_memory, "
        "prefetch_factor). Check storage: local disk and NFS read throughput (teye_disk_*, teye_nfs_*). "
        "In the FaceNet case a tf.data pipeline took GPU utilization from 60 % to 90 % and steps 17-135 % faster."),
    "host": (
        "The GPU waits for the host: kernel launches and Python work between ops. Set "
        "TF_GPU_THREAD_MODE=gpu_private (TF_GPU_THREAD_COUNT=1..2) so input preprocessing cannot steal the "
        "threads that launch GPU kernels; compile the step with tf.function(jit_compile=True) (XLA) to fuse "
        "small kernels; raise the batch size to amortize launch overhead; run fewer Python callbacks and "
        "compute metrics every few steps instead of every step."),
    "communication": (
        "Time goes to exchanging gradients. Fuse gradients into fewer, larger all-reduce messages (Horovod "
        "tensor fusion), all-reduce in half precision (fp16 compression), use a ring all-reduce instead of "
        "parameter servers, overlap communication with the backward pass, and check the interconnect "
        "(NVLink within a node; InfiniBand rather than 25 Gb/s Ethernet between nodes: teye_infiniband_*, "
        "teye_network_*)."),
    "compute": (
        "The step is compute-bound: the device does the work and the input keeps up. Make the work cheaper: "
        "mixed precision (float16 / bfloat16 on Tensor Cores), channels_last (NHWC) layout, XLA "
        "(jit_compile=True), the largest batch that fits in memory (re-tune the learning rate), no bias "
        "before batch normalization; then scale out to more GPUs."),
    "idle": (
        "The GPU idles outside the phases the job reports, or the job reports nothing. Look for a stalled "
        "data loader, a hung NFS mount, checkpoints or evaluation that are not instrumented (report them "
        "as 'checkpoint' / 'eval' phases), or a job that finished its steps without exiting."),
}

# Which reported phases each kind of lost time comes from.
_PHASES_OF = {"input": ("data_wait",), "communication": ("communication",), "host": ("host",)}
_ORDER = ("input", "communication", "host", "idle")


@dataclass(frozen=True)
class Thresholds:
    input_bound: float = 0.2
    host: float = 0.2
    communication: float = 0.2
    idle_dominant_share: float = 0.5
    gpu_idle_min_ratio: float = 0.1
    stall_seconds: float = 30.0

    @classmethod
    def from_config(cls, phases_cfg: Mapping) -> "Thresholds":
        return cls(phases_cfg["input_bound_threshold"], phases_cfg["host_threshold"],
                   phases_cfg["communication_threshold"], phases_cfg["idle_dominant_share"],
                   phases_cfg["gpu_idle_min_ratio"], phases_cfg["stall_seconds"])


@dataclass(frozen=True)
class Evidence:
    """What the job did over the window (seconds; GPU figures summed over the job's GPUs)."""

    window_s: float
    phase_seconds: Mapping[str, float]
    step_seconds: float = 0.0                # wall time of reported steps (0: the job reports none)
    steps: int = 0
    gpu_idle_seconds: Mapping[str, float] = field(default_factory=dict)  # GPU idle overlapping each phase
    gpu_observed_seconds: float = 0.0        # GPU time covered by samples during steps (or phases)
    gpu_step_idle_seconds: Optional[float] = None  # GPU idle during steps (None: no steps attributed)
    silent_s: float = 0.0                    # since the job's last message

    @property
    def step_time(self) -> float:
        return self.step_seconds if self.step_seconds > 0 else sum(self.phase_seconds.values())

    def share(self, phase: str) -> float:
        t = self.step_time
        return min(1.0, self.phase_seconds.get(phase, 0.0) / t) if t > 0 else 0.0

    @property
    def gpu_idle_total(self) -> float:
        """GPU idle during the job's activity: over steps when reported, else over phases."""
        if self.gpu_step_idle_seconds is not None:
            return self.gpu_step_idle_seconds
        return sum(self.gpu_idle_seconds.values())

    @property
    def gpu_idle_ratio(self) -> Optional[float]:
        if self.gpu_observed_seconds <= 0:
            return None
        return min(1.0, self.gpu_idle_total / self.gpu_observed_seconds)

    def idle_share(self, phases) -> float:
        """Share of the GPU idle time that overlaps the given phases."""
        total = self.gpu_idle_total
        if total <= 0:
            return 0.0
        return min(1.0, sum(self.gpu_idle_seconds.get(p, 0.0) for p in phases) / total)


@dataclass(frozen=True)
class Verdict:
    kind: str
    evidence: str
    recommendation: str
    scores: Tuple[Tuple[str, float], ...] = ()   # lost share per candidate kind, for the record


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def decide(ev: Evidence, th: Thresholds = Thresholds()) -> Verdict:
    """Apply the rules above to one job's evidence."""
    if ev.silent_s >= th.stall_seconds or ev.step_time <= 0:
        why = (f"no phase or step reported for {ev.silent_s:.0f} s" if ev.silent_s >= th.stall_seconds
               else f"no phase or step time in the last {ev.window_s:.0f} s")
        return Verdict("idle", why, RECOMMENDATIONS["idle"])

    idle_ratio = ev.gpu_idle_ratio
    gpu_rules = idle_ratio is not None and idle_ratio >= th.gpu_idle_min_ratio and ev.gpu_idle_total > 0
    thresholds = {"input": th.input_bound, "communication": th.communication, "host": th.host}
    scores: Dict[str, float] = {}
    notes: Dict[str, str] = {}
    for kind in ("input", "communication", "host"):
        phases = _PHASES_OF[kind]
        share = sum(ev.share(p) for p in phases)
        idle_phases = phases + (("compute",) if kind == "host" else ())
        ishare = ev.idle_share(idle_phases) if gpu_rules else 0.0
        lost = max(share, ishare * idle_ratio) if gpu_rules else share
        # GPU idle inside compute is weaker evidence (some gaps between kernels are normal), so for
        # host the idle rule also needs the lost share itself to reach the threshold.
        by_idle = ishare >= th.idle_dominant_share and (kind != "host" or lost >= thresholds[kind])
        if share >= thresholds[kind] or by_idle:
            scores[kind] = lost
            bits = [f"{'+'.join(phases)} {_pct(share)} of step time (threshold {_pct(thresholds[kind])})"]
            if gpu_rules:
                bits.append(f"{_pct(ishare)} of GPU idle time falls in {'+'.join(idle_phases)}")
            notes[kind] = "; ".join(bits)
    if gpu_rules:
        explained = ev.idle_share(("data_wait", "communication", "host", "compute", "checkpoint", "eval"))
        unexplained = 1.0 - explained
        if unexplained >= th.idle_dominant_share:
            scores["idle"] = unexplained * idle_ratio
            notes["idle"] = f"{_pct(unexplained)} of GPU idle time lies outside the reported phases"

    steps = f"{ev.steps} steps" + (f", mean step {1000 * ev.step_seconds / ev.steps:.0f} ms" if ev.steps else "")
    gpu = (f"GPU idle {_pct(idle_ratio)} of observed time" if idle_ratio is not None
           else "no GPU samples for this job")
    tail = f"; {gpu}; {steps} in the last {ev.window_s:.0f} s"
    ordered = tuple((k, round(scores[k], 4)) for k in _ORDER if k in scores)
    if scores:
        kind = max(_ORDER, key=lambda k: (scores.get(k, -1.0), -_ORDER.index(k)))
        return Verdict(kind, notes[kind] + tail, RECOMMENDATIONS[kind], ordered)
    return Verdict("compute", f"compute {_pct(ev.share('compute'))} of step time, data_wait "
                              f"{_pct(ev.share('data_wait'))}" + tail, RECOMMENDATIONS["compute"], ordered)
