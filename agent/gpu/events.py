"""XID critical-error events: one thread blocked in nvmlEventSetWait, counting per GPU and XID code.

The wait has a timeout (``timeout_ms``, 1 s: the thread wakes once a second when no event comes), so
``stop()`` returns within about that long; the
counts are read by the GPU source at each poll (``counts()``, a copy).
"""
from __future__ import annotations

import logging
import threading
from typing import Dict, List, Tuple

from ..errors import SourceUnavailable
from ..logutil import RateLimitedLog
from .nvml import XID_EVENT, GpuLost, NvmlBackend, handle_key

log = logging.getLogger("teye.gpu.events")


class XidWatcher:
    def __init__(self, backend: NvmlBackend, devices: List[Tuple[str, object]], timeout_ms: int = 1000):
        """``devices``: [(gpu label, handle)] of physical GPUs."""
        self._backend = backend
        self._timeout_ms = int(timeout_ms)
        self._labels: Dict[object, str] = {}
        self._counts: Dict[Tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self._rlog = RateLimitedLog(log)
        self.registered: List[str] = []
        self._set = backend.event_set_create()
        if self._set is None:
            return
        for label, h in devices:
            try:
                ok = backend.register_xid(h, self._set)
            except GpuLost as e:
                log.warning("gpu %s: cannot register XID events: %s", label, e.reason)
                continue
            if ok:
                self._labels[handle_key(h)] = label
                self.registered.append(label)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self._set is None or not self.registered:
            return
        self._thread = threading.Thread(target=self._run, name="teye-gpu-xid", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                ev = self._backend.event_wait(self._set, self._timeout_ms)
            except GpuLost as e:
                self._rlog.warning("wait", "waiting for XID events: %s", e.reason)
                self._stop.wait(self._timeout_ms / 1000.0)
                continue
            except SourceUnavailable as e:
                log.warning("XID event thread stops: %s", e)
                return
            if ev is None or not int(ev.eventType) & XID_EVENT:
                continue
            label = self._labels.get(handle_key(ev.device))
            if label is None:
                continue
            key = (label, int(ev.eventData))
            with self._lock:
                self._counts[key] = self._counts.get(key, 0) + 1

    def counts(self) -> Dict[Tuple[str, int], int]:
        with self._lock:
            return dict(self._counts)

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._set is not None and not self.running:
            try:
                self._backend.event_set_free(self._set)
            except (GpuLost, SourceUnavailable) as e:
                log.debug("freeing the event set: %s", e)
            self._set = None
