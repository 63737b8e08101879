"""`teye report`: resolve where Prometheus is, build the report, print it, return its exit status."""
from __future__ import annotations

import datetime
import math
import os
import re
import sys
import time
from typing import Optional

EXIT_USAGE = 2

ENV_URL = "TEYE_PROMETHEUS_URL"
_REL = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
LATEST_TIME = 253402300799.0        # 9999-12-31T23:59:59Z: the last time an ISO date can name
MIN_SUMMARY_BYTES = 64              # --max-bytes: room for the smallest summary that still parses


def _finite(name: str, value, low: float, high: float, integer: bool = False) -> float:
    """``value`` as a number in [low, high] (a flag or config key named ``name``), else ValueError."""
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} {value!r} is not a number") from None
    if not math.isfinite(x) or not low <= x <= high or (integer and x != int(x)):
        kind = "a whole number" if integer else "a number"
        raise ValueError(f"{name} {value!r} must be {kind} from {low:g} to {high:g}")
    return x


def parse_time(text: str, now: Optional[float] = None) -> float:
    """Unix seconds, RFC 3339 / ISO 8601 ('2026-11-24T03:00:00Z', '2026-11-24'), or a duration ago ('2h', '7d')."""
    text = text.strip()
    now = time.time() if now is None else now
    m = _REL.match(text)
    if m:
        t = now - float(m.group(1)) * _UNIT[m.group(2)]
    else:
        try:
            t = float(text)
        except ValueError:
            try:
                d = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
            except ValueError:
                raise ValueError(f"cannot read time {text[:80]!r}: give unix seconds, an ISO time "
                                 f"(2026-11-24T03:00:00Z) or a duration ago (2h, 7d)") from None
            if d.tzinfo is None:
                d = d.replace(tzinfo=datetime.timezone.utc)
            t = d.timestamp()
    if not (math.isfinite(t) and 0 <= t <= LATEST_TIME):
        raise ValueError(f"time {text[:80]!r} is out of range: it must fall between 1970 and 9999")
    return t


