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
5. A data-parallel job whose gradient exchange is not observed (``Evidence.exchange_observed``:
   TensorFlow's multi-worker strategies run it inside the step) and that rules 2-4 would call
   ``compute`` is ``not_observed``: "communication not observed", never ``compute``.
   A job whose input wait is not observed (a steps-only source: ``tf-steps``, ``torch-steps``;
   see :func:`unobserved_input`) is never judged by rules 2-4, whose "no candidate, so
   ``compute``" would be a guess: its GPUs' samples decide what can be said.  GPUs idle less
   than ``gpu_idle_min_ratio`` of its steps: ``compute`` (the GPU is the limit, whatever the
   input does); idle at least that: ``idle`` (the GPU waits, for a reason the job's phases do
   not show); no GPU samples: ``not_observed`` (the bottleneck is not observed: no verdict).
6. An ``input`` verdict names its cause from what the sending processes did while they
   waited (:class:`InputWait`, sampled from /proc by ``agent.phases.procstat``):
   ``host_cpu`` when their threads used at least ``input_cpu_busy_ratio`` CPU seconds per
   second of data_wait (decoding, augmentation, Python), or would have with the time the
   main thread sat runnable on a run queue after a preemption (schedstat and its involuntary
   context switches: a starved decoder; not after a wake-up, agent.phases.cause.starved_delay), or when the
   job's cgroup was stalled on CPU for at least ``input_cpu_stall_ratio`` of it
   (cpu.pressure); the sending processes' figures include their descendants (DataLoader
   workers).  ``storage`` when they waited with little CPU *and* storage evidence: reads of
   at least ``STORAGE_READ_MIN_BPS`` per second of wait or I/O pressure for at least
   ``STORAGE_STALL_MIN`` of it (a slow file system, NFS); ``unknown``, with the reason, when
   they waited with idle CPUs and no storage I/O (a sleep, a lock, a remote service) or when
   the waits could not be measured (the process exited, lives in another pid namespace,
   /proc/<pid>/io is not readable).  The recommendation is the cause's.
   A ``communication`` verdict names its cause from the node's interfaces and the job's ranks
   (``agent.phases.links``: ``network_errors``, ``network_bandwidth``, ``straggler``, ``unknown``),
   and the advice starts with the cause's.
7. Every recommendation speaks the job's own framework (:func:`recommendation`): PyTorch advice
   (DataLoader num_workers, pin_memory, persistent_workers, prefetch_factor, decode, storage layout;
   torch.compile, autocast, DDP buckets) for the torch sources, tf.data / Keras advice for
   ``tf.data``, ``tf-steps`` and ``keras``, and neutral advice naming both for a client that did not
   say which framework it runs.  Where the job sent what it is configured with (``Evidence.config``,
   agent.phases.jobconfig), the advice starts from it (agent.phases.advice, issue 45): it never recommends
   what the job already has, and says what to try next given it.

Shares are computed, never clipped: the evidence holds the phase time *inside* the
steps and the GPU idle time inside the steps, so no share can exceed 1, and
:class:`Evidence` refuses figures that would make one (a bug in its producer).
``Evidence.extra`` carries optional notes from other collectors (e.g. hardware counters:
memory bandwidth), cited when the host is the limit.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Tuple

from .advice import Advice, RankFacts, advise
from . import definitions
from .links import COMMUNICATION_CAUSES, network_cause
from .protocol import SOURCES, STEPS_ONLY_SOURCES

KINDS = ("input", "host", "communication", "compute", "idle", "not_observed")
CAUSES = ("storage", "host_cpu", "unknown")   # why an input-bound job waits

