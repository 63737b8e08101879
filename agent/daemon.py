"""`teye agent`: build sources from config, start the sampler and the HTTP server, stop on a signal."""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from typing import Any, Dict, Optional

from . import config as config_mod
from . import sources as sources_mod
from .errors import ConfigError, SourceUnavailable
from .sampler import Sampler

log = logging.getLogger("teye.agent")


class DownSource:
    """Stands in for a source that cannot run here; it reports itself down with the reason."""

    def __init__(self, name: str, reason: str, error: type = SourceUnavailable):
        self.name = name
        self.reason = reason
        self.error = error      # HardwareAbsent stays absent (no alert), anything else is down

    def collect(self):
        raise self.error(self.reason)


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
        except SourceUnavailable as e:  # said in the start-up line (and by the sampler on its first read)
            src = DownSource(name, str(e), type(e))
        out[name] = (src, ccfg["interval_seconds"])
    return out


def collectors_line(cfg: Dict[str, Any], snapshot) -> str:
    """What the start-up line says of the collectors after their first read: which run, which are absent (the
    node has no such hardware) and which down, each with why, which have not finished a read yet, which the
    configuration disables."""
    states = list(snapshot.sources.values())
    running = [st.name for st in states if st.state == "up"]
    absent = [f"{st.name} ({st.error})" for st in states if st.state == "absent"]
    down = [f"{st.name} ({st.error})" for st in states if st.state == "down"]
    pending = [st.name for st in states if st.state == "pending"]
    off = [n for n, c in cfg["collectors"].items() if not c["enabled"]]
    parts = [f"collectors running: {', '.join(running) or 'none'}"]
    if absent:
        parts.append(f"absent ({len(absent)}, no such hardware here; not an alert): {'; '.join(absent)}")
    if down:
        parts.append(f"down ({len(down)}): {'; '.join(down)}")
    if pending:
        parts.append(f"first read not finished: {', '.join(pending)}")
    if off:
        parts.append(f"disabled in the configuration: {', '.join(off)}")
    return "; ".join(parts)


def first_reads(sampler: Sampler, stop: threading.Event, timeout_s: float) -> None:
    """Wait until every source has completed one read (or timeout_s, or stop)."""
    deadline = time.monotonic() + timeout_s
    while not all(st.reads for st in sampler.snapshot.sources.values()):
        left = deadline - time.monotonic()
        if left <= 0 or stop.wait(min(0.05, left)):
            return


def health(sampler: Sampler) -> Optional[str]:
    """/healthz: ok while the sampler threads are publishing."""
    return None if sampler.snapshot.sources is not None else "sampler not running"


def trace_webhook(cfg: Dict[str, Any], srcs: Dict[str, tuple], sampler: Sampler, web) -> Dict[str, tuple]:
    """The web server's POST paths: the trace webhook where ``trace.webhook`` is on (agent/trace/webhook.py).
    ConfigError where it is on without basic auth in the web config, or without the phases collector."""
    tcfg = cfg["trace"]
    if not tcfg["webhook"]:
        return {}
    if not web.has_users:
        raise ConfigError("trace.webhook needs basic auth: the web config (web.config_file) has no "
                          "basic_auth_users (docs/trace.md, \"The trace webhook\")")
    phases = srcs.get("phases")
    if phases is None:
        raise ConfigError("trace.webhook needs the phases collector (collectors.phases.enabled)")
    from .trace.webhook import MAX_BODY, Webhook

    def jobs():
        st = sampler.snapshot.state("phases")
        return st.reading.jobs if st is not None and st.reading is not None else ()
    hook = Webhook(jobs, os.path.join(os.path.dirname(phases[0].path), "trace"), tcfg["steps"],
                   tcfg["job_interval_seconds"], tcfg["node_interval_seconds"])
    return {"/-/trace": (hook.handle, MAX_BODY)}


