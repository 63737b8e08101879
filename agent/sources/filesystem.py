"""Mounted filesystems: size, free and available space, inodes, read-only (node_exporter's ``filesystem``).

Mounts come from ``<procfs>/1/mountinfo`` (the host's mount namespace where the agent runs with the
host's /proc, as in the DaemonSet), else ``<procfs>/self/mountinfo``.  Pseudo filesystems (proc, sysfs,
cgroup, tmpfs under /run/credentials, overlay layers of container runtimes...) and mount points under
/dev, /proc, /sys and the container runtimes' storage are skipped, as node_exporter's defaults do.  Each
remaining mount point is ``statvfs``-ed under ``rootfs`` (``/`` unless the host's root is mounted
elsewhere, as node_exporter's ``--path.rootfs``).

A network filesystem whose server is gone can make ``statvfs`` hang for minutes.  Network mounts are
therefore statted in a thread of their own, waited for at most MOUNT_TIMEOUT_S: a mount that does not
answer is exported with ``teye_filesystem_device_error 1`` and no sizes, and is not statted again until
that call has returned (at most one call in flight per mount point), so a dead server costs one thread,
never the collector's pass, and never a scrape.  At most MAX_MOUNTS mount points are exported (in
mountinfo order); the rest are counted in ``teye_filesystem_mounts_skipped``.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple

from ..errors import ParseError
from ..metrics import GAUGE, Point, metric, point
from ._files import read_text, under

MOUNT_TIMEOUT_S = 5.0
MAX_MOUNTS = 1024
LABELS = ("device", "fstype", "mountpoint")

# node_exporter's --collector.filesystem.fs-types-exclude and mount-points-exclude defaults
IGNORED_FSTYPES = frozenset((
    "autofs", "binfmt_misc", "bpf", "cgroup", "cgroup2", "configfs", "debugfs", "devpts", "devtmpfs", "fusectl",
    "hugetlbfs", "iso9660", "mqueue", "nsfs", "overlay", "proc", "procfs", "pstore", "rpc_pipefs", "securityfs",
    "selinuxfs", "squashfs", "erofs", "sysfs", "tracefs", "rootfs", "efivarfs", "fuse.lxcfs", "ramfs"))
IGNORED_MOUNT_PREFIXES = ("/dev", "/proc", "/sys", "/run/credentials/", "/var/lib/docker/",
                          "/var/lib/containers/storage/", "/var/lib/kubelet/pods/", "/run/containerd/")
NETWORK_FSTYPES = frozenset(("nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "lustre", "glusterfs", "9p",
                             "afs", "beegfs", "gpfs", "fuse.sshfs", "fuse.glusterfs", "fuse.ceph"))

SIZE = metric("teye_filesystem_size_bytes", GAUGE, "Filesystem size in bytes (statvfs f_blocks × f_frsize; "
              "node_exporter's node_filesystem_size_bytes).", LABELS)
FREE = metric("teye_filesystem_free_bytes", GAUGE, "Free space in bytes, including the blocks reserved for root "
              "(statvfs f_bfree × f_frsize; node_filesystem_free_bytes).", LABELS)
AVAIL = metric("teye_filesystem_avail_bytes", GAUGE, "Space available to unprivileged users in bytes (statvfs "
               "f_bavail × f_frsize; node_filesystem_avail_bytes): what a job can still write.", LABELS)
FILES = metric("teye_filesystem_files", GAUGE, "Inodes in the filesystem (statvfs f_files; "
               "node_filesystem_files).", LABELS)
FILES_FREE = metric("teye_filesystem_files_free", GAUGE, "Free inodes (statvfs f_ffree; "
                    "node_filesystem_files_free).", LABELS)
READONLY = metric("teye_filesystem_readonly", GAUGE, "1 when the filesystem is mounted read-only (statvfs "
                  "ST_RDONLY, e.g. remounted after an I/O error; node_filesystem_readonly).", LABELS)
DEVICE_ERROR = metric("teye_filesystem_device_error", GAUGE,
                      "1 when statvfs failed or did not answer within %g s (a network filesystem whose server "
                      "is gone); its sizes are then absent (node_filesystem_device_error)." % MOUNT_TIMEOUT_S,
                      LABELS)
SKIPPED = metric("teye_filesystem_mounts_skipped", GAUGE,
                 "Mount points past the first %d that are not exported (a bound on series)." % MAX_MOUNTS)


class Mount(NamedTuple):
    device: str
    mountpoint: str
    fstype: str
    options: str


class FsStats(NamedTuple):
    size: int
    free: int
    avail: int
    files: int
    files_free: int
    readonly: bool


def _unescape(s: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo octal."""
    if "\\" not in s:
        return s
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 4 <= len(s) and all(c in "01234567" for c in s[i + 1:i + 4]):
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str, path: str = "mountinfo") -> List[Mount]:
    """Every mount of a mountinfo file (proc(5)): ``id parent maj:min root mountpoint opts [tags] - fstype dev sopts``.
    A line without the ``-`` separator or its three fields is a ParseError naming the line."""
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        try:
            sep = fields.index("-", 6)
        except ValueError:
            raise ParseError(path, f"line {lineno}: no ' - ' separator (truncated?): {line[:120]!r}") from None
        if len(fields) < sep + 3 or len(fields) < 6:
            raise ParseError(path, f"line {lineno}: expected 'fstype source options' after ' - ': {line[:120]!r}")
        out.append(Mount(_unescape(fields[sep + 2]), _unescape(fields[4]), fields[sep + 1], fields[5]))
    if not out:
        raise ParseError(path, "no mounts (empty file)")
    return out


