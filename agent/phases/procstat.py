"""What the processes that send phases do while they wait for input: CPU time, reads, pressure.

The one door to ``/proc/<pid>`` for the input-cause split (issue 13).  :class:`ProcReader`
reads one process (its roots, ``procfs`` and ``sysfs``, come from the config, so tests hand
it fixture trees); :class:`InputProbe` samples the processes of live jobs every
``phases.input_sample_interval_seconds`` in its own thread and keeps a short ring of
cumulative readings per pid.  The analysis (``agent.phases.cause``) only reads those rings.

Per sample, all cumulative, of the sending process *and its descendants* (the input pipeline is
often not in the sender: PyTorch DataLoader workers, multiprocessing pools, a decoder subprocess):

* CPU: ``utime + stime`` of ``/proc/<pid>/stat`` (the whole process, every thread), plus
  ``cutime + cstime`` (children it has reaped), plus ``utime + stime + cutime + cstime`` of each
  live descendant, seconds;
* run delay: the second field of ``/proc/<pid>/schedstat``, seconds the main thread was
  runnable but waited for a CPU (a starved decoder in the training thread); ``None``
  without schedstats; with the main thread's ``voluntary_ctxt_switches`` and
  ``nonvoluntary_ctxt_switches`` (``/proc/<pid>/status``), which tell a thread preempted while it
  works (involuntary) from one woken from a wait (voluntary) that then queues for a CPU behind the
  neighbours' work (agent.phases.cause.wait_usage credits only the former's share);
* reads: ``read_bytes`` of ``/proc/<pid>/io`` (bytes fetched from storage), plus each live
  descendant's; ``None`` when the sender's file is not readable (another user's process without
  CAP_SYS_PTRACE, hardened kernels);
* pressure stall: ``total=`` of the ``some`` line of the process's cgroup ``io.pressure`` and
  ``cpu.pressure`` (cgroup v2, from ``/proc/<pid>/cgroup``); without a cgroup figure (cgroup v1),
  the node's ``/proc/pressure/io`` for I/O only where the process's own reads cannot be read (the
  node's stalls are every process's: another job's checkpoint would make a sleeping job's waits
  look like storage); ``None`` where the kernel has no PSI.

A pid the kernel handed us is checked against the sender: the process under ``/proc/<pid>``
must belong to the sender's uid (otherwise the sender lives in another pid namespace than
our /proc, or the pid was reused), and its start time must not change (the process exited
and the pid was reused).  Each such problem is a reason, never an exception into the agent.

Descendants are found through ``/proc/<pid>/task/<tid>/children`` (every thread's children,
recursively, at most ``MAX_DESCENDANTS``), looked up again at most once a second
(``DESCENDANTS_EVERY_NS``), not at every sample; a kernel without that file
(CONFIG_PROC_CHILDREN) leaves the sender alone.  Why the process tree and not the job's cgroup:
a Slurm job's or pod's cgroup holds every rank of a data-parallel job on the node, and each
rank's wait is judged by its own input pipeline (its DataLoader workers are its children); the
job's cgroup still gives the I/O and CPU pressure (cgroup v2), as before.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict, deque
from typing import Callable, Deque, Dict, FrozenSet, List, NamedTuple, Optional, Sequence, Tuple

from ..errors import ParseError
from ..gpu.procinfo import parse_status_uid
from ..logutil import RateLimitedLog
from ..sources._files import read_bytes, read_text
from ..sources.cgroups import cpu_set
from ..sources.pressure import parse_psi

log = logging.getLogger("teye.phases")

RING = 1200            # samples kept per pid (60 s at the default 50 ms)
MAX_PIDS = 64          # processes sampled at once (the most recently active)
_RETRACK_NS = 10**8    # a sender's last_ns (for IDLE_S) is refreshed at most this often
IDLE_S = 30.0          # a pid whose job sent no data_wait this long is no longer sampled
MAX_DESCENDANTS = 256  # descendants of one sender whose CPU and reads count with its own
DESCENDANTS_EVERY_NS = 10**9   # how often a sender's descendants are looked up again
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


class ProcSample(NamedTuple):
    """Cumulative figures of one process at ``t_ns`` (CLOCK_MONOTONIC)."""

    t_ns: int
    cpu_s: float                   # utime + stime, all threads, with its reaped children and live descendants
    read_bytes: Optional[int]      # with its live descendants'; None: the sender's /proc/<pid>/io unreadable
    io_stall_s: Optional[float]    # PSI io "some" total (cgroup, else system); None: no PSI
    cpu_stall_s: Optional[float]   # PSI cpu "some" total of the cgroup; None: no cgroup PSI
    run_delay_s: Optional[float] = None  # main thread's time runnable but not running; None: no schedstat
    switches: Optional[int] = None       # main thread's voluntary context switches (it blocked); None: unknown
    preempted: Optional[int] = None      # ... and involuntary ones (it was preempted while it ran)


class Gone(Exception):
    """The process cannot be sampled at all (exited, another pid namespace); the message says why."""


def _psi_total(path: str) -> Optional[float]:
    """Seconds of the ``some`` line's ``total=`` of a pressure file, None when absent or unreadable."""
    try:
        line = parse_psi(read_text(path, allow_empty=True), path).get("some")
    except (OSError, ParseError):
        return None
    return None if line is None else line.total_seconds


