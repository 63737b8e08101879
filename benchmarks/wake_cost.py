"""What a wake-up costs an idle agent's sampler: one read through the sampler, back to back and after a sleep.

    python benchmarks/wake_cost.py [--reads 40] [--sleep 0.2]

A Sampler of 24 sources that return at once (the agent's count at the defaults); CPU time of the calling
thread (``time.thread_time``) around each piece, medians:

- ``read_once`` of one source, called back to back (warm: code and data in the caches);
- the same, the first call after a --sleep (as the sampler thread runs it: after sleeping until its slot);
- two ``read_once`` of two sources after a sleep (what a second read of the same wake-up adds);
- the 24 states' dict copied (what every read's publication does), after a sleep, and nothing at all.

docs/operations.md "Agent footprint" reads these figures: after a sleep the same work costs many times what it
costs warm, and a second read of the same wake-up costs little more, so the number of wake-ups, not the work
of each, sets an idle agent's CPU.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from agent.sampler import Sampler  # noqa: E402


class Instant:
    def collect(self):
        return 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reads", type=int, default=40)
    ap.add_argument("--sleep", type=float, default=0.2)
    a = ap.parse_args()
    s = Sampler({f"s{i}": (Instant(), 5.0) for i in range(24)})
    for n in s.names:
        s.read_once(n, publish_start=False)

    def cpu_us(fn, sleep):
        out = []
        for _ in range(a.reads):
            if sleep:
                time.sleep(a.sleep)
            t = time.thread_time()
            fn()
            out.append((time.thread_time() - t) * 1e6)
        return statistics.median(out)

    def one():
        s.read_once("s3", publish_start=False)

    def two():
        s.read_once("s3", publish_start=False)
        s.read_once("s4", publish_start=False)
    rows = [("read_once, back to back", cpu_us(one, False)),
            (f"read_once, after {a.sleep:g} s asleep", cpu_us(one, True)),
            (f"two read_once, after {a.sleep:g} s asleep", cpu_us(two, True)),
            (f"24 states' dict copied, after {a.sleep:g} s asleep", cpu_us(lambda: dict(s.snapshot.sources), True)),
            (f"nothing, after {a.sleep:g} s asleep", cpu_us(lambda: None, True))]
    print(f"{'piece':<44} {'CPU µs (median of ' + str(a.reads) + ')':>24}")
    for name, us in rows:
        print(f"{name:<44} {us:>24.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
