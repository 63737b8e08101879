"""Host memory errors reported by the EDAC drivers, from <sysfs>/devices/system/edac/mc (node_exporter's
``edac`` collector): correctable and uncorrectable ECC errors per memory controller and per chip-select row.

A rising correctable count predicts a DIMM that will fail; one uncorrectable error can crash the node or
corrupt a training run's host buffers.  A node without EDAC (most VMs, drivers not loaded) exports
nothing from it: absent hardware, not a failure.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Iterator, Optional, Tuple

from ..errors import ParseError
from ..metrics import COUNTER, Point, metric, point
from ._files import read_text, under

CE = metric("teye_edac_correctable_errors_total", COUNTER, "Correctable memory errors of a memory controller "
            "(mcN/ce_count; node_edac_correctable_errors_total).", ("controller",))
UE = metric("teye_edac_uncorrectable_errors_total", COUNTER, "Uncorrectable memory errors of a memory "
            "controller (mcN/ue_count; node_edac_uncorrectable_errors_total).", ("controller",))
CSROW_CE = metric("teye_edac_csrow_correctable_errors_total", COUNTER, "Correctable memory errors of one "
                  "chip-select row (mcN/csrowM/ce_count; node_edac_csrow_correctable_errors_total).",
                  ("controller", "csrow"))
CSROW_UE = metric("teye_edac_csrow_uncorrectable_errors_total", COUNTER, "Uncorrectable memory errors of one "
                  "chip-select row (mcN/csrowM/ue_count; node_edac_csrow_uncorrectable_errors_total).",
                  ("controller", "csrow"))
_MC = re.compile(r"^mc([0-9]{1,4})$")
_CSROW = re.compile(r"^csrow([0-9]{1,4})$")


def _count(path: str) -> Optional[int]:
    try:
        text = read_text(path).strip()
    except FileNotFoundError:
        return None
    if not text.isascii() or not text.isdigit():
        raise ParseError(path, f"expected a count, got {text[:40]!r}")
    return int(text)


@dataclass(frozen=True)
class EdacReading:
    rows: Tuple[Tuple[object, Tuple[str, ...], int], ...]

    def points(self) -> Iterator[Point]:
        for spec, labels, value in self.rows:
            yield point(spec, value, *labels)


class EdacSource:
    name = "edac"

    def __init__(self, sysfs: str = "/sys"):
        self.dir = under(sysfs, "devices", "system", "edac", "mc")

    def collect(self) -> EdacReading:
        rows = []
        if not os.path.isdir(self.dir):
            return EdacReading(())
        for entry in sorted(os.listdir(self.dir)):
            m = _MC.match(entry)
            if not m:
                continue
            d = os.path.join(self.dir, entry)
            mc = m.group(1)
            for spec, f in ((CE, "ce_count"), (UE, "ue_count")):
                v = _count(os.path.join(d, f))
                if v is not None:
                    rows.append((spec, (mc,), v))
            for sub in sorted(os.listdir(d)) if os.path.isdir(d) else []:
                r = _CSROW.match(sub)
                if not r:
                    continue
                for spec, f in ((CSROW_CE, "ce_count"), (CSROW_UE, "ue_count")):
                    v = _count(os.path.join(d, sub, f))
                    if v is not None:
                        rows.append((spec, (mc, r.group(1)), v))
        return EdacReading(tuple(rows))


def from_config(cfg, ctx=None) -> EdacSource:
    return EdacSource(cfg["sysfs"])
