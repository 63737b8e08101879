#!/usr/bin/env python3
"""Generate tests/data/gpu/synthetic-8gpu.jsonl: a SYNTHETIC NVML trace of an 8-GPU node.

Nothing here was measured on hardware.  The trace is produced by running teye's own GPU
source through ``agent.gpu.record.Recorder`` on top of the tests' fake pynvml
(tests/gpu/fake_pynvml.py), with a simulated clock, so it contains exactly the calls the
backend makes.  Regenerate with::

    python tests/data/gpu/make_synthetic_trace.py

``--gpus N`` writes an N-GPU node instead (benchmarks/scrape.py uses 1 and 16): GPU i follows
the timeline of GPU i mod 8 below, the XID events are kept for the GPUs that exist.

Driver model: a utilization sample every P = 166 667 µs (1/6 s), value = percent of the
sample period that the ground-truth timeline below is busy; the ring keeps 100 samples.
The trace lasts D = 540 P = 90.00018 s (polled every second, plus a last poll at D) and
loops on replay.  Busy/idle ground truth per GPU (seconds from the trace start):

- GPU 0-3, data-parallel job starved by its input pipeline (the FaceNet case), rank i
  shifted by phi = 0.013 i: busy [0, 0.6+phi), then each second k = 1..89 a step busy
  [k+phi, k+0.6+phi) (the last one runs to D), i.e. an idle gap of 0.4 s before every
  step; steps k = 40..47 are skipped (checkpoint), giving one 8.4 s gap [39.6+phi, 48+phi).
  Gaps per GPU: 80 x 0.4 s and 1 x 8.4 s.  Busy ratio about 0.61.
- GPU 4, compute-bound: busy except [30.05, 32.25) (2.2 s) and [60.1, 64.7) (4.6 s).
- GPU 5, fine-grained: 90 ms busy / 10 ms idle every 100 ms for the whole trace: busy
  ratio 0.9 and no gap the ring can see (every gap is shorter than one sample period).
- GPU 6, a short job then idle: busy [0, 3.5), idle [3.5, D): the 86.5 s gap ends when the
  replay loops (at D), so it is observed once per loop, in the +Inf bucket.  Its process
  (pid 41040) exits at 3.5 s.
- GPU 7, a ladder of gaps separated by 2 s of work: 0.35, 0.7, 1.5, 3.5, 7, 15 and 40 s,
  starting at 2.0, 4.35, 7.05, 10.55, 16.05, 25.05 and 42.05 s; busy again from 82.05 s to D.

XID events: XID 13 on GPU 2 at 2.0 s, XID 31 on GPU 5 at 45.0 s.  Processes: pid 41000+i
on GPU i (0-3), 41004 on GPU 4, 41005 on GPU 5, 41040 on GPU 6 (until 3.5 s), 41007 on
GPU 7.  GPM is supported (H100), GPM values scale with the busy fraction.

The header records the ground truth (``truth``: gaps per GPU and busy seconds per GPU over
[0, D)) so tests compare what the replay yields against it.
"""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import pynvml  # noqa: E402  (constants only)

from agent.context import AgentContext  # noqa: E402
from agent.gpu.record import Recorder  # noqa: E402
from agent.gpu.source import GpuSource  # noqa: E402
from tests.gpu.fake_pynvml import GiB, FakeGpu, FakeNvml, Timeline  # noqa: E402

START_US = 1_700_000_000_000_000
PERIOD_US = 166_667
N_PERIODS = 540
DURATION_US = N_PERIODS * PERIOD_US
OUT = os.path.join(HERE, "synthetic-8gpu.jsonl")
XIDS = ((2_000_000, 2, 13), (45_000_000, 5, 31))  # (t µs, gpu, xid)
S = 1_000_000  # µs per second


def _us(seconds: float) -> int:
    return int(round(seconds * S))


