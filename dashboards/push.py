"""`teye dashboards push --url URL [--token-file FILE | --token TOKEN] [--folder NAME]`: upload the dashboards.

The token (a Grafana service-account token with the Editor role) comes from ``--token-file``, else
``--token``, else the ``GRAFANA_TOKEN`` environment variable: a file or the environment keeps it out of
``ps`` and shell history.

Grafana's HTTP API through teye.grafana (standard library: no extra needed).  Each dashboard is saved with
``overwrite: true`` under its fixed uid (``teye-cluster``, ``teye-node``, ``teye-job``)
into the named folder (created when missing), so pushing again replaces them: the
command is idempotent.

Failures never pass silently: an unreachable Grafana or a rejected token stops the
push (nothing after it can succeed) and a dashboard Grafana rejects (400, 403, 412...)
is reported while the others are still uploaded.  Each failure prints one line naming
the dashboard, and a final report lists what was and was not uploaded; the exit status
is 1 when anything was not uploaded.

``annotate(...)`` posts a Grafana annotation (job start/end, epoch boundaries) with
the tags the training-job dashboard shows (``teye`` and the train_job name); from an install import it as
``from teye.grafana import annotate``.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, TextIO, Tuple
from urllib.parse import urlparse

from teye.grafana import Grafana, GrafanaError
from teye.grafana import annotate as _annotate

from .generate import JSON_DIR, MODULES

DEFAULT_TIMEOUT_S = 10.0


class PushError(Exception):
    """A problem that stops the push before any dashboard is tried (bad URL, missing library)."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status  # exit status: 2 for a usage error, 1 otherwise


@dataclass
class Report:
    uploaded: List[Tuple[str, str, str]] = field(default_factory=list)   # (uid, title, url)
    failed: List[Tuple[str, str, str]] = field(default_factory=list)     # (uid, title, reason)
    skipped: List[Tuple[str, str]] = field(default_factory=list)         # (uid, title): not tried after a fatal error

    @property
    def ok(self) -> bool:
        return not self.failed and not self.skipped

    def summary(self) -> str:
        up = ", ".join(uid for uid, _, _ in self.uploaded) or "none"
        not_up = [uid for uid, _, _ in self.failed] + [uid for uid, _ in self.skipped]
        total = len(self.uploaded) + len(not_up)
        return (f"uploaded {len(self.uploaded)} of {total} dashboards: {up}; "
                f"not uploaded: {', '.join(not_up) or 'none'}")


def load_dashboards(json_dir: str = JSON_DIR) -> List[dict]:
    """The committed dashboard JSON, in push order (generated on the fly when the files are absent)."""
    out = []
    missing = False
    for name in MODULES:
        path = os.path.join(json_dir, name)
        try:
            with open(path, encoding="utf-8") as fh:
                out.append(json.load(fh))
        except FileNotFoundError:
            missing = True
            break
        except json.JSONDecodeError as e:
            raise PushError(f"dashboard file {path} is not valid JSON ({e}); run: python -m dashboards.generate")
    if missing:
        try:
            from .generate import render_all
        except ImportError as e:  # pragma: no cover - depends on the installed extras
            raise PushError(f"dashboard JSON not found under {json_dir} and cannot be generated ({e}); "
                            "install teye[dashboards]") from None
        out = [json.loads(text) for text in render_all().values()]
    return out