class ProcReader:
    """Reads one process's CPU time, reads and pressure from a procfs/sysfs root."""

    def __init__(self, procfs: str = "/proc", sysfs: str = "/sys", clk_tck: Optional[int] = None):
        self.procfs = procfs
        self.sysfs = sysfs
        self.tck = clk_tck or os.sysconf("SC_CLK_TCK")

    def _p(self, pid: int, name: str) -> str:
        return os.path.join(self.procfs, str(pid), name)

    def identity(self, pid: int) -> Tuple[int, int]:
        """(real uid, start time in ticks) of the process; Gone when it does not exist."""
        stat = self._stat(pid)
        path = self._p(pid, "status")
        try:
            start = int(stat[19])
            return parse_status_uid(read_text(path, allow_empty=True), path), start
        except FileNotFoundError:
            raise Gone(f"pid {pid} exited (no {path})") from None
        except (OSError, ValueError) as e:   # ParseError is a ValueError: it names the file and the field
            raise Gone(f"cannot read {path}: {e}") from None

    def resident(self, pid: int) -> int:
        """Resident memory of the process, bytes (``/proc/<pid>/statm``'s second field, in pages: what ``ps``
        shows as RSS); Gone when it exited or the file is not what the kernel writes."""
        path = self._p(pid, "statm")
        try:
            fields = read_text(path, limit=4096).split()
            return int(fields[1]) * PAGE_SIZE
        except FileNotFoundError:
            raise Gone(f"pid {pid} exited (no {path})") from None
        except OSError as e:
            raise Gone(f"cannot read {path}: {e.strerror or e}") from None
        except (IndexError, ValueError):   # ParseError (empty) is a ValueError
            raise Gone(f"{path} is not a statm line") from None

    def _stat(self, pid: int) -> List[str]:
        path = self._p(pid, "stat")
        try:
            text = read_text(path, allow_empty=True)
        except FileNotFoundError:
            raise Gone(f"pid {pid} exited (no {path})") from None
        except OSError as e:
            raise Gone(f"cannot read {path}: {e.strerror or e}") from None
        fields = text.rpartition(")")[2].split()   # the command name may hold spaces and parentheses
        if len(fields) < 20:
            raise Gone(f"{path} is not a process stat line ({len(fields)} fields after the name)")
        return fields

    def cpu(self, pid: int) -> Tuple[float, float, int]:
        """(its own CPU seconds: utime + stime of every thread, CPU seconds of the children it reaped: cutime +
        cstime, start time in ticks) of one process; Gone when it cannot be read."""
        f = self._stat(pid)
        try:
            return ((int(f[11]) + int(f[12])) / self.tck, (int(f[13]) + int(f[14])) / self.tck, int(f[19]))
        except ValueError:
            raise Gone(f"{self._p(pid, 'stat')}: utime/stime are not numbers") from None

    def cpus_allowed(self, pid: int) -> Optional[FrozenSet[int]]:
        """The CPUs the process may run on (``Cpus_allowed_list`` of /proc/<pid>/status: taskset, a cpuset),
        None when unknown."""
        try:
            text = read_bytes(self._p(pid, "status")).decode("ascii", "replace")
        except OSError:
            return None
        at = text.find("Cpus_allowed_list:")
        if at < 0:
            return None
        try:
            return cpu_set(text[at + len("Cpus_allowed_list:"):].split("\n", 1)[0], self._p(pid, "status")) or None
        except ValueError:   # ParseError
            return None

    def cgroup(self, pid: int) -> Optional[str]:
        """The process's cgroup v2 directory under sysfs, None when unknown (v1 only, unreadable)."""
        try:
            for line in read_text(self._p(pid, "cgroup"), allow_empty=True).splitlines():
                if line.startswith("0::"):
                    return os.path.join(self.sysfs, "fs", "cgroup", line[3:].strip().lstrip("/"))
        except OSError:
            return None
        return None

    def descendants(self, pid: int, limit: int = MAX_DESCENDANTS) -> List[int]:
        """The live descendants of ``pid`` (children of every thread, recursively), at most ``limit``;
        [] where the kernel has no ``task/<tid>/children`` file or the process is gone."""
        out: List[int] = []
        seen = {pid}
        todo = [pid]
        while todo and len(out) < limit:
            p = todo.pop()
            task = self._p(p, "task")
            try:
                tids = os.listdir(task)
            except OSError:
                continue
            for tid in tids:
                try:
                    kids = [int(k) for k in read_bytes(os.path.join(task, tid, "children")).decode("ascii").split()]
                except (OSError, ValueError):
                    continue
                for k in kids:
                    if k not in seen and len(out) < limit:
                        seen.add(k)
                        out.append(k)
                        todo.append(k)
        return out

    def _descendant(self, pid: int) -> Tuple[float, Optional[int]]:
        """(CPU seconds with its reaped children, read_bytes or None) of one descendant; (0, None) when gone."""
        try:
            own, reaped, _ = self.cpu(pid)
        except Gone:
            return 0.0, None
        return own + reaped, self.read_bytes(pid)[0]

    def read_bytes(self, pid: int) -> Tuple[Optional[int], str]:
        """(read_bytes, problem): None and the reason when /proc/<pid>/io cannot be read."""
        path = self._p(pid, "io")
        try:
            for line in read_bytes(path).decode("ascii").splitlines():
                if line.startswith("read_bytes:"):
                    return int(line.split()[1]), ""
        except PermissionError:
            return None, (f"cannot read {path}: permission denied (another user's process: the agent needs "
                          f"CAP_SYS_PTRACE, or ptrace is restricted on this kernel)")
        except FileNotFoundError:
            return None, f"no {path} (kernel without task I/O accounting, or the process exited)"
        except (OSError, ValueError, IndexError) as e:
            return None, f"cannot read {path}: {e}"
        return None, f"{path} has no read_bytes line"

    def sample(self, pid: int, now_ns: int, cgroup: Optional[str],
               psi: Optional[Dict[str, Optional[float]]] = None,
               descendants: Sequence[int] = ()) -> Tuple[ProcSample, str, int]:
        """One reading of ``pid`` with its ``descendants`` (Gone when ``pid`` cannot be read at all), the
        I/O problem if any, and the process's start time (ticks since boot: another value means another
        process).

        ``psi`` caches pressure files for one sampling cycle (processes of a job share a cgroup)."""
        psi = {} if psi is None else psi

        def pressure(path: str) -> Optional[float]:
            if path not in psi:
                psi[path] = _psi_total(path)
            return psi[path]

        own, reaped, start = self.cpu(pid)
        cpu = own + reaped
        rb, problem = self.read_bytes(pid)
        for d in descendants:
            d_cpu, d_rb = self._descendant(d)
            cpu += d_cpu
            if rb is not None and d_rb is not None:
                rb += d_rb
        io = pressure(os.path.join(cgroup, "io.pressure")) if cgroup else None
        if io is None and rb is None:
            # the node's I/O pressure is other processes' as much as the job's: only where the job's own reads
            # cannot be seen is it the storage evidence left
            io = pressure(os.path.join(self.procfs, "pressure", "io"))
        cpu_stall = pressure(os.path.join(cgroup, "cpu.pressure")) if cgroup else None
        vol, invol = self.switches(pid)
        return ProcSample(now_ns, cpu, rb, io, cpu_stall, self.run_delay(pid), vol, invol), problem, start

    def switches(self, pid: int) -> Tuple[Optional[int], Optional[int]]:
        """The main thread's (voluntary, involuntary) context switches (/proc/<pid>/status), None when unknown."""
        vol = invol = None
        try:
            text = read_bytes(self._p(pid, "status")).decode("ascii", "replace")
            at = text.find("voluntary_ctxt_switches:")
            if at >= 0:
                for line in text[text.rfind("\n", 0, at) + 1:].splitlines():
                    if line.startswith("voluntary_ctxt_switches:"):
                        vol = int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches:"):
                        invol = int(line.split()[1])
        except (OSError, ValueError, IndexError):
            return None, None
        return (vol, invol) if vol is not None and invol is not None else (None, None)

    def run_delay(self, pid: int) -> Optional[float]:
        """Seconds the main thread waited on a run queue (/proc/<pid>/schedstat), None when unknown."""
        try:
            return int(read_bytes(self._p(pid, "schedstat")).decode("ascii").split()[1]) / 1e9
        except (OSError, ValueError, IndexError, UnicodeDecodeError):
            return None


