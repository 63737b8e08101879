"""Logging set-up (text, logfmt or JSON lines; no timestamp of its own under journald) and rate-limited logging:
one line per key per interval, with a count of what was suppressed."""
from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from typing import Dict, Tuple


def under_journald(environ=os.environ, stream=None) -> bool:
    """Whether stderr is journald's stream: systemd sets JOURNAL_STREAM to its "device:inode" (a child that
    inherited the variable but writes elsewhere keeps its timestamps)."""
    want = environ.get("JOURNAL_STREAM", "")
    dev, sep, ino = want.partition(":")
    if not sep or not dev.isdigit() or not ino.isdigit():
        return False
    try:
        st = os.fstat((stream or sys.stderr).fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


def _logfmt_value(v: str) -> str:
    if v and not any(c in v for c in ' "=\\\n\t'):
        return v
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t") + '"'


class StructuredFormatter(logging.Formatter):
    """One record as logfmt (``ts=... level=info logger=teye.agent msg="..."``, go-kit's keys as node_exporter
    writes them) or as one JSON object with the same keys; ``ts`` left out where journald stamps the line."""

    def __init__(self, kind: str, timestamps: bool = True):
        super().__init__()
        self.kind = kind
        self.timestamps = timestamps

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if record.exc_info:
            msg = msg + "\n" + self.formatException(record.exc_info)
        fields = {}
        if self.timestamps:
            fields["ts"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + \
                ".%03dZ" % int(record.msecs)
        fields.update(level=record.levelname.lower(), logger=record.name, msg=msg)
        if self.kind == "json":
            return json.dumps(fields, ensure_ascii=False)
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in fields.items())


def setup_logging(level: str, fmt: str = "text", environ=os.environ) -> None:
    """The agent's log lines on stderr at ``level`` (debug, info, warning, error) in ``fmt`` (text, logfmt,
    json); under journald without a timestamp of their own (journald adds one to every line)."""
    stamped = not under_journald(environ)
    handler = logging.StreamHandler()
    if fmt in ("logfmt", "json"):
        handler.setFormatter(StructuredFormatter(fmt, stamped))
    else:
        handler.setFormatter(logging.Formatter(("%(asctime)s " if stamped else "") +
                                               "%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])


class RateLimitedLog:
    def __init__(self, logger: logging.Logger, interval_s: float = 60.0, clock=time.monotonic):
        self._log = logger
        self._interval = interval_s
        self._clock = clock
        self._last: Dict[str, Tuple[float, int]] = {}
        self._lock = threading.Lock()

    def log(self, level: int, key: str, msg: str, *args, exc_info=None) -> bool:
        """Log unless the same key logged within the interval; returns whether it logged."""
        now = self._clock()
        with self._lock:
            last, suppressed = self._last.get(key, (None, 0))
            if last is not None and now - last < self._interval:
                self._last[key] = (last, suppressed + 1)
                return False
            self._last[key] = (now, 0)
        if suppressed:
            msg = msg + " (%d similar messages suppressed)"
            args = args + (suppressed,)
        self._log.log(level, msg, *args, exc_info=exc_info)
        return True

    def warning(self, key: str, msg: str, *args) -> bool:
        return self.log(logging.WARNING, key, msg, *args)

    def error(self, key: str, msg: str, *args, exc_info=None) -> bool:
        return self.log(logging.ERROR, key, msg, *args, exc_info=exc_info)
