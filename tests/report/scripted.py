"""A scripted GPU driver for the report tests: a small SYNTHETIC NVML trace made like
tests/data/gpu/make_synthetic_trace.py (teye's own GPU source recorded on the fake pynvml).

Two GPUs with a fixed busy share in every driver sample (so any window of the job has that share):
GPU 0 busy BUSY[0] of each sample period, held by pid PIDS[0] (Slurm job SLURM[0] in the procfs tree
that ``procfs_tree`` writes), GPU 1 busy BUSY[1], pid PIDS[1] (Slurm job SLURM[1]).  Each process
uses PROC_MEM bytes of device memory; the GPU shows 2 GiB more.
"""
from __future__ import annotations

import os

from agent.context import AgentContext
from agent.gpu.record import Recorder
from agent.gpu.source import GpuSource
from tests.gpu.fake_pynvml import GiB, FakeGpu, FakeNvml, Timeline

START_US = 1_700_000_000_000_000
PERIOD_US = 166_667
BUSY = (0.30, 0.90)
PIDS = (5001, 5002)
SLURM = ("4242", "4243")
UID = 1000
PROC_MEM = 10 * GiB
S = 1_000_000


def _timeline(share: float, seconds: int) -> Timeline:
    out = []
    for k in range(-120, int(seconds * S / PERIOD_US) + 2):
        a = START_US + k * PERIOD_US
        out.append((a, a + int(round(share * PERIOD_US))))
    return Timeline(out)


def write_trace(path: str, seconds: int = 60, proc_seconds: int = 60, proc_from=0, busy=BUSY, pids=PIDS,
                timelines=None) -> str:
    """The trace; the processes start after ``proc_from`` s (one number, or one per GPU) and exit (the Slurm
    jobs end) after ``proc_seconds``.  ``busy``: each GPU's share; ``pids``: the process on each GPU (None: none).
    ``timelines``: each GPU's busy intervals instead of ``busy`` in every sample (None for a GPU: its share's)."""
    starts = proc_from if isinstance(proc_from, (tuple, list)) else (proc_from,) * len(busy)
    gpus = []
    for i, share in enumerate(busy):
        own = timelines[i] if timelines is not None and i < len(timelines) else None
        g = FakeGpu(i, timeline=own if own is not None else _timeline(share, seconds), period_us=PERIOD_US,
                    ring_start_us=START_US - 100 * PERIOD_US)
        g.ecc, g.remapped, g.energy_mj = (0, 0), (0, 0, 0, 0), 1_000_000_000
        gpus.append(g)
    fake = FakeNvml(gpus, now_us=START_US, ring_capacity=100, driver_version="550.54.15")
    ctx = AgentContext(clock=lambda: fake.now_us * 1000)
    header = {"synthetic": True, "host": "scripted-2gpu", "tool": "tests/report/scripted.py",
              "description": "SYNTHETIC: GPU 0 30 % busy, GPU 1 90 % busy in every sample", "sample_period_us": PERIOD_US}
    with open(path, "w", encoding="utf-8") as out:
        rec = Recorder(fake, out, clock_us=lambda: fake.now_us, header=header)
        src = GpuSource(lambda: rec, procfs=os.path.join(os.path.dirname(path), "no-such-procfs"), ctx=ctx,
                        events=False, wall_ns=lambda: fake.now_us * 1000)
        for t in [k * S for k in range(seconds)] + [seconds * S]:
            for g, share in zip(fake.gpus, busy):
                g.energy_mj += int(g.power_mw * (t - (fake.now_us - START_US)) / S)
                g.util_gpu = int(round(100 * share))
                g.power_mw = int(70_000 + 580_000 * share)
                alive = starts[g.index] * S <= t < proc_seconds * S and pids[g.index] is not None
                g.processes = [(pids[g.index], PROC_MEM)] if alive else []
                g.memory_used = 2 * GiB + (PROC_MEM if alive else 0)
            fake.now_us = START_US + t
            src.collect()
        src.close()
        rec.close()
    return path


def procfs_tree(root: str, base: str, slurm=SLURM) -> str:
    """A procfs root: every entry of ``base`` (the host fixture) linked, plus the scripted GPU processes."""
    os.makedirs(root, exist_ok=True)
    for name in os.listdir(base):
        os.symlink(os.path.join(base, name), os.path.join(root, name))
    for pid, job in zip(PIDS, slurm):
        d = os.path.join(root, str(pid))
        os.makedirs(d)
        with open(os.path.join(d, "status"), "w") as fh:
            fh.write(f"Name:\tpython\nTgid:\t{pid}\nPid:\t{pid}\nPPid:\t1\nUid:\t{UID}\t{UID}\t{UID}\t{UID}\n"
                     f"Gid:\t{UID}\t{UID}\t{UID}\t{UID}\n")
        with open(os.path.join(d, "cgroup"), "w") as fh:
            fh.write(f"0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0\n")
    return root
