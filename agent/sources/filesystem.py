"""Mounted filesystems: size, free and available space, inodes, read-only (node_exporter's ``filesystem``).

Mounts come from ``<procfs>/1/mountinfo`` (the host's mount namespace where the agent runs with the
host's /proc, as in the DaemonSet), else ``<procfs>/self/mountinfo``.  Pseudo filesystems (proc, sysfs,
cgroup, tmpfs under /run/credentials, overlay layers of container runtimes...) and mount points under
/dev, /proc, /sys and the container runtimes' storage are skipped, as node_exporter's defaults do.  Each
remaining mount point is ``statvfs``-ed under ``rootfs`` (``/`` unless the host's root is mounted
elsewhere, as node_exporter's ``--path.rootfs``).

In a container (``--path.rootfs=/host/root``) the mount table is the host's where the host's /proc is
mounted and its pid 1 readable (hostPID, or podman's ``-v /proc:/host/proc``): mount points are the
host's own.  Where only the container's own table is readable, the host's mounts appear under the
rootfs prefix: those are kept with the prefix taken off the ``mountpoint`` label (as node_exporter's
``rootfsStripPrefix``), and the container's own mounts beside them (``/etc/hosts``, ``/run/teye``) are
left out.  A mount point inside the rootfs seen again (the host's root bind-mounted onto ``/host/root``
itself, or the recursive copy ``rbind`` makes) is left out too.  Each mount point's fate is counted in
``teye_filesystem_mount_points{state}``.

Where ``rootfs`` is missing or empty (the container was started without ``-v /:/host/root``), the agent
does not see the host: ``teye_filesystem_rootfs_state{state="missing"|"empty"}`` is 1, no mount is
statted and none is exported (rather than a device error on every mount point), and ``teye doctor``
says so in one line.

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
import time
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
# what became of each mount point of the mount table (one series per state, 0 included)
EXPORTED, ERROR, STUCK, OVER_LIMIT, EXCLUDED, AUTOFS, ROOTFS_SELF, OUTSIDE_ROOTFS = (
    "exported", "device_error", "stuck", "over_limit", "excluded", "autofs", "rootfs_self", "outside_rootfs")
MOUNT_STATES = (EXPORTED, ERROR, STUCK, OVER_LIMIT, EXCLUDED, AUTOFS, ROOTFS_SELF, OUTSIDE_ROOTFS)
MOUNT_POINTS = metric(
    "teye_filesystem_mount_points", GAUGE,
    "Mount points of the mount table by what became of them at the last pass: exported (sizes read), "
    "device_error (statvfs failed), stuck (statvfs did not answer within %g s, or an earlier call has not "
    "returned: a network server gone), over_limit (past the first %d), excluded (pseudo filesystems and "
    "runtime mount points, node_exporter's default exclusions), autofs (automount points: never statted, "
    "which would trigger the mount), rootfs_self (the rootfs seen again inside itself: a bind mount of "
    "--path.rootfs onto itself), outside_rootfs (the container's own mounts beside the host's, when only the "
    "container's mount table is readable)." % (MOUNT_TIMEOUT_S, MAX_MOUNTS), ["state"])
ROOTFS_OK, ROOTFS_MISSING, ROOTFS_EMPTY = "host", "missing", "empty"
ROOTFS_STATES = (ROOTFS_OK, ROOTFS_MISSING, ROOTFS_EMPTY)
ROOTFS_STATE = metric(
    "teye_filesystem_rootfs_state", GAUGE,
    "1 for the state of --path.rootfs (rootfs): host (the host's root is seen there), missing (no such "
    "directory: in a container, the host's / is not mounted there) or empty (an empty directory: a mount "
    "namespace without the host's root); in the last two no mount point is statted or exported, and teye "
    "doctor says what to mount.", ["state"])


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
    rootfs_state: str = ROOTFS_OK
    states: Tuple[Tuple[str, int], ...] = ()      # (state, mount points), MOUNT_STATES order

    def points(self) -> Iterator[Point]:
        for state in ROOTFS_STATES:
            yield point(ROOTFS_STATE, 1 if state == self.rootfs_state else 0, state)
        for state, n in self.states:
            yield point(MOUNT_POINTS, n, state)
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
        # the prefix under which the host's mounts appear in a container's own mount table ("" for "/")
        self._prefix = os.path.normpath(rootfs).rstrip("/") if rootfs else ""
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
        return self._prefix + mountpoint if self._prefix else mountpoint

    def rootfs_state(self) -> str:
        """host, missing or empty: whether --path.rootfs shows a root filesystem at all."""
        if not self._prefix:
            return ROOTFS_OK
        try:
            with os.scandir(self.rootfs) as it:
                return ROOTFS_OK if next(it, None) is not None else ROOTFS_EMPTY
        except (FileNotFoundError, NotADirectoryError):
            return ROOTFS_MISSING

    def _start(self, mp: str) -> Optional[Tuple[threading.Thread, list]]:
        """statvfs of one mount point in a thread of its own; None while an earlier call is still stuck."""
        with self._lock:
            if mp in self._in_flight:  # still stuck in an earlier pass: do not pile up threads
                return None
        box: list = [None]

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
        return t, box

    def stuck(self) -> List[str]:
        """Mount points whose statvfs has not returned yet."""
        with self._lock:
            return sorted(self._in_flight)

    def _host_mounts(self, mounts: List[Mount], count: Dict[str, int]) -> List[Mount]:
        """The host's mount points, labelled as the host names them, each once (the last mount of a point is
        the visible one; mountinfo order kept)."""
        prefix = self._prefix
        under_prefix = bool(prefix) and any(m.mountpoint == prefix or m.mountpoint.startswith(prefix + "/")
                                            for m in mounts)
        last: Dict[str, Mount] = {}
        for m in mounts:
            mp = m.mountpoint
            if under_prefix:       # the container's own table: the host's mounts are those under the prefix
                if mp != prefix and not mp.startswith(prefix + "/"):
                    count[OUTSIDE_ROOTFS] += 1
                    continue
                mp = mp[len(prefix):] or "/"
                m = m._replace(mountpoint=mp)
            if prefix and (mp == prefix or mp.startswith(prefix + "/")):
                count[ROOTFS_SELF] += 1        # the rootfs inside itself: statting it would see the host twice
                continue
            if m.fstype == "autofs":
                count[AUTOFS] += 1
                continue
            if not wanted(m):
                count[EXCLUDED] += 1
                continue
            if mp in last:
                count[EXCLUDED] += 1           # mounted over: only the last one is seen
            last[mp] = m
        return list(last.values())

    def collect(self) -> FilesystemReading:
        count = dict.fromkeys(MOUNT_STATES, 0)
        state = self.rootfs_state()
        if state != ROOTFS_OK:
            return FilesystemReading((), 0, state, tuple(count.items()))
        path, text = self._mountinfo()
        mounts = self._host_mounts(parse_mountinfo(text, path), count)
        skipped = max(0, len(mounts) - MAX_MOUNTS)
        count[OVER_LIMIT] = skipped
        stats: Dict[str, Optional[FsStats]] = {}
        waiting = []
        # network mounts first, all at once, each in a thread of its own: one deadline for them all, so N dead
        # servers cost one timeout, not N
        network = set()
        for m in mounts[:MAX_MOUNTS]:
            if m.fstype in NETWORK_FSTYPES or m.fstype.startswith("fuse."):
                network.add(m.mountpoint)
                started = self._start(m.mountpoint)
                if started is None:
                    stats[m.mountpoint] = None
                    count[STUCK] += 1
                else:
                    waiting.append((m.mountpoint, started))
        for m in mounts[:MAX_MOUNTS]:
            if m.mountpoint in stats or m.mountpoint in network:
                continue
            try:
                stats[m.mountpoint] = _stats(self._statvfs(self._path(m.mountpoint)))
            except OSError:
                stats[m.mountpoint] = None
                count[ERROR] += 1
        deadline = time.monotonic() + self.timeout_s
        for mp, (t, box) in waiting:
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                stats[mp] = None
                count[STUCK] += 1
            else:
                stats[mp] = box[0]
                if box[0] is None:
                    count[ERROR] += 1
        out = tuple((m, stats[m.mountpoint]) for m in mounts[:MAX_MOUNTS])
        count[EXPORTED] = sum(1 for _, st in out if st is not None)
        return FilesystemReading(out, skipped, ROOTFS_OK, tuple(count.items()))


def from_config(cfg, ctx=None) -> FilesystemSource:
    return FilesystemSource(cfg["procfs"], cfg["rootfs"])
