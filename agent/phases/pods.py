"""Which Kubernetes pod a phase sender runs in: pods are tenants (issue 36).

On Kubernetes, pods of different tenants commonly all run as uid 0, so the sender's uid does not
tell them apart.  The kernel does: ``/proc/<pid>/cgroup`` (under the agent's ``--procfs``, which
with ``hostPID`` is the node's) names the pod's cgroup, ``.../kubepods/.../pod<uid>`` (cgroupfs
driver) or ``...kubepods-...-pod<uid>.slice`` (systemd driver); ``agent.gpu.procinfo.parse_cgroup``
reads it, as for GPU processes.  The pod's namespace and name come from where the code base already
finds them for pod cgroups: the kubelet's ``/var/log/pods/<namespace>_<name>_<uid>`` directories
(``jobs.pod_log_dir``, ``agent.sources.cgroups.pod_names``).  The kubelet's pod-resources API names
only pods with devices and gives no pod uid, so it cannot map a cgroup to a pod.  Where the log
directory does not name the pod, the pod uid itself is exported (``pod`` = the uid, ``namespace``
empty).

A process gone before the agent reads its cgroup (it sent and exited at once) has no pod: its
datagram keys to ``(uid, name)`` as outside Kubernetes.  Bounded: at most MAX_PIDS pids cached,
each re-read after CACHE_NS (a pid reused by another pod is seen again then); each file read is
at most MAX_CGROUP_BYTES.
"""
from __future__ import annotations

import os
from typing import Callable, Dict, Optional, Tuple

from ..gpu.procinfo import parse_cgroup
from ..sources.cgroups import pod_names

MAX_PIDS = 4096
CACHE_NS = 5 * 10**9
MAX_CGROUP_BYTES = 64 * 1024
NAMES_REFRESH_NS = 10 * 10**9


class PodResolver:
    """pid -> pod uid ('' when none), pod uid -> (namespace, name)."""

    def __init__(self, procfs: str = "/proc", pod_log_dir: Optional[str] = "/var/log/pods",
                 names: Callable[[Optional[str]], Dict[str, Tuple[str, str]]] = pod_names):
        self.procfs = procfs
        self.pod_log_dir = pod_log_dir
        self._pod_names = names
        self._pids: Dict[int, Tuple[str, int]] = {}
        self._names: Dict[str, Tuple[str, str]] = {}
        self._names_at: Optional[int] = None

    def of(self, pid: int, now_ns: int) -> str:
        got = self._pids.get(pid)
        if got is not None and now_ns - got[1] < CACHE_NS:
            return got[0]
        pod = self._read(pid)
        if len(self._pids) >= MAX_PIDS:
            self._pids.clear()
        self._pids[pid] = (pod, now_ns)
        return pod

    def _read(self, pid: int) -> str:
        try:
            fd = os.open(os.path.join(self.procfs, str(int(pid)), "cgroup"), os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return ""   # gone (or another pid namespace): no pod known
        try:
            text = os.read(fd, MAX_CGROUP_BYTES).decode("utf-8", "replace")
        except OSError:
            return ""
        finally:
            os.close(fd)
        return parse_cgroup(text)[1]

    def names(self, pod_uid: str, now_ns: int) -> Tuple[str, str]:
        """(namespace, pod name) of a pod uid; ('', pod uid) where the kubelet's log directory does not name it."""
        got = self._names.get(pod_uid)
        if got is None and (self._names_at is None or now_ns - self._names_at >= NAMES_REFRESH_NS):
            self._names_at = now_ns
            self._names = self._pod_names(self.pod_log_dir)
            got = self._names.get(pod_uid)
        return got if got is not None else ("", pod_uid)
