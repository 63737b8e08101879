"""The sampler asks a source that paces itself (``next_interval_s``) for the wait before its next read
(issue 38: the GPU collector reads its ring faster while jobs wait, slower when idle)."""
from __future__ import annotations

import threading
import time

from agent.sampler import Sampler


class Paced:
    name = "paced"

    def __init__(self, fast_reads: int):
        self.fast_reads = fast_reads
        self.reads = 0
        self.asked = []
        self.done = threading.Event()

    def collect(self):
        self.reads += 1
        if self.reads > self.fast_reads:
            self.done.set()
        return None

    def next_interval_s(self, configured: float) -> float:
        self.asked.append(configured)
        return 0.01 if self.reads <= self.fast_reads else configured


class Plain:
    name = "plain"

    def __init__(self):
        self.reads = 0

    def collect(self):
        self.reads += 1
        return None


def test_a_source_that_paces_itself_is_read_at_its_own_interval_then_at_the_configured_one():
    paced, plain = Paced(fast_reads=5), Plain()
    s = Sampler({"paced": (paced, 30.0), "plain": (plain, 30.0)})
    s.start()
    try:
        assert paced.done.wait(10.0)          # 5 reads 10 ms apart, then the sixth: far less than 30 s
        time.sleep(0.2)
        assert paced.reads == 6               # then it waits the configured 30 s
        assert set(paced.asked) == {30.0}     # always asked with its configured interval
        assert plain.reads == 1               # a source without the hook keeps the configured interval
    finally:
        s.stop()
