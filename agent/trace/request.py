"""`teye trace --train-job NAME`: ask a running job's processes on this node for a trace of their next steps.

The request is a file (teye_client._trace describes the job's side): written atomically into the job uid's
request directory, which only that uid and root may write; the processes of the job (its ranks) take it at
their next step boundary, start together at a step they agree on after ``start_after`` (each proposes one in its
status and takes the largest of the node's proposals), and write their trace
and a status file.  This module writes the request, counts the processes that took it, waits (bounded) for
each one's trace, and reduces what came back with the summary of :mod:`agent.trace.summary`.
"""
from __future__ import annotations

import glob
import json
import os
import secrets
import stat
import time
from typing import Dict, List, Optional

from teye_client import _trace as job_side

from .defaults import DEFAULT_START_IN_S, DEFAULT_STEPS, DEFAULT_TIMEOUT_S  # noqa: F401 (request.DEFAULT_*)
from .defaults import MAX_TRACE_BYTES

POLL_S = 0.1


class RequestError(Exception):
    """A request that cannot be made or taken: one line for the user."""


def _own_dir(path: str, uid: int, mode: int = 0o700) -> None:
    """Make ``path`` a directory of ``uid``'s that no one else may write (or check the one there)."""
    try:
        os.mkdir(path, mode)
        if os.geteuid() == 0 and uid != 0:
            gid = _gid_of(uid)
            os.chown(path, uid, uid if gid is None else gid)
    except FileExistsError:
        pass
    except OSError as e:
        raise RequestError(f"cannot make {path}: {e.strerror or e}") from None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):   # (lstat: a symbolic link is not one)
        raise RequestError(f"{path} is not a directory")
    if st.st_uid not in (uid, 0):
        raise RequestError(f"{path} is owned by uid {st.st_uid}, not uid {uid} or root: refusing it (remove it)")
    if st.st_mode & 0o022:
        raise RequestError(f"{path} may be written by group or others (mode {st.st_mode & 0o7777:04o}): refusing it")


def _gid_of(uid: int) -> Optional[int]:
    try:
        import pwd
        return pwd.getpwuid(uid).pw_gid
    except (ImportError, KeyError):
        return None


def prepare_output(output: str, uid: int) -> str:
    """The absolute output directory, made (0700, ``uid``'s) where absent; refused where another user could
    read or write it or it is not ``uid``'s (the job writes its traces there as ``uid``)."""
    out = os.path.abspath(output)
    if not os.path.exists(out):
        parent = os.path.dirname(out)
        if not os.path.isdir(parent):
            raise RequestError(f"the output's parent {parent} is not a directory")
        _own_dir(out, uid)
    st = os.lstat(out)
    if not stat.S_ISDIR(st.st_mode):
        raise RequestError(f"the output {out} is not a directory (or is a symbolic link)")
    if st.st_uid != uid:
        raise RequestError(f"the output directory {out} is owned by uid {st.st_uid}; the job runs as uid {uid} and "
                           "writes its traces as that uid (pass --output a directory of its own)")
    if st.st_mode & 0o077:
        raise RequestError(f"the output directory {out} is open to group or others (mode {st.st_mode & 0o7777:04o}); "
                           "a trace shows the job's code: chmod 700 it or pass another")
    return out


def write_request(train_job: str, uid: int, steps: int, output: str, ranks: Optional[List[int]],
                  start_in_s: float, timeout_s: float, directory: Optional[str] = None,
                  max_bytes: int = MAX_TRACE_BYTES, request_id: Optional[str] = None) -> dict:
    """Write the request for ``train_job`` (uid ``uid``'s processes); the request as written.  Refused where a
    request of that job is still pending (two at once), with its id and until when."""
    d = directory or job_side.request_dir(uid)
    if directory is None:
        _own_dir(os.path.dirname(d), uid)
    _own_dir(d, uid)
    path = os.path.join(d, train_job + ".json")
    now = time.time()
    try:
        with open(path, "rb") as f:
            old = job_side.parse_request(f.read(job_side.MAX_REQUEST_BYTES + 1), now)
        if isinstance(old, dict):
            raise RequestError(f"a trace of {train_job} is already requested (id {old['id']}) until "
                               f"{time.strftime('%H:%M:%S', time.localtime(old['expires']))}; wait for it")
    except FileNotFoundError:
        pass
    except OSError as e:
        raise RequestError(f"cannot read {path}: {e.strerror or e}") from None
    rid = request_id or time.strftime("%Y%m%dT%H%M%S", time.localtime(now)) + "-" + secrets.token_hex(3)
    req = {"id": rid,
           "steps": steps, "output": output, "ranks": ranks, "start_after": now + start_in_s,
           "expires": now + start_in_s + timeout_s, "max_bytes": max_bytes}
    checked = job_side.parse_request(json.dumps(req).encode(), now)
    if isinstance(checked, str):
        raise RequestError(f"the request would be refused: {checked}")
    job_side._write_private(path, json.dumps(req).encode())
    if os.geteuid() == 0 and uid != 0:
        os.chown(path, uid, -1)
    return dict(req, path=path, dir=d)


def statuses(req: dict, train_job: str) -> Dict[int, dict]:
    """The statuses the job's processes wrote for ``req``, by pid (a file that does not read is left out)."""
    out = {}
    for p in glob.glob(os.path.join(glob.escape(req["dir"]), glob.escape(f"{train_job}.{req['id']}.") + "*.status.json")):
        try:
            with open(p, "rb") as f:
                rec = json.loads(f.read(65536))
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and type(rec.get("pid")) is int:
            out[rec["pid"]] = rec
    return out


def wait(req: dict, train_job: str, timeout_s: float, clock=time.monotonic, sleep=time.sleep) -> Dict[int, dict]:
    """Each process's last status once every process that took the request is done or failed, or at the
    timeout (a rank that never reached a step boundary stays ``accepted`` or ``tracing``).  The processes that
    took it are those that said so before the start (it waits that long for them)."""
    start_wait = max(0.0, req["start_after"] - time.time()) + 0.5
    end = clock() + timeout_s
    t_start = clock() + start_wait
    seen: Dict[int, dict] = {}
    while True:
        seen = statuses(req, train_job)
        now = clock()
        if now >= t_start:
            if not seen or all(s.get("state") in ("done", "failed") for s in seen.values()) or now >= end:
                return seen   # (nobody took it by the start: no one will trace together with the others)
        sleep(POLL_S)


def withdraw(req: dict, train_job: str) -> None:
    """Remove the request and the statuses read (a process that took it carries on; no other takes it)."""
    paths = [req["path"]] + glob.glob(os.path.join(glob.escape(req["dir"]),
                                                   glob.escape(f"{train_job}.{req['id']}.") + "*.status.json"))
    for p in paths:
        try:
            os.unlink(p)
        except OSError:
            pass
