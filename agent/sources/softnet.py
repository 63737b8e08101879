"""The kernel's per-CPU packet receive work, from ``<procfs>/net/softnet_stat`` (node_exporter's ``softnet``):
packets processed, dropped because the CPU's backlog queue was full (``netdev_max_backlog``), and the times the
receive softirq ran out of budget with work left (``time_squeeze``: raise ``netdev_budget``).

One line per CPU that has one, hexadecimal columns (net/core/net-procfs.c): processed, dropped,
time_squeeze, 5 zeros, cpu_collision, received_rps, flow_limit_count; kernels from 5.10 add the backlog length
and the CPU's number.  The ``cpu`` label is that number where the kernel prints it (offline CPUs have no
line, so the line's index is not the CPU), else the line's index, as node_exporter 1.5 labels every line.

Read by the ``network`` collector in the same pass as ``/proc/net/dev``; absent where the file is (a kernel
without it), left out and counted (``teye_softnet_unreadable_total``) where it is garbled.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, Tuple

from ..errors import ParseError
from ..metrics import COUNTER, Point, metric, point

_C = ("cpu",)
PROCESSED = metric("teye_softnet_processed_total", COUNTER, "Packets the CPU's receive softirq processed "
                   "(/proc/net/softnet_stat column 1; node_softnet_processed_total).", _C)
DROPPED = metric("teye_softnet_dropped_total", COUNTER, "Packets dropped because the CPU's backlog queue was full "
                 "(net.core.netdev_max_backlog; /proc/net/softnet_stat column 2; node_softnet_dropped_total).", _C)
SQUEEZED = metric("teye_softnet_times_squeezed_total", COUNTER, "Times the CPU's receive softirq stopped with work "
                  "left because its budget ran out (net.core.netdev_budget; /proc/net/softnet_stat column 3; "
                  "node_softnet_times_squeezed_total).", _C)
UNREADABLE = metric("teye_softnet_unreadable_total", COUNTER, "Reads of /proc/net/softnet_stat refused because it "
                    "was garbled (the softnet families left out of that pass, the reason in the log).")
MAX_CPUS = 8192
_HEX = re.compile(r"[0-9a-fA-F]{1,16}")   # int(w, 16) alone takes "-1", "0x1f" and "1_0"


@dataclass(frozen=True)
class SoftnetReading:
    cpus: Tuple[Tuple[str, int, int, int], ...]   # (cpu, processed, dropped, squeezed)
    unreadable_total: int = 0

    def points(self) -> Iterator[Point]:
        for cpu, processed, dropped, squeezed in self.cpus:
            yield point(PROCESSED, processed, cpu)
            yield point(DROPPED, dropped, cpu)
            yield point(SQUEEZED, squeezed, cpu)
        if self.unreadable_total:
            yield point(UNREADABLE, self.unreadable_total)


def parse_softnet(text: str, path: str = "softnet_stat") -> Tuple[Tuple[str, int, int, int], ...]:
    out = []
    seen = set()
    for index, line in enumerate(ln for ln in text.splitlines() if ln.strip()):
        words = line.split()
        if len(words) < 3:
            raise ParseError(path, f"line {index + 1}: expected at least 3 hexadecimal columns, got {len(words)}")
        if not all(_HEX.fullmatch(w) for w in words):
            raise ParseError(path, f"line {index + 1}: expected hexadecimal columns, got {line[:80]!r}")
        values = [int(w, 16) for w in words]
        cpu = values[12] if len(values) >= 13 else index
        if cpu in seen or cpu >= MAX_CPUS or index >= MAX_CPUS:
            raise ParseError(path, f"line {index + 1}: CPU {cpu} repeated or out of range")
        seen.add(cpu)
        out.append((str(cpu), values[0], values[1], values[2]))
    if not out:
        raise ParseError(path, "file is empty")
    return tuple(out)