RECOMMENDATIONS: Dict[str, str] = {
    "input": (
        "The training loop waits for its input. Prepare the next batch while the current step trains: load and "
        "decode in parallel (several workers or threads: tf.data map(num_parallel_calls=AUTOTUNE), a PyTorch "
        "DataLoader's num_workers), prefetch a few batches ahead, cache decoded data that fits in memory, shard "
        "early on several GPUs (shard the file list, not the records), keep per-sample Python out of the hot path, "
        "and consider NVIDIA DALI when CPU cycles run short. Check storage: local disk and NFS read throughput "
        "(teye_disk_*, teye_nfs_*). In the FaceNet case an overlapped input pipeline took GPU utilization from "
        "60 % to 90 % and steps 17-135 % faster."),
    "host": (
        "The GPU waits for the host: kernel launches and Python work between ops. Keep input preprocessing off "
        "the threads that launch GPU kernels (TensorFlow: TF_GPU_THREAD_MODE=gpu_private; PyTorch: fewer "
        "DataLoader workers than cores), compile the step so that small kernels are fused and launched "
        "together (XLA, torch.compile, CUDA graphs), raise the batch size to amortize launch overhead, avoid "
        "reading values back to the host every step, run fewer Python callbacks and compute metrics every few "
        "steps instead of every step."),
    "communication": (
        "Time goes to exchanging gradients. Fuse gradients into fewer, larger all-reduce messages (Horovod "
        "tensor fusion), all-reduce in half precision (fp16 compression), use a ring all-reduce instead of "
        "parameter servers, overlap communication with the backward pass, and check the interconnect "
        "(NVLink within a node; InfiniBand rather than 25 Gb/s Ethernet between nodes: teye_infiniband_*, "
        "teye_network_*)."),
    "compute": (
        "The step is compute-bound: the device does the work and the input keeps up. Make the work cheaper: "
        "mixed precision (float16 / bfloat16 on Tensor Cores), channels-last (NHWC) layout, a compiler that fuses "
        "kernels (XLA, torch.compile), the largest batch that fits in memory (re-tune the learning rate), no bias "
        "before batch normalization; then scale out to more GPUs."),
    "idle": (
        "The GPU idles outside the phases the job reports, or the job reports nothing. Look for a stalled "
        "data loader, a hung NFS mount, checkpoints or evaluation that are not instrumented (report them "
        "as 'checkpoint' / 'eval' phases), or a job that finished its steps without exiting."),
    "not_observed": (
        "teye cannot say what limits this job: it reports steps only (its input wait is not observed) and the "
        "agent has no GPU samples for its GPUs. To get a verdict, feed the training loop from a tf.data iterator "
        "or a torch DataLoader (zero-code phases time their waits), or report phases with teye_client.Reporter "
        "(data_wait around the batch fetch, compute around the step); run it where the agent samples its GPUs."),
}
# the recommendation of a steps-only job whose GPUs wait (rule 5): the phases cannot say for what
STEPS_ONLY_IDLE = (
    "The GPU waits for something the job's phases do not show: it reports steps only, so its input wait is not "
    "observed. The usual cause is the input pipeline (a Python generator, NumPy arrays copied every step, a slow "
    "map); feed the loop from a tf.data iterator or a torch DataLoader, or report data_wait with "
    "teye_client.Reporter, and the verdict will name it. " + RECOMMENDATIONS["idle"])

INPUT_CAUSE_RECOMMENDATIONS: Dict[str, str] = {
    "host_cpu": (
        "The input pipeline is limited by host CPU work (decoding, augmentation, Python) in the training "
        "process and its workers. Parallelize it (tf.data map(num_parallel_calls=AUTOTUNE), more DataLoader "
        "workers), vectorize the decode (batch first, then decode the batch), cache decoded samples that fit in "
        "memory so decoding runs once, and move augmentation to the GPU or to NVIDIA DALI. If the host is "
        "saturated, give input threads their own cores, away from the threads that launch GPU kernels."),
    "storage": (
        "The input pipeline waits for storage with little CPU work: overlap and widen the reads: prefetch "
        "ahead, read many files at once (several readers or workers), pack small files into large shards read "
        "sequentially, stage the data set on local NVMe or in memory, shard the file list across workers, and "
        "check the file system: local disk and NFS throughput and latency (teye_disk_*, teye_nfs_*)."),
    "unknown": RECOMMENDATIONS["input"],
}

# a data-parallel job whose exchange teye cannot time, and whose other phases name nothing (rule 4's compute)
EXCHANGE_NOT_OBSERVED = (
    "teye cannot say whether this job computes or exchanges gradients: its framework's exchange (TensorFlow's "
    "MultiWorkerMirroredStrategy, Horovod) runs inside the step, where it is not timed. Compare its step time "
    "with one worker's (scaling efficiency by hand), look at the interconnect (teye_network_*, "
    "teye_infiniband_*, teye_network_qdisc_*), or report the exchange with teye_client.Reporter's "
    "'communication' phase; a PyTorch DDP or FSDP job is timed zero-code.")

# A communication verdict's cause (agent.phases.links) comes first, then the framework's advice on the exchange.
COMMUNICATION_CAUSE_RECOMMENDATIONS: Dict[str, str] = {
    "network_bandwidth": (
        "The link between the nodes is full while the job exchanges gradients: send fewer bytes (larger "
        "gradient buckets, fp16 or bf16 gradient compression: a DDP communication hook, Horovod's "
        "Compression.fp16), overlap the exchange with the backward pass, accumulate gradients over several "
        "micro-batches (no_sync) to exchange less often, or place the job's ranks on nodes with a faster "
        "interconnect (InfiniBand, more links)."),
    "network_errors": (
        "A link the job exchanges over has errors, drops or went down: check that interface (teye_network_*, "
        "teye_network_carrier_changes_total, teye_infiniband_*), its cable or optic and the switch port; "
        "retransmissions and a renegotiated lower speed slow every rank of the job."),
    "straggler": (
        "The ranks wait in the exchange for a rank that computes longer: find it (teye_job_critical_rank, the "
        "job dashboard's ranks panel) and why it is slower: a GPU held down by power or heat, more data per "
        "rank, another process on its GPU or CPUs."),
}

