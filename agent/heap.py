"""glibc's allocator, set up for a long-running agent with one thread per collector (docs/operations.md
"Agent footprint").

- :func:`limit_arenas`: at most ``n`` malloc arenas (``mallopt(M_ARENA_MAX, n)``).  glibc gives each
  thread that allocates an arena of its own until there are 8 per core, and each arena keeps the memory
  freed in it; the agent's threads allocate little, and under the interpreter's lock anyway.  The same
  as ``MALLOC_ARENA_MAX=n`` in the environment, which wins when set.
- :func:`trim`: hand the heap's free pages back to the kernel (``malloc_trim(0)``) once start-up's
  transient allocations (module loading, configuration, the first reads) are freed; glibc would keep them.
- :func:`freeze`: once start-up is done, collect its garbage and move every object left to the interpreter's
  permanent generation (``gc.freeze()``): the full collections a running agent's allocations still set off
  now and then traverse only the objects made since, not the modules, tables and replays of start-up (issue
  49: one full collection took 20 ms on the 8-GPU replay, 0.017 % of a core over two minutes).

Without glibc (musl) both do nothing and say so (False).
"""
from __future__ import annotations

import ctypes
import gc
import os

M_ARENA_MAX = -8   # glibc's malloc.h


def _libc():
    try:
        return ctypes.CDLL(None)   # the C library this interpreter runs on
    except OSError:
        return None


def limit_arenas(n: int = 2, libc=None) -> bool:
    """True when glibc took the limit; False where MALLOC_ARENA_MAX is set (the operator's choice) or
    there is no glibc.  Call before threads start."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    mallopt = getattr(libc if libc is not None else _libc(), "mallopt", None)
    return bool(mallopt is not None and mallopt(M_ARENA_MAX, n) == 1)


def trim(libc=None) -> bool:
    """True when glibc gave pages back."""
    malloc_trim = getattr(libc if libc is not None else _libc(), "malloc_trim", None)
    return bool(malloc_trim is not None and malloc_trim(0) == 1)


def freeze() -> int:
    """Collect start-up's garbage (its cycles), then freeze what is left; the objects frozen (gc.get_freeze_count)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
