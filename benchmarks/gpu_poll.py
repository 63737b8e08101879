"""Cost of the GPU source: one full poll per GPU, and the agent's CPU with the 8-GPU replay trace.

    python benchmarks/gpu_poll.py [--polls 400] [--agent-seconds 45] [--skip-agent]

1. One full GPU poll (ring, utilization, memory, power, energy, temperature, clocks, PCIe,
   clock events, ECC/retired/remapped, GPM, processes) through the real backend and source,
   timed with perf_counter around ``collect()``; the median over --polls polls, divided by the
   number of GPUs.  Backends: the tests' fake pynvml (8 GPUs, GPM, one process each), the
   replay of tests/data/gpu/synthetic-8gpu.jsonl (fast-forwarded), and real NVML when present.
2. ``teye agent --gpu-replay tests/data/gpu/synthetic-8gpu.jsonl`` at default settings (GPU
   source every 1 s, XID thread on), once with only the gpu collector enabled and once with the
   default collector set; CPU = utime+stime from /proc/<pid>/stat over --agent-seconds after a
   5 s warm-up, scraped every 15 s.  Reported as CPU seconds per minute.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from agent.context import AgentContext  # noqa: E402
from benchmarks._proc import cpu_seconds  # noqa: E402
from agent.errors import SourceUnavailable  # noqa: E402
from agent.gpu.nvml import load_pynvml  # noqa: E402
from agent.gpu.replay import Replay  # noqa: E402
from agent.gpu.source import GpuSource  # noqa: E402
from tests.gpu.fake_pynvml import FakeGpu, FakeNvml, Timeline  # noqa: E402
from tests.procs import REPO, free_port, wait_http  # noqa: E402

TRACE = os.path.join(REPO, "tests", "data", "gpu", "synthetic-8gpu.jsonl")
OTHER_COLLECTORS = ("cpu", "memory", "disk", "network", "infiniband", "nfs", "nfsd", "pressure", "phases")



def time_polls(src: GpuSource, advance, polls: int) -> list:
    src.collect()
    advance()
    src.collect()
    out = []
    for _ in range(polls):
        advance()
        t = time.perf_counter()
        src.collect()
        out.append(time.perf_counter() - t)
    src.close()
    return out


def bench_fake(polls: int):
    t0 = 1_700_000_000_000_000
    tl = Timeline([(t0 + k * 1_000_000, t0 + k * 1_000_000 + 600_000) for k in range(-20, polls + 20)])
    gpus = [FakeGpu(i, timeline=tl, ring_start_us=t0 - 100 * 166_667) for i in range(8)]
    for g in gpus:
        g.processes = [(40000 + g.index, 1 << 30)]
    fake = FakeNvml(gpus, now_us=t0)
    src = GpuSource(lambda: fake, ctx=AgentContext(clock=lambda: fake.now_us * 1000), events=False,
                    wall_ns=lambda: fake.now_us * 1000, procfs="/nonexistent")
    return time_polls(src, lambda: fake.advance(1.0), polls), 8


def bench_replay(polls: int):
    now = [5_000_000_000_000_000]
    rp = Replay.load(TRACE, wall_us=lambda: now[0], sleep=lambda s: None)
    src = GpuSource(lambda: rp, ctx=AgentContext(clock=lambda: now[0] * 1000), events=False,
                    wall_ns=lambda: now[0] * 1000, procfs="/nonexistent")

    def advance():
        now[0] += 1_000_000
    return time_polls(src, advance, polls), 8


def bench_nvml(polls: int):
    src = GpuSource(load_pynvml, ctx=AgentContext(), events=False)
    try:
        src.collect()
    except SourceUnavailable as e:
        return None, str(e)
    n = len(src.devices)
    return time_polls(src, lambda: time.sleep(0.2), polls), n


def agent_cpu(seconds: float, gpu_only: bool) -> float:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        args = [sys.executable, "-m", "agent", "agent", "--listen", f"127.0.0.1:{port}", "--gpu-replay", TRACE,
                "--log-level", "warning"]
        if gpu_only:
            cfg = os.path.join(tmp, "teye.yaml")
            with open(cfg, "w") as fh:
                fh.write("collectors:\n" + "".join(f"  {c}: {{enabled: false}}\n" for c in OTHER_COLLECTORS))
            args += ["--config", cfg]
        proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            wait_http(url, proc=proc)
            time.sleep(5)
            c0, t0 = cpu_seconds(proc.pid), time.monotonic()
            next_scrape = t0
            while time.monotonic() - t0 < seconds:
                if time.monotonic() >= next_scrape:
                    urllib.request.urlopen(url, timeout=10).read()
                    next_scrape += 15
                time.sleep(0.5)
            c1, t1 = cpu_seconds(proc.pid), time.monotonic()
        finally:
            proc.terminate()
            proc.wait(10)
    return (c1 - c0) / (t1 - t0) * 60


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--polls", type=int, default=400)
    ap.add_argument("--agent-seconds", type=float, default=45.0)
    ap.add_argument("--skip-agent", action="store_true")
    a = ap.parse_args()
    print(f"{'measurement':58s} {'value':>14s}")
    for label, fn in (("fake pynvml", bench_fake), ("replay of synthetic-8gpu.jsonl", bench_replay),
                      ("real NVML", bench_nvml)):
        times, n = fn(a.polls if label != "real NVML" else min(a.polls, 50))
        if times is None:
            print(f"{'one full poll per GPU, ' + label:58s} {'n/a':>14s}  ({n})")
            continue
        med = statistics.median(times) / n * 1e6
        p90 = sorted(times)[int(0.9 * len(times))] / n * 1e6
        print(f"{'one full poll per GPU, ' + label + f' ({n} GPUs), median':58s} {med:11.0f} us  (p90 {p90:.0f} us)")
    if not a.skip_agent:
        for gpu_only in (True, False):
            what = "gpu collector only" if gpu_only else "default collectors"
            cpm = agent_cpu(a.agent_seconds, gpu_only)
            print(f"{'agent CPU, 8-GPU replay, ' + what:58s} {cpm:9.2f} s/min  ({cpm / 60 * 100:.2f} % of a core)")


if __name__ == "__main__":
    main()
