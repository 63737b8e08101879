"""Who holds a GPU: pid -> user, Slurm job id, Kubernetes pod uid, from procfs.

- ``<procfs>/<pid>/cgroup``: Slurm puts each job's tasks under a ``job_<id>`` cgroup
  (``/slurm/uid_1000/job_1234/step_0/task_0`` on cgroup v1,
  ``/system.slice/slurmstepd.scope/job_1234/step_0/user/task_0`` on v2); the kubelet puts a
  pod's containers under ``pod<uid>`` (``/kubepods/burstable/pod<uid>/<container>`` with the
  cgroupfs driver, ``.../kubepods-burstable-pod<uid with _ for ->.slice/...`` with systemd).
- ``<procfs>/<pid>/status``: the real uid on the ``Uid:`` line, named through the password
  database (the number itself when it has no name).

A process that exited (or lives in a pid namespace we cannot see) has empty labels.
"""
from __future__ import annotations

import logging
import os
import pwd
import re
from dataclasses import dataclass
from typing import Callable, Tuple

from ..errors import ParseError, parse_int
from ..sources._files import read_text

log = logging.getLogger("teye.gpu.procinfo")

_SLURM_JOB = re.compile(r"/job_([0-9]{1,18})(?=/|\Z)")   # ASCII digits only: \d takes '٤', int() then 4
_POD_UID = re.compile(r"pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})")


@dataclass(frozen=True)
class ProcOwner:
    user: str = ""
    slurm_job: str = ""
    pod_uid: str = ""


def parse_cgroup(text: str) -> Tuple[str, str]:
    """(slurm job id, pod uid) from a /proc/<pid>/cgroup file; '' when not found."""
    job = pod = ""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        if not job:
            m = _SLURM_JOB.search(path)
            if m:
                job = m.group(1)
        if not pod:
            m = _POD_UID.search(path)
            if m:
                pod = m.group(1).replace("_", "-").lower()
    return job, pod


def parse_status_uid(text: str, path: str = "status") -> int:
    """The real uid from the Uid: line of /proc/<pid>/status (ParseError when missing or garbled)."""
    for line in text.splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            if len(fields) < 2:
                raise ParseError(path, "Uid: line has no value")
            return parse_int(fields[1], path, "Uid")
    raise ParseError(path, "no Uid: line")


def user_name(uid: int, getpwuid: Callable = pwd.getpwuid) -> str:
    try:
        return getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def owner(procfs: str, pid: int, getpwuid: Callable = pwd.getpwuid) -> ProcOwner:
    """The labels for one GPU process; fields are '' when the process or file is gone or unreadable."""
    base = os.path.join(procfs, str(int(pid)))
    user = job = pod = ""
    try:
        text = read_text(os.path.join(base, "status"), allow_empty=True)   # bounded, never blocks
        user = user_name(parse_status_uid(text, os.path.join(base, "status")), getpwuid)
    except (OSError, ParseError) as e:
        log.debug("pid %s: %s", pid, e)
    try:
        job, pod = parse_cgroup(read_text(os.path.join(base, "cgroup"), allow_empty=True))
    except OSError as e:
        log.debug("pid %s: %s", pid, e)
    return ProcOwner(user, job, pod)

