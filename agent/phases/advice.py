"""What to do about a verdict, starting from what the job already does: one function for every view (issue 45).

:func:`advise` turns (verdict kind, cause, framework, the job's configuration, facts about the node and the
critical rank) into an :class:`Advice`: its text, and the tips it is made of, each one of a fixed catalog
(:data:`TIPS`, plus the framework's whole paragraphs of ``agent.phases.verdict``), so the agent can export
the advice as bounded series (``teye_job_advice_tip{train_job, tip}``) that the job dashboard's "What to do"
maps back to the same sentences.  The agent's evidence (``verdict.decide``), ``teye profile`` (the agent's
verdict), ``teye report`` (the configuration read back from Prometheus) and the dashboard all go through it.

The rules:

1. A job whose zero-code hook sent no configuration, and no rank named for computing longer, gets the
   framework's paragraph as before (``verdict.recommendation``'s base text): nothing is known, so nothing
   is taken out.
2. What the job already has is said first ("The job already has ...") and never recommended: a DataLoader
   with workers is not told to use workers, pinned memory is not suggested to a loader that pins,
   persistent workers neither, a compression hook is not suggested to a module that has one, ``no_sync``
   never to a job that uses it, autocast never to a job in a low-precision autocast region, torch.compile
   never to a compiled job; larger buckets only below DDP's default (25 MiB).
3. What to try next follows from it: a CPU-bound input (cause ``host_cpu``) whose workers already fill the
   node's cores (``num_workers + 1 >= cpus``: the training process is one more) has reached the host's limit,
   so the advice is to move the decoding offline or to the GPU, or ask for more cores, not more workers.
4. A rank named because it computes longer than the others (``agent.phases.ranks``' rule 3; a
   ``communication`` verdict whose cause is ``straggler`` says the same) gets advice about that rank: its
   node, its data shard, its GPU's clocks; never buckets, compression or fewer exchanges, which would not
   make it compute faster.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Mapping, Optional, Sequence, Tuple

from ..metrics import GAUGE, Point, metric, point
from .jobconfig import COMPRESSING_HOOKS, DDP_DEFAULT_BUCKET_BYTES, LOW_PRECISION

ADVICE_TIP = metric(
    "teye_job_advice_tip", GAUGE,
    "The advice for the job's current verdict, one series per tip (tip: an id of a fixed catalog, "
    "agent/phases/advice.py; the job dashboard's What to do maps it to its sentence); the value is the tip's "
    "place in the advice (1 first). The advice starts from what the job is configured with "
    "(teye_job_config_info) and never recommends what it already has.",
    ["train_job", "tip"])

# The sentences advice is made of, by tip id (bounded: the dashboard maps the exported ids back to these).
TIPS = {
    # input, PyTorch DataLoader (rule 2 and 3)
    "torch.loader.set_workers": (
        "Set DataLoader num_workers above 0 (up to the CPU cores per GPU; each worker is a process): with "
        "num_workers=0 the training process reads and decodes every batch itself while the GPU waits."),
    "torch.loader.more_workers": (
        "Raise DataLoader num_workers while the node has free cores: each worker prepares batches in parallel."),
    "torch.loader.more_io_workers": (
        "Raise DataLoader num_workers (and prefetch_factor): workers that wait on reads rather than compute can "
        "outnumber the cores."),
    "torch.loader.host_limit": (
        "The DataLoader's workers already fill the node's cores: the host is the limit, and more workers will "
        "not help. Move the decoding offline (decode once and store tensors or decoded shards: memory-mapped "
        "NumPy, WebDataset, LMDB), or to the GPU (torchvision.io.decode_jpeg(device='cuda'), NVIDIA DALI), or "
        "ask for more CPU cores per GPU."),
    "torch.loader.pin_memory": (
        "Pin the batches: DataLoader(pin_memory=True) with .to(device, non_blocking=True), so the copy to the "
        "GPU overlaps compute."),
    "torch.loader.persistent": (
        "Keep the workers between epochs: DataLoader(persistent_workers=True), so they are not restarted (and "
        "the dataset copied to them again) every epoch."),
    "torch.loader.prefetch": (
        "Keep more reads in flight: DataLoader(prefetch_factor=4 or more) per worker hides storage latency."),
    "torch.input.cpu_work": (
        "Make each batch cheaper to prepare: decode faster (torchvision.io.decode_jpeg, Pillow-SIMD), run "
        "augmentation on batched tensors on the GPU (torchvision.transforms.v2) instead of per sample in "
        "__getitem__, cache decoded samples that fit in memory, keep torch.set_num_threads(1) in the workers."),
    "torch.input.storage": (
        "Store the data set as large shards read sequentially (WebDataset tar shards, LMDB, memory-mapped NumPy "
        "arrays) rather than one small file per sample, stage it on local NVMe or in memory, and check the file "
        "system: local disk and NFS throughput and latency (teye_disk_*, teye_nfs_*)."),
    "torch.input.slow_items": (
        "The workers are slower than the step while they use little CPU: find what __getitem__ waits on (a "
        "slow read, a remote service, a lock, a sleep), cache what it fetches, and store the data set as large "
        "shards read sequentially on local NVMe or in memory; check local disk and NFS throughput "
        "(teye_disk_*, teye_nfs_*)."),
    # communication, PyTorch DDP (rule 2)
    "comm.link_full": (
        "The link between the nodes is full while the job exchanges gradients: send fewer bytes or exchange "
        "less often, or place the job's ranks on nodes with a faster interconnect (InfiniBand, more links)."),
    "comm.link_errors": (
        "A link the job exchanges over has errors, drops or went down: check that interface (teye_network_*, "
        "teye_network_carrier_changes_total, teye_infiniband_*), its cable or optic and the switch port; "
        "retransmissions and a renegotiated lower speed slow every rank of the job."),
    "torch.ddp.buckets": (
        "Larger gradient buckets: DistributedDataParallel(bucket_cap_mb=...) above the default 25 MB sends "
        "fewer, larger messages."),
    "torch.ddp.compress": (
        "Compress the gradients: model.register_comm_hook(None, fp16_compress_hook or bf16_compress_hook) "
        "halves the bytes on the wire."),
    "torch.ddp.no_sync": (
        "Exchange once per optimizer step: accumulate gradients over micro-batches under model.no_sync()."),
    "torch.ddp.static_graph": (
        "DistributedDataParallel(static_graph=True) where the parameters a step uses do not change: DDP then "
        "orders and overlaps the exchange better."),
    "torch.ddp.interconnect": (
        "Use the NCCL backend on GPUs and check the interconnect: NVLink within a node; InfiniBand rather than "
        "25 Gb/s Ethernet between nodes (teye_infiniband_*, teye_network_*)."),
    # a rank that computes longer (rule 4)
    "rank.slow": (
        "One rank computes longer than the others, and they wait for it in the gradient exchange: the exchange "
        "is not what to change (larger buckets, compression or fewer exchanges would not make that rank "
        "faster). Look at that rank:"),
    "rank.node": (
        "its node: other processes on its CPUs or GPU, its CPU load and frequency (the node dashboard);"),
    "rank.shard": (
        "its data shard: more or longer samples than the other ranks get (a sampler that splits unevenly, "
        "inputs of varying length: bucket them by length so every rank gets the same work);"),
    "rank.clocks": (
        "its GPU's clocks: held down by power or heat, or an XID error (teye_gpu_clock_event_active, the GPU "
        "dashboard)."),
    # compute and host, PyTorch (rule 2)
    "torch.compute.amp": (
        "Use automatic mixed precision: torch.autocast with bfloat16 (or float16 with a GradScaler) on Tensor "
        "Cores."),
    "torch.compute.tf32": (
        "TF32 matmuls (torch.set_float32_matmul_precision('high')) and the channels_last memory format for "
        "convolutions."),
    "torch.compute.compile": "Compile the model with torch.compile to fuse kernels.",
    "torch.compute.batch": (
        "Use the largest batch that fits in memory (re-tune the learning rate), no bias before batch "
        "normalization; then scale out with DistributedDataParallel."),
    "torch.host.compile": (
        "Compile the model (torch.compile; mode='reduce-overhead' uses CUDA graphs) so that small kernels are "
        "fused and launched together."),
    "torch.host.graphs": (
        "The model is compiled already: try mode='reduce-overhead' (CUDA graphs), or compile the whole step "
        "(loss and optimizer too) so that fewer launches remain."),
    "torch.host.rest": (
        "Raise the batch size to amortize launch overhead, avoid host syncs every step (.item(), .cpu(), "
        "printing a loss tensor), log metrics every few steps, and keep DataLoader workers off the cores of the "
        "training process."),
}


@dataclass(frozen=True)
class RankFacts:
    """The critical rank, where it was named for computing longer than the others (ranks' rule 3)."""

    rank: int
    compute_s: float = 0.0         # its compute per step
    others_compute_s: float = 0.0  # the other ranks' mean compute per step
    gpu_note: str = ""             # what slows its GPU now (clock events, XID), where the agent knows


@dataclass(frozen=True)
class Advice:
    text: str
    tips: Tuple[str, ...]   # tip ids, in the order the text gives them (TIPS, or a base paragraph's id)


def _int(cfg: Mapping[str, str], key: str) -> Optional[int]:
    v = cfg.get(key)
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _true(cfg: Mapping[str, str], key: str) -> bool:
    return cfg.get(key) == "true"


def _loader_has(cfg) -> str:
    bits = [f"{k.split('.', 1)[1]}={'True' if cfg[k] == 'true' else 'False' if cfg[k] == 'false' else cfg[k]}"
            for k in ("loader.num_workers", "loader.pin_memory", "loader.persistent_workers",
                      "loader.prefetch_factor", "loader.batch_size") if k in cfg]
    return "DataLoader(" + ", ".join(bits) + ")" if bits else ""


def _ddp_has(cfg) -> str:
    bits = []
    b = _int(cfg, "ddp.bucket_cap_bytes")
    if b is not None:
        bits.append(f"bucket_cap_mb={b / 2**20:g}")
    if "ddp.static_graph" in cfg:
        bits.append(f"static_graph={'True' if _true(cfg, 'ddp.static_graph') else 'False'}")
    out = "DistributedDataParallel(" + ", ".join(bits) + ")" if bits else ""
    hook = cfg.get("ddp.comm_hook")
    if hook:
        out += (" with " if out else "") + ("a communication hook of its own" if hook == "custom" else hook)
    if _true(cfg, "ddp.no_sync"):
        out += (", " if out else "") + "no_sync() accumulation"
    return out


def _step_has(cfg) -> str:
    bits = []
    dt = cfg.get("autocast.dtype")
    if dt:
        bits.append(f"torch.autocast in {dt}")
    if _true(cfg, "torch.compile"):
        bits.append("torch.compile")
    return ", ".join(bits)


def _torch_input(cause: Optional[str], cfg, cpus: Optional[float]) -> Tuple[str, ...]:
    nw = _int(cfg, "loader.num_workers")
    tips = []
    if nw == 0:
        tips.append("torch.loader.set_workers")
    elif nw is not None:
        at_cores = cpus is not None and nw + 1 >= cpus
        if cause == "host_cpu":
            tips.append("torch.loader.host_limit" if at_cores else "torch.loader.more_workers")
        elif cause == "storage":
            tips.append("torch.loader.more_io_workers")
        elif not at_cores:
            tips.append("torch.loader.more_workers")
    if "loader.pin_memory" in cfg and not _true(cfg, "loader.pin_memory"):
        tips.append("torch.loader.pin_memory")
    if nw and "loader.persistent_workers" in cfg and not _true(cfg, "loader.persistent_workers"):
        tips.append("torch.loader.persistent")
    pf = _int(cfg, "loader.prefetch_factor")
    if cause == "storage" and nw and (pf is None or pf < 4):
        tips.append("torch.loader.prefetch")
    tips.append({"host_cpu": "torch.input.cpu_work", "storage": "torch.input.storage"}.get(
        cause or "unknown", "torch.input.slow_items"))
    return tuple(tips)


def _torch_communication(cause: Optional[str], cfg) -> Tuple[str, ...]:
    tips = []
    if cause == "network_bandwidth":
        tips.append("comm.link_full")
    elif cause == "network_errors":
        tips.append("comm.link_errors")
    b = _int(cfg, "ddp.bucket_cap_bytes")
    if b is None or b <= DDP_DEFAULT_BUCKET_BYTES:
        tips.append("torch.ddp.buckets")
    if cfg.get("ddp.comm_hook") not in COMPRESSING_HOOKS:
        tips.append("torch.ddp.compress")
    if not _true(cfg, "ddp.no_sync"):
        tips.append("torch.ddp.no_sync")
    if "ddp.static_graph" in cfg and not _true(cfg, "ddp.static_graph"):
        tips.append("torch.ddp.static_graph")
    tips.append("torch.ddp.interconnect")
    return tuple(tips)


def _torch_compute(cfg) -> Tuple[str, ...]:
    tips = []
    if cfg.get("autocast.dtype") not in LOW_PRECISION:
        tips.append("torch.compute.amp")
    tips.append("torch.compute.tf32")
    if not _true(cfg, "torch.compile"):
        tips.append("torch.compute.compile")
    tips.append("torch.compute.batch")
    return tuple(tips)


def _torch_host(cfg) -> Tuple[str, ...]:
    return ("torch.host.graphs" if _true(cfg, "torch.compile") else "torch.host.compile", "torch.host.rest")


def _secs(s: float) -> str:
    return f"{s:.2f} s" if s >= 1 else f"{1000 * s:.0f} ms"


def advise(kind: str, cause: Optional[str], framework: str, base: Tuple[str, str],
           config: Mapping[str, str] = None, cpus: Optional[float] = None,
           rank: Optional[RankFacts] = None) -> Advice:
    """The advice for a verdict of ``kind`` (``cause``: an input or communication cause) in ``framework``
    (verdict.FRAMEWORKS), given ``base`` = (id, text): the framework's paragraph for it, what the job is
    configured with (``config``: key -> value as exported, jobconfig.KEYS), the CPUs of the node (``cpus``)
    and the critical ``rank`` where it was named for computing longer (module docstring's rules)."""
    cfg = dict(config or ())
    straggler = rank is not None or (kind == "communication" and cause == "straggler")
    if straggler and kind in ("communication", "compute"):
        tips = ("rank.slow", "rank.node", "rank.shard", "rank.clocks")
        lead = ""
        if rank is not None:
            lead = f"Rank {rank.rank} is the one"
            if rank.compute_s and rank.others_compute_s:
                lead += (f": it computes {_secs(rank.compute_s)} per step against {_secs(rank.others_compute_s)} "
                         f"for the others")
            if rank.gpu_note:
                lead += f"; its {rank.gpu_note}"
            lead += ". "
        has = _ddp_has(cfg)
        text = " ".join(TIPS[t] for t in tips)
        return Advice(lead + text + (f" (The job already has {has}: keep it.)" if has else ""), tips)
    torch = framework == "torch" or (framework == "neutral" and bool(cfg))
    if kind == "input" and base[0].endswith(":own_data_work"):
        # the wait is the loop's own work outside any DataLoader it has: that loader's settings are not it
        return Advice(base[1], (base[0],))
    if not cfg or not torch:
        return Advice(base[1], (base[0],))
    if kind == "input" and "loader.num_workers" in cfg:
        tips, has = _torch_input(cause, cfg, cpus), _loader_has(cfg)
    elif kind == "communication" and any(k.startswith("ddp.") for k in cfg):
        tips, has = _torch_communication(cause, cfg), _ddp_has(cfg)
    elif kind == "compute" and ("autocast.dtype" in cfg or "torch.compile" in cfg):
        tips, has = _torch_compute(cfg), _step_has(cfg)
    elif kind == "host" and "torch.compile" in cfg:
        tips, has = _torch_host(cfg), _step_has(cfg)
    else:
        return Advice(base[1], (base[0],))
    text = " ".join(TIPS[t] for t in tips)
    return Advice((f"The job already has {has}. " if has else "") + text, tips)


def points(train_job: str, tips: Sequence[str]) -> Iterator[Point]:
    for i, t in enumerate(tips, 1):
        yield point(ADVICE_TIP, i, train_job, t)


def catalog(base_texts: Iterator[Tuple[str, str]] = ()) -> Sequence[Tuple[str, str]]:
    """Every (tip id, sentence) an advice may hold: TIPS and the framework paragraphs handed in."""
    return tuple(TIPS.items()) + tuple(base_texts)
