"""What a training job is configured with: the optional ``cfg`` of a phase message, checked, kept per
process and exported as ``teye_job_config_info`` (issue 45).

teye's zero-code hook (``teye_client._config``) holds the job's DataLoader, DistributedDataParallel module,
autocast regions and torch.compile in its hands; it sends their settings, never user data or paths, as a
JSON object of **fixed keys** (:data:`KEYS`), each with a type and a bounded domain: small integers,
booleans, or one name of a fixed set.  A process sends its whole configuration (a snapshot, not a change)
with its identity, once per connection and whenever it changes, so the agent replaces what that process
said before.

A ``cfg`` that is not an object, has more than :data:`MAX_ENTRIES` entries, a key longer than
:data:`MAX_KEY_CHARS`, or a known key whose value has the wrong type or lies outside its domain is refused
whole (never half a configuration) with a counted reason (``teye_phase_config_messages_total{result}``);
the datagram's phases and steps are taken either way (a configuration is advice's input, never worth
losing a job's figures).  Keys this agent does not know are ignored (a newer client), as unknown message
keys are.

The job's configuration is, per key, the value of its lowest rank that sent the key (processes without a
rank come after those with one, lowest pid first): ranks of one job run one script, and where they differ
the exported value says which one was taken (docs/phases.md).  Per process bounded by the job table's
process limit; each series of the family is one (train_job, key) pair, at most ``len(KEYS)`` per job.
"""
from __future__ import annotations

import json
from typing import Dict, Iterator, Mapping, Optional, Tuple

from ..metrics import COUNTER, GAUGE, Point, metric, point

MAX_ENTRIES = 64         # entries in one cfg object (known and unknown keys)
MAX_KEY_CHARS = 64
MAX_INT = 1 << 44        # the largest integer any key takes (16 TiB of bucket bytes)

# Which gradient-communication hook a DistributedDataParallel module has (register_comm_hook): PyTorch's own
# hooks by name, anything else "custom" (a function of the job's: its name is the job's, never sent).
COMM_HOOKS = ("allreduce_hook", "fp16_compress_hook", "bf16_compress_hook", "fp16_compress_wrapper",
              "bf16_compress_wrapper", "powerSGD_hook", "batched_powerSGD_hook", "noop_hook",
              "quantization_pertensor_hook", "quantization_perchannel_hook", "custom")
# Hooks that send fewer bytes than the gradients (compression or low rank): advice never suggests compressing.
COMPRESSING_HOOKS = frozenset({"fp16_compress_hook", "bf16_compress_hook", "fp16_compress_wrapper",
                               "bf16_compress_wrapper", "powerSGD_hook", "batched_powerSGD_hook",
                               "quantization_pertensor_hook", "quantization_perchannel_hook"})
DTYPES = ("float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2", "other")
LOW_PRECISION = frozenset({"float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"})

INT, BOOL, ENUM = "int", "bool", "enum"
# key -> (type, low, high) for integers, (type,) for booleans, (type, names) for enums
KEYS: Dict[str, tuple] = {
    "loader.num_workers": (INT, 0, 4096),
    "loader.pin_memory": (BOOL,),
    "loader.persistent_workers": (BOOL,),
    "loader.prefetch_factor": (INT, 1, 1 << 16),
    "loader.batch_size": (INT, 1, 1 << 31),
    "ddp.bucket_cap_bytes": (INT, 1, MAX_INT),
    "ddp.static_graph": (BOOL,),
    "ddp.comm_hook": (ENUM, COMM_HOOKS),
    "ddp.no_sync": (BOOL,),
    "autocast.dtype": (ENUM, DTYPES),
    "torch.compile": (BOOL,),
}
DDP_DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024   # DistributedDataParallel's bucket_cap_mb default (25)

ACCEPTED = "accepted"
CONFIG_REASONS = ("wrong_type", "too_large", "bad_value")
CONFIG_RESULTS = (ACCEPTED,) + CONFIG_REASONS

CONFIG_INFO = metric(
    "teye_job_config_info", GAUGE,
    "Always 1: one setting of what the training job is configured with, as teye's zero-code hook saw it "
    "(key: loader.num_workers, loader.pin_memory, loader.persistent_workers, loader.prefetch_factor, "
    "loader.batch_size, ddp.bucket_cap_bytes, ddp.static_graph, ddp.comm_hook, ddp.no_sync, autocast.dtype, "
    "torch.compile; value: an integer, true/false, or a name of a fixed set). A fixed set of keys with bounded "
    "values, never user data or paths; the value of the job's lowest rank that sent the key (docs/phases.md). "
    "Absent for a key the job did not show.",
    ["train_job", "key", "value"])
