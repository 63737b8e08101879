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


# -- one sampler thread, coalesced ticks; a hang handed over (issue 49) ----------------------------------------

class Recorder:
    def __init__(self, name, hang=None):
        self.name = name
        self.calls = []                 # (native thread id, monotonic time)
        self.hang = hang                # an Event the read waits for, while set to one
        self.in_read = 0
        self.max_in_read = 0

    def collect(self):
        self.calls.append((threading.get_native_id(), time.monotonic()))
        self.in_read += 1
        self.max_in_read = max(self.max_in_read, self.in_read)
        try:
            if self.hang is not None and len(self.calls) > 1:    # the first read (its own thread) answers
                self.hang.wait(30)
        finally:
            self.in_read -= 1
        return None


def test_sources_of_one_interval_are_read_back_to_back_in_one_thread():
    """Five sources every 0.2 s: after the first reads (all at once, a thread each, at start), each tick reads all
    five in one thread, within a few ms of each other, and the agent's threads are the sampler and its watchdog,
    not one per source."""
    srcs = [Recorder(f"s{i}") for i in range(5)]
    s = Sampler({r.name: (r, 0.2) for r in srcs})
    before = threading.active_count()
    s.start()
    try:
        time.sleep(1.1)
        threads = threading.active_count() - before
    finally:
        s.stop()
    assert threads == 2
    assert len({tid for r in srcs for tid, _ in r.calls[:1]}) == 5        # first reads: a thread each
    tids = {tid for r in srcs for tid, _ in r.calls[1:]}
    assert len(tids) == 1
    n = min(len(r.calls) for r in srcs)
    assert 5 <= n <= 7
    for k in range(n):                       # the k-th read of every source: one burst
        times = [r.calls[k][1] for r in srcs]
        assert max(times) - min(times) < 0.05, (k, times)


def test_a_hanging_source_hands_the_schedule_over_and_is_not_piled_up(monkeypatch):
    import agent.sampler as sampler_mod
    monkeypatch.setattr(sampler_mod, "HANG_S", 0.3)
    release = threading.Event()
    stuck, other = Recorder("stuck", hang=release), Recorder("other")
    s = Sampler({"stuck": (stuck, 0.1), "other": (other, 0.1)})
    s.start()
    try:
        time.sleep(1.5)
        during = len(other.calls)
        assert not s.snapshot.is_up("stuck", time.monotonic_ns(), 0.5)
        release.set()
        time.sleep(0.5)
        # the thread that was stuck returned and left: one sampler again, not two reading the same schedule
        samplers = [t for t in threading.enumerate() if t.name == "teye-sampler" and t.is_alive()]
    finally:
        s.stop()
    assert len(samplers) == 1, samplers
    # others were read on after the watchdog handed over (a read longer than the shortest interval, 0.1 s)
    assert during >= 5, during
    assert stuck.max_in_read == 1                       # never a second read while the first hangs
    assert len(stuck.calls) >= 2                        # read again once the stuck read returned


# -- a read through the sampler thread publishes one snapshot, not two (issue 49) --------------------------------

class Peeker:
    """Records, during each read, whether the sampler's snapshot says this read is in flight."""

    def __init__(self, name):
        self.name = name
        self.sampler = None
        self.seen = []          # (native thread id, in_flight_since_ns seen during the read)
        self.done = threading.Event()

    def collect(self):
        st = self.sampler.snapshot.sources[self.name]
        self.seen.append((threading.get_native_id(), st.in_flight_since_ns))
        if len(self.seen) >= 4:
            self.done.set()
        return len(self.seen)


def test_the_sampler_thread_publishes_a_read_once_it_returned_and_read_once_publishes_its_start():
    """The sampler thread's reads swap the snapshot once, with their outcome (the watchdog publishes a read's
    start should it outlast hang_s: the test above); a read asked for directly (tests, `teye profile`) and every
    first read publish their start before reading, as before."""
    p = Peeker("p")
    s = Sampler({"p": (p, 0.05)})
    p.sampler = s
    s.start()
    try:
        assert p.done.wait(10.0)
    finally:
        s.stop()
    first, loop = p.seen[0], p.seen[1:]
    assert first[1] is not None                          # the first read, in its own thread: its start published
    assert len({tid for tid, _ in loop}) == 1 and loop[0][0] != first[0]
    assert all(seen is None for _, seen in loop), loop   # the sampler thread's reads: only their outcome
    st = s.snapshot.sources["p"]
    assert st.up and st.in_flight_since_ns is None and st.reading == st.reads
    n = len(p.seen)
    assert s.read_once("p").reading == n + 1
    assert p.seen[-1][1] is not None                     # read_once itself: its start published during the read


def test_a_read_that_returned_is_never_marked_in_flight_afterwards():
    """The watchdog marks a stuck read in flight only while it still is: one that returned meanwhile (the race
    between its end and the watchdog's hand-over) stays up, not stale forever."""
    p = Peeker("p")
    s = Sampler({"p": (p, 30.0)})
    p.sampler = s
    s.read_once("p", publish_start=False)
    s._mark_in_flight("p")                                # too late: the read returned
    st = s.snapshot.sources["p"]
    assert st.up and st.in_flight_since_ns is None
    assert s.snapshot.is_up("p", time.monotonic_ns() + 3600 * 10**9, 1.0)


# -- the watchdog sleeps until hang_s after the next slot: one wake-up a tick (issue 49) --------------------------

class Joiner(Recorder):
    """Its first read (a thread of its own) returns late, then it paces itself 50 ms apart: it joins the schedule
    with a slot earlier than the one the watchdog planned for; its second read hangs."""

    def __init__(self, name, hang, first_s):
        super().__init__(name, hang)
        self.first_s = first_s

    def collect(self):
        if not self.calls:
            time.sleep(self.first_s)
        return super().collect()

    def next_interval_s(self, configured: float) -> float:
        return 0.05


def test_the_idle_watchdog_looks_hang_s_after_the_next_slot_and_a_read_before_it_wakes_it(monkeypatch):
    """Between ticks the watchdog sleeps until hang_s after the sampler's next slot (``_watch_at``), so a tick's
    reads need not wake it; a source that joins the schedule with an earlier slot (a late first read) and hangs
    there wakes it at its read's start: handed over after hang_s, not at the planned look 2 s later."""
    import agent.sampler as sampler_mod
    monkeypatch.setattr(sampler_mod, "HANG_S", 0.3)
    release = threading.Event()
    steady, late = Recorder("steady"), Joiner("late", release, first_s=2.6)
    s = Sampler({"steady": (steady, 2.0), "late": (late, 2.0)})
    t0 = time.monotonic()
    s.start()
    try:
        time.sleep(2.45)            # steady read at its slot t0+2 (the late source not scheduled yet): the look
        with s._lock:               # at t0+2.3 found nothing in progress and planned the next at t0+4.3
            plan, due = s._watch_at, [(d, n) for d, _, n in s._due]
        assert due == [(due[0][0], "steady")], due
        assert abs(plan - (t0 + 4.3)) < 0.2, plan - t0
        time.sleep(1.35)            # t0+3.8: late joined at t0+2.6 and hangs since about t0+2.65
        assert len(late.calls) == 2 and late.in_read == 1
        stuck = s.snapshot.sources["late"].in_flight_since_ns      # marked in flight by the watchdog
        assert len(steady.calls) == 2
    finally:
        release.set()
        s.stop()
    assert stuck is not None and stuck < (t0 + 3.1) * 1e9
