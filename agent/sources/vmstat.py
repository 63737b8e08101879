"""Virtual-memory event counters, from <procfs>/vmstat (node_exporter's ``vmstat`` collector).

node_exporter exports the fields matching ``^(oom_kill|pgpg|pswp|pg.*fault).*`` as untyped
``node_vmstat_<field>``; teye exports the same fields as counters, ``teye_vmstat_<field>_total``
(a fixed list, each with its own HELP: no family name is made from what a file says).  A field this
kernel does not print (``oom_kill`` needs 4.13) is absent, not zero.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator

from ..errors import ParseError, parse_int
from ..metrics import COUNTER, Point, metric, point
from ._files import KeptFiles, KeptFilesSource, under

# field -> HELP (node_exporter's node_vmstat_<field>)
FIELDS = {
    "oom_kill": "Processes killed by the kernel's OOM killer since boot (/proc/vmstat oom_kill, 4.13+).",
    "pgfault": "Page faults, minor and major, since boot (/proc/vmstat pgfault).",
    "pgmajfault": "Major page faults (the page had to be read from disk or swap) since boot (/proc/vmstat "
                  "pgmajfault).",
    "pgpgin": "Kibibytes paged in from block devices since boot (/proc/vmstat pgpgin; unit as the kernel counts).",
    "pgpgout": "Kibibytes paged out to block devices since boot (/proc/vmstat pgpgout; unit as the kernel counts).",
    "pswpin": "Pages swapped in since boot (/proc/vmstat pswpin).",
    "pswpout": "Pages swapped out since boot (/proc/vmstat pswpout).",
}
METRICS = {f: metric(f"teye_vmstat_{f}_total", COUNTER, h + f" node_exporter: node_vmstat_{f}.")
           for f, h in FIELDS.items()}


@dataclass(frozen=True)
class VmstatReading:
    values: Dict[str, int]  # field -> count, for the FIELDS this kernel prints

    def points(self) -> Iterator[Point]:
        for f, m in METRICS.items():
            if f in self.values:
                yield point(m, self.values[f])


def parse_vmstat(text: str, path: str = "vmstat") -> VmstatReading:
    """The FIELDS of /proc/vmstat (``name value`` lines). ParseError on a garbled line of a field teye exports,
    or a file that has none of them."""
    out: Dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts or parts[0] not in FIELDS:
            continue  # other fields are not read (a new kernel's odd line costs nothing)
        if len(parts) != 2:
            raise ParseError(path, f"line {lineno}: expected 'name value', got {line!r}")
        v = parse_int(parts[1], path, f"line {lineno} {parts[0]}")
        if v < 0:
            raise ParseError(path, f"line {lineno}: {parts[0]}: negative count {v}")
        out[parts[0]] = v
    if not out:
        raise ParseError(path, f"none of {', '.join(FIELDS)} present (empty or truncated?)")
    return VmstatReading(out)


class VmstatSource(KeptFilesSource):
    name = "vmstat"
    KEPT = 1   # vmstat

    def __init__(self, procfs: str = "/proc"):
        self.path = under(procfs, "vmstat")
        self._files = KeptFiles()

    def collect(self) -> VmstatReading:
        return parse_vmstat(self._files.read_text(self.path), self.path)


def from_config(cfg, ctx=None) -> VmstatSource:
    return VmstatSource(cfg["procfs"])
