"""The PMU trace format (docs/pmu-trace-format.md): a header line, then one line per poll.

    {"format": "teye-pmu-trace", "version": 1, ...}
    {"t": 0.0, "reads": [{"pmu": "cpu", "event": "cpu-cycles", "cpu": 0, "value": 123,
                          "enabled_ns": 1000, "running_ns": 1000}, ...]}

``value``/``enabled_ns``/``running_ns`` are cumulative since the counter was enabled, as
read() returned them, before scaling.
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

from .. import tracefile
from ..errors import ParseError

FORMAT = "teye-pmu-trace"
VERSION = 1
READ_KEYS = (("pmu", str), ("event", str), ("cpu", int), ("value", int), ("enabled_ns", int), ("running_ns", int))


def read(path: str) -> Tuple[Dict[str, Any], List[Tuple[float, List[Dict[str, Any]]]]]:
    """(header, [(t, reads)]) of a trace file; ParseError naming the line on anything malformed."""
    header = None
    lines: List[Tuple[float, List[Dict[str, Any]]]] = []
    for lineno, obj in tracefile.records(path, FORMAT, VERSION):
        if header is None:
            header = obj
            continue
        t = obj.get("t")
        if not isinstance(t, (int, float)) or isinstance(t, bool) or t < 0:
            raise ParseError(path, f"line {lineno}: 't' must be a number >= 0 (seconds since the start)")
        if lines and t < lines[-1][0]:
            raise ParseError(path, f"line {lineno}: 't' goes backwards ({t} < {lines[-1][0]})")
        reads = obj.get("reads")
        if not isinstance(reads, list):
            raise ParseError(path, f"line {lineno}: 'reads' must be a list")
        for i, r in enumerate(reads):
            if not isinstance(r, dict):
                raise ParseError(path, f"line {lineno}: reads[{i}] is not an object")
            for key, typ in READ_KEYS:
                v = r.get(key)
                if not isinstance(v, typ) or isinstance(v, bool) or (typ is int and v < 0):
                    raise ParseError(path, f"line {lineno}: reads[{i}].{key} must be a "
                                           f"{'non-negative integer' if typ is int else 'string'}")
        lines.append((float(t), reads))
    return header, lines
