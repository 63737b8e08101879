"""Helpers for the GPU tests: a fake-NVML-backed source on a simulated clock, and exposition."""
from __future__ import annotations

import os

from prometheus_client import generate_latest

from agent.context import AgentContext
from agent.gpu.source import GpuSource
from agent.sampler import Sampler
from exporters.prometheus import make_registry
from tests.conftest import DATA, parse_exposition

GPU_DATA = os.path.join(DATA, "gpu")
GPU_PROCFS = os.path.join(GPU_DATA, "proc")
TRACE_8GPU = os.path.join(GPU_DATA, "synthetic-8gpu.jsonl")
MONO_OFFSET_NS = 1_699_000_000_000_000_000  # the simulated CLOCK_MONOTONIC runs this far behind the wall clock


def make_source(fake, **kw) -> GpuSource:
    """A GpuSource over the fake, with the fake's clock as wall clock and a shifted monotonic clock."""
    ctx = kw.pop("ctx", None) or AgentContext(clock=lambda: fake.now_us * 1000 - MONO_OFFSET_NS)
    kw.setdefault("events", False)
    kw.setdefault("procfs", GPU_PROCFS)
    return GpuSource(lambda: fake, ctx=ctx, wall_ns=lambda: fake.now_us * 1000, **kw)


def exposition(source, clock=None) -> str:
    """Read the source once through the real sampler and exporter; the Prometheus text."""
    sampler = Sampler({"gpu": (source, 1.0)}, clock=clock or source.ctx.clock)
    sampler.read_once("gpu")
    return generate_latest(make_registry(lambda: sampler.snapshot)).decode()


def values(text: str):
    return parse_exposition(text)


def value(parsed, name: str, /, **labels) -> float:
    return parsed[(name, tuple(sorted(labels.items())))]