# The same advice in the job's own framework: the source (protocol.SOURCES) names it when teye's zero-code
# instrumentation produced the phases; a client that did not say (``client``, ``other``) gets the neutral
# texts above.  Keys: a kind of KINDS, a cause of CAUSES (an input verdict), or "steps_only_idle".
FRAMEWORKS = ("torch", "tensorflow", "neutral")
_FRAMEWORK_OF = {"torch": "torch", "torch-steps": "torch", "torch-forward": "torch", "tf.data": "tensorflow",
                 "tf-steps": "tensorflow", "keras": "tensorflow"}
# an input verdict whose input is the training thread's own data work (source torch-forward: no DataLoader on it)
OWN_DATA_WORK = (
    "The training loop prepares its batches itself, on the training thread, before each forward (a generator of "
    "its own, a get_batch function, a queue it waits on): nothing overlaps that work with the step. Move it into "
    "a torch.utils.data.DataLoader with num_workers=N (a Dataset or IterableDataset doing the same work per "
    "sample or per batch, persistent_workers=True, prefetch_factor=2..4), or run the augmentation on batched "
    "tensors on the GPU (torchvision.transforms.v2); a loop of tensors already in memory should index them "
    "on the device instead of slicing and copying on the host every step; a producer thread's queue that runs "
    "empty needs more producers (DataLoader workers are processes: no GIL).")
_TORCH_STORAGE_LAYOUT = (
    "store the data set as large shards read sequentially (WebDataset tar shards, LMDB, memory-mapped NumPy "
    "arrays) rather than one small file per sample, stage it on local NVMe or in memory, and let a "
    "DistributedSampler give each rank its own part")
