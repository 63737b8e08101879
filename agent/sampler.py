"""The sampler owns the clock and the schedule.

At start every source is read once in a thread of its own (the first /metrics has them all); from then on one
thread (``teye-sampler``) reads every source at its own interval: sources whose reads fall due together
(every 5 s collector starts on the same tick) are read back to back in one wake-up.  Waking is what an idle
agent spends most on (docs/operations.md, "Agent footprint": a thread per collector woke 23 threads and
handed the GIL round on every tick), so the schedule coalesces timers.  A source that hangs (a stuck NFS
mount, a lost GPU) still delays nobody else for long: a watchdog (``teye-watchdog``, waking hang_s after each
tick's slot) sees the sampler stuck in one read for more than HANG_S (or the shortest interval), leaves that
read to its thread and starts a new sampler thread that reads everyone else; the stuck source is not read again until its read returns (one
call in flight per source), and is reported down by the exporters meanwhile (``is_up``).  After every read
the sampler publishes a new immutable :class:`Snapshot` by swapping one reference; readers (exporters,
``teye profile``) just read ``sampler.snapshot``, lock-free.
"""
from __future__ import annotations

import heapq
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from .errors import HardwareAbsent, ParseError, SourceUnavailable
from .logutil import RateLimitedLog

log = logging.getLogger("teye.sampler")

# What a failing read may raise, translated into "collector down".  Anything else is
# a bug: it is logged with its traceback (rate-limited) and the collector is down too.
EXPECTED_ERRORS = (OSError, ParseError, SourceUnavailable)
# a read in progress longer than this (or than the shortest interval, if shorter) hands the schedule to a new
# sampler thread
HANG_S = 1.0
# a collector whose hardware is absent (no GPU, no PMU, no InfiniBand) is probed again this often, not every interval
ABSENT_REPROBE_S = 60.0


@dataclass(frozen=True)
class SourceState:
    """The latest outcome of one source."""

    name: str
    up: bool = False
    reading: Any = None              # last successful reading (None when down)
    duration_s: float = 0.0          # how long the last read took
    error: Optional[str] = None      # why it is down
    updated_ns: int = 0              # CLOCK_MONOTONIC of the last completed read
    in_flight_since_ns: Optional[int] = None  # a read started at this time has not returned yet
    reads: int = 0
    failures: int = 0
    # the node has no such hardware (HardwareAbsent) and the collector never read anything, nor did the
    # configuration turn it on explicitly: not a failure (teye_collector_absent=1, no alert)
    absent: bool = False
    worked: bool = False             # at least one read succeeded since the agent started

    @property
    def state(self) -> str:
        """up, absent, down, or pending (no read finished yet)."""
        if self.up:
            return "up"
        if self.absent:
            return "absent"
        return "down" if self.reads else "pending"


@dataclass(frozen=True)
class Snapshot:
    """Immutable view of every source's latest state."""

    taken_ns: int = 0
    sources: Mapping[str, SourceState] = field(default_factory=lambda: MappingProxyType({}))

    def state(self, name: str) -> Optional[SourceState]:
        return self.sources.get(name)

    def is_up(self, name: str, now_ns: int, stale_after_s: float) -> bool:
        """Up, and not stuck in a read for longer than stale_after_s."""
        st = self.sources.get(name)
        if st is None or not st.up:
            return False
        if st.in_flight_since_ns is not None and now_ns - st.in_flight_since_ns > stale_after_s * 1e9:
            return False
        return True


