"""What sending the job's configuration costs (issue 45), side by side with the same thing without it.

    python benchmarks/config_cost.py [--rounds N]

1. ``with torch.autocast("cpu", dtype=torch.bfloat16): pass``: µs per region with teye's wrapper of
   ``autocast.__enter__`` (teye_client._config.patch_autocast) and with PyTorch's own, alternating rounds in
   one process (the wrapper is put on and taken off between rounds), medians;
2. ``DistributedDataParallel.no_sync()`` entered and left (the configuration's wrapper against the method's own),
   the same way, on a one-rank gloo group;
3. ``teye_client._config.payload()``: µs per call when nothing changed (what every flush of the reporter pays,
   ~10 a second) and when the training loader changed (once an epoch at most).
Figures move with this machine's load: compare within one run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def per_call_us(fn, n):
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def alternate(label, fn, put_on, take_off, rounds, n):
    on, off = [], []
    for _ in range(rounds):
        take_off()
        off.append(per_call_us(fn, n))
        put_on()
        on.append(per_call_us(fn, n))
    take_off()
    a, b = statistics.median(on), statistics.median(off)
    print(f"{label}: {a:.2f} µs with teye, {b:.2f} µs without, +{a - b:.2f} µs ({a / b:.3f}x), "
          f"medians of {rounds} rounds of {n}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    import torch
    import torch.amp.autocast_mode as am
    from teye_client import _config

    orig = am.autocast.__dict__["__enter__"]
    _config.patch_autocast(am)
    wrapped = am.autocast.__dict__["__enter__"]

    def region():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            pass

    alternate("autocast region", region, lambda: setattr(am.autocast, "__enter__", wrapped),
              lambda: setattr(am.autocast, "__enter__", orig), args.rounds, 20000)

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29671")
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{tempfile.mktemp()}")
    model = DDP(torch.nn.Linear(4, 1))
    ns_orig = DDP.__dict__["no_sync"]
    _config.patch_ddp(DDP)
    ns_wrapped = DDP.__dict__["no_sync"]

    def nosync():
        with model.no_sync():
            pass

    alternate("DDP no_sync()", nosync, lambda: setattr(DDP, "no_sync", ns_wrapped),
              lambda: setattr(DDP, "no_sync", ns_orig), args.rounds, 20000)
    dist.destroy_process_group()

    class It:
        pass

    class Loader:
        num_workers, pin_memory, persistent_workers, prefetch_factor, batch_size = 4, True, True, 2, 64

    it = It()
    _config.loader_made(it, Loader())
    _config.keyed(1, it)
    _config.session.train_keys.append(1)
    _config.payload()
    same = statistics.median(per_call_us(_config.payload, 100000) for _ in range(args.rounds))

    def changed():
        _config._state["key"] = None
        _config._loader.clear()
        _config.payload()

    new = statistics.median(per_call_us(changed, 20000) for _ in range(args.rounds))
    print(f"payload(): {same:.2f} µs per flush when nothing changed, {new:.2f} µs when the loader changed")


if __name__ == "__main__":
    main()