def _check_url(url: str) -> None:
    u = urlparse(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise PushError(f"--url must be an http(s) URL such as http://grafana:3000, got {url!r}", status=2)


def _api(url: str, token: str, timeout: float) -> Grafana:
    return Grafana(url, token, timeout)


def _reason(e: BaseException, url: str) -> Tuple[str, bool]:
    """(one-line reason, fatal?) for an exception raised while talking to Grafana."""
    if isinstance(e, GrafanaError):
        if e.status == 401:
            return f"Grafana at {url} rejected the token (401 Unauthorized)", True
        if e.status == 403:
            return f"Grafana refused it (403 Forbidden: {e.message}); the token needs the Editor role", False
        if 300 <= e.status < 400:
            return f"Grafana at {url} answered with a redirect ({e.status}), not followed: give its final URL", True
        if e.status == 0:
            return f"Grafana at {url} answered oddly: {e.message}", True
        return f"Grafana rejected it ({e.status}: {e.message})", False
    # connection refused, DNS failure, TLS error, timeout: OSError (urllib's URLError among them)
    inner = getattr(e, "reason", None)
    shown = inner if isinstance(inner, BaseException) else e
    first = str(shown).splitlines()[0] if str(shown) else type(shown).__name__
    return f"cannot reach Grafana at {url} ({type(shown).__name__}: {first})", True


def _slug(name: str) -> str:
    s = "".join(c if c.isalnum() or c in "-_" else "-" for c in name.lower()).strip("-")
    return (s or "teye")[:40]


def ensure_folder(api, name: str) -> str:
    """uid of the folder titled ``name``, created when it does not exist."""
    for f in api.folders():
        if f.get("title") == name:
            return f["uid"]
    created = api.create_folder(name, uid=_slug(name))
    return created["uid"]


def push(url: str, token: str, folder: str, dashboards: Sequence[dict], out: Optional[TextIO] = None,
         err: Optional[TextIO] = None, timeout: float = DEFAULT_TIMEOUT_S) -> Report:
    """Upload ``dashboards``; prints one line per dashboard (to ``out``/``err``, default stdout/stderr)."""
    out = out or sys.stdout
    err = err or sys.stderr
    _check_url(url)
    api = _api(url, token, timeout)
    report = Report()
    base = url.rstrip("/")
    todo = list(dashboards)
    try:
        folder_uid = ensure_folder(api, folder)
    except (GrafanaError, OSError) as e:
        reason, _ = _reason(e, url)
        first = todo[0]
        print(f"teye: dashboard '{first.get('title')}' (uid {first.get('uid')}) not uploaded: "
              f"folder '{folder}': {reason}", file=err)
        report.failed.append((first.get("uid"), first.get("title"), f"folder '{folder}': {reason}"))
        report.skipped.extend((d.get("uid"), d.get("title")) for d in todo[1:])
        return report
    for i, dash in enumerate(todo):
        uid, title = dash.get("uid"), dash.get("title")
        body = dict(dash)
        body["id"] = None        # Grafana matches by uid; a foreign numeric id would conflict
        body.pop("version", None)
        try:
            resp = api.save_dashboard({"dashboard": body, "folderUid": folder_uid, "overwrite": True,
                                       "message": "teye dashboards push"})
        except (GrafanaError, OSError) as e:
            reason, fatal = _reason(e, url)
            print(f"teye: dashboard '{title}' (uid {uid}) not uploaded: {reason}", file=err)
            report.failed.append((uid, title, reason))
            if fatal:
                report.skipped.extend((d.get("uid"), d.get("title")) for d in todo[i + 1:])
                break
            continue
        link = base + resp["url"] if isinstance(resp, dict) and resp.get("url") else base
        version = resp.get("version") if isinstance(resp, dict) else None
        report.uploaded.append((uid, title, link))
        print(f"uploaded '{title}' (uid {uid}{f', version {version}' if version else ''}) -> {link}", file=out)
    return report


ENV_TOKEN = "GRAFANA_TOKEN"


def token_from(args, environ=None) -> str:
    """The token: --token-file (its first line, stripped), --token, or $GRAFANA_TOKEN; PushError(status 2) if
    none, or the file cannot be read or is empty."""
    env = os.environ if environ is None else environ
    path = getattr(args, "token_file", None)
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                token = fh.readline().strip()
        except OSError as e:
            raise PushError(f"cannot read the token file {path}: {e.strerror or e}", status=2) from None
        if not token:
            raise PushError(f"the token file {path} is empty", status=2)
        return token
    token = getattr(args, "token", None) or env.get(ENV_TOKEN, "").strip()
    if not token:
        raise PushError(f"no Grafana token: pass --token-file FILE or set {ENV_TOKEN}", status=2)
    return token


def main(args) -> int:
    """Entry point of `teye dashboards push` (args: url, token_file, token, folder)."""
    try:
        token = token_from(args)
        dashboards = load_dashboards()
        report = push(args.url, token, args.folder, dashboards)
    except PushError as e:
        print(f"teye: {e}", file=sys.stderr)
        return e.status
    stream = sys.stdout if report.ok else sys.stderr
    print(("teye: " if not report.ok else "") + report.summary(), file=stream)
    return 0 if report.ok else 1


def annotate(url: str, token: str, train_job: str, text: str, kind: str = "event",
             time_ms: Optional[int] = None, time_end_ms: Optional[int] = None,
             timeout: float = 5.0) -> Optional[Dict]:
    """:func:`teye.grafana.annotate` (the name an install documents): kept here for existing callers."""
    return _annotate(url, token, train_job, text, kind, time_ms, time_end_ms, timeout)