FRAMEWORK_RECOMMENDATIONS: Dict[str, Dict[str, str]] = {
    "torch": {
        "unknown": (
            "The training loop waits for its DataLoader. Load the next batches while the current step trains: "
            "DataLoader(num_workers=N) with N up to the CPU cores per GPU (each worker is a process), "
            "pin_memory=True with .to(device, non_blocking=True), persistent_workers=True so that workers are "
            "not restarted every epoch, prefetch_factor=2..4 batches per worker. Make __getitem__ cheap: decode "
            "faster (torchvision.io.decode_jpeg, on the GPU with device='cuda'; Pillow-SIMD; NVIDIA DALI), "
            "cache decoded samples that fit in memory, batch the transforms in collate_fn or on the GPU; "
            + _TORCH_STORAGE_LAYOUT + ". Check storage: local disk and NFS read throughput (teye_disk_*, "
            "teye_nfs_*)."),
        "host_cpu": (
            "The DataLoader is limited by CPU work (decoding, augmentation, collate, Python) in the training "
            "process and its workers. Raise DataLoader num_workers up to the CPU cores per GPU "
            "(persistent_workers=True, prefetch_factor=2..4), never num_workers=0 in training; decode faster "
            "(torchvision.io.decode_jpeg on the GPU, Pillow-SIMD, NVIDIA DALI); run augmentation on batched "
            "tensors on the GPU (torchvision.transforms.v2) instead of per sample in __getitem__; cache decoded "
            "samples that fit in memory; keep torch.set_num_threads small in the workers. If the host is "
            "saturated, ask for more CPU cores per GPU."),
        "storage": (
            "The DataLoader waits for storage with little CPU work: keep more reads in flight and make them "
            "larger. Raise num_workers and prefetch_factor (each worker reads its own batches), "
            "persistent_workers=True, pin_memory=True; " + _TORCH_STORAGE_LAYOUT + "; check the file system: "
            "local disk and NFS throughput and latency (teye_disk_*, teye_nfs_*)."),
        "host": (
            "The GPU waits for the host: kernel launches and Python work between ops. Compile the model "
            "(torch.compile; mode='reduce-overhead' uses CUDA graphs) so that small kernels are fused and launched "
            "together, raise the batch size to amortize launch overhead, avoid host syncs every step (.item(), "
            ".cpu(), printing a loss tensor), log metrics every few steps, and keep DataLoader workers off the "
            "cores of the training process (fewer workers, or torch.set_num_threads)."),
        "compute": (
            "The step is compute-bound: the device does the work and the DataLoader keeps up. Make the work "
            "cheaper: automatic mixed precision (torch.autocast with bfloat16, or float16 with a GradScaler), "
            "TF32 matmuls (torch.set_float32_matmul_precision('high')), channels_last memory format for "
            "convolutions, torch.compile, the largest batch that fits in memory (re-tune the learning rate), no "
            "bias before batch normalization; then scale out with DistributedDataParallel."),
        "communication": (
            "Time goes to exchanging gradients. With DistributedDataParallel: larger gradient buckets "
            "(bucket_cap_mb), a compression hook (fp16_compress_hook / bf16_compress_hook), no_sync() during "
            "gradient accumulation, the NCCL backend, and check the interconnect (NVLink within a node; "
            "InfiniBand rather than 25 Gb/s Ethernet between nodes: teye_infiniband_*, teye_network_*)."),
        "not_observed": (
            "teye cannot say what limits this job: its optimizer steps are timed, but it does not draw its "
            "batches from a torch DataLoader, so its input wait is not observed, and the agent has no GPU samples "
            "for its GPUs. To get a verdict, feed the training loop from a torch.utils.data.DataLoader (zero-code "
            "phases time its waits) or report phases with teye_client.Reporter; run it where the agent samples "
            "its GPUs."),
        "steps_only_idle": (
            "The GPU waits for something the job's phases do not show: it reports optimizer steps only, so its "
            "input wait is not observed. The usual cause is the input (a Python generator, tensors built or "
            "copied every step, a slow transform); feed the loop from a torch DataLoader with num_workers, or "
            "report data_wait with teye_client.Reporter, and the verdict will name it. " + RECOMMENDATIONS["idle"]),
    },
    "tensorflow": {
        "unknown": (
            "The training loop waits for its tf.data input. Prepare the next batch while the current step trains: "
            "parallelize map (num_parallel_calls=tf.data.AUTOTUNE), end the pipeline with "
            "prefetch(tf.data.AUTOTUNE), cache() decoded data that fits in memory, shard early on several GPUs "
            "(shard the file list, not the records), avoid from_generator / py_function in the hot path, and "
            "consider NVIDIA DALI when CPU cycles run short. Check storage: local disk and NFS read throughput "
            "(teye_disk_*, teye_nfs_*). In the FaceNet case a tf.data pipeline took GPU utilization from 60 % to "
            "90 % and steps 17-135 % faster."),
        "host_cpu": (
            "The tf.data pipeline is limited by host CPU work (decoding, augmentation, Python). Parallelize it: "
            "map(num_parallel_calls=tf.data.AUTOTUNE) instead of a Python generator, vectorize the decode (batch "
            "first, then map a batched decode), cache() decoded samples that fit in memory so decoding runs once, "
            "move augmentation to the GPU (Keras preprocessing layers in the model) or to NVIDIA DALI, and keep "
            "py_function / from_generator out of the hot path. If the host is saturated, give input threads their "
            "own cores (TF_GPU_THREAD_MODE=gpu_private keeps them off the kernel-launch threads)."),
        "storage": (
            "The tf.data pipeline waits for storage with little CPU work: overlap and widen the reads. End the "
            "pipeline with prefetch(tf.data.AUTOTUNE), read many files at once (interleave(num_parallel_calls="
            "tf.data.AUTOTUNE), TFRecord shards rather than small files), stage the data set on local NVMe or in "
            "memory (cache() to a local file), shard the file list across workers, and check the file system: "
            "local disk and NFS throughput and latency (teye_disk_*, teye_nfs_*)."),
        "host": (
            "The GPU waits for the host: kernel launches and Python work between ops. Set "
            "TF_GPU_THREAD_MODE=gpu_private (TF_GPU_THREAD_COUNT=1..2) so input preprocessing cannot steal the "
            "threads that launch GPU kernels; compile the step with tf.function(jit_compile=True) (XLA) to fuse "
            "small kernels; raise the batch size to amortize launch overhead (Keras: steps_per_execution); run "
            "fewer Python callbacks and compute metrics every few steps instead of every step."),
        "compute": (
            "The step is compute-bound: the device does the work and the input keeps up. Make the work cheaper: "
            "mixed precision (keras.mixed_precision.set_global_policy('mixed_float16' or 'mixed_bfloat16') on "
            "Tensor Cores), channels_last (NHWC) layout, XLA (jit_compile=True), the largest batch that fits in "
            "memory (re-tune the learning rate), no bias before batch normalization; then scale out with a "
            "tf.distribute strategy."),
        "communication": (
            "Time goes to exchanging gradients. With tf.distribute: the NCCL all-reduce "
            "(CommunicationImplementation.NCCL), gradient packing into fewer, larger messages "
            "(experimental_communication_options / bytes_per_pack), fp16 all-reduce, and check the interconnect "
            "(NVLink within a node; InfiniBand rather than 25 Gb/s Ethernet between nodes: teye_infiniband_*, "
            "teye_network_*)."),
        "not_observed": (
            "teye cannot say what limits this job: it reports TensorFlow steps only (a loop without tf.data, or a "
            "Model.fit teye stands aside from), so its input wait is not observed, and the agent has no GPU "
            "samples for its GPUs. To get a verdict, feed the training loop from a tf.data iterator (zero-code "
            "phases time its GetNext) or report phases with teye_client.Reporter; run it where the agent "
            "samples its GPUs."),
        "steps_only_idle": (
            "The GPU waits for something the job's phases do not show: it reports TensorFlow steps only, so its "
            "input wait is not observed. The usual cause is the input (a Python generator, NumPy arrays copied "
            "every step, a py_function); feed the loop from a tf.data pipeline with prefetch, or report data_wait "
            "with teye_client.Reporter, and the verdict will name it. " + RECOMMENDATIONS["idle"]),
    },
}


