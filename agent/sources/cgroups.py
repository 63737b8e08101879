"""What each job on the node uses, from its cgroup: Slurm jobs and Kubernetes pods (the ``jobs`` collector).

Where the schedulers put a job (paths relative to the cgroup root, ``--cgroupfs``, default
/sys/fs/cgroup; on cgroup v1 the same relative path under each controller's hierarchy):

- Slurm, cgroup v1 (``proctrack/cgroup``, ``task/cgroup``): ``slurm/uid_<uid>/job_<id>`` under
  ``cpuacct``, ``memory``, ``blkio``, ``cpuset`` (``slurm_<node>/...`` on a multiple-slurmd node);
- Slurm, cgroup v2 (``cgroup/v2`` plugin, 22.05+): ``system.slice/slurmstepd.scope/job_<id>``;
  the older ``slurm/uid_<uid>/job_<id>`` layout is read too;
- Kubernetes: the kubelet's ``kubepods`` tree, one cgroup per pod in its QoS class: with the
  cgroupfs driver ``kubepods/pod<uid>`` (guaranteed), ``kubepods/burstable/pod<uid>``,
  ``kubepods/besteffort/pod<uid>``; with the systemd driver ``kubepods.slice/kubepods-pod<uid>.slice``,
  ``kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`` (``-`` in the uid
  written ``_``).  Namespace and pod name come from the kubelet's log directory
  (``/var/log/pods/<namespace>_<name>_<uid>``, ``jobs.pod_log_dir``) where it is mounted.

What is read (every file hierarchical: a job's steps and containers are included):

============  ==========================================  =============================================
              cgroup v1                                   cgroup v2
============  ==========================================  =============================================
CPU time      cpuacct.usage (exact), split as             cpu.stat user_usec / system_usec
              cpuacct.usage_user : usage_sys (else
              cpuacct.stat); without usage, the split
              counters themselves
CPUs          cpuset.cpus; cpu.cfs_quota_us / period      cpuset.cpus.effective; cpu.max
memory        memory.usage_in_bytes, max_usage_in_bytes,  memory.current, memory.peak (5.19+), memory.max,
              limit_in_bytes, memory.stat total_cache /   memory.stat file / anon
              total_rss
I/O           blkio.throttle.io_service_bytes_recursive   io.stat rbytes / wbytes
              (Read / Write, summed over devices)
pressure      (none)                                      cpu.pressure, memory.pressure, io.pressure
============  ==========================================  =============================================

A value whose file is absent (controller not enabled for the job, kernel too old) is absent from the
export, never zero.  Memory peak without a peak file is the largest value this agent saw.  A job whose
cgroup disappears while it is read (it ended) is left out of that reading; a file that cannot be
read or parsed leaves that value out and logs one rate-limited line; a FIFO, device or oversized file
in a cgroup file's place is refused without blocking (agent/sources/_files.py), named once and counted
in ``teye_files_refused_total{collector="jobs"}``.  A job directory is a job only when its whole name is
``job_`` and 1 to 18 ASCII digits (others are counted as ``bad_name`` and named).  Only a missing
cgroup tree makes the collector down.
"""
from __future__ import annotations

import errno
import logging
import os
import re
from dataclasses import dataclass, field, replace
from typing import Dict, FrozenSet, Iterator, List, Optional, Tuple

from ..errors import ParseError, SourceUnavailable, parse_int
from ..logutil import RateLimitedLog
from ..metrics import COUNTER, GAUGE, Point, metric, point
from ._files import MAX_FILE_BYTES, FileRefused, Refusals, counting, read_bytes, read_or_none, refused_points
from .pressure import parse_psi

log = logging.getLogger("teye.sources.cgroups")

SLURM, POD = "slurm", "pod"
QOS = ("guaranteed", "burstable", "besteffort")
PSI_RESOURCES = ("cpu", "memory", "io")
V1_CONTROLLERS = {  # what teye reads -> the directory names a v1 controller is mounted under
    "cpuacct": ("cpuacct", "cpu,cpuacct", "cpuacct,cpu"),
    "cpu": ("cpu", "cpu,cpuacct", "cpuacct,cpu"),
    "cpuset": ("cpuset",),
    "memory": ("memory",),
    "blkio": ("blkio",),
}
UNLIMITED = 1 << 62   # v1 prints 9223372036854771712 (PAGE_COUNTER_MAX pages) for "no limit"
USER_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# Names are matched whole (fullmatch: ``$`` would accept a trailing newline, ``job_4444\n`` read as job 4444)
# and a job id is ASCII digits only (str.isdigit() and int() accept '²' or '٤', int() a newline).
MAX_BAD_NAMED = 10   # bad job directory names named (log, doctor) per read; all are counted
_JOB_DIR = re.compile(r"job_(.*)", re.DOTALL)
_JOB_ID = re.compile(r"[0-9]{1,18}")
_PID = re.compile(r"[0-9]{1,10}")
_UID_DIR = re.compile(r"uid_[0-9]+")
_POD_FS = re.compile(r"pod([0-9a-fA-F-]{36})")
_POD_SD = re.compile(r"kubepods(?:-(burstable|besteffort))?-pod([0-9a-fA-F_]{36})\.slice")


