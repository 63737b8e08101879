"""The one door to files under a procfs, sysfs or cgroup root: every read bounded, none blocking.

A file there is the kernel's, or whatever a test, a container's bind mount or a broken node put in its
place: ``stat`` linked to ``/dev/zero`` never ends (read whole it took 1.5 GB each interval), a FIFO
as a job's ``memory.stat`` blocks its reader forever.  So every file is opened with ``O_NONBLOCK``
(opening a FIFO with no writer returns at once), checked with ``fstat`` to be a regular file (procfs
and sysfs pseudo-files are regular files that report size 0, so the size is never trusted) and read in
chunks up to :data:`MAX_FILE_BYTES`.  A file refused (:class:`FileRefused`, an ``OSError``, so every
caller's existing "cannot read: value left out" path handles it) is named once in the log (per path
and reason, at most once an hour) and counted in ``teye_files_refused_total{collector,reason}``; only
what that file held is lost.

The bound: the largest legitimate file teye reads is ``/proc/stat`` on a very large machine (one
``cpuN`` line of about 100 bytes per CPU, ``intr`` one number per interrupt: about 1 MiB at 8,192
CPUs) or ``/proc/self/mountstats`` with many NFS mounts (about 4 KiB per mount: 4 MiB for 1,000
mounts).  :data:`MAX_FILE_BYTES` is 8 MiB, twice that.
"""
from __future__ import annotations

import errno
import logging
import os
import stat
import threading
from contextlib import contextmanager
from typing import Dict, Iterator, Optional, Tuple

from ..errors import ParseError
from ..logutil import RateLimitedLog
from ..metrics import COUNTER, Point, metric, point

log = logging.getLogger("teye.sources.files")

MAX_FILE_BYTES = 8 << 20
_CHUNK = 1 << 16
NOT_REGULAR, TOO_LARGE = "not_regular", "too_large"
REASONS = (NOT_REGULAR, TOO_LARGE)

FILES_REFUSED = metric(
    "teye_files_refused_total", COUNTER,
    "Files under --procfs, --sysfs or the cgroup root that the collector refused to read since the agent "
    "started, by reason: not_regular (a FIFO, device or socket in place of a kernel file: reading it could "
    "block or never end), too_large (more than 8 MiB). Only the values that file held are left out; "
    "absent until a file is refused.",
    ["collector", "reason"])

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))

_local = threading.local()
_rlog = RateLimitedLog(log, interval_s=3600.0)


class FileRefused(OSError):
    """A file teye will not read: not a regular file, or larger than the bound (``reason``)."""

    def __init__(self, path: str, reason: str, detail: str):
        super().__init__(errno.EINVAL if reason == NOT_REGULAR else errno.EFBIG, detail, path)
        self.reason = reason


class Refusals:
    """One collector's refused files, by reason, since it was made (a source holds one: its counter)."""

    def __init__(self, collector: str):
        self.collector = collector
        self._lock = threading.Lock()
        self._n: Dict[str, int] = {}

    def add(self, reason: str) -> None:
        with self._lock:
            self._n[reason] = self._n.get(reason, 0) + 1

    def counts(self) -> Tuple[Tuple[str, int], ...]:
        """(reason, count) in REASONS order, only those not zero (what a reading keeps)."""
        with self._lock:
            return tuple((r, self._n[r]) for r in REASONS if self._n.get(r))


@contextmanager
def counting(ledger: Refusals) -> Iterator[Refusals]:
    """Files refused inside the block (in this thread) are counted in ``ledger``."""
    prev = getattr(_local, "ledger", None)
    _local.ledger = ledger
    try:
        yield ledger
    finally:
        _local.ledger = prev


def _refuse(path: str, reason: str, detail: str) -> FileRefused:
    ledger = getattr(_local, "ledger", None)
    if ledger is not None:
        ledger.add(reason)
        who = ledger.collector
    else:   # outside a collector's read (doctor, a process's files): logged, not exported
        name = threading.current_thread().name
        who = name[5:] if name.startswith("teye-") else name   # the sampler's threads are teye-<collector>
    _rlog.warning(f"{reason}:{path}", "%s: %s: %s (refused, not read; the values it holds are left out)",
                  who, path, detail)
    return FileRefused(path, reason, detail)


def refused_points(collector: str, counts: Tuple[Tuple[str, int], ...]) -> Iterator[Point]:
    for reason, n in counts:
        yield point(FILES_REFUSED, n, collector, reason)


def _open_regular(path: str) -> int:
    """An fd of ``path`` opened without blocking (O_NONBLOCK), closed and refused unless a regular file."""
    fd = os.open(path, _OPEN_FLAGS)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = next((w for test, w in _KINDS if test(mode)), "not a regular file")
            raise _refuse(path, NOT_REGULAR, f"{what}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


class Outside(Exception):
    """The file opened is not inside the directory it had to be in (a symbolic link leading out)."""


def read_bytes(path: str, limit: int = MAX_FILE_BYTES, within: str = None) -> bytes:
    """A whole file, at most ``limit`` bytes; FileRefused when it is not a regular file or is larger.
    Never blocks on a FIFO or device (O_NONBLOCK, then fstat).  Other OSErrors propagate.  With ``within``
    (a real path, no symbolic links in it), Outside unless the file opened lies in that directory tree: the
    check is of the open descriptor itself, so a link swapped after any earlier check changes nothing."""
    fd = _open_regular(path)
    try:
        if within is not None:
            real = os.readlink(f"/proc/self/fd/{fd}")
            if not real.startswith(within.rstrip(os.sep) + os.sep):
                raise Outside(path)
        chunks = []
        n = 0
        while True:
            b = os.read(fd, min(_CHUNK, limit + 1 - n))
            if not b:
                break
            chunks.append(b)
            n += len(b)
            if n > limit:
                raise _refuse(path, TOO_LARGE, f"larger than {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_head(path: str, size: int) -> str:
    """At most the first ``size`` bytes of a file as text (the first processor's block of /proc/cpuinfo, which
    on thousands of CPUs is larger than the bound): never blocks, not a regular file refused, never refused
    for its size."""
    fd = _open_regular(path)
    try:
        chunks = []
        n = 0
        while n < size:
            b = os.read(fd, min(_CHUNK, size - n))
            if not b:
                break
            chunks.append(b)
            n += len(b)
        return b"".join(chunks).decode("utf-8", "replace")
    finally:
        os.close(fd)


def read_text(path: str, allow_empty: bool = False, limit: int = MAX_FILE_BYTES) -> str:
    """A whole (bounded) file as text; an empty file is a ParseError unless allowed. OSError propagates
    (FileRefused included)."""
    text = read_bytes(path, limit).decode("utf-8", "replace")
    if not allow_empty and not text.strip():
        raise ParseError(path, "file is empty")
    return text


def read_or_none(path: str, limit: int = MAX_FILE_BYTES) -> Optional[str]:
    """The text, or None when the file cannot be read (absent, refused, ...)."""
    try:
        return read_bytes(path, limit).decode("utf-8", "replace")
    except OSError:
        return None


def under(root: str, *parts: str) -> str:
    """Join parts under root (parts are relative, e.g. 'net/dev')."""
    return os.path.join(root, *parts)


def read_value(path: str) -> str:
    """A one-line sysfs attribute, stripped."""
    return read_text(path).strip()
