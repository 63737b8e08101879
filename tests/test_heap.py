"""agent/heap.py: glibc's arena limit and trim, against glibc's own account (malloc_stats) in a child."""
from __future__ import annotations

import subprocess
import sys

from agent import heap
from tests.procs import REPO

# Eight threads allocate at once; malloc_stats() writes one "Arena N:" block per arena to stderr.
_CHILD = r"""
import ctypes, sys, threading
from agent import heap
print(heap.limit_arenas(int(sys.argv[1])) if sys.argv[1] != "0" else None, flush=True)
go = threading.Barrier(8)
def work():
    go.wait()
    for _ in range(2000):
        keep = [bytearray(200) for _ in range(50)]
threads = [threading.Thread(target=work) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
ctypes.CDLL(None).malloc_stats()
"""


def arenas(limit: int, env=None) -> tuple:
    p = subprocess.run([sys.executable, "-c", _CHILD, str(limit)], cwd=REPO, capture_output=True, text=True,
                       timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip(), sum(1 for line in p.stderr.splitlines() if line.startswith("Arena "))


def test_the_limit_holds_where_threads_would_take_more():
    assert arenas(0)[1] > 2                 # the oracle: without it these threads take arenas of their own
    assert arenas(2) == ("True", 2)
    assert arenas(1) == ("True", 1)


def test_the_operators_environment_wins():
    import os
    env = dict(os.environ, MALLOC_ARENA_MAX="3")
    said, n = arenas(1, env)
    assert said == "False" and 1 < n <= 3


class FakeLibc:
    def __init__(self, answer=1):
        self.calls, self.answer = [], answer

    def mallopt(self, param, value):
        self.calls.append(("mallopt", param, value))
        return self.answer

    def malloc_trim(self, pad):
        self.calls.append(("malloc_trim", pad))
        return self.answer


def test_calls_and_answers(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    libc = FakeLibc()
    assert heap.limit_arenas(2, libc) and heap.trim(libc)
    assert libc.calls == [("mallopt", -8, 2), ("malloc_trim", 0)]
    refused = FakeLibc(0)
    assert not heap.limit_arenas(2, refused) and not heap.trim(refused)


def test_without_glibc_nothing_happens(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    musl = object()   # no mallopt, no malloc_trim
    assert heap.limit_arenas(2, musl) is False and heap.trim(musl) is False


_FREEZE_CHILD = r"""
import gc, weakref
from agent import heap
class Node:
    pass
garbage = Node()
garbage.me = garbage                  # a cycle: only a collection frees it
dead = weakref.ref(garbage)
del garbage
kept = Node()
n = heap.freeze()
after = Node()
tracked = {id(o) for o in gc.get_objects()}
print(dead() is None, n == gc.get_freeze_count() > 1000, id(kept) in tracked, id(after) in tracked)
"""


def test_freeze_collects_start_ups_cycles_then_leaves_what_is_left_out_of_the_collections():
    p = subprocess.run([sys.executable, "-c", _FREEZE_CHILD], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    # the cycle was freed; start-up's objects are frozen (out of every generation), those made later are not
    assert p.stdout.split() == ["True", "True", "False", "True"]
