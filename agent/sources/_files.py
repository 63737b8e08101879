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
from typing import Dict, Iterator, Optional, Set, Tuple

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
    return _open_regular_st(path)[0]


def _open_regular_st(path: str) -> Tuple[int, os.stat_result]:
    """:func:`_open_regular`, with the file's fstat."""
    fd = os.open(path, _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            what = next((w for test, w in _KINDS if test(st.st_mode)), "not a regular file")
            raise _refuse(path, NOT_REGULAR, f"{what}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _read_fd(fd: int, path: str, limit: int, again: bool = False) -> bytes:
    """The rest of the file from the fd's offset (``again``: the whole file from offset 0, with pread, the fd's
    offset neither used nor moved), at most ``limit`` bytes, else FileRefused."""
    chunks = []
    n = 0
    while True:
        b = os.pread(fd, min(_CHUNK, limit + 1 - n), n) if again else os.read(fd, min(_CHUNK, limit + 1 - n))
        if not b:
            break
        chunks.append(b)
        n += len(b)
        if n > limit:
            raise _refuse(path, TOO_LARGE, f"larger than {limit} bytes")
    return b"".join(chunks)


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
        return _read_fd(fd, path, limit)
    finally:
        os.close(fd)


class KeptFilesSource:
    """A source that reads its kernel files through :class:`KeptFiles` (``self._files``): how many descriptors
    those reads keep open at most (``KEPT``, opened by its first read; the HTTP server keeps them out of its
    connection budget), and their closing."""

    KEPT = 1

    def fds_wanted(self) -> int:
        return self.KEPT

    def close(self) -> None:
        self._files.close()


class KeptFiles:
    """One source's kernel pseudo-files kept open between its reads (issue 49: an idle agent's reads of small
    /proc files were mostly their open, fstat and close, and the path's lookup).

    A file that reports size 0 when opened (procfs's and /proc/sys's files: the kernel makes their text at each
    read from offset 0, a seq_file starting again) keeps its fd, read again whole from offset 0 with ``pread``
    at the next read; any other file (sysfs attributes report 4096, a fixture tree's files their size) is read
    and closed as :func:`read_text` does.  Before each read of a kept fd, ``fstat``: a file that now has a size
    or no link (a regular file written, or replaced by a rename: a test's or a bind mount's, not the kernel's)
    is closed and opened again by its path, and so is one whose read fails (the error, if any, is then the
    path's own: a file gone is FileNotFoundError as before; a path whose kept fd could not be read again is
    never kept again).  Refusals are the same as :func:`read_bytes`'s:
    a FIFO or device is never kept (refused at open), a file over the bound is refused at each read."""

    def __init__(self):
        self._fds: Dict[str, int] = {}
        self._unkept: Set[str] = set()   # a kept fd's pread failed (not seekable?): read and closed from then on
        self._lock = threading.Lock()    # a read through the sampler and one asked for directly (teye profile)

    def read_bytes(self, path: str, limit: int = MAX_FILE_BYTES) -> bytes:
        with self._lock:
            fd = self._fds.get(path)
            if fd is not None:
                st = os.fstat(fd)
                if st.st_size == 0 and st.st_nlink:
                    try:
                        return _read_fd(fd, path, limit, again=True)
                    except FileRefused:
                        raise
                    except OSError:
                        self._unkept.add(path)
                del self._fds[path]
                os.close(fd)
            fd, st = _open_regular_st(path)
            try:
                data = _read_fd(fd, path, limit)
            except BaseException:
                os.close(fd)
                raise
            if st.st_size == 0 and path not in self._unkept:
                self._fds[path] = fd
            else:
                os.close(fd)
            return data

    def read_text(self, path: str, allow_empty: bool = False, limit: int = MAX_FILE_BYTES) -> str:
        """:func:`read_text`'s answer and errors, the file kept open when it is the kernel's."""
        text = self.read_bytes(path, limit).decode("utf-8", "replace")
        if not allow_empty and not text.strip():
            raise ParseError(path, "file is empty")
        return text

    @property
    def kept(self) -> Tuple[str, ...]:
        """The paths whose fd is kept open."""
        with self._lock:
            return tuple(self._fds)

    def close(self) -> None:
        with self._lock:
            fds, self._fds = list(self._fds.values()), {}
        for fd in fds:
            os.close(fd)

    def __del__(self):
        try:
            self.close()
        except (OSError, AttributeError):
            pass


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