def framework_of(source: str) -> str:
    """Whose advice a job gets: ``torch``, ``tensorflow``, or ``neutral`` (a client that did not say)."""
    return _FRAMEWORK_OF.get(source, "neutral")


def base_advice(kind: str, cause: Optional[str] = None, source: str = "client") -> Tuple[str, str]:
    """(id, text): the framework's paragraph for a verdict of ``kind`` (with its ``cause``) in the framework of
    ``source``, whatever the job is configured with (the id names it among the tips: agent.phases.advice)."""
    fw = framework_of(source)
    if kind == "input" and source == "torch-forward":
        return f"{fw}:input:own_data_work", OWN_DATA_WORK
    if kind == "communication" and cause in COMMUNICATION_CAUSE_RECOMMENDATIONS:
        return (f"{fw}:communication:{cause}",
                COMMUNICATION_CAUSE_RECOMMENDATIONS[cause] + " " + base_advice(kind, source=source)[1])
    key = (cause or "unknown") if kind == "input" else kind
    ident = f"{fw}:{kind}:{key}" if kind == "input" else f"{fw}:{kind}:"
    own = FRAMEWORK_RECOMMENDATIONS.get(fw, {}).get(key)
    if own:
        return ident, own
    if kind == "input":
        return ident, INPUT_CAUSE_RECOMMENDATIONS.get(key, RECOMMENDATIONS["input"])
    if key == "steps_only_idle":
        return ident, STEPS_ONLY_IDLE
    return ident, RECOMMENDATIONS.get(kind, "")


def base_catalog():
    """Every (id, text) base_advice can give: the tips of agent.phases.advice that are whole paragraphs."""
    seen = {"exchange_not_observed": EXCHANGE_NOT_OBSERVED}
    for source in ("client", "torch", "torch-forward", "tf.data"):
        for kind in KINDS + ("steps_only_idle",):
            causes = {"input": CAUSES, "communication": COMMUNICATION_CAUSES}.get(kind, (None,))
            for c in causes:
                i, t = base_advice(kind, c, source)
                seen.setdefault(i, t)
    return tuple(seen.items())


def advice(kind: str, cause: Optional[str] = None, source: str = "client", config=(), cpus: Optional[float] = None,
           rank: Optional[RankFacts] = None) -> Advice:
    """The advice for a verdict: agent.phases.advice.advise, from the framework's paragraph, what the job is
    configured with (``config``: (key, value) pairs, agent.phases.jobconfig), the node's ``cpus`` and the
    critical ``rank`` named for computing longer.  Every view (the agent's evidence, teye profile, teye report,
    the dashboard's tips) gets its advice here."""
    return advise(kind, cause, framework_of(source), base_advice(kind, cause, source), dict(config or ()), cpus,
                  rank)


def recommendation(kind: str, cause: Optional[str] = None, source: str = "client", config=(),
                   cpus: Optional[float] = None, rank: Optional[RankFacts] = None) -> str:
    """The advice's text for a verdict of ``kind`` (with its ``cause``) in the framework of ``source``
    (:func:`advice`)."""
    return advice(kind, cause, source, config, cpus, rank).text


# Which reported phases each kind of lost time comes from.
_PHASES_OF = {"input": ("data_wait",), "communication": ("communication",), "host": ("host",)}
# ... and whose GPU idle time counts for it (GPU idle inside compute counts for host: see rule 2).
_IDLE_PHASES_OF = {"input": ("data_wait",), "communication": ("communication",), "host": ("host", "compute"),
                   "explained": ("data_wait", "communication", "host", "compute", "checkpoint", "eval", "compile")}
_ORDER = ("input", "communication", "host", "idle")


@dataclass(frozen=True)
class Thresholds:
    input_bound: float = 0.2
    host: float = 0.2
    communication: float = 0.2
    idle_dominant_share: float = 0.5
    gpu_idle_min_ratio: float = 0.1
    stall_seconds: float = 30.0
    input_cpu_busy: float = 0.5
    input_cpu_stall: float = 0.5

    @classmethod
    def from_config(cls, phases_cfg: Mapping) -> "Thresholds":
        return cls(phases_cfg["input_bound_threshold"], phases_cfg["host_threshold"],
                   phases_cfg["communication_threshold"], phases_cfg["idle_dominant_share"],
                   phases_cfg["gpu_idle_min_ratio"], phases_cfg["stall_seconds"],
                   phases_cfg["input_cpu_busy_ratio"], phases_cfg["input_cpu_stall_ratio"])