def _families(prefix: str, what: str, idl: str):
    """The family set of one kind of job (Slurm jobs, pods): same meaning, own id label."""
    L = [idl]
    return {
        "cpu": metric(f"{prefix}_cpu_seconds_total", COUNTER,
                      f"CPU seconds used by the {what}'s processes, by mode (user, system), from its cgroup: "
                      "v2 cpu.stat user_usec/system_usec; v1 the exact cpuacct.usage split in the proportion of "
                      "cpuacct.usage_user:usage_sys (tick-based), each mode monotonic, as getrusage does.",
                      L + ["mode"]),
        "cpus": metric(f"{prefix}_cpus", GAUGE,
                       f"CPUs the {what} may use: the smaller of its cpuset's size and its CPU quota "
                       "(quota/period); absent when neither limits it.", L),
        "mem": metric(f"{prefix}_memory_used_bytes", GAUGE,
                      f"Memory charged to the {what}'s cgroup now, page cache included (v1 memory.usage_in_bytes, "
                      "v2 memory.current).", L),
        "peak": metric(f"{prefix}_memory_peak_bytes", GAUGE,
                       f"Highest memory charged to the {what}'s cgroup (v1 memory.max_usage_in_bytes, v2 "
                       "memory.peak; without them, the largest value this agent saw).", L),
        "limit": metric(f"{prefix}_memory_limit_bytes", GAUGE,
                        f"Memory limit of the {what}'s cgroup (v1 memory.limit_in_bytes, v2 memory.max); absent "
                        "when unlimited.", L),
        "cache": metric(f"{prefix}_memory_cache_bytes", GAUGE,
                        f"Page cache charged to the {what} (v1 memory.stat total_cache, v2 memory.stat file).", L),
        "anon": metric(f"{prefix}_memory_anon_bytes", GAUGE,
                       f"Anonymous memory of the {what}: heap, stacks (v1 memory.stat total_rss, v2 memory.stat "
                       "anon).", L),
        "read": metric(f"{prefix}_read_bytes_total", COUNTER,
                       f"Bytes the {what} read from block devices (v1 blkio.throttle.io_service_bytes_recursive "
                       "Read, v2 io.stat rbytes; summed over devices).", L),
        "written": metric(f"{prefix}_written_bytes_total", COUNTER,
                          f"Bytes the {what} wrote to block devices (v1 blkio.throttle.io_service_bytes_recursive "
                          "Write, v2 io.stat wbytes; summed over devices).", L),
        "psi": metric(f"{prefix}_pressure_stalled_seconds_total", COUNTER,
                      f"Seconds in which some (kind=some) or all (kind=full) of the {what}'s tasks were stalled on "
                      "the resource (cgroup v2 cpu.pressure, memory.pressure, io.pressure total=).",
                      L + ["resource", "kind"]),
    }


FAMILIES = {SLURM: _families("teye_slurm_job", "Slurm job", "slurm_job"),
            POD: _families("teye_pod", "pod", "pod_uid")}
POD_INFO = metric("teye_pod_info", GAUGE, "Always 1 per Kubernetes pod with a cgroup on the node: its QoS class, "
                  "and its namespace and name where the kubelet's log directory shows them ('' otherwise).",
                  ["pod_uid", "namespace", "pod", "qos"])
CGROUP_DIRS = metric("teye_jobs_cgroups", GAUGE,
                     "Job cgroups found by the jobs collector at its last read, by state: read; empty (a job "
                     "directory with no cgroup files or no process, left behind); bad_name (job_<not a number>); "
                     "vanished (the job ended while it was read); over_limit (beyond jobs.max_jobs).", ["state"])
STATES = ("read", "empty", "bad_name", "vanished", "over_limit")


@dataclass(frozen=True)
class Job:
    """One job cgroup: its kind, id, QoS class (pods) and path relative to the hierarchy root."""

    kind: str
    id: str
    rel: str
    qos: str = ""