def wanted(m: Mount) -> bool:
    if m.fstype in IGNORED_FSTYPES:
        return False
    mp = m.mountpoint
    return not any(mp == p.rstrip("/") or mp.startswith(p if p.endswith("/") else p + "/")
                   for p in IGNORED_MOUNT_PREFIXES)


@dataclass(frozen=True)
class FilesystemReading:
    # (mount, stats or None when statvfs failed or hangs)
    mounts: Tuple[Tuple[Mount, Optional[FsStats]], ...]
    skipped: int

    def points(self) -> Iterator[Point]:
        for m, st in self.mounts:
            labels = (m.device, m.fstype, m.mountpoint)
            yield point(DEVICE_ERROR, 0 if st is not None else 1, *labels)
            if st is None:
                continue
            yield point(SIZE, st.size, *labels)
            yield point(FREE, st.free, *labels)
            yield point(AVAIL, st.avail, *labels)
            yield point(FILES, st.files, *labels)
            yield point(FILES_FREE, st.files_free, *labels)
            yield point(READONLY, 1 if st.readonly else 0, *labels)
        yield point(SKIPPED, self.skipped)


def _stats(v) -> FsStats:
    frsize = v.f_frsize or v.f_bsize
    return FsStats(v.f_blocks * frsize, v.f_bfree * frsize, v.f_bavail * frsize, v.f_files, v.f_ffree,
                   bool(v.f_flag & os.ST_RDONLY))


class FilesystemSource:
    name = "filesystem"

    def __init__(self, procfs: str = "/proc", rootfs: str = "/", statvfs: Callable = os.statvfs,
                 timeout_s: float = MOUNT_TIMEOUT_S):
        self.procfs = procfs
        self.rootfs = rootfs
        self._statvfs = statvfs  # the one door to the syscall (tests hand a fake)
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._in_flight: Dict[str, threading.Thread] = {}  # mount point -> the call that has not returned

    def _mountinfo(self) -> Tuple[str, str]:
        for who in ("1", "self"):
            path = under(self.procfs, who, "mountinfo")
            try:
                return path, read_text(path)
            except FileNotFoundError:
                continue
        raise FileNotFoundError(f"{under(self.procfs, '1', 'mountinfo')} and self/mountinfo: no such file")

    def _path(self, mountpoint: str) -> str:
        return os.path.join(self.rootfs, mountpoint.lstrip("/")) if self.rootfs != "/" else mountpoint

    def _stat_in_thread(self, mp: str) -> Optional[FsStats]:
        with self._lock:
            if mp in self._in_flight:  # still stuck in an earlier pass: do not pile up threads
                return None
        box: List[Optional[FsStats]] = [None]

        def call():
            try:
                box[0] = _stats(self._statvfs(self._path(mp)))
            except OSError:
                pass
            finally:
                with self._lock:
                    self._in_flight.pop(mp, None)

        t = threading.Thread(target=call, name="teye-statvfs", daemon=True)
        with self._lock:
            self._in_flight[mp] = t
        t.start()
        t.join(self.timeout_s)
        return box[0] if not t.is_alive() else None

    def stuck(self) -> List[str]:
        """Mount points whose statvfs has not returned yet."""
        with self._lock:
            return sorted(self._in_flight)

    def collect(self) -> FilesystemReading:
        path, text = self._mountinfo()
        # a mount point mounted over more than once: the last mount is the visible one (dict order is the
        # first occurrence's, so mountinfo order is kept)
        last: Dict[str, Mount] = {}
        for m in parse_mountinfo(text, path):
            if wanted(m):
                last[m.mountpoint] = m
        mounts = list(last.values())
        skipped = max(0, len(mounts) - MAX_MOUNTS)
        out = []
        for m in mounts[:MAX_MOUNTS]:
            if m.fstype in NETWORK_FSTYPES or m.fstype.startswith("fuse."):
                st = self._stat_in_thread(m.mountpoint)
            else:
                try:
                    st = _stats(self._statvfs(self._path(m.mountpoint)))
                except OSError:
                    st = None
            out.append((m, st))
        return FilesystemReading(tuple(out), skipped)


def from_config(cfg, ctx=None) -> FilesystemSource:
    return FilesystemSource(cfg["procfs"], cfg["rootfs"])