@dataclass(frozen=True)
class InputWait:
    """What the job's sending processes did during the data_wait time that /proc samples covered."""

    wait_s: float = 0.0                    # data_wait seconds covered by samples
    cpu_s: float = 0.0                     # CPU seconds of those processes (all threads) during them
    read_bytes: Optional[int] = None       # bytes they read from storage meanwhile (None: /proc/<pid>/io unreadable)
    io_stall_s: Optional[float] = None     # io pressure ("some") during them: the job's cgroup, else the system's
    #                                        where read_bytes cannot be seen (agent.phases.procstat)
    cpu_stall_s: Optional[float] = None    # cpu pressure ("some") of the job's cgroup during them
    run_delay_s: Optional[float] = None    # main thread runnable but waiting for a CPU during them
    problem: str = ""                      # why (some) waits could not be measured

    @property
    def cpu_ratio(self) -> Optional[float]:
        """CPU seconds per second of data_wait (1.0: one core busy all the time; more with several threads)."""
        return self.cpu_s / self.wait_s if self.wait_s > 0 else None


# Storage evidence: an input wait is called ``storage`` only when its processes read at least this much per
# second of wait, or stalled on I/O (PSI "some") at least this share of it; little CPU alone is no evidence.
STORAGE_READ_MIN_BPS = 1e6
STORAGE_STALL_MIN = 0.05


def input_cause(w: Optional[InputWait], th: "Thresholds" = None) -> Tuple[str, str]:
    """(cause, evidence in words) of an input-bound job's waits: one of CAUSES."""
    th = th or Thresholds()
    if w is None or w.wait_s <= 0:
        why = (w.problem if w is not None and w.problem else "no /proc samples of the sending processes "
               "covered their data_wait phases")
        return "unknown", f"cause unknown: {why}"
    r = w.cpu_ratio
    bits = [f"{r:.2f} CPU s per s of data_wait over {w.wait_s:.1f} s"]
    if w.read_bytes is not None:
        bits.append(f"read {w.read_bytes / w.wait_s / 1e6:.1f} MB/s")
    if w.io_stall_s is not None:
        bits.append(f"I/O pressure {_pct(w.io_stall_s / w.wait_s)}")
    cpu_stall = w.cpu_stall_s / w.wait_s if w.cpu_stall_s is not None else None
    if cpu_stall is not None:
        bits.append(f"CPU pressure {_pct(cpu_stall)}")
    delay = w.run_delay_s / w.wait_s if w.run_delay_s is not None else 0.0
    if w.run_delay_s is not None:
        bits.append(f"main thread waiting for a CPU {_pct(delay)}")
    measured = ", ".join(bits)
    if r >= th.input_cpu_busy:
        return "host_cpu", f"cause host_cpu: the job's threads are busy while it waits ({measured})"
    if r + delay >= th.input_cpu_busy:
        return "host_cpu", (f"cause host_cpu: the job's threads are busy or runnable, starved of CPU, while it "
                            f"waits ({measured})")
    if cpu_stall is not None and cpu_stall >= th.input_cpu_stall:
        return "host_cpu", f"cause host_cpu: the job's threads wait for a CPU while it waits ({measured})"
    read_rate = w.read_bytes / w.wait_s if w.read_bytes is not None else None
    io_stall = w.io_stall_s / w.wait_s if w.io_stall_s is not None else None
    if (read_rate is not None and read_rate >= STORAGE_READ_MIN_BPS) or (
            io_stall is not None and io_stall >= STORAGE_STALL_MIN):
        return "storage", f"cause storage: the job waits with little CPU while it reads or stalls on I/O ({measured})"
    if w.read_bytes is None and io_stall is None:
        return "unknown", (f"cause unknown: little CPU while waiting ({measured}) but the reads cannot be "
                           f"seen: {w.problem or '/proc/<pid>/io is not readable'}")
    return "unknown", (f"cause unknown: the job waits with idle CPUs and no storage I/O ({measured}): sleeping, "
                       f"a lock, a remote service or another process it waits for")


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
    # GPU idle inside steps in the merged time of each kind's phases: input (data_wait), communication,
    # host (host + compute), explained (every phase but 'other'); None: summed from gpu_idle_seconds
    gpu_idle_by_kind: Optional[Mapping[str, float]] = None
    silent_s: float = 0.0                    # since the job's last message
    input_wait: Optional[InputWait] = None   # what the processes did while waiting for input
    extra: Tuple[Tuple[str, str], ...] = ()  # (topic, note) from other collectors; topic "host" is cited
    #                                          when the host is the limit (e.g. PMU memory bandwidth)
    source: str = "client"                   # where the phases come from (protocol.SOURCES)
    network: Optional[Tuple] = None          # the node's interfaces over the window (context.LinkWindow; None:
    #                                          not sampled), for the cause of a communication verdict
    comm_spread: float = 0.0                 # the largest less the least communication share of the job's
    #                                          ranks on this node (agent.phases.ranks)
    exchange_observed: bool = True           # False: a data-parallel job whose framework's gradient exchange
    #                                          teye cannot time (TensorFlow's collectives): it is in compute
    config: Tuple[Tuple[str, str], ...] = ()  # what the job is configured with (agent.phases.jobconfig): advice
    #                                          never recommends what it already has (agent.phases.advice)
    cpus: Optional[float] = None             # the node's CPUs (None: not known), for the input advice

    def __post_init__(self):
        """Refuse figures that would make a share exceed 1: the producer has a bug."""
        bad = [p for p, v in self.phase_seconds.items() if v < 0 or (self.step_seconds > 0 and v > self.step_seconds)]
        if bad:
            raise ValueError(f"inconsistent evidence: phase time of {', '.join(bad)} exceeds the step time "
                             f"{self.step_seconds} s (phase_seconds must be the time inside the steps)")
        if self.gpu_idle_total > self.gpu_observed_seconds or self.gpu_idle_total < 0:
            raise ValueError(f"inconsistent evidence: GPU idle {self.gpu_idle_total} s exceeds the observed "
                             f"{self.gpu_observed_seconds} s")
        for kind in ("input", "communication", "host", "explained"):
            if self._idle_of(kind) > self.gpu_idle_total:
                raise ValueError(f"inconsistent evidence: GPU idle in {kind} phases exceeds the total GPU idle "
                                 f"{self.gpu_idle_total} s")

    @property
    def step_time(self) -> float:
        """The reported steps' wall time but ``compile`` (a one-time cost that shares are not taken of:
        docs/phases.md; zero-code TensorFlow sends it between steps, a client may send it inside one), never
        below a training phase's time (so no share exceeds 1); without steps, the training phases' time (but
        eval and compile): agent.phases.definitions, the one definition every view uses."""
        return definitions.step_time(self.step_seconds, self.phase_seconds,
                                     compile_in_steps=self.phase_seconds.get("compile", 0.0))

    def share(self, phase: str) -> float:
        """The phase's share of step time (at most 1: checked when the evidence is made); 0 for a phase beside
        training (eval, compile: definitions.NOT_TRAINING), which is in no share of it (a job that evaluated
        longer than it trained read an eval share of 2)."""
        if phase in definitions.NOT_TRAINING:
            return 0.0
        return definitions.share(self.phase_seconds.get(phase, 0.0), self.step_time) or 0.0

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
        return self.gpu_idle_total / self.gpu_observed_seconds

    def _idle_of(self, kind: str) -> float:
        if self.gpu_idle_by_kind is not None:
            return self.gpu_idle_by_kind.get(kind, 0.0)
        phases = _IDLE_PHASES_OF[kind]
        # same order as gpu_idle_total's sum: a sum over part of the terms cannot round above it
        return sum(v for p, v in self.gpu_idle_seconds.items() if p in phases)

    def idle_share(self, kind: str) -> float:
        """Share of the GPU idle time that overlaps the phases of ``kind`` (input, communication,
        host = host + compute, explained = every phase but 'other')."""
        total = self.gpu_idle_total
        return self._idle_of(kind) / total if total > 0 else 0.0