def run(cfg: Dict[str, Any], stop_event: Optional[threading.Event] = None, required=()) -> int:
    """Run until SIGTERM/SIGINT (or stop_event); returns the exit status.  ``required``: the collectors the
    configuration turned on explicitly (absent hardware is a failure for them)."""
    from exporters import lean
    lean.import_asyncio(cfg["web"]["config_file"])   # (no web config, no TLS: no OpenSSL mapped, 5 MiB)
    from exporters.http import Limits, MetricsServer, bind_listener
    from exporters.webconfig import WebConfig
    from exporters.webstats import WebStats
    from exporters.render import Exposition
    from exporters.selfstats import ProcessStats, chain, wall_clock

    from .context import AgentContext
    from . import heap
    heap.limit_arenas()   # before any thread starts: two malloc arenas for ~30 threads (agent/heap.py)
    web = WebConfig(cfg["web"]["config_file"])  # a bad web config fails before anything is opened
    host, port = config_mod.split_hostport(cfg["listen"])
    # the port first: taken, the agent stops (exit 2) before any source opens a file or binds its socket
    try:
        listener = bind_listener(host, port)
    except OSError as e:
        raise ConfigError(f"cannot listen on {cfg['listen']}: {e.strerror or e}") from None
    for key, what in (("procfs", "/proc"), ("sysfs", "/sys")):
        root = cfg[key]
        if not os.path.isdir(root):  # a container started without the host's filesystem mounted: say it once
            log.warning("--%s %s does not exist: is the host's %s mounted there? (the DaemonSet mounts it "
                        "read-only at /host%s); the collectors that read it are down", key, root, what, what)
    try:
        srcs = build_sources(cfg, AgentContext())
    except BaseException:
        listener.close()
        raise
    sampler = Sampler(srcs, required=required)
    stats = WebStats()  # the server counts into it, every scrape formats it
    # the agent's own process_* series (as client_python's process collector defines them) beside the web
    # server's counters; teye formats /metrics itself, prometheus_client's registry is made only where a
    # scrape needs its encoder
    get, stale = (lambda: sampler.snapshot), cfg["stale_after_seconds"]
    extra, hidden = chain(stats.state, ProcessStats().state, wall_clock()), config_mod.hidden_collectors(cfg)

    def registry():   # prometheus_client's encoder, for the scrapes teye's own cannot answer (render.negotiate)
        from exporters.prometheus import make_registry
        return make_registry(get, stale, extra=extra, hidden=hidden)
    metrics = Exposition(get, stale, fallback=registry, extra=extra, hidden=hidden)
    # sources that open descriptors on their first read (perf events) say how many, so the
    # connection budget leaves them room
    later = sum(src.fds_wanted() for src, _ in srcs.values() if hasattr(src, "fds_wanted"))
    limits = dataclasses.replace(Limits.from_config(cfg["web"]), reserved_fds=later)
    server = MetricsServer(host, port, metrics.render, lambda: health(sampler), web, limits,
                           stats, listener=listener, posts=trace_webhook(cfg, srcs, sampler, web))
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
    # serving already; the line waits for the first reads so that it can say which collectors are down and why
    first_reads(sampler, stop, min(10.0, cfg["stale_after_seconds"]))
    heap.freeze()   # start-up's objects out of the full collections' way (agent/heap.py)
    heap.trim()   # start-up's transient allocations are freed: give their pages back
    log.info("teye agent listening on %s://%s/metrics (at most %d connections); %s",
             server.scheme, config_mod.join_hostport(h, p), server.max_connections,
             collectors_line(cfg, sampler.snapshot))
    try:
        # a signal handler sets stop, which wakes this at once (a lock's wait is interrupted by signals on POSIX
        # since Python 3.2): no timeout, so an idle agent's main thread never wakes (it woke every 2 s)
        stop.wait()
    finally:
        server.stop()
        sampler.stop()
    log.info("stopped")
    return 0