CONFIG_MESSAGES = metric(
    "teye_phase_config_messages_total", COUNTER,
    "Phase datagrams that carried a job's configuration (cfg), by result: accepted, or why the configuration "
    "was refused whole (wrong_type, too_large, bad_value); the datagram's phases and steps are taken either way.",
    ["result"])


class Refused(ValueError):
    """A cfg that is not a valid configuration; ``reason`` is one of CONFIG_REASONS."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


Config = Tuple[Tuple[str, str], ...]   # (key, value as exported), in KEYS order


def render(kind: tuple, v) -> str:
    """A checked value as the label value it is exported as."""
    if kind[0] == BOOL:
        return "true" if v else "false"
    return str(v)


def check(obj) -> Config:
    """The configuration of a decoded ``cfg`` value, or Refused."""
    if type(obj) is not dict:
        raise Refused("wrong_type", f"'cfg' must be an object of settings, got {type(obj).__name__}")
    if len(obj) > MAX_ENTRIES:
        raise Refused("too_large", f"'cfg' has {len(obj)} entries (limit {MAX_ENTRIES})")
    out = []
    for key, v in obj.items():
        if len(key) > MAX_KEY_CHARS:
            raise Refused("too_large", f"a 'cfg' key of {len(key)} characters (limit {MAX_KEY_CHARS})")
        kind = KEYS.get(key)
        if kind is None:
            continue   # a newer client's key: ignored
        t = kind[0]
        if t == BOOL:
            if type(v) is not bool:
                raise Refused("wrong_type", f"cfg {key!r} must be true or false")
        elif t == INT:
            if type(v) is not int:   # bool is an int subclass: excluded on purpose
                raise Refused("wrong_type", f"cfg {key!r} must be an integer")
            if not kind[1] <= v <= kind[2]:
                raise Refused("bad_value", f"cfg {key!r} {v} outside {kind[1]}..{kind[2]}")
        else:
            if type(v) is not str:
                raise Refused("wrong_type", f"cfg {key!r} must be a string")
            if v not in kind[1]:
                raise Refused("bad_value", f"cfg {key!r} {v[:40]!r} is not one of {', '.join(kind[1])}")
        out.append((key, render(kind, v)))
    order = {k: i for i, k in enumerate(KEYS)}
    return tuple(sorted(out, key=lambda kv: order[kv[0]]))


def config_of(data: bytes) -> Optional[Config]:
    """The checked ``cfg`` of an accepted datagram (None: it has none), or Refused.  Called for every
    datagram accepted: the usual one (no cfg) costs one byte search."""
    if b'"cfg"' not in data:
        return None
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    if type(obj) is not dict or "cfg" not in obj:
        return None
    return check(obj["cfg"])


def taken(data: bytes, results: Dict[str, int], rlog, pid: int, uid: int) -> Optional[Config]:
    """The configuration of an accepted datagram, counted in ``results`` by result; a refused one is logged
    (rate-limited, ``rlog``: the job table's RateLimitedLog) and None, like a datagram without one."""
    try:
        cfg = config_of(data)
    except Refused as r:
        results[r.reason] += 1
        rlog.warning(f"config:{r.reason}", "configuration from pid %d uid %d refused (its phases are taken): %s",
                     pid, uid, r)
        return None
    if cfg is not None:
        results[ACCEPTED] += 1
    return cfg


class JobConfigs:
    """The configurations a job's processes sent: pid -> (rank or None, Config), bounded by the caller."""

    __slots__ = ("by_pid",)

    def __init__(self):
        self.by_pid: Dict[int, Tuple[Optional[int], Config]] = {}

    def note(self, pid: int, rank: Optional[int], cfg: Config, known: bool) -> None:
        """pid's whole configuration now (``known``: the job keeps state for this pid)."""
        if known:
            self.by_pid[pid] = (rank, cfg)

    def merged(self) -> Config:
        """Per key, the value of the lowest rank that sent it (then processes without a rank, lowest pid)."""
        out: Dict[str, str] = {}
        order = sorted(self.by_pid.items(), key=lambda kv: (kv[1][0] is None, kv[1][0] or 0, kv[0]))
        for _, (_, cfg) in order:
            for k, v in cfg:
                out.setdefault(k, v)
        keys = {k: i for i, k in enumerate(KEYS)}
        return tuple(sorted(out.items(), key=lambda kv: keys[kv[0]]))


def points(train_job: str, config: Config) -> Iterator[Point]:
    for key, value in config:
        yield point(CONFIG_INFO, 1, train_job, key, value)


def result_points(results: Mapping[str, int]) -> Iterator[Point]:
    for r in CONFIG_RESULTS:
        yield point(CONFIG_MESSAGES, results.get(r, 0), r)
