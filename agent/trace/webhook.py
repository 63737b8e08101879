"""The agent's trace webhook (issue 46): an alert about a job takes a trace of that job by itself.

Alertmanager posts its webhook payload (``{"version": "4", "status": ..., "alerts": [{"status", "labels", ...}]}``)
to ``POST /-/trace`` on the agent (exporters/http.py: only with basic auth configured, and only where
``trace.webhook`` is on).  For each firing alert that names a ``train_job`` this agent holds (a live job on this
node, as the agent labels it), the agent writes a request for the job's processes into
``<phase socket's directory>/trace/<uid>/<name>.json``: a directory of the agent's own, which the job's
zero-code hook trusts as it trusts the socket's (teye_client._trace).  The job then traces as for
``teye trace --train-job`` into its own default directory (``/tmp/teye-<uid>/traces``, its user's only) and
reports the trace with its next datagram.  Refused, with a one-line reason each (the answer lists them): an
alert that is resolved or names no ``train_job``; a job not live on this node; an alert whose ``user`` or
``namespace`` label is not the job's (another tenant's); a job traced less than ``job_interval_seconds`` ago,
or any job on this node less than ``node_interval_seconds`` ago (rate limits); a request still pending.
A payload that is not Alertmanager's is refused whole (400).
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from teye_client import _trace as job_side

log = logging.getLogger("teye.trace")

MAX_BODY = 256 * 1024            # bytes of a payload (exporters/http.py answers 413 beyond)
MAX_ALERTS = 1000
START_IN_S = 1.0
EXPIRES_S = 120.0                # a request not taken by then is void (and, until then, pending)


class Webhook:
    """``jobs()``: the live job views (agent.phases.jobstate.JobView); ``root``: the agent's request root
    (``<socket dir>/trace``).  ``handle(body)`` is called from the web server's worker threads."""

    def __init__(self, jobs: Callable[[], Sequence], root: str, steps: int = 5, job_interval_s: float = 600.0,
                 node_interval_s: float = 60.0, clock: Callable[[], float] = time.time):
        self.jobs = jobs
        self.root = root
        self.steps = steps
        self.job_interval_s = job_interval_s
        self.node_interval_s = node_interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._last_job: Dict[str, float] = {}
        self._last_node = float("-inf")
        self.results: Dict[str, int] = {}     # result -> alerts (teye_trace_webhook_alerts_total)

    def handle(self, body: bytes) -> Tuple[int, bytes]:
        """The HTTP status and the JSON answer: per alert, ``requested`` (with the trace's id) or ``refused``
        (with the reason)."""
        try:
            doc = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            return self._bad(f"not JSON: {str(e)[:120]}")
        if not isinstance(doc, dict) or not isinstance(doc.get("alerts"), list):
            return self._bad("not an Alertmanager webhook payload: no 'alerts' list")
        alerts = doc["alerts"]
        if len(alerts) > MAX_ALERTS:
            return self._bad(f"{len(alerts)} alerts (at most {MAX_ALERTS})")
        with self._lock:
            out = [self._one(a) for a in alerts]
        for r in out:
            self.results[r["result"]] = self.results.get(r["result"], 0) + 1
            if r["result"] == "requested":
                log.info("trace webhook: a trace of %s requested (id %s)", r["train_job"], r["id"])
            elif r["result"] not in ("resolved", "not_here"):   # (every node's agent gets every alert)
                log.info("trace webhook: %s: %s", r["train_job"] or "(no train_job)", r["reason"])
        return 200, (json.dumps({"results": out}, sort_keys=True) + "\n").encode()

    def _bad(self, why: str) -> Tuple[int, bytes]:
        self.results["malformed"] = self.results.get("malformed", 0) + 1
        return 400, (json.dumps({"error": why}) + "\n").encode()

    def _one(self, alert) -> dict:
        labels = alert.get("labels") if isinstance(alert, dict) else None
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            return _refused("", "malformed", "an alert without a labels object of strings")
        name = labels.get("train_job", "")
        if alert.get("status", "firing") != "firing":
            return _refused(name, "resolved", "the alert is resolved")
        if not name:
            return _refused(name, "no_job", "the alert names no train_job")
        live = [j for j in self.jobs() if j.train_job == name and not j.ended]
        if not live:
            return _refused(name, "not_here", f"no live job {name} on this node")
        job = live[0]
        for key, mine in (("user", job.user), ("namespace", job.namespace)):
            if key in labels and labels[key] != mine:
                return _refused(name, "other_tenant", f"the alert's {key} {labels[key]!r} is not the job's")
        now = self.clock()
        if now - self._last_job.get(name, float("-inf")) < self.job_interval_s:
            return _refused(name, "rate_limited", f"{name} was traced less than {self.job_interval_s:g} s ago "
                                                  "(trace.job_interval_seconds)")
        if now - self._last_node < self.node_interval_s:
            return _refused(name, "rate_limited", f"a job on this node was traced less than "
                                                  f"{self.node_interval_s:g} s ago (trace.node_interval_seconds)")
        try:
            rid = self._write(job, now)
        except _Pending as e:
            return _refused(name, "pending", str(e))
        except OSError as e:
            return _refused(name, "error", f"the request could not be written: {e.strerror or e}")
        self._last_job[name] = self._last_node = now
        if len(self._last_job) > 4096:
            self._last_job = {k: t for k, t in self._last_job.items() if now - t < self.job_interval_s}
        return {"train_job": name, "result": "requested", "id": rid}

    def _write(self, job, now: float) -> str:
        """The request for ``job``'s processes (its uid's directory under the root, made 0755, the agent's)."""
        raw = job.train_job.rsplit("/", 1)[-1].split("#", 1)[0]   # (the name its processes send)
        d = os.path.join(self.root, str(job.uid))
        for p, mode in ((self.root, 0o755), (d, 0o711)):   # (a uid's: its jobs open their file, no one lists it)
            try:
                os.mkdir(p, mode)
            except FileExistsError:
                pass
        path = os.path.join(d, raw + ".json")
        try:
            with open(path, "rb") as f:
                old = job_side.parse_request(f.read(job_side.MAX_REQUEST_BYTES + 1), now)
            if isinstance(old, dict):   # (unexpired)
                raise _Pending(f"a trace of {job.train_job} is already requested (id {old['id']})")
        except FileNotFoundError:
            pass
        rid = time.strftime("%Y%m%dT%H%M%S", time.localtime(now)) + "-" + secrets.token_hex(3)
        req = {"id": rid, "steps": self.steps, "output": None, "ranks": None, "start_after": now + START_IN_S,
               "expires": now + EXPIRES_S}
        job_side._write_private(path, json.dumps(req).encode())
        os.chmod(path, 0o644)   # the job's processes, of another uid, read it
        return rid


class _Pending(Exception):
    pass


def _refused(name: str, result: str, reason: str) -> dict:
    return {"train_job": name, "result": result, "reason": reason}