class Sampler:
    def __init__(self, sources: Dict[str, Tuple[Any, float]], clock: Callable[[], int] = time.monotonic_ns,
                 required=()):
        """``sources``: name -> (source, interval_seconds).  ``required``: collectors the configuration
        turned on explicitly; absent hardware is a failure for them, not an absence."""
        self._sources = dict(sources)
        self._required = frozenset(required)
        self._clock = clock
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = []
        self._rlog = RateLimitedLog(log)
        self._in_flight: Dict[str, int] = {}   # name -> start (CLOCK_MONOTONIC ns) of each read in progress
        self.snapshot = Snapshot(clock(), MappingProxyType({n: SourceState(n) for n in self._sources}))

    @property
    def names(self):
        return list(self._sources)

    def source(self, name: str):
        return self._sources[name][0]

    def _publish(self, name: str, **changes) -> None:
        with self._write_lock:
            states = dict(self.snapshot.sources)
            states[name] = replace(states[name], **changes)
            self.snapshot = Snapshot(self._clock(), MappingProxyType(states))

    def _done(self, state: SourceState) -> None:
        """Publish a read's outcome: the read is no longer in flight."""
        with self._write_lock:
            self._in_flight.pop(state.name, None)
            states = dict(self.snapshot.sources)
            states[state.name] = state
            self.snapshot = Snapshot(self._clock(), MappingProxyType(states))

    def _mark_in_flight(self, name: str) -> None:
        """Publish that ``name``'s read (started by the sampler thread, which does not publish it) is in flight, if
        it still is: the watchdog's, once that read outlasted hang_s."""
        with self._write_lock:
            start = self._in_flight.get(name)
            if start is not None and self.snapshot.sources[name].in_flight_since_ns is None:
                states = dict(self.snapshot.sources)
                states[name] = replace(states[name], in_flight_since_ns=start)
                self.snapshot = Snapshot(self._clock(), MappingProxyType(states))

    def read_once(self, name: str, publish_start: bool = True) -> SourceState:
        """Read one source now and publish the outcome (used by the loop, tests and `teye profile`).

        ``publish_start``: publish the read's start (``in_flight_since_ns``) before reading.  The sampler thread
        does not (one snapshot copy a read fewer: issue 49); its watchdog publishes it once a read outlasts
        hang_s, with the read's true start, so a stuck read turns stale as before."""
        src = self._sources[name][0]
        start = self._clock()
        self._in_flight[name] = start
        if publish_start:
            self._publish(name, in_flight_since_ns=start)
        prev = self.snapshot.sources[name]
        try:
            reading = src.collect()
        except EXPECTED_ERRORS as e:
            why = _describe(e)
            absent = isinstance(e, HardwareAbsent) and not prev.worked and name not in self._required
            self._fail(name, prev, start, why, absent)
            if prev.up or prev.error != why:  # log changes, not every failed read of a steady state
                if absent:
                    log.info("collector %s absent: %s", name, why)
                elif isinstance(e, SourceUnavailable):
                    log.info("collector %s unavailable: %s", name, why)
                else:
                    self._rlog.warning(f"{name}:{type(e).__name__}", "collector %s down: %s", name, why)
        except Exception as e:  # a bug in a source must not kill the agent; it is logged loudly
            self._fail(name, prev, start, f"internal error: {type(e).__name__}: {e}")
            self._rlog.error(f"{name}:bug", "collector %s raised unexpectedly", name, exc_info=True)
        else:
            end = self._clock()
            if prev.error is not None:
                log.info("collector %s is up again", name)
            self._done(SourceState(name, True, reading, (end - start) / 1e9, None, end, None, prev.reads + 1,
                                   prev.failures, False, True))
        return self.snapshot.sources[name]

    def _fail(self, name, prev, start, why, absent=False):
        end = self._clock()
        # an absent collector's reads are not failures: teye_collector_failures_total stays where it is
        self._done(SourceState(name, False, None, (end - start) / 1e9, why, end, None, prev.reads + 1,
                               prev.failures + (0 if absent else 1), absent, prev.worked))

    def _next_deadline(self, name: str, deadline: int) -> int:
        """The next slot after a read whose slot was ``deadline``: a source may pace itself between reads (the
        GPU source: faster while phase intervals wait for its samples, never slower than its driver ring
        allows), otherwise its configured interval; slots missed by a slow read are skipped, the phase kept
        (so sources of one interval stay on one tick)."""
        src, interval_s = self._sources[name]
        pace = getattr(src, "next_interval_s", None)
        if self.snapshot.sources[name].absent:
            interval_s = max(interval_s, ABSENT_REPROBE_S)
            pace = None
        paced_s = pace(interval_s) if pace is not None else interval_s
        interval_ns = max(1_000_000, int(paced_s * 1e9))
        if paced_s > interval_s:
            # slower than configured (the phases collector while idle): the first slot of the slower pace's grid
            # from the start at least one configured interval on, so it shares the sources of that interval's ticks
            t0 = self._t0
            deadline = t0 + -(-(deadline + int(interval_s * 1e9) - t0) // interval_ns) * interval_ns
        else:
            deadline += interval_ns
        now = self._clock()
        if deadline < now:
            deadline += ((now - deadline) // interval_ns + 1) * interval_ns
        return deadline

    def hurry(self, name: str) -> None:
        """Read ``name`` at its configured interval's next slot where its own pace had put it later (the
        phases collector, idle, once something came: called from its threads)."""
        cv = getattr(self, "_cv", None)
        if cv is None:
            return
        interval_ns = max(1_000_000, int(self._sources[name][1] * 1e9))
        with cv:
            for i, (deadline, order, n) in enumerate(self._due):
                if n != name:
                    continue
                sooner = deadline - max(0, (deadline - self._clock()) // interval_ns) * interval_ns
                if sooner < deadline:
                    self._due[i] = (sooner, order, n)
                    heapq.heapify(self._due)
                    cv.notify_all()
                return

    def _run(self, gen: int) -> None:
        """The sampler thread: read whatever is due, in slot order, then sleep until the next slot."""
        _name_thread("teye-sampler")
        cv = self._cv
        while True:
            with cv:
                while True:
                    if self._stop.is_set() or gen != self._gen:
                        return
                    now = self._clock()
                    if self._due and self._due[0][0] <= now:
                        deadline, order, name = heapq.heappop(self._due)
                        if name in self._in_flight:
                            # its first read (or a read left to a replaced thread) has not returned: not twice
                            heapq.heappush(self._due, (self._next_deadline(name, deadline), order, name))
                            continue
                        start = time.monotonic()
                        self._busy = (name, start)
                        at = self._watch_at
                        if at is None or at > start + self.hang_s:   # the watchdog would look too late: wake it
                            self._wcv.notify()
                        break
                    wait = (self._due[0][0] - now) / 1e9 if self._due else None
                    cv.wait(wait)
            try:
                self.read_once(name, publish_start=False)
            finally:
                with cv:
                    if gen == self._gen:
                        self._busy = None
                    heapq.heappush(self._due, (self._next_deadline(name, deadline), order, name))
                    cv.notify_all()     # a replacement sampler may be sleeping past this source's new slot

    def _first_read(self, name: str, order: int, t0: int) -> None:
        """A source's first read; then it joins the schedule (its slots t0 + k × its interval, or its own pace
        after this read), so a first read that hangs never has a second one beside it."""
        _name_thread(f"teye-first-{name}"[:15])
        try:
            self.read_once(name)
        finally:
            with self._cv:
                heapq.heappush(self._due, (self._next_deadline(name, t0), order, name))
                self._cv.notify_all()

    def _watch(self) -> None:
        """Looks at the read in progress once it has run for hang_s: one still in progress then gets the schedule a
        new thread.  While the sampler sleeps it sleeps until hang_s after the next slot (``_watch_at``, the
        monotonic time it looks next), so a tick's reads find it already due to look in time and need not wake
        it: one wake-up a tick (issue 49: a wake-up at each tick's first read and another hang_s later were 2.4 a
        second with the phases collector's 1 s tick).  A read that starts later than that (the schedule
        changed) wakes it (``_run``)."""
        _name_thread("teye-watchdog")
        with self._lock:
            while not self._stop.is_set():
                busy = self._busy
                if busy is None:
                    if not self._due:
                        self._watch_at = None
                        self._wcv.wait()
                        continue
                    wait = max(0.0, (self._due[0][0] - self._clock()) / 1e9) + self.hang_s
                    self._watch_at = time.monotonic() + wait
                    self._wcv.wait(wait)
                    continue
                left = busy[1] + self.hang_s - time.monotonic()
                if left > 0:
                    self._watch_at = busy[1] + self.hang_s
                    self._wcv.wait(left)
                    continue
                self._gen += 1
                self._busy = None
                self._mark_in_flight(busy[0])   # the exporters see it stuck (is_up), from the read's own start
                t = threading.Thread(target=self._run, args=(self._gen,), name="teye-sampler", daemon=True)
                self._threads.append(t)
                t.start()
                log.info("collector %s has been reading for more than %g s: the other collectors go on in a new "
                         "sampler thread; %s is read again once that read returns", busy[0], self.hang_s, busy[0])

    def start(self) -> None:
        now = self._t0 = self._clock()
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)      # the sampler threads wait on it for the next slot
        self._wcv = threading.Condition(self._lock)     # the watchdog waits on it
        self._watch_at: Optional[float] = None   # when the watchdog looks next (time.monotonic), None: when woken
        self._gen = 0
        self._busy: Optional[Tuple[str, float]] = None
        # a read longer than the shortest interval delays another source's slot: hand over then (at most HANG_S)
        self.hang_s = min([HANG_S] + [iv for _, iv in self._sources.values()])
        # the first read of every source at once, each in a thread of its own (start-up: the first /metrics
        # has everything without waiting for the slowest first read, e.g. NVML's or grpcio's import); then the
        # schedule: each source joins it once its first read returned, its first slot one interval from now,
        # those of one interval sharing every slot
        self._due = []
        for name, (src, _interval) in self._sources.items():
            if hasattr(src, "set_hurry"):   # a source that paces itself slower while idle, told when to stop
                src.set_hurry(lambda n=name: self.hurry(n))
        for i, name in enumerate(self._sources):
            t = threading.Thread(target=self._first_read, args=(name, i, now), name=f"teye-first-{name}",
                                 daemon=True)
            t.start()
            self._threads.append(t)   # (stop() waits for it too: a first read that returns is published first)
        for target, args, name in ((self._run, (0,), "teye-sampler"), (self._watch, (), "teye-watchdog")):
            t = threading.Thread(target=target, args=args, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the loops and close the sources; a thread stuck in a hung read is abandoned (daemon)."""
        self._stop.set()
        cv = getattr(self, "_cv", None)
        if cv is not None:
            with cv:
                cv.notify_all()
                self._wcv.notify_all()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        for src, _ in self._sources.values():
            close = getattr(src, "close", None)
            if close:
                try:
                    close()
                except EXPECTED_ERRORS as e:
                    log.warning("closing %s: %s", src, e)


def _name_thread(name: str) -> None:
    """The OS thread's name (top -H, /proc/<pid>/task/*/comm: benchmarks/footprint.py counts CPU and wakeups by
    it); Python's thread names stay inside Python.  Linux's limit is 15 bytes."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as fh:
            fh.write(name[:15])
    except OSError:
        pass


def _describe(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename:
        return f"{e.filename}: {e.strerror or e}"
    return str(e) or type(e).__name__
