"""Software RAID (md) arrays, from ``<procfs>/mdstat`` (node_exporter's ``mdadm`` collector): each array's
state, its member disks by state and the disks it needs, its size and how much of it is in sync.

mdstat (drivers/md/md.c, md_seq_show): a ``Personalities`` line, then per array a line
``md0 : active raid1 sdb1[1] sda1[0](F)`` (members with their role number, ``(F)`` failed, ``(S)`` spare) and
indented lines under it: ``<blocks> blocks ... [total/working] [UU_]`` (1 KiB blocks; raid0 and linear
print no ``[n/m]``: every member is needed), perhaps a ``bitmap:`` line, and while the array is being rebuilt
a progress line (``recovery``, ``resync`` or ``check`` ``= 8.5% (16775552/195310144)``; ``resync=PENDING`` or
``DELAYED`` before it starts).

Read by the ``disk`` collector in the same pass as ``/proc/diskstats``.  A node without md (no ``/proc/mdstat``,
or no arrays in it) has none of these families; a garbled file leaves them out, named in the log and counted in
``teye_md_unreadable_total``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, List, Tuple

from ..errors import ParseError
from ..metrics import COUNTER, GAUGE, Point, metric, point

STATES = ("active", "inactive", "recovering", "resync", "check")
_DEV = ("device",)
STATE = metric("teye_md_state", GAUGE, "1 for the md array's current state, 0 for the others: active, inactive, "
               "recovering (a member being rebuilt), resync, check (/proc/mdstat; node_md_state).", ("device", "state"))
DISKS = metric("teye_md_disks", GAUGE, "Member disks of the md array by state: active (working), failed (F), spare "
               "(S) (/proc/mdstat; node_md_disks).", ("device", "state"))
REQUIRED = metric("teye_md_disks_required", GAUGE, "Disks the md array needs to be complete (the n of [n/m]; every "
                  "member for raid0 and linear; 0 while inactive) (/proc/mdstat; node_md_disks_required): fewer "
                  "active disks is a degraded array.", _DEV)
SIZE = metric("teye_md_size_bytes", GAUGE, "Size of the md array in bytes (/proc/mdstat blocks × 1024; "
              "node_md_blocks × 1024).", _DEV)
SYNCED = metric("teye_md_synced_bytes", GAUGE, "Bytes of the md array in sync: its size unless a recovery, resync "
                "or check is under way (0 while one is pending or delayed) (node_md_blocks_synced × 1024).", _DEV)
UNREADABLE = metric("teye_md_unreadable_total", COUNTER, "Reads of /proc/mdstat refused because it was garbled (the "
                    "md families left out of that pass, the reason in the log).")

MAX_ARRAYS = 1024
_HEAD = re.compile(r"^(md[A-Za-z0-9_]+) : (\S+)")
_STATUS = re.compile(r"\[([0-9]+)/([0-9]+)\] \[[U_]+\]")
_PROGRESS = re.compile(r"\(([0-9]+)/([0-9]+)\)")
_MEMBER = re.compile(r"\S+\[[0-9]+\]")
_BLOCKS = re.compile(r"\s*([0-9]+) blocks")


@dataclass(frozen=True)
class MdArray:
    device: str
    state: str
    active: int
    failed: int
    spare: int
    required: int
    blocks: int
    synced: int


@dataclass(frozen=True)
class MdReading:
    arrays: Tuple[MdArray, ...]
    unreadable_total: int = 0

    def points(self) -> Iterator[Point]:
        for a in self.arrays:
            for s in STATES:
                yield point(STATE, 1 if a.state == s else 0, a.device, s)
            yield point(DISKS, a.active, a.device, "active")
            yield point(DISKS, a.failed, a.device, "failed")
            yield point(DISKS, a.spare, a.device, "spare")
            yield point(REQUIRED, a.required, a.device)
            yield point(SIZE, a.blocks * 1024, a.device)
            yield point(SYNCED, a.synced * 1024, a.device)
        if self.unreadable_total:
            yield point(UNREADABLE, self.unreadable_total)


def _array(head: str, body: List[str], path: str, lineno: int) -> MdArray:
    m = _HEAD.match(head)
    device, state = m.group(1), m.group(2)
    if state not in ("active", "inactive"):
        raise ParseError(path, f"line {lineno}: {device}: state {state!r}, expected active or inactive")
    size = _BLOCKS.match(body[0]) if body else None
    if size is None:
        raise ParseError(path, f"line {lineno + 1}: {device}: expected '<blocks> blocks ...' under the array")
    blocks = int(size.group(1))
    words = head.split()[3:]
    failed, spare = head.count("(F)"), head.count("(S)")
    members = sum(1 for w in words if _MEMBER.match(w))
    if state == "inactive":
        active = required = 0
    elif "raid0" in words or "linear" in words:
        active = required = members
    else:
        st = _STATUS.search(body[0])
        if st is None:
            raise ParseError(path, f"line {lineno + 1}: {device}: no '[total/working] [U_]' in {body[0][:80]!r}")
        required, active = int(st.group(1)), int(st.group(2))
        if active > required:
            raise ParseError(path, f"line {lineno + 1}: {device}: {active} working disks of {required}")
    synced = blocks
    for line in body[1:]:
        kind = next((k for k in ("recovery", "resync", "check") if k in line), None)
        if kind is None:
            continue
        state = {"recovery": "recovering", "resync": "resync", "check": "check"}[kind]
        if "PENDING" in line or "DELAYED" in line:
            synced = 0
        else:
            p = _PROGRESS.search(line)
            if p is None:
                raise ParseError(path, f"{device}: progress line without '(done/total)': {line.strip()[:80]!r}")
            synced = int(p.group(1))
        break
    return MdArray(device, state, active, failed, spare, required, blocks, synced)


def parse_mdstat(text: str, path: str = "mdstat") -> Tuple[MdArray, ...]:
    """Every array in /proc/mdstat (none when it lists none).  ParseError on a line it cannot read."""
    arrays: List[MdArray] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.startswith(("Personalities", "unused devices")) or line[0].isspace():
            i += 1
            continue
        if not _HEAD.match(line):
            raise ParseError(path, f"line {i + 1}: expected 'mdN : state ...', got {line[:80]!r}")
        body = []
        j = i + 1
        while j < len(lines) and lines[j][:1].isspace() and lines[j].strip():
            body.append(lines[j])
            j += 1
        if len(arrays) >= MAX_ARRAYS:
            raise ParseError(path, f"more than {MAX_ARRAYS} arrays")
        arrays.append(_array(line, body, path, i + 1))
        i = j
    return tuple(arrays)