def busy_intervals(gpu: int):
    """Ground-truth busy intervals of one GPU in µs relative to the trace start, within [0, D)."""
    d = DURATION_US
    gpu %= 8
    if gpu <= 3:
        phi = 0.013 * gpu
        out = [(0, _us(0.6 + phi))]
        for k in range(1, 90):
            if 40 <= k <= 47:
                continue
            out.append((_us(k + phi), d if k == 89 else _us(k + 0.6 + phi)))
        return out
    if gpu == 4:
        return [(0, _us(30.05)), (_us(32.25), _us(60.1)), (_us(64.7), d)]
    if gpu == 5:
        return [(k * 100_000, min(d, k * 100_000 + 90_000)) for k in range(d // 100_000 + 1)]
    if gpu == 6:
        return [(0, _us(3.5))]
    busy, t = [], 0.0
    for gap in (0.35, 0.7, 1.5, 3.5, 7.0, 15.0, 40.0):
        busy.append((_us(t), _us(t + 2.0)))
        t += 2.0 + gap
    busy.append((_us(t), d))
    return busy


def truth(n_gpus: int = 8) -> dict:
    """Gaps (seconds) and busy seconds per GPU over one loop [0, D)."""
    out = {}
    for g in range(n_gpus):
        iv = busy_intervals(g)
        gaps = [round((b - a) / S, 6) for (_, a), (b, _) in zip(iv, iv[1:]) if b > a]
        if g % 8 == 6:
            gaps.append(round((DURATION_US - iv[-1][1]) / S, 6))  # closed by the next loop
        out[str(g)] = {"gaps_s": gaps, "busy_s": sum(b - a for a, b in iv) / S}
    return out


def _timeline(gpu: int) -> Timeline:
    """Busy intervals on the fake's wall clock, repeated for the backlog before the start."""
    iv = busy_intervals(gpu)
    out = []
    for loop in (-1, 0):
        base = START_US + loop * DURATION_US
        out += [(base + a, base + b) for a, b in iv]
    return Timeline(out)


def build_fake(n_gpus: int = 8) -> FakeNvml:
    gpus = []
    for i in range(n_gpus):
        g = FakeGpu(i, timeline=_timeline(i), period_us=PERIOD_US, ring_start_us=START_US - 100 * PERIOD_US)
        g.uuid = f"GPU-5e7e0000-0000-4000-8000-{i:012d}"  # synthetic
        g.bus_id = f"{i // 8:08X}:{(0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)[i % 8]:02X}:00.0"
        g.ecc = (0, 0)
        g.remapped = (0, 0, 0, 0)
        g.energy_mj = 1_000_000_000 + i * 10_000_000
        gpus.append(g)
    return FakeNvml(gpus, now_us=START_US, ring_capacity=100, driver_version="550.54.15")


def set_state(fake: FakeNvml, t_us: int) -> None:
    """Slow-changing readings as functions of the busy fraction over the last second."""
    now = START_US + t_us
    for g in fake.gpus:
        f = g.timeline.busy_us(now - S, now) / S
        g.util_gpu, g.util_mem = int(round(100 * f)), int(round(45 * f))
        g.power_mw = int(70_000 + 580_000 * f)
        g.temperature = 35 + int(round(35 * f))
        g.sm_mhz = 1980 if f > 0 else 345
        g.pcie_gen = 5 if f > 0 else 1
        g.pcie_rx_kb, g.pcie_tx_kb = int(12_000_000 * f), int(800_000 * f)
        g.clock_events = 0x1 if f == 0 else (0x4 if f > 0.95 else 0x0)
        nvlink = 20_000.0 * f if g.index % 8 <= 3 else 0.0
        g.gpm_values = {pynvml.NVML_GPM_METRIC_SM_UTIL: round(90 * f, 1),
                        pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: round(50 * f, 1),
                        pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: round(60 * f, 1),
                        pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: round(35 * f, 1),
                        pynvml.NVML_GPM_METRIC_FP16_UTIL: round(5 * f, 1),
                        pynvml.NVML_GPM_METRIC_FP32_UTIL: round(10 * f, 1),
                        pynvml.NVML_GPM_METRIC_FP64_UTIL: 0.0,
                        pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: round(nvlink),
                        pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: round(nvlink)}
        k = g.index % 8
        pid = {0: 41000, 1: 41001, 2: 41002, 3: 41003, 4: 41004, 5: 41005, 6: 41040, 7: 41007}[k] + 100 * (g.index // 8)
        alive = not (k == 6 and t_us >= 3_500_000)
        g.processes = [(pid, 60 * GiB if k <= 3 else 30 * GiB)] if alive else []
        g.memory_used = (2 * GiB + (g.processes[0][1] if g.processes else 0))


def advance_energy(fake: FakeNvml, seconds: float) -> None:
    for g in fake.gpus:
        g.energy_mj += int(g.power_mw * seconds)


def generate(path: str = OUT, n_gpus: int = 8) -> str:
    fake = build_fake(n_gpus)
    ctx = AgentContext(clock=lambda: fake.now_us * 1000)
    header = {"synthetic": True, "host": f"synthetic-{n_gpus}gpu", "tool": "tests/data/gpu/make_synthetic_trace.py",
              "description": f"SYNTHETIC {n_gpus}-GPU node (not measured): see the generator's docstring for the "
                             "busy/idle timelines and XID events",
              "sample_period_us": PERIOD_US, "truth": truth(n_gpus)}
    poll_times = [k * S for k in range(90)] + [DURATION_US]
    with open(path, "w", encoding="utf-8") as out:
        rec = Recorder(fake, out, clock_us=lambda: fake.now_us, header=header)
        # events=True records the XID registration; the fake's event queue stays empty (the XID
        # records below are written at their simulated times instead)
        src = GpuSource(lambda: rec, procfs=os.path.join(HERE, "no-such-procfs"), ctx=ctx, events=True,
                        event_timeout_ms=20, wall_ns=lambda: fake.now_us * 1000)
        prev = -1
        for t in poll_times:
            advance_energy(fake, (t - (fake.now_us - START_US)) / S)
            fake.now_us = START_US + t
            set_state(fake, t)
            for at, gpu, xid in XIDS:
                if prev < at <= t and gpu < n_gpus:
                    ev = pynvml.c_nvmlEventData_t()
                    ev.device, ev.eventType, ev.eventData = fake.gpus[gpu].handle, pynvml.nvmlEventTypeXidCriticalError, xid
                    ev.gpuInstanceId = ev.computeInstanceId = 0xFFFFFFFF
                    rec.write_call(at, "nvmlEventSetWait_v2", None, [], {}, ret=rec.encode(ev), dedup=False)
            src.collect()
            prev = t
        src.close()
        rec.close()
    return path


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="Write the synthetic NVML trace.")
    ap.add_argument("output", nargs="?", default=OUT)
    ap.add_argument("--gpus", type=int, default=8, help="GPUs on the synthetic node (default 8)")
    a = ap.parse_args()
    p = generate(a.output, a.gpus)
    with open(p, encoding="utf-8") as fh:
        head = json.loads(fh.readline())
    print(f"wrote {p} ({os.path.getsize(p)} bytes, synthetic={head['synthetic']})")
