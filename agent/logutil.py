"""Rate-limited logging: one line per key per interval, with a count of what was suppressed."""
from __future__ import annotations

import logging
import threading
import time
from typing import Dict, Tuple


def setup_logging(level: str) -> None:
    """The agent's log format on stderr at ``level`` (debug, info, warning, error)."""
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


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
