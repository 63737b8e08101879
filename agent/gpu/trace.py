"""The GPU trace format shared by ``teye record`` and ``--gpu-replay`` (docs/gpu-trace-format.md).

JSON lines: a header object, then one object per NVML call the backend made (only when its
answer changed since the last record of the same call), event records, and an end record.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List, Tuple

from .. import tracefile
from ..errors import ParseError

FORMAT = "teye-gpu-trace"
VERSION = 1

# Calls whose last argument is a "last seen" CPU timestamp (µs) and whose results carry
# timeStamp fields: recorded relative to the trace start, replayed shifted to look live.
TIMESTAMPED = ("nvmlDeviceGetSamples", "nvmlDeviceGetProcessUtilization", "nvmlDeviceGetProcessesUtilizationInfo")
RING = "nvmlDeviceGetSamples"
# Cumulative counters: replay adds one loop's increase per loop so they never go backwards.
CUMULATIVE = ("nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetPcieReplayCounter")
# Calls the replay implements itself (opaque objects, no data worth recording).
NATIVE = ("nvmlInit", "nvmlInitWithFlags", "nvmlShutdown", "nvmlGpmSampleAlloc", "nvmlGpmSampleFree",
          "nvmlGpmSampleGet", "nvmlGpmMigSampleGet", "nvmlEventSetCreate", "nvmlEventSetFree",
          "nvmlDeviceRegisterEvents")
EVENT_WAIT = ("nvmlEventSetWait_v2", "nvmlEventSetWait")
GPM_METRICS_GET = "nvmlGpmMetricsGet"
# nvmlDeviceGetFieldValues: each value carries NVML's own timestamp and latency, written without them
FIELD_VALUES = "nvmlDeviceGetFieldValues"
FIELD_VALUE_STAMPS = ("timestamp", "latencyUsec")

DEFAULT_RING_CAPACITY = 100  # samples the replayed driver ring keeps (an assumption; see the doc)


def call_key(fn: str, dev, args: List[Any], kw: Dict[str, Any]) -> Tuple[str, Any, str, str]:
    """Identity of a call for de-duplication and replay lookup (timestamps excluded)."""
    return fn, dev, json.dumps(args, separators=(",", ":")), json.dumps(kw, sort_keys=True, separators=(",", ":"))


def read(path: str) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """(header, records) of a trace file; ParseError naming the line on anything malformed."""
    header, records = stream(path)
    return header, list(records)


def stream(path: str) -> Tuple[Dict[str, Any], Iterator[Dict[str, Any]]]:
    """(header, records one at a time): the replay builds its tables as it reads, so a long trace is never
    held twice (its JSON objects and the tables) at the agent's peak RSS.  The header is read (and checked)
    now; a malformed record raises ParseError when the iteration reaches it."""
    lines = tracefile.records(path, FORMAT, VERSION)
    _, header = next(lines)  # an empty file: ParseError from tracefile.records
    return header, _checked(path, lines)


def _checked(path: str, lines) -> Iterator[Dict[str, Any]]:
    for lineno, obj in lines:
        t = obj.get("t")
        if not isinstance(t, int) or isinstance(t, bool):
            raise ParseError(path, f"line {lineno}: 't' must be an integer (µs since the start)")
        if not obj.get("end") and not isinstance(obj.get("fn"), str):
            raise ParseError(path, f"line {lineno}: record without 'fn'")
        if "fn" in obj and "ret" not in obj and "err" not in obj:
            raise ParseError(path, f"line {lineno}: record without 'ret' or 'err'")
        yield obj
