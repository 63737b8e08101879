"""The few error behaviours a source's caller needs.

Parsers raise :class:`ParseError` naming the file; sources raise
:class:`SourceUnavailable` when the subsystem is absent (no InfiniBand, no NVML).
The sampler turns both, and OSError, into ``teye_collector_up{collector}=0``.  :class:`HardwareAbsent`
(a SourceUnavailable) says the node has no such hardware at all (no NVIDIA driver, no PMU, no InfiniBand
device, no NFS server): a collector that raises it before it ever read anything, and that the
configuration did not turn on explicitly, is *absent* (``teye_collector_absent{collector}=1``), which
the TeyeCollectorFailing alert leaves alone.
"""
from __future__ import annotations


class ParseError(ValueError):
    """A file under procfs/sysfs is missing a field, truncated, empty or non-numeric."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class SourceUnavailable(RuntimeError):
    """The subsystem a source reads is not present or not usable here (with why)."""


class HardwareAbsent(SourceUnavailable):
    """The hardware (or kernel service) a source reads does not exist on this node at all: nothing broke."""


class ConfigError(ValueError):
    """Bad configuration: the message names the key and the expected type."""


def parse_int(text: str, path: str, what: str) -> int:
    """int(text) or ParseError naming the file and the field."""
    try:
        return int(text)
    except (TypeError, ValueError):
        raise ParseError(path, f"{what}: expected an integer, got {text!r}") from None


def parse_float(text: str, path: str, what: str) -> float:
    """float(text) or ParseError naming the file and the field."""
    try:
        return float(text)
    except (TypeError, ValueError):
        raise ParseError(path, f"{what}: expected a number, got {text!r}") from None