@dataclass(frozen=True)
class Verdict:
    kind: str
    evidence: str
    recommendation: str
    scores: Tuple[Tuple[str, float], ...] = ()   # lost share per candidate kind, for the record
    cause: Optional[str] = None                  # kind "input": one of CAUSES; "communication": COMMUNICATION_CAUSES
    tips: Tuple[str, ...] = ()                   # the advice's tips (agent.phases.advice), exported as series

    def __post_init__(self):
        """A recommendation given as an :class:`Advice` (decide's): its text, and its tips kept beside it."""
        if isinstance(self.recommendation, Advice):
            a = self.recommendation
            object.__setattr__(self, "recommendation", a.text)
            object.__setattr__(self, "tips", a.tips)


def _adv(ev: "Evidence", kind: str, cause: Optional[str] = None) -> Advice:
    """The advice for a verdict on ``ev``: its framework, and what the job is configured with."""
    return advice(kind, cause, ev.source, ev.config, ev.cpus)


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def decide(ev: Evidence, th: Thresholds = Thresholds()) -> Verdict:
    """Apply the rules above to one job's evidence."""
    if ev.silent_s >= th.stall_seconds or ev.step_time <= 0:
        why = (f"no phase or step reported for {ev.silent_s:.0f} s" if ev.silent_s >= th.stall_seconds
               else f"no phase or step time in the last {ev.window_s:.0f} s")
        return Verdict("idle", why, _adv(ev, "idle"))

    idle_ratio = ev.gpu_idle_ratio
    gpu_rules = idle_ratio is not None and idle_ratio >= th.gpu_idle_min_ratio and ev.gpu_idle_total > 0
    thresholds = {"input": th.input_bound, "communication": th.communication, "host": th.host}
    scores: Dict[str, float] = {}
    notes: Dict[str, str] = {}
    for kind in ("input", "communication", "host"):
        phases = _PHASES_OF[kind]
        share = sum(ev.share(p) for p in phases)
        idle_phases = _IDLE_PHASES_OF[kind]
        ishare = ev.idle_share(kind) if gpu_rules else 0.0
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
        unexplained = 1.0 - ev.idle_share("explained")
        if unexplained >= th.idle_dominant_share:
            scores["idle"] = unexplained * idle_ratio
            notes["idle"] = f"{_pct(unexplained)} of GPU idle time lies outside the reported phases"

    steps = f"{ev.steps} steps" + (f", mean step {1000 * ev.step_seconds / ev.steps:.0f} ms" if ev.steps else "")
    gpu = (f"GPU idle {_pct(idle_ratio)} of observed time" if idle_ratio is not None
           else "no GPU samples for this job")
    tail = f"; {gpu}; {steps} in the last {ev.window_s:.0f} s; phases from {SOURCES.get(ev.source, ev.source)}"
    ordered = tuple((k, round(scores[k], 4)) for k in _ORDER if k in scores)
    if ev.source in STEPS_ONLY_SOURCES:  # the input wait is not observed: say only what the GPUs show ...
        comm = ev.share("communication")
        if comm >= th.communication:
            # ... but a data-parallel job's exposed exchange is timed whatever feeds it (issue 47): where it
            # alone crosses the threshold, the job is communication-bound, its input observed or not
            cause, why = network_cause(ev.network, comm, ev.comm_spread, th.communication)
            return Verdict("communication", f"communication {_pct(comm)} of step time (threshold "
                                            f"{_pct(th.communication)}; its input wait is not observed); {why}{tail}",
                           recommendation("communication", cause, ev.source),
                           (("communication", round(comm, 4)),), cause)
        return unobserved_input(ev, th, tail)
    if scores:
        kind = max(_ORDER, key=lambda k: (scores.get(k, -1.0), -_ORDER.index(k)))
        host_notes = "".join(f"; {note}" for topic, note in ev.extra if topic == "host")
        if kind == "input":
            cause, why = input_cause(ev.input_wait, th)
            cited = host_notes if cause == "host_cpu" else ""
            return Verdict(kind, f"{notes[kind]}; {why}{cited}{tail}", _adv(ev, kind, cause),
                           ordered, cause)
        if kind == "communication":
            cause, why = network_cause(ev.network, ev.share("communication"), ev.comm_spread, th.communication)
            return Verdict(kind, f"{notes[kind]}; {why}{tail}", _adv(ev, kind, cause), ordered,
                           cause)
        return Verdict(kind, notes[kind] + (host_notes if kind == "host" else "") + tail,
                       _adv(ev, kind), ordered)
    if not ev.exchange_observed:
        return Verdict("not_observed", f"compute {_pct(ev.share('compute'))} of step time, data_wait "
                                       f"{_pct(ev.share('data_wait'))}; communication not observed: the gradient "
                                       f"exchange of this data-parallel job runs inside its steps where teye "
                                       f"cannot time it (TensorFlow's collective all-reduce), so compute holds "
                                       f"it too" + tail, Advice(EXCHANGE_NOT_OBSERVED, ("exchange_not_observed",)),
                       ordered)
    return Verdict("compute", f"compute {_pct(ev.share('compute'))} of step time, data_wait "
                              f"{_pct(ev.share('data_wait'))}" + tail, _adv(ev, "compute"),
                   ordered)


