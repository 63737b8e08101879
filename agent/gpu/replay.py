"""``--gpu-replay FILE``: serve a recorded NVML trace as a pynvml-like module.

The GPU backend and source run unchanged on top of :class:`Replay`; only the answers come
from the file.  Replay time starts at ``nvmlInit`` and runs with the wall clock:

- a plain call gets the answer most recently recorded for the same function, device and
  arguments at or before the current trace time (errors are raised as the same NVML
  error class), so values hold between records;
- ``nvmlDeviceGetSamples`` serves the recorded utilization samples with their timestamps
  shifted so they look live (``start of replay + offset in the trace``), newer than the
  caller's last-seen timestamp and at most ``ring_capacity`` of them, like the driver's
  ring; NotFound when there is none; per-process utilization samples are shifted the same way;
- XID events come out of ``nvmlEventSetWait`` when their time comes;
- past the end record the trace loops: trace time restarts at 0, sample timestamps keep
  increasing (loop n is shifted by n trace durations) and cumulative counters (energy,
  ECC totals) add one loop's increase per loop, so an agent of any run time keeps serving.

A function never recorded raises FunctionNotFound (as on a driver without it); a recorded
function asked with other arguments raises NotSupported.
"""
from __future__ import annotations

import bisect
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from ..errors import ParseError
from . import trace


@dataclass(frozen=True)
class ReplayHandle:
    """A device handle of the replay (its trace key: '0', '0/mig1', ...)."""

    key: str


class ReplayGpmSample:
    def __init__(self):
        self.dev: Optional[str] = None
        self.gi: Optional[int] = None


class ReplayEventSet:
    pass


class _Obj:
    """Attribute bag standing in for a pynvml struct / friendly object."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def __repr__(self):
        return f"_Obj({self.__dict__!r})"


class _GpmMetric:
    def __init__(self):
        self.metricId = 0
        self.nvmlReturn = 0
        self.value = 0.0


class ReplayGpmMetricsGet:
    """Same fields as pynvml.c_nvmlGpmMetricsGet_t."""

    def __init__(self):
        self.version = 0
        self.numMetrics = 0
        self.sample1 = None
        self.sample2 = None
        self.metrics = [_GpmMetric() for _ in range(32)]


def _decode(v) -> Any:
    if isinstance(v, list):
        return [_decode(x) for x in v]
    if isinstance(v, dict):
        if "$h" in v:
            return ReplayHandle(v["$h"])
        if "$p" in v:
            return ReplayEventSet()
        return _Obj(**{k: _decode(x) for k, x in v.items()})
    return v


_SCALARS = (int, str, float, type(None))


def _frozen(v):
    """A hashable form of decoded JSON arguments (lists -> tuples, dicts -> sorted item tuples)."""
    if type(v) in (list, tuple) and all(type(x) in _SCALARS for x in v):
        return tuple(v)  # the common case (handles, indices, enum values): no recursion
    if isinstance(v, (list, tuple)):
        return tuple(_frozen(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _frozen(x)) for k, x in v.items()))
    return v


def _key(fn: str, dev, args, kw) -> tuple:
    return fn, dev, _frozen(args) if args else (), _frozen(kw) if kw else ()


class _Sample:
    """One ring sample as pynvml's c_nvmlSample_t reads: timeStamp and the value union."""

    __slots__ = ("timeStamp", "sampleValue")

    def __init__(self, ts: int, value: _Obj):
        self.timeStamp = ts
        self.sampleValue = value


_VALUES: Dict[Any, _Obj] = {}   # the value unions, one per value (a trace's values recur: percents)


def _sample(ts: int, value) -> _Sample:
    num = _VALUES.get(value)
    if num is None:
        if len(_VALUES) >= 4096:
            _VALUES.clear()
        num = _VALUES[value] = _Obj(dVal=float(value), uiVal=value, ulVal=value, ullVal=value, sllVal=value,
                                    siVal=value, usVal=value)
    return _Sample(ts, num)