@dataclass(frozen=True)
class JobUsage:
    job: Job
    cpu_user_s: Optional[float] = None
    cpu_system_s: Optional[float] = None
    cpu_total_s: Optional[float] = None      # v1 cpuacct.usage: exact; user/system above are then only its split
    cpus: Optional[float] = None
    mem_bytes: Optional[int] = None
    mem_peak_bytes: Optional[int] = None
    mem_limit_bytes: Optional[int] = None
    cache_bytes: Optional[int] = None
    anon_bytes: Optional[int] = None
    read_bytes: Optional[int] = None
    written_bytes: Optional[int] = None
    psi: Tuple[Tuple[str, str, float], ...] = ()     # (resource, kind, stalled seconds)
    missing: FrozenSet[str] = frozenset()             # files absent (controller not enabled)


@dataclass(frozen=True)
class Layout:
    """What the cgroup root holds: version ('v1', 'v2', 'hybrid'), v1 controller dirs, and notes for doctor."""

    version: str
    roots: Tuple[Tuple[str, str], ...]   # controller -> absolute hierarchy dir (v2: every controller -> root)
    notes: Tuple[str, ...] = ()

    def root(self, controller: str) -> Optional[str]:
        return dict(self.roots).get(controller)


@dataclass(frozen=True)
class JobsReading:
    layout: Layout
    jobs: Tuple[JobUsage, ...]
    pod_names: Dict[str, Tuple[str, str]] = field(default_factory=dict)   # pod uid -> (namespace, name)
    counts: Dict[str, int] = field(default_factory=dict)                  # STATES -> count
    skipped: Tuple[str, ...] = ()                                         # why some job dirs were not read
    refused: Tuple[Tuple[str, int], ...] = ()                             # files refused so far, by reason

    def points(self) -> Iterator[Point]:
        for u in self.jobs:
            F, jid = FAMILIES[u.job.kind], u.job.id
            yield point(F["cpu"], u.cpu_user_s, jid, "user")
            yield point(F["cpu"], u.cpu_system_s, jid, "system")
            yield point(F["cpus"], u.cpus, jid)
            yield point(F["mem"], u.mem_bytes, jid)
            yield point(F["peak"], u.mem_peak_bytes, jid)
            yield point(F["limit"], u.mem_limit_bytes, jid)
            yield point(F["cache"], u.cache_bytes, jid)
            yield point(F["anon"], u.anon_bytes, jid)
            yield point(F["read"], u.read_bytes, jid)
            yield point(F["written"], u.written_bytes, jid)
            for res, kind, secs in u.psi:
                yield point(F["psi"], secs, jid, res, kind)
            if u.job.kind == POD:
                ns, name = self.pod_names.get(jid, ("", ""))
                yield point(POD_INFO, 1.0, jid, ns, name, u.job.qos)
        for st in STATES:
            yield point(CGROUP_DIRS, self.counts.get(st, 0), st)
        yield from refused_points("jobs", self.refused)


# ----------------------------------------------------------------------------- layout and discovery

def detect_layout(cgroupfs: str) -> Layout:
    """Which cgroup version is mounted at ``cgroupfs``; SourceUnavailable when none is."""
    if not os.path.isdir(cgroupfs):
        raise SourceUnavailable(f"{cgroupfs}: no such directory (no cgroup tree mounted; in a container, mount "
                                f"the host's /sys/fs/cgroup and pass --cgroupfs)")
    if os.path.exists(os.path.join(cgroupfs, "cgroup.controllers")):
        ctrl = _read_or_none(os.path.join(cgroupfs, "cgroup.controllers")) or ""
        return Layout("v2", tuple((c, cgroupfs) for c in V1_CONTROLLERS),
                      (f"cgroup v2 (unified) at {cgroupfs}; controllers: {ctrl.strip() or 'none listed'}",))
    roots, notes = [], []
    for what, names in V1_CONTROLLERS.items():
        for n in names:
            d = os.path.join(cgroupfs, n)
            if os.path.isdir(d) and _has_files(d):
                roots.append((what, d))
                break
        else:
            notes.append(f"v1 controller {what} not mounted under {cgroupfs}: its figures are absent")
    if not roots:
        raise SourceUnavailable(f"{cgroupfs}: neither cgroup v2 (no cgroup.controllers) nor a v1 controller "
                                f"(cpuacct, memory, blkio) is mounted there")
    unified = os.path.join(cgroupfs, "unified")
    version = "hybrid" if os.path.exists(os.path.join(unified, "cgroup.controllers")) else "v1"
    head = f"cgroup {version} at {cgroupfs}: " + ", ".join(f"{w} in {os.path.basename(d)}" for w, d in roots)
    if version == "hybrid":
        head += f"; the v2 hierarchy at {unified} holds no resource controller here and is not read"
    return Layout(version, tuple(roots), (head, *notes))