def unobserved_input(ev: Evidence, th: Thresholds = Thresholds(), tail: str = "") -> Verdict:
    """Rule 5: what can be said of a job whose input wait is not observed (steps only), never a guess.

    Its steps cannot be split into waiting and working, so only its GPUs' samples during the steps
    speak: busy all but ``gpu_idle_min_ratio`` of the time, the GPU is the limit (``compute``);
    idle more, the GPU waits for a reason the phases do not show (``idle``); no samples, nothing
    can be said (``not_observed``)."""
    r = ev.gpu_idle_ratio
    base = "steps only: input wait not observed"
    if r is None:
        return Verdict("not_observed", f"{base}, and no GPU samples of the job's GPUs: the bottleneck is not "
                                       f"observed" + tail, _adv(ev, "not_observed"))
    if r < th.gpu_idle_min_ratio:
        return Verdict("compute", f"{base}; its GPUs are busy {_pct(1 - r)} of step time (idle below "
                                  f"{_pct(th.gpu_idle_min_ratio)}): the GPU is the limit" + tail,
                       _adv(ev, "compute"), (("compute", round(1 - r, 4)),))
    return Verdict("idle", f"{base}; its GPUs idle {_pct(r)} of step time (at least "
                           f"{_pct(th.gpu_idle_min_ratio)}), waiting for what the job's phases do not show" + tail,
                   _adv(ev, "steps_only_idle"), (("idle", round(r, 4)),))
