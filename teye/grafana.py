"""Grafana's HTTP API as teye uses it, standard library only: what ``teye dashboards push`` needs, and
annotations a training loop posts (importable from any install: ``from teye.grafana import annotate``).

    from teye.grafana import annotate
    annotate("https://grafana.example", token, "resnet50-bs64", "epoch 3", kind="epoch")

The token is a Grafana service-account token (Bearer).  A redirect is an error, never followed: the token
is not sent to wherever a redirect points (Go's and Prometheus' HTTP clients drop credentials on a redirect
to another host; here none is followed at all).  Answers are read up to 1 MiB.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional
from urllib.parse import urlparse

MAX_ANSWER_BYTES = 1 << 20


class GrafanaError(Exception):
    """Grafana answered with an HTTP error: ``status`` and Grafana's own ``message``."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None   # urllib then raises HTTPError(code): the Authorization header goes nowhere else


class Grafana:
    """One Grafana: ``url`` (http or https), a service-account ``token``, a per-request ``timeout``."""

    def __init__(self, url: str, token: str, timeout: float = 10.0):
        u = urlparse(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.base = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self._open = urllib.request.build_opener(_NoRedirect()).open

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """The decoded JSON answer; GrafanaError for an HTTP error, OSError when Grafana cannot be reached."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Accept": "application/json",
            **({"Content-Type": "application/json"} if data is not None else {})})
        try:
            with self._open(req, timeout=self.timeout) as resp:
                raw = resp.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as e:
            try:
                raw = e.read(MAX_ANSWER_BYTES)
            except OSError:
                raw = b""
            finally:
                e.close()
            raise GrafanaError(e.code, _message(raw) or e.reason or "") from None
        if len(raw) > MAX_ANSWER_BYTES:
            raise GrafanaError(0, f"answer larger than {MAX_ANSWER_BYTES} bytes")
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            raise GrafanaError(0, "answer is not JSON") from None

    def folders(self) -> List[Dict]:
        return self.request("GET", "/api/folders") or []

    def create_folder(self, title: str, uid: str) -> Dict:
        return self.request("POST", "/api/folders", {"title": title, "uid": uid})

    def save_dashboard(self, payload: Dict) -> Dict:
        return self.request("POST", "/api/dashboards/db", payload)

    def add_annotation(self, tags: List[str], text: str, time_ms: int, time_end_ms: Optional[int] = None) -> Dict:
        return self.request("POST", "/api/annotations", {"panelId": None, "time": time_ms, "timeEnd": time_end_ms,
                                                          "tags": tags, "text": text})


def _message(raw: bytes) -> str:
    try:
        body = json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace").strip()[:200]
    return str(body.get("message", "")) if isinstance(body, dict) else ""


def annotate(url: str, token: str, train_job: str, text: str, kind: str = "event",
             time_ms: Optional[int] = None, time_end_ms: Optional[int] = None,
             timeout: float = 5.0) -> Optional[Dict]:
    """Post an annotation for a training job (the training-job dashboard shows those tagged ``teye`` and the
    job's name).  ``kind`` is a free tag such as "start", "end" or "epoch".  Returns Grafana's answer, or None
    when Grafana cannot be reached or refuses: never raises (a training loop must not die because Grafana is
    down)."""
    try:
        g = Grafana(url, token, timeout)
        return g.add_annotation(["teye", train_job, kind], text,
                                time_ms if time_ms is not None else int(time.time() * 1000), time_end_ms)
    except (ValueError, GrafanaError, OSError):
        return None
