"""Sources: one module per subsystem.  Each reads only under its configured roots.

A source is an object with:
  - ``name``: the collector label (``teye_collector_up{collector=name}``);
  - ``collect()``: read the subsystem once and return an immutable reading whose
    ``points()`` yields :class:`agent.metrics.Point` values.  It raises
    ``ParseError`` / ``OSError`` / ``SourceUnavailable`` on failure; the sampler
    turns those into ``teye_collector_up=0`` and a rate-limited log line;
  - optionally ``close()`` (stop threads, release handles).

``build(name, cfg)`` constructs a source from the validated config.
"""
from __future__ import annotations

import importlib
from typing import Any, Dict

# Collector name -> "module:factory"; the factory takes (cfg, ctx: agent.context.AgentContext)
# and returns a source.
FACTORIES = {
    "cpu": "agent.sources.cpu:from_config",
    "memory": "agent.sources.memory:from_config",
    "disk": "agent.sources.disk:from_config",
    "network": "agent.sources.network:from_config",
    "netclass": "agent.sources.netclass:from_config",
    "netstat": "agent.sources.netstat:from_config",
    "qdisc": "agent.sources.qdisc:from_config",
    "infiniband": "agent.sources.infiniband:from_config",
    "nfs": "agent.sources.nfs:from_config",
    "nfsd": "agent.sources.nfsd:from_config",
    "pressure": "agent.sources.pressure:from_config",
    "loadavg": "agent.sources.loadavg:from_config",
    "filesystem": "agent.sources.filesystem:from_config",
    "vmstat": "agent.sources.vmstat:from_config",
    "timex": "agent.sources.timex:from_config",
    "os": "agent.sources.osinfo:from_config",
    "edac": "agent.sources.edac:from_config",
    "hwmon": "agent.sources.hwmon:from_config",
    "textfile": "agent.sources.textfile:from_config",
    "systemd": "agent.sources.systemd:from_config",
    "jobs": "agent.sources.cgroups:from_config",
    "allocation": "agent.sources.allocation:from_config",
    "gpu": "agent.gpu.source:from_config",
    "pmu": "agent.pmu.source:from_config",
    "phases": "agent.phases.source:from_config",
}


def factory(name: str):
    mod, _, fn = FACTORIES[name].partition(":")
    return getattr(importlib.import_module(mod), fn)


def build(name: str, cfg: Dict[str, Any], ctx=None):
    """Construct the named source from the validated config and the shared agent context."""
    from ..context import AgentContext
    return factory(name)(cfg, ctx if ctx is not None else AgentContext())