def _has_files(d: str) -> bool:
    try:
        with os.scandir(d) as it:
            return any(e.is_file() for e in it)
    except OSError:
        return False


def _subdirs(d: str) -> List[str]:
    try:
        with os.scandir(d) as it:
            return [e.name for e in it if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def discover(hierarchy: str) -> Tuple[List[Job], List[str], int]:
    """Job cgroups under one hierarchy root: (jobs, bad-name notes, bad-name count)."""
    jobs: List[Job] = []
    bad: List[str] = []
    nbad = 0
    slurm_parents = [os.path.join("system.slice", "slurmstepd.scope")]
    for top in _subdirs(hierarchy):
        if top == "slurm" or top.startswith("slurm_"):
            slurm_parents += [os.path.join(top, u) for u in _subdirs(os.path.join(hierarchy, top))
                              if _UID_DIR.fullmatch(u)]
    for parent in slurm_parents:
        for name in _subdirs(os.path.join(hierarchy, parent)):
            m = _JOB_DIR.fullmatch(name)
            if not m:
                continue
            if not _JOB_ID.fullmatch(m.group(1)):
                nbad += 1
                if len(bad) < MAX_BAD_NAMED:
                    bad.append(f"{os.path.join(parent, name)!r}: job id {m.group(1)[:40]!r} is not a number "
                               f"(ASCII digits, at most 18)")
                continue
            jobs.append(Job(SLURM, str(int(m.group(1))), os.path.join(parent, name)))
    # Kubernetes, cgroupfs driver
    kp = os.path.join(hierarchy, "kubepods")
    for qos, sub in (("guaranteed", ""), ("burstable", "burstable"), ("besteffort", "besteffort")):
        for name in _subdirs(os.path.join(kp, sub)):
            m = _POD_FS.fullmatch(name)
            if m:
                jobs.append(Job(POD, m.group(1).lower(), os.path.join("kubepods", sub, name), qos))
    # Kubernetes, systemd driver
    ks = "kubepods.slice"
    for sub in ("", "kubepods-burstable.slice", "kubepods-besteffort.slice"):
        for name in _subdirs(os.path.join(hierarchy, ks, sub)):
            m = _POD_SD.fullmatch(name)
            if m:
                jobs.append(Job(POD, m.group(2).replace("_", "-").lower(), os.path.join(ks, sub, name),
                                m.group(1) or "guaranteed"))
    return jobs, bad, nbad


def pod_names(log_dir: Optional[str]) -> Dict[str, Tuple[str, str]]:
    """uid -> (namespace, name) from the kubelet's /var/log/pods/<namespace>_<name>_<uid> directories."""
    out: Dict[str, Tuple[str, str]] = {}
    if not log_dir:
        return out
    for d in _subdirs(log_dir):
        parts = d.rsplit("_", 1)
        if len(parts) == 2 and "_" in parts[0]:
            ns, _, name = parts[0].partition("_")
            out[parts[1].lower()] = (ns, name)
    return out


# ----------------------------------------------------------------------------- parsing

def _read_or_none(path: str) -> Optional[str]:
    return read_or_none(path)


def parse_flat_keyed(text: str, path: str) -> Dict[str, int]:
    """``key value`` lines (cpu.stat, memory.stat, cpuacct.stat)."""
    out = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        f = line.split()
        if not f:
            continue
        if len(f) != 2:
            raise ParseError(path, f"line {lineno}: expected 'key value', got {line!r}")
        out[f[0]] = parse_int(f[1], path, f"line {lineno} {f[0]}")
    return out


def cpu_set(text: str, path: str) -> FrozenSet[int]:
    """The CPUs of a kernel CPU list such as ``0-3,8,10-11`` (a cpuset, a process's Cpus_allowed_list)."""
    cpus = set()
    for part in text.strip().split(","):
        if not part:
            continue
        a, sep, b = part.partition("-")
        lo = parse_int(a, path, "cpu list")
        hi = parse_int(b, path, "cpu list") if sep else lo
        if hi < lo or lo < 0 or hi - lo > 65535:
            raise ParseError(path, f"bad cpu range {part!r}")
        cpus.update(range(lo, hi + 1))
    return frozenset(cpus)


def parse_cpulist(text: str, path: str) -> int:
    """Number of CPUs in a cpuset list such as ``0-3,8,10-11``."""
    return len(cpu_set(text, path))


def parse_io_stat(text: str, path: str) -> Tuple[int, int]:
    """(read, written) bytes summed over devices from a v2 io.stat."""
    r = w = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        f = line.split()
        if not f:
            continue
        for item in f[1:]:
            k, sep, v = item.partition("=")
            if not sep:
                raise ParseError(path, f"line {lineno}: expected key=value, got {item!r}")
            if k == "rbytes":
                r += parse_int(v, path, f"line {lineno} rbytes")
            elif k == "wbytes":
                w += parse_int(v, path, f"line {lineno} wbytes")
    return r, w


def parse_blkio(text: str, path: str) -> Tuple[int, int]:
    """(read, written) bytes summed over devices from a v1 blkio ``*io_service_bytes*`` file."""
    r = w = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        f = line.split()
        if len(f) != 3:
            continue   # the "Total N" line
        if f[1] == "Read":
            r += parse_int(f[2], path, f"line {lineno} Read")
        elif f[1] == "Write":
            w += parse_int(f[2], path, f"line {lineno} Write")
    return r, w


class _Vanished(Exception):
    """The job's cgroup disappeared while it was read."""


class _JobReader:
    """Reads one job's files; remembers absent files (for doctor) and logs unreadable ones once."""

    def __init__(self, job_dir: str, rlog: RateLimitedLog):
        self.dir = job_dir    # the job's directory in its first hierarchy: gone means the job ended
        self.rlog = rlog
        self.missing: List[str] = []
        self.refused: List[str] = []

    def text(self, base: Optional[str], name: str) -> Optional[str]:
        if base is None:
            return None
        path = os.path.join(base, name)
        try:
            return read_bytes(path).decode("utf-8", "replace")
        except FileRefused:   # a FIFO or device in its place, or far too large: counted and named once
            self.refused.append(name)
        except FileNotFoundError:
            if not os.path.isdir(self.dir):
                raise _Vanished() from None
            self.missing.append(name)   # the controller is not enabled for the job (or the kernel lacks it)
        except OSError as e:
            if e.errno in (errno.ENODEV, errno.ESRCH) and not os.path.isdir(self.dir):
                raise _Vanished() from None
            self.rlog.warning(f"read:{name}:{e.errno}", "jobs: cannot read %s: %s (value left out)", path,
                              e.strerror or e)
        return None

    def first(self, base, names, parse):
        """The first of several alternative files that exists; only the preferred one is named as missing."""
        before = len(self.missing)
        for name in names:
            v = self.parsed(base, name, parse)
            if v is not None:
                del self.missing[before:]
                return v
        del self.missing[before + 1:]
        return None

    def parsed(self, base, name, parse):
        text = self.text(base, name)
        if text is None:
            return None
        try:
            return parse(text, os.path.join(base, name))
        except ParseError as e:
            self.rlog.warning(f"parse:{name}", "jobs: %s (value left out)", e)
            return None


def _int_file(text: str, path: str) -> int:
    v = text.strip()
    return parse_int(v, path, "value")


def _max_file(text: str, path: str) -> Optional[int]:
    v = text.strip()
    return None if v == "max" else parse_int(v, path, "value")


def _cpu_max(text: str, path: str) -> Optional[float]:
    f = text.split()
    if len(f) != 2:
        raise ParseError(path, f"expected 'QUOTA PERIOD', got {text.strip()!r}")
    if f[0] == "max":
        return None
    q, p = parse_int(f[0], path, "quota"), parse_int(f[1], path, "period")
    return q / p if p > 0 else None


def read_job(job: Job, layout: Layout, rlog: RateLimitedLog) -> JobUsage:
    """One job's usage; raises _Vanished when its cgroup is gone."""
    d = lambda c: os.path.join(layout.root(c), job.rel) if layout.root(c) else None  # noqa: E731
    rd = _JobReader(d("cpuacct") or d("memory") or d("cpu") or d("blkio"), rlog)
    u: Dict[str, object] = {}
    psi = []
    if layout.version == "v2":
        base = d("cpu")
        st = rd.parsed(base, "cpu.stat", parse_flat_keyed) or {}
        if "user_usec" in st:
            u["cpu_user_s"], u["cpu_system_s"] = st["user_usec"] / 1e6, st.get("system_usec", 0) / 1e6
        cpus = [x for x in (rd.parsed(base, "cpuset.cpus.effective", parse_cpulist),
                            rd.parsed(base, "cpu.max", _cpu_max)) if x]
        mem = rd.parsed(base, "memory.current", _int_file)
        peak = rd.parsed(base, "memory.peak", _int_file)
        limit = rd.parsed(base, "memory.max", _max_file)
        ms = rd.parsed(base, "memory.stat", parse_flat_keyed) or {}
        u["cache_bytes"], u["anon_bytes"] = ms.get("file"), ms.get("anon")
        io = rd.parsed(base, "io.stat", parse_io_stat)
        for res in PSI_RESOURCES:
            lines = rd.parsed(base, f"{res}.pressure", parse_psi) or {}
            psi += [(res, k, ln.total_seconds) for k, ln in sorted(lines.items())]
    else:
        acct = d("cpuacct")
        # cpuacct.usage is the exact CPU time (ns, from the scheduler); usage_user/usage_sys (4.15+) and
        # cpuacct.stat only say how it splits: recent kernels fill them from timer ticks, which can be far off
        # (a quarter of the truth seen on a 6.18 VM under load).  The split is applied in JobsSource.
        total = rd.parsed(acct, "cpuacct.usage", _int_file)
        if total is not None:
            u["cpu_total_s"] = total / 1e9
        usr = rd.first(acct, ("cpuacct.usage_user",), _int_file)
        sys_ = rd.parsed(acct, "cpuacct.usage_sys", _int_file) if usr is not None else None
        if usr is not None and sys_ is not None:
            u["cpu_user_s"], u["cpu_system_s"] = usr / 1e9, sys_ / 1e9
        else:
            st = rd.first(acct, ("cpuacct.stat",), parse_flat_keyed) or {}
            if st:
                rd.missing = [m for m in rd.missing if m != "cpuacct.usage_user"]   # older kernel: ticks
            if "user" in st:
                u["cpu_user_s"], u["cpu_system_s"] = st["user"] / USER_HZ, st.get("system", 0) / USER_HZ
        quota = rd.parsed(d("cpu"), "cpu.cfs_quota_us", _int_file)
        period = rd.parsed(d("cpu"), "cpu.cfs_period_us", _int_file) if quota and quota > 0 else None
        cpus = [x for x in (rd.parsed(d("cpuset"), "cpuset.cpus", parse_cpulist),
                            quota / period if quota and quota > 0 and period else None) if x]
        mbase = d("memory")
        mem = rd.parsed(mbase, "memory.usage_in_bytes", _int_file)
        peak = rd.parsed(mbase, "memory.max_usage_in_bytes", _int_file)
        limit = rd.parsed(mbase, "memory.limit_in_bytes", _int_file)
        limit = None if limit is not None and limit >= UNLIMITED else limit
        ms = rd.parsed(mbase, "memory.stat", parse_flat_keyed) or {}
        u["cache_bytes"], u["anon_bytes"] = ms.get("total_cache"), ms.get("total_rss")
        io = rd.first(d("blkio"), ("blkio.throttle.io_service_bytes_recursive", "blkio.io_service_bytes_recursive",
                                   "blkio.throttle.io_service_bytes"), parse_blkio)
    if io is not None:
        u["read_bytes"], u["written_bytes"] = io
    return JobUsage(job, cpus=min(cpus) if cpus else None, mem_bytes=mem, mem_peak_bytes=peak,
                    mem_limit_bytes=limit, psi=tuple(psi), missing=frozenset(rd.missing), **u)


def _populated(layout: Layout, job: Job) -> Optional[bool]:
    """Whether a job cgroup holds a process: v2 ``cgroup.events`` 'populated'; v1 a non-empty
    ``cgroup.procs`` in the job dir or its steps and tasks (three levels).  False too for a job directory
    without cgroup files (half removed, or a plain directory); None when it cannot be told."""
    base = os.path.join(layout.root("cpuacct") or layout.root("memory") or layout.root("cpu"), job.rel)
    if layout.version == "v2":
        text = _read_or_none(os.path.join(base, "cgroup.events"))
        if text is None:
            return False if not os.path.exists(os.path.join(base, "cgroup.procs")) else None
        for line in text.splitlines():
            if line.startswith("populated "):
                return line.split()[1] != "0"
        return None
    return _v1_has_procs(base, 3)


def _v1_has_procs(d: str, depth: int) -> bool:
    procs = _read_or_none(os.path.join(d, "cgroup.procs"))
    if procs is None:
        return False
    if procs.strip():
        return True
    return depth > 1 and any(_v1_has_procs(os.path.join(d, s), depth - 1) for s in _subdirs(d))


# ----------------------------------------------------------------------------- the source

class JobsSource:
    """The ``jobs`` collector: per-job CPU, memory, I/O and pressure from the job cgroups on the node."""

    name = "jobs"

    def __init__(self, cgroupfs: str = "/sys/fs/cgroup", pod_log_dir: Optional[str] = "/var/log/pods",
                 max_jobs: int = 512):
        self.cgroupfs = cgroupfs
        self.pod_log_dir = pod_log_dir
        self.max_jobs = max_jobs
        self._peaks: Dict[Tuple[str, str], int] = {}
        self._cputime: Dict[Tuple[str, str], Tuple[float, float]] = {}
        self._rlog = RateLimitedLog(log)
        self._refusals = Refusals(self.name)

    def collect(self) -> JobsReading:
        with counting(self._refusals):
            return self._collect()

    def _collect(self) -> JobsReading:
        layout = detect_layout(self.cgroupfs)
        hier = layout.root("cpuacct") or layout.root("memory") or layout.root("cpu") or layout.root("blkio")
        jobs, bad, nbad = discover(hier)
        counts = dict.fromkeys(STATES, 0)
        counts["bad_name"] = nbad
        skipped = list(bad)
        for b in bad:
            self._rlog.warning(f"bad_name:{b}", "jobs: %s: skipped", b)
        live = [j for j in jobs if _populated(layout, j) is not False]
        counts["empty"] = len(jobs) - len(live)
        if len(live) > self.max_jobs:   # keep the newest Slurm jobs (highest ids), then pods
            live.sort(key=lambda j: (j.kind != SLURM, -int(j.id) if j.kind == SLURM else 0, j.id))
            counts["over_limit"] = len(live) - self.max_jobs
            skipped.append(f"{counts['over_limit']} job cgroup(s) beyond jobs.max_jobs={self.max_jobs} not read")
            self._rlog.warning("over_limit", "jobs: %d job cgroups on the node, reading the newest %d "
                               "(jobs.max_jobs)", len(live), self.max_jobs)
            live = live[:self.max_jobs]
        out = []
        for j in live:
            try:
                u = read_job(j, layout, self._rlog)
            except _Vanished:
                counts["vanished"] += 1
                continue
            out.append(self._with_cputime(self._with_peak(u)))
        counts["read"] = len(out)
        seen = {(u.job.kind, u.job.id) for u in out}
        self._peaks = {k: v for k, v in self._peaks.items() if k in seen}   # an ended job's state goes with it
        self._cputime = {k: v for k, v in self._cputime.items() if k in seen}
        names = pod_names(self.pod_log_dir) if any(j.kind == POD for j in live) else {}
        return JobsReading(layout, tuple(out), names, counts, tuple(skipped), self._refusals.counts())

    def _with_cputime(self, u: JobUsage) -> JobUsage:
        """v1: the exact total split in the user:system proportion of the (tick-based) split counters,
        each mode never below what it was at the previous read (as the kernel's cputime_adjust does for
        getrusage), so both stay counters and they always sum to the exact total."""
        if u.cpu_total_s is None:
            return u
        key = (u.job.kind, u.job.id)
        total = u.cpu_total_s
        pu, ps = self._cputime.get(key, (0.0, 0.0))
        if total <= pu + ps:
            user, system = pu, ps             # no time since the last read (or a counter that went back)
        else:
            tu, ts = u.cpu_user_s or 0.0, u.cpu_system_s or 0.0
            system = total * ts / (tu + ts) if tu + ts > 0 else 0.0
            system = max(system, ps)
            user = total - system
            if user < pu:
                user, system = pu, total - pu
        self._cputime[key] = (user, system)
        return replace(u, cpu_user_s=user, cpu_system_s=system)

    def _with_peak(self, u: JobUsage) -> JobUsage:
        """The kernel's peak, else the largest memory seen (kept per job while it lives)."""
        key = (u.job.kind, u.job.id)
        if u.mem_peak_bytes is not None or u.mem_bytes is None:
            return u
        peak = max(self._peaks.get(key, 0), u.mem_bytes)
        self._peaks[key] = peak
        return replace(u, mem_peak_bytes=peak)


def from_config(cfg, ctx=None) -> JobsSource:
    return JobsSource(cfg["cgroupfs"], cfg["jobs"]["pod_log_dir"], cfg["jobs"]["max_jobs"])


def jobs_with_processes(procfs: str, most: int = 100000) -> Dict[Tuple[str, str], int]:
    """(kind, id) -> one pid, for every Slurm job and pod that ``<procfs>/<pid>/cgroup`` names."""
    from ..gpu.procinfo import parse_cgroup
    out: Dict[Tuple[str, str], int] = {}
    try:
        pids = [n for n in os.listdir(procfs) if _PID.fullmatch(n)][:most]
    except OSError:
        return out
    for pid in pids:
        text = _read_or_none(os.path.join(procfs, pid, "cgroup"))
        if text:
            job, pod = parse_cgroup(text)
            if job:
                out.setdefault((SLURM, job), int(pid))
            if pod:
                out.setdefault((POD, pod), int(pid))
    return out


def doctor_lines(cgroupfs: str, pod_log_dir: Optional[str] = None, max_jobs: int = 512,
                 procfs: Optional[str] = None) -> List[str]:
    """``teye doctor``'s lines: the layout found, where jobs are looked for, and why one is not seen
    (with ``procfs``: jobs whose processes name a cgroup this tree does not have)."""
    try:
        reading = JobsSource(cgroupfs, pod_log_dir, max_jobs).collect()
    except SourceUnavailable as e:
        return [f"jobs (cgroups): not available: {e}; per-job CPU, memory and I/O are not exported"]
    lay = reading.layout
    lines = [f"jobs (cgroups): {lay.notes[0]}"] + [f"jobs (cgroups): {n}" for n in lay.notes[1:]]
    kinds = {}
    for u in reading.jobs:
        where = u.job.rel.split("/job_")[0].split("/pod")[0].split("/kubepods-")[0]
        if u.job.kind == SLURM:
            where = "slurm/uid_*" if where.startswith("slurm") else where
        kinds.setdefault(f"{u.job.kind} jobs under {where}" if u.job.kind == SLURM else
                         f"pods under {where} ({'systemd' if '.slice' in u.job.rel else 'cgroupfs'} driver)", []
                         ).append(u.job.id)
    c = reading.counts
    if kinds:
        lines.append("jobs (cgroups): " + "; ".join(f"{len(ids)} {k} ({', '.join(sorted(ids)[:5])}"
                                                     f"{', ...' if len(ids) > 5 else ''})"
                                                     for k, ids in sorted(kinds.items())))
    else:
        lines.append("jobs (cgroups): no Slurm job or Kubernetes pod cgroup found (looked for slurm/uid_*/job_*, "
                     "system.slice/slurmstepd.scope/job_*, kubepods/, kubepods.slice/): Slurm puts jobs in cgroups "
                     "only with ProctrackType=proctrack/cgroup or TaskPlugin=task/cgroup; jobs outside a scheduler "
                     "have no cgroup of their own and are not seen")
    if c.get("empty"):
        lines.append(f"jobs (cgroups): {c['empty']} job cgroup(s) without a process (ended, not yet removed) are "
                     f"skipped")
    if c.get("vanished"):
        lines.append(f"jobs (cgroups): {c['vanished']} job(s) ended while they were read")
    for s in reading.skipped:
        lines.append(f"jobs (cgroups): not read: {s}")
    for reason, n in reading.refused:
        lines.append(f"jobs (cgroups): {n} file(s) refused ({reason}: a FIFO, device or socket in place of a "
                     f"cgroup file, or one larger than {MAX_FILE_BYTES} bytes): their values are left out")
    absent: Dict[Tuple[str, ...], List[str]] = {}
    for u in reading.jobs:
        if u.missing:
            absent.setdefault(tuple(sorted(u.missing)), []).append(u.job.id)
    for files, ids in sorted(absent.items())[:5]:
        lines.append(f"jobs (cgroups): job(s) {', '.join(sorted(ids)[:5])}: {', '.join(files)} absent (controller "
                     f"not enabled for the job, or the kernel lacks it): those figures are left out")
    if procfs:
        read = {(u.job.kind, u.job.id) for u in reading.jobs}
        unseen = sorted((k, pid) for k, pid in jobs_with_processes(procfs).items() if k not in read)
        for (kind, jid), pid in unseen[:5]:
            what = f"Slurm job {jid}" if kind == SLURM else f"pod {jid}"
            lines.append(f"jobs (cgroups): {what} has processes ({procfs}/{pid}/cgroup names it) but no cgroup read "
                         f"under {cgroupfs}: is --cgroupfs the host's cgroup tree (in a container, mount it), and "
                         f"was it skipped above (not a number, beyond jobs.max_jobs)?")
        if len(unseen) > 5:
            lines.append(f"jobs (cgroups): {len(unseen) - 5} more job(s) with processes and no cgroup read")
    return lines