def parse_bytes(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B?)?\s*", text or "", re.I)
    if not m:
        raise ValueError(f"cannot read memory size {text!r} (e.g. 64G, 512M, 1048576)")
    x = float(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ").upper())
    if not (math.isfinite(x) and 1 <= x < 2 ** 63):
        raise ValueError(f"memory size {text[:80]!r} is out of range (1 byte to 8 EiB)")
    return x


def run(args, cfg) -> int:
    from . import render
    from .build import Request, build
    from .model import _iso
    from .prom import HttpConfig, Prometheus, PrometheusError
    rcfg = cfg.get("report", {})
    url = args.prometheus or os.environ.get(ENV_URL) or rcfg.get("prometheus_url")
    if not url:
        print(f"teye report: no Prometheus: give --prometheus URL, set {ENV_URL}, or report.prometheus_url in the "
              f"config file", file=sys.stderr)
        return EXIT_USAGE
    if not (args.slurm_job or args.train_job or args.user):
        print("teye report: name the jobs: --slurm-job ID, --train-job NAME or --user NAME --since T",
              file=sys.stderr)
        return EXIT_USAGE
    if getattr(args, "compare", None) is not None and (len(args.train_job or []) != 1 or args.slurm_job or args.user
                                                       or args.format not in ("text", "json")):
        print("teye report: --compare takes one --train-job NAME (no --slurm-job, --user) and --format text or json",
              file=sys.stderr)
        return EXIT_USAGE
    if args.user and not args.since and not (args.slurm_job or args.train_job):
        print("teye report: --user needs --since (and optionally --until)", file=sys.stderr)
        return EXIT_USAGE
    from .prom import DEFAULT_DEADLINE_S, DEFAULT_TIMEOUT_S, MAX_ANSWER_BYTES
    try:
        since = parse_time(args.since) if args.since else None
        until = parse_time(args.until) if args.until else None
        mem = parse_bytes(args.mem) if args.mem else None
        if args.cpus is not None:
            _finite("--cpus", args.cpus, 1, 1 << 20, integer=True)
        if args.step is not None:
            _finite("--step", args.step, 0.001, 366 * 86400)
        _finite("--max-bytes", args.max_bytes, MIN_SUMMARY_BYTES, 1 << 30, integer=True)
        timeout = _finite("--timeout" if args.timeout is not None else "report.timeout_seconds",
                          args.timeout if args.timeout is not None else rcfg.get("timeout_seconds", DEFAULT_TIMEOUT_S),
                          0.001, 86400)
        deadline = _finite("--deadline" if args.deadline is not None else "report.deadline_seconds",
                           args.deadline if args.deadline is not None else
                           rcfg.get("deadline_seconds", DEFAULT_DEADLINE_S), 0.001, 7 * 86400)
        cap = (parse_bytes(args.max_answer_size) if args.max_answer_size is not None else
               _finite("report.max_answer_bytes", rcfg.get("max_answer_bytes", MAX_ANSWER_BYTES), 1, 1 << 40,
                       integer=True))
    except ValueError as e:
        print(f"teye report: {e}", file=sys.stderr)
        return EXIT_USAGE
    grafana = (cfg.get("grafana") or {}).get("url")
    req = Request(slurm_jobs=[str(j) for j in args.slurm_job or []], train_jobs=list(args.train_job or []),
                  user=args.user, since=since, until=until, step=args.step, cpus=args.cpus, mem_bytes=mem,
                  grafana_url=grafana)
    try:
        http = HttpConfig.load(args.http_config_file or rcfg.get("http_config_file"))
        prom = Prometheus(url, http, timeout=timeout, deadline=deadline, max_answer_bytes=int(cap))
        doc = build(prom, req)
        if getattr(args, "compare", None) is not None:     # docs/report.md "Comparing runs"
            from . import compare
            return compare.run(args, prom, req, doc)
    except PrometheusError as e:
        print(f"teye report: {e}", file=sys.stderr)
        return e.exit_status
    except ValueError as e:
        print(f"teye report: {e}", file=sys.stderr)
        return EXIT_USAGE
    out = {"json": render.as_json, "markdown": lambda d: render.text(d, md=True),
           "text": render.text, "summary": lambda d: render.summary(d, args.max_bytes)}[args.format](doc)
    sys.stdout.write(out if out.endswith("\n") else out + "\n")
    for u in doc["unknown_jobs"]:
        print(f"teye report: unknown job {u}: no series in Prometheus between {_iso(doc['since'])} and "
              f"{_iso(doc['until'])} (wrong id, or the agents never saw its processes)", file=sys.stderr)
    for j in doc["jobs"]:
        for c in j["conditions"]:
            name = j["slurm_job"] or ",".join(j["train_jobs"])
            print(f"teye report: job {name}: {c['kind']}: {c['message']}", file=sys.stderr)
    return doc["exit_status"]


def add_parser(sub) -> None:
    """Register `teye report` on the CLI's subparsers."""
    r = sub.add_parser("report", help="per-job efficiency report from Prometheus (text, JSON, Markdown)")
    r.add_argument("--prometheus", metavar="URL", help=f"Prometheus base URL (else ${ENV_URL}, else "
                   f"report.prometheus_url in --config)")
    r.add_argument("--http.config.file", dest="http_config_file", metavar="FILE",
                   help="Prometheus HTTP client config (basic_auth, bearer_token_file, tls_config), as promtool's")
    r.add_argument("--slurm-job", action="append", metavar="ID", help="Slurm job id (repeatable)")
    r.add_argument("--train-job", action="append", metavar="NAME", help="training job name (repeatable)")
    r.add_argument("--user", metavar="NAME", help="every job of this user in --since/--until")
    r.add_argument("--since", metavar="TIME", help="start of the search (unix s, ISO time, or 2h/7d ago; default 7d)")
    r.add_argument("--until", metavar="TIME", help="end of the search (default now)")
    r.add_argument("--format", choices=["text", "json", "markdown", "summary"], default="text",
                   help="text with bars (default), json (stable keys), markdown, or summary (the epilog's "
                   "AdminComment)")
    r.add_argument("--compare", nargs="?", const="previous", metavar="RUN",
                   help="with one --train-job: its latest run beside an earlier one (previous; N runs back; or a "
                   "time inside it), each change judged against the runs' spread (docs/report.md)")
    r.add_argument("--max-bytes", type=int, default=1024, metavar="N",
                   help="--format summary: at most N bytes (default 1024; the epilog's AdminComment bound)")
    r.add_argument("--cpus", type=int, metavar="N", help="cores allocated to the job (for CPU efficiency)")
    r.add_argument("--mem", metavar="SIZE", help="memory requested (64G...), for the over-request note")
    r.add_argument("--step", type=float, metavar="SECONDS", help="query step (default: the scrape interval)")
    r.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="bound on each query, redirects and the whole answer included (default 30)")
    r.add_argument("--deadline", type=float, metavar="SECONDS",
                   help="bound on the whole report: past it, exit 4 (default 120)")
    r.add_argument("--max-answer-size", metavar="SIZE",
                   help="refuse a Prometheus answer larger than this (default 64M; exit 1)")
    r.add_argument("--config", metavar="FILE", help="agent config file (report.*, grafana.url)")
    r.set_defaults(func=_call)


def _call(args) -> int:
    from .. import config as config_mod
    cfg = config_mod.load(getattr(args, "config", None), {})
    return run(args, cfg)
