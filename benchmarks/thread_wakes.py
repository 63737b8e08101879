"""What a helper thread's wake-ups cost a Python training loop on a loaded machine (issue 47: where the client's
extra time per batch goes under load).

    python benchmarks/thread_wakes.py [--rounds 15] [--hogs 2] [--seconds 3]

A loop of pure-Python work (about 1 ms a step, holding the GIL as a loop's own data work does) runs beside
``--hogs`` busy processes, in rounds that alternate these variants:

- bare:       the loop alone;
- wake-N:     beside a thread that sleeps 1/N s and does a few µs of Python, N times a second (what any helper
              thread does: each wake-up must take the GIL from the loop);
- reporter:   the loop records a step each iteration to teye's Reporter (flush_ms=100, to a path where no agent
              listens: the records are dropped and counted, so only the client's own work and its flush
              thread's wake-ups remain).

Printed: each variant's steps per second (median of the rounds) and its difference from bare.  On an idle
machine a wake-up costs the loop microseconds; with every core busy, the loop that gave up the GIL waits for a
core to take it back.  Compare within one run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from teye_client.reporter import Reporter  # noqa: E402


def work() -> int:
    s = 0
    for i in range(20000):   # about 1 ms of Python on the test machine
        s += i
    return s


def loop(seconds: float, rep=None) -> float:
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        work()
        if rep is not None:
            rep.step(samples=1)
        n += 1
    return n / seconds


def waker(period: float, stop: threading.Event) -> None:
    while not stop.is_set():
        time.sleep(period)
        [i for i in range(20)]


def run(variant: str, seconds: float) -> float:
    if variant == "bare":
        return loop(seconds)
    if variant == "reporter":
        rep = Reporter("wakes", socket_path="/nonexistent/teye-bench/phases.sock", flush_ms=100)
        try:
            return loop(seconds, rep)
        finally:
            rep.close()
    stop = threading.Event()
    t = threading.Thread(target=waker, args=(1.0 / int(variant.split("-")[1]), stop), daemon=True)
    t.start()
    try:
        return loop(seconds)
    finally:
        stop.set()
        t.join()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--hogs", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--variants", default="bare,wake-10,wake-20,wake-100,reporter")
    args = ap.parse_args()
    variants = args.variants.split(",")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    try:
        rates = {v: [] for v in variants}
        for _ in range(args.rounds):
            for v in variants:
                rates[v].append(run(v, args.seconds))
    finally:
        for h in hogs:
            h.kill()
    base = statistics.median(rates["bare"]) if "bare" in rates else None
    print(f"{args.hogs} hogs, {args.rounds} alternating rounds of {args.seconds:g} s, steps/s (medians):")
    for v in variants:
        m = statistics.median(rates[v])
        rel = f"{100 * (m / base - 1):+.2f} %  ({1e6 / m - 1e6 / base:+.0f} µs a step)" if base else ""
        print(f"  {v:10} {m:8.0f}  {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
