"""`teye agent`: build sources from config, start the sampler and the HTTP server, stop on a signal."""
from __future__ import annotations

import dataclasses
import logging
import signal
import threading
from typing import Any, Dict, Optional

from . import config as config_mod
from . import sources as sources_mod
from .errors import ConfigError, SourceUnavailable
from .sampler import Sampler

log = logging.getLogger("teye.agent")


class DownSource:
    """Stands in for a source that cannot run here; it reports itself down with the reason."""

    def __init__(self, name: str, reason: str):
        self.name = name
        self.reason = reason

    def collect(self):
        raise SourceUnavailable(self.reason)


def build_sources(cfg: Dict[str, Any], ctx=None) -> Dict[str, tuple]:
    """name -> (source, interval) for every enabled collector.

    ConfigError propagates (the agent exits 2); a source that cannot run here is
    replaced by a DownSource so ``teye_collector_up`` says so.
    """
    out = {}
    for name, ccfg in cfg["collectors"].items():
        if not ccfg["enabled"]:
            continue
        try:
            src = sources_mod.build(name, cfg, ctx)
        except SourceUnavailable as e:
            log.info("collector %s unavailable: %s", name, e)
            src = DownSource(name, str(e))
        out[name] = (src, ccfg["interval_seconds"])
    return out


def health(sampler: Sampler) -> Optional[str]:
    """/healthz: ok while the sampler threads are publishing."""
    return None if sampler.snapshot.sources is not None else "sampler not running"


def run(cfg: Dict[str, Any], stop_event: Optional[threading.Event] = None) -> int:
    """Run until SIGTERM/SIGINT (or stop_event); returns the exit status."""
    from exporters.http import Limits, MetricsServer, registry_renderer
    from exporters.webconfig import WebConfig
    from exporters.webstats import WebStats
    from exporters.prometheus import make_registry

    from .context import AgentContext
    web = WebConfig(cfg["web"]["config_file"])  # a bad web config fails before anything is opened
    srcs = build_sources(cfg, AgentContext())
    sampler = Sampler(srcs)
    stats = WebStats()  # the server counts into it, every scrape formats it
    registry = make_registry(lambda: sampler.snapshot, cfg["stale_after_seconds"], extra=stats.state)
    host, port = config_mod.split_hostport(cfg["listen"])
    # sources that open descriptors on their first read (perf events) say how many, so the
    # connection budget leaves them room
    later = sum(src.fds_wanted() for src, _ in srcs.values() if hasattr(src, "fds_wanted"))
    limits = dataclasses.replace(Limits.from_config(cfg["web"]), reserved_fds=later)
    try:
        server = MetricsServer(host, port, registry_renderer(registry), lambda: health(sampler), web, limits,
                               stats)
    except OSError as e:
        for src, _ in srcs.values():
            close = getattr(src, "close", None)
            if close:
                close()
        raise ConfigError(f"cannot listen on {cfg['listen']}: {e.strerror or e}") from None
    stop = stop_event or threading.Event()

    def _on_signal(signum, _frame):
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)
    sampler.start()
    server.start()
    h, p = server.address
    log.info("teye agent listening on %s://%s:%d/metrics (at most %d connections) with collectors: %s",
             server.scheme, h, p, server.max_connections, ", ".join(srcs))
    try:
        while not stop.wait(2.0):  # a signal handler sets stop, which wakes this at once
            pass
    finally:
        server.stop()
        sampler.stop()
    log.info("stopped")
    return 0