class Replay:
    """A pynvml-like module serving a trace; build with :meth:`load`."""

    c_nvmlGpmMetricsGet_t = ReplayGpmMetricsGet

    def __init__(self, header: Dict[str, Any], records: Iterable[Dict[str, Any]], path: str = "<trace>",
                 wall_us: Callable[[], int] = lambda: time.time_ns() // 1000,
                 sleep: Callable[[float], None] = time.sleep, base=None):
        if base is None:
            from .nvml import import_pynvml
            base = import_pynvml()  # for NVML's constants and error classes only; nothing is called
        self._base = base
        self.header = header
        self.path = path
        self._wall_us = wall_us
        self._sleep = sleep
        self._wall0: Optional[int] = None
        self._lock = threading.Lock()
        self.capacity = int(header.get("ring_capacity") or trace.DEFAULT_RING_CAPACITY)
        self._calls: Dict[tuple, Tuple[List[int], List[tuple]]] = {}
        self._fns = set()
        self._rings: Dict[Tuple[Optional[str], str], List[Tuple[int, Any]]] = {}
        self._ring_vtype: Dict[Tuple[Optional[str], str], int] = {}
        self._events: List[Tuple[int, Any]] = []
        end = None
        last_t = 0
        for rec in records:
            t = rec["t"]
            last_t = max(last_t, t)
            if rec.get("end"):
                end = t
                continue
            fn = rec["fn"]
            self._fns.add(fn)
            answer = ("err", int(rec["err"])) if "err" in rec else ("ret", rec.get("ret"))
            if fn != trace.RING and answer[0] == "ret" and fn not in trace.EVENT_WAIT:
                answer = ("ret", _decode(answer[1]))  # decoded once; served objects are never mutated
            if fn in trace.EVENT_WAIT:
                if answer[0] == "ret":
                    self._events.append((t, _decode(answer[1])))
                continue
            args, kw = rec.get("args", []), rec.get("kw", {})
            if fn == trace.RING and answer[0] == "ret":
                key = (rec.get("dev"), _frozen(args))
                self._ring_vtype[key] = int(answer[1].get("vt", 1))
                self._rings.setdefault(key, []).extend((int(ts), v) for ts, v in answer[1]["s"])
                continue
            times, values = self._calls.setdefault(_key(fn, rec.get("dev"), args, kw), ([], []))
            times.append(t)
            values.append(answer)
        self._ring_times: Dict[tuple, List[int]] = {}
        for key, samples in self._rings.items():
            self._rings[key] = sorted(dict(samples).items())
            self._ring_times[key] = [ts for ts, _ in self._rings[key]]
        self._events.sort(key=lambda e: e[0])
        self._event_times = [t for t, _ in self._events]
        self.duration_us = end if end else last_t + 1_000_000
        if self.duration_us <= 0:
            raise ParseError(path, "trace has no duration (end record at t=0)")
        self._event_cursor = -1

    @classmethod
    def load(cls, path: str, **kw) -> "Replay":
        header, records = trace.stream(path)
        return cls(header, records, path, **kw)

    # ------------------------------------------------------------------ time
    def _now(self) -> int:
        """µs since the replay started (the first nvmlInit)."""
        if self._wall0 is None:
            with self._lock:
                if self._wall0 is None:
                    self._wall0 = self._wall_us()
        return self._wall_us() - self._wall0

    def _error(self, name: str):
        return self._base.NVMLError(getattr(self._base, "NVML_ERROR_" + name))

    # ------------------------------------------------------------------ module surface
    def __getattr__(self, name: str):
        if name.startswith("nvml"):
            if name in self._fns:
                def serve(*args, **kw):
                    return self._serve(name, args, kw)
                serve.__name__ = name
                self.__dict__[name] = serve  # cached: later lookups skip __getattr__
                return serve
            attr = getattr(self._base, name, None)
            if callable(attr):
                def missing(*args, **kw):
                    raise self._error("FUNCTION_NOT_FOUND")
                return missing
            if attr is None:
                raise AttributeError(name)
            return attr
        return getattr(self._base, name)

    def nvmlInit(self):
        self._now()

    nvmlInitWithFlags = lambda self, flags: self.nvmlInit()  # noqa: E731

    def nvmlShutdown(self):
        return None

    def nvmlGpmSampleAlloc(self):
        return ReplayGpmSample()

    def nvmlGpmSampleFree(self, sample):
        return None

    def nvmlGpmSampleGet(self, handle, sample):
        sample.dev, sample.gi = handle.key, None
        return sample

    def nvmlGpmMigSampleGet(self, handle, gpu_instance_id, sample):
        sample.dev, sample.gi = handle.key, int(gpu_instance_id)
        return sample

    def nvmlGpmMetricsGet(self, mg):
        s = mg.sample2
        args = [] if s.gi is None else [s.gi]
        value = self._lookup(trace.GPM_METRICS_GET, s.dev, args, {})
        got = {int(mid): (int(ret), float(val)) for mid, ret, val in value.m}
        unsupported = getattr(self._base, "NVML_ERROR_NOT_SUPPORTED", 3)
        for i in range(int(mg.numMetrics)):
            m = mg.metrics[i]
            m.nvmlReturn, m.value = got.get(int(m.metricId), (unsupported, 0.0))
        return mg

    def nvmlEventSetCreate(self):
        return ReplayEventSet()

    def nvmlEventSetFree(self, event_set):
        return None

    def nvmlDeviceRegisterEvents(self, handle, event_types, event_set):
        return None

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        now = self._now()
        nxt = self._next_event()
        if nxt is not None:
            at, ev = nxt
            if at <= now + timeout_ms * 1000:
                if at > now:
                    self._sleep((at - now) / 1e6)
                self._event_cursor = at
                return ev
        self._sleep(timeout_ms / 1000.0)
        raise self._error("TIMEOUT")

    nvmlEventSetWait = nvmlEventSetWait_v2

    # ------------------------------------------------------------------ serving
    def _loop(self, now: int) -> Tuple[int, int]:
        k = now // self.duration_us
        return k, now - k * self.duration_us

    def _lookup(self, fn: str, dev, args, kw):
        entry = self._calls.get(_key(fn, dev, args, kw))
        if entry is None:
            raise self._error("NOT_SUPPORTED")
        times, values = entry
        k, local = self._loop(self._now())
        i = bisect.bisect_right(times, local) - 1
        loops = k
        if i < 0:
            if k == 0:
                i = 0
            else:
                i, loops = len(values) - 1, k - 1
        kind, value = values[i]
        if kind == "err":
            raise self._base.NVMLError(value)
        if fn in trace.CUMULATIVE and loops and isinstance(value, (int, float)):
            first = next((v for c, v in values if c == "ret" and isinstance(v, (int, float))), value)
            last = next((v for c, v in reversed(values) if c == "ret" and isinstance(v, (int, float))), value)
            value = value + loops * (last - first)
        return value

    def _serve(self, fn: str, args, kw):
        args = list(args)
        dev = None
        if args and isinstance(args[0], ReplayHandle):
            dev = args.pop(0).key
        last_seen = None
        if fn in trace.TIMESTAMPED and args:
            last_seen = int(args.pop())
        if fn == trace.RING:
            return self._ring(dev, args, kw, last_seen or 0)
        value = self._lookup(fn, dev, args, kw)
        if fn in trace.TIMESTAMPED:
            return self._shift(value, last_seen or 0)
        return value

    def _ring(self, dev, args, kw, last_seen: int):
        key = (dev, _frozen(args))
        samples = self._rings.get(key)
        if samples is None:  # never returned samples: replay the recorded error (e.g. NotSupported)
            return self._lookup(trace.RING, dev, args, kw)
        now = self._now()
        wall0 = self._wall0
        d = self.duration_us
        rel_last = last_seen - wall0
        k_now, _ = self._loop(now)
        k_low = max(0, rel_last // d)
        times = self._ring_times[key]
        out: List[Tuple[int, Any]] = []
        k = k_now
        while k >= k_low and len(out) < self.capacity:
            base = k * d
            lo = max(rel_last - base, 0 if k > 0 else -(1 << 62))
            hi = min(now - base, d)
            if hi > lo:
                i0 = bisect.bisect_right(times, lo)
                i1 = bisect.bisect_right(times, hi)
                for ts, v in reversed(samples[i0:i1]):
                    out.append((wall0 + base + ts, v))
                    if len(out) >= self.capacity:
                        break
            k -= 1
        if not out:
            raise self._error("NOT_FOUND")
        out.reverse()
        return self._ring_vtype.get(key, 1), [_sample(ts, v) for ts, v in out]

    def _shift(self, value, last_seen: int):
        k, _ = self._loop(self._now())
        base = self._wall0 + k * self.duration_us
        out = []
        for s in value:
            live = base + int(s.timeStamp)
            if live > last_seen:
                out.append(_Obj(**{**s.__dict__, "timeStamp": live}))
        if not out:
            raise self._error("NOT_FOUND")
        return out

    def _next_event(self) -> Optional[Tuple[int, Any]]:
        """The first event after the cursor: (replay time µs, event)."""
        if not self._events:
            return None
        d = self.duration_us
        cur = self._event_cursor
        k = max(0, cur // d) if cur >= 0 else 0
        local = cur - k * d
        i = bisect.bisect_right(self._event_times, local)
        if i >= len(self._events):
            k, i = k + 1, 0
        t, ev = self._events[i]
        return k * d + t, ev
