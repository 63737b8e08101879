"""Reading another process's CPU time, memory and threads from /proc (shared by the benchmarks)."""
from __future__ import annotations

import os


def cpu_seconds(pid: int) -> float:
    """utime + stime of pid, in seconds."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status(pid: int) -> dict:
    """/proc/<pid>/status as {field: first number} (kB for the memory fields)."""
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            words = rest.split()
            if words and words[0].isdigit():
                out[key] = int(words[0])
    return out


def peak_rss_mib(pid: int) -> float:
    """VmHWM of pid, in MiB."""
    return status(pid).get("VmHWM", float("nan")) / 1024


def rss_mib(pid: int) -> float:
    """VmRSS of pid, in MiB."""
    return status(pid).get("VmRSS", float("nan")) / 1024
