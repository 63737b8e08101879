"""Cost of one ``pmu`` poll: 128 CPUs x the default events, on the syscall fake.

    python benchmarks/pmu_poll.py [--polls 200] [--cpus 128]

The tree is tests/data/pmu/cascadelake widened to --cpus CPUs in 2 sockets (Intel: per CPU one
core group of 2 events and two floating-point groups of 4; per socket 2 memory controllers x 2
events and 2 IIO stacks x 2 groups of 4 ports).  Timed with perf_counter around ``collect()``,
median over --polls polls after 2 warm-up polls, for:

- ``fake``: the tests' scripted FakeSyscalls (no kernel at all: the Python cost of teye's
  decoding, scaling, totals and reading construction);
- ``fake+syscall``: the same, each group read also doing one real 8*(3+n)-byte ``pread`` of
  /dev/zero, a stand-in for the kernel round trip of a perf read (the real one also walks
  the group's counters: a lower bound);
- ``replay``: the same plan served by ReplayReader from a recorded trace;
- peer: the ``cpu`` collector's poll of this machine's /proc/stat, the agent's cheapest
  always-on source, in the same run.

It prints µs per poll, CPU seconds per minute at the default interval
(collectors.pmu.interval_seconds) and the share of one core, and the ratio to the peer.
"""
from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from agent.config import COLLECTORS  # noqa: E402
from agent.pmu.perf import Counters  # noqa: E402
from agent.pmu.record import RecordingReader  # noqa: E402
from agent.pmu.replay import ReplayReader  # noqa: E402
from agent.pmu.source import LiveReader, PmuSource  # noqa: E402
from agent.pmu import trace  # noqa: E402
from agent.sources.cpu import CpuSource  # noqa: E402
from tests.pmu.fake_perf import FakeSyscalls  # noqa: E402
from tests.procs import REPO  # noqa: E402

TREE = os.path.join(REPO, "tests", "data", "pmu", "cascadelake")


def wide_tree(dst: str, cpus: int) -> tuple:
    shutil.copytree(TREE, dst, symlinks=True)
    sysfs = os.path.join(dst, "sys")
    cpu_dir = os.path.join(sysfs, "devices", "system", "cpu")
    with open(os.path.join(cpu_dir, "online"), "w") as fh:
        fh.write(f"0-{cpus - 1}\n")
    for c in range(cpus):
        d = os.path.join(cpu_dir, f"cpu{c}", "topology")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "physical_package_id"), "w") as fh:
            fh.write(f"{c * 2 // cpus}\n")
    devices = os.path.join(sysfs, "bus", "event_source", "devices")
    for pmu in os.listdir(devices):
        mask = os.path.join(devices, pmu, "cpumask")
        if os.path.exists(mask):
            with open(mask, "w") as fh:
                fh.write(f"0,{cpus // 2}\n")
    return sysfs, os.path.join(dst, "proc")


class SyscallFake(FakeSyscalls):
    """FakeSyscalls plus one real read system call per group read."""

    def __init__(self):
        super().__init__()
        self._zero = os.open("/dev/zero", os.O_RDONLY)

    def read(self, fd, size):
        os.pread(self._zero, size, 0)
        return super().read(fd, size)


class Clock:
    ns = 0

    def __call__(self):
        return self.ns


def script(fake: FakeSyscalls, step: int) -> None:
    """Every counter advances: 1 s enabled, 0.5 s running (multiplexed), growing values."""
    for (typ, config, cpu) in {v[:3] for v in fake.fds.values()}:
        fake.set(typ, config, cpu, step * 1000 + config % 97, enabled=step * 10**9, running=step * 5 * 10**8)


def time_source(src: PmuSource, fake, polls: int, clock: Clock) -> list:
    out = []
    for step in range(1, polls + 3):
        if fake is not None:
            script(fake, step)
        clock.ns += 10**9
        t = time.perf_counter()
        src.collect()
        if step > 2:
            out.append(time.perf_counter() - t)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--polls", type=int, default=200)
    ap.add_argument("--cpus", type=int, default=128)
    a = ap.parse_args(argv)
    interval = COLLECTORS["pmu"][0]
    results = {}
    with tempfile.TemporaryDirectory(prefix="teye-pmu-bench-") as tmp:
        sysfs, procfs = wide_tree(os.path.join(tmp, "tree"), a.cpus)
        for name, fake in (("fake", FakeSyscalls()), ("fake+syscall", SyscallFake())):
            clock = Clock()
            src = PmuSource(lambda f=fake: LiveReader(Counters(f)), sysfs, procfs, clock=clock)
            src.collect()
            events = len(fake.fds)
            groups = len(src.plan.groups)
            results[name] = time_source(src, fake, a.polls, clock)
            src.close()
        # record a short trace through the fake, then replay it
        fake, buf, clock = FakeSyscalls(), io.StringIO(), Clock()
        rec = RecordingReader(LiveReader(Counters(fake)), buf, clock)
        src = PmuSource(lambda: rec, sysfs, procfs, clock=clock)
        src.collect()
        rec.flush()
        for step in range(1, 11):
            script(fake, step)
            clock.ns += 10**9
            src.collect()
            rec.flush()
        src.close()
        path = os.path.join(tmp, "t.jsonl")
        with open(path, "w") as fh:
            fh.write(buf.getvalue())
        rclock = Clock()
        header, lines = trace.read(path)
        replay = ReplayReader(header, lines, rclock)
        rsrc = PmuSource(lambda: replay, sysfs, procfs, clock=rclock)
        results["replay"] = time_source(rsrc, None, a.polls, rclock)
        assert len(rsrc.collect().cycles) == a.cpus, "the replay must serve every CPU"
    cpu = CpuSource("/proc")
    peer = []
    for _ in range(a.polls + 2):
        t = time.perf_counter()
        cpu.collect()
        peer.append(time.perf_counter() - t)
    peer = peer[2:]
    peer_med = statistics.median(peer)
    print(f"pmu poll, {a.cpus} CPUs x default events: {groups} groups, {events} counters (fds); "
          f"median of {a.polls} polls; default interval {interval:g} s")
    print(f"{'backend':<16}{'us/poll':>10}{'CPU s/min':>12}{'core share':>12}{'x cpu poll':>12}")
    for name, vals in list(results.items()) + [("peer: cpu /proc/stat", peer)]:
        med = statistics.median(vals)
        per_min = med * 60.0 / (interval if not name.startswith("peer") else COLLECTORS["cpu"][0])
        print(f"{name:<16}{med * 1e6:>10.0f}{per_min:>12.4f}{per_min / 60.0:>11.3%}{med / peer_med:>12.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