class _Tracked:
    __slots__ = ("uid", "start", "cgroup", "ring", "problem", "last_ns", "gone", "kids", "kids_ns")

    def __init__(self, uid: int, now_ns: int):
        self.uid = uid
        self.start: Optional[int] = None
        self.cgroup: Optional[str] = None
        self.ring: Deque[ProcSample] = deque(maxlen=RING)
        self.problem = ""
        self.last_ns = now_ns
        self.gone = False
        self.kids: List[int] = []       # live descendants (see ProcReader.descendants)
        self.kids_ns: Optional[int] = None


class InputProbe:
    """Samples the tracked processes (the senders of data_wait phases) into per-pid rings."""

    RETRACK_NS = _RETRACK_NS

    def __init__(self, reader: ProcReader, interval_s: float = 0.05, clock: Callable[[], int] = time.monotonic_ns):
        self.reader = reader
        self.interval_s = interval_s
        self.clock = clock
        self._pids: "OrderedDict[int, _Tracked]" = OrderedDict()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()   # set by track() on a new pid: the idle thread sleeps on it
        self._thread: Optional[threading.Thread] = None
        self._rlog = RateLimitedLog(log)
        self.samples_taken = 0

    def track(self, pid: int, uid: int, now_ns: int) -> None:
        """Sample ``pid`` (sent by ``uid``) from now on; called when its data_wait phases arrive."""
        t = self._pids.get(pid)   # a pid tracked a moment ago: nothing to do (every message calls this)
        if t is not None and t.uid == uid and 0 <= now_ns - t.last_ns < self.RETRACK_NS:
            return
        with self._lock:
            t = self._pids.get(pid)
            if t is None or t.uid != uid:
                t = self._pids[pid] = _Tracked(uid, now_ns)
                if pid <= 0:
                    t.gone, t.problem = True, ("the sender is outside the agent's pid namespace (the kernel "
                                               "reported pid 0)")
                while len(self._pids) > MAX_PIDS:
                    self._pids.popitem(last=False)
                self._wake.set()
            t.last_ns = now_ns
            self._pids.move_to_end(pid)

    def samples(self, pid: int) -> Tuple[List[ProcSample], str, bool]:
        """(samples oldest first, problem, gone) of pid; ([], reason, True) when not tracked."""
        with self._lock:
            t = self._pids.get(pid)
            if t is None:
                return [], f"pid {pid} is not sampled (more than {MAX_PIDS} processes, or idle)", True
            return list(t.ring), t.problem, t.gone

    def sample_once(self, now_ns: Optional[int] = None) -> None:
        """Read every tracked, live process once (the thread's loop body; tests call it directly)."""
        now = self.clock() if now_ns is None else now_ns
        with self._lock:
            todo = [(pid, t) for pid, t in self._pids.items() if not t.gone]
            stale = [pid for pid, t in self._pids.items() if now - t.last_ns > IDLE_S * 1e9]
            for pid in stale:
                del self._pids[pid]
        psi: Dict[str, Optional[float]] = {}
        for pid, t in todo:
            if pid in stale:
                continue
            try:
                if t.start is None:
                    uid, t.start = self.reader.identity(pid)
                    if uid != t.uid:
                        raise Gone(f"{os.path.join(self.reader.procfs, str(pid))} belongs to uid {uid}, the sender "
                                   f"is uid {t.uid}: the sender lives in another pid namespace than this /proc "
                                   f"(or the pid was reused)")
                    t.cgroup = self.reader.cgroup(pid)
                if t.kids_ns is None or now - t.kids_ns >= DESCENDANTS_EVERY_NS:
                    t.kids, t.kids_ns = self.reader.descendants(pid), now
                smp, problem, start = self.reader.sample(pid, now, t.cgroup, psi, t.kids)
                if start != t.start:
                    raise Gone(f"pid {pid} exited (its pid now belongs to a newer process)")
            except Gone as e:
                with self._lock:
                    t.gone, t.problem = True, str(e)
                self._rlog.log(logging.INFO, f"probe:{pid}", "input cause: %s", e)
                continue
            with self._lock:
                t.ring.append(smp)
                t.problem = problem
            self.samples_taken += 1

    # -- thread --------------------------------------------------------------------------------
    def start(self) -> None:
        if self.interval_s <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="teye-input-probe", daemon=True)
        self._thread.start()

    def _sampling(self) -> bool:
        """Whether a tracked process is still to be sampled (live, not yet idle for IDLE_S)."""
        with self._lock:
            return any(not t.gone for t in self._pids.values())

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._sampling():
                # Nobody to sample (no job reports data_wait): sleep until track() adds a process,
                # rather than waking 20 times a second for nothing.
                self._wake.wait()
                self._wake.clear()
                continue
            if self._stop.wait(self.interval_s):
                break
            self.sample_once()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None
