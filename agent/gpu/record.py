"""``teye record``: write what the GPU backend reads from NVML as a JSON-lines trace.

:class:`Recorder` wraps a pynvml-like module: every ``nvml*`` call passes through to it
unchanged and its answer (or NVML error) is written down, so the GPU source runs exactly as
live while recording, and ``teye agent --gpu-replay FILE`` later serves the same answers
through the same backend and source code.  The format is in docs/gpu-trace-format.md.
"""
from __future__ import annotations

import ctypes
import json
import os
import socket
import threading
import time
from typing import Any, Callable, Dict, Optional, TextIO

from .. import __version__
from . import trace


class Recorder:
    """pynvml-like: delegates to ``nv`` and writes each call's answer to ``out``."""

    def __init__(self, nv, out: TextIO, clock_us: Callable[[], int] = lambda: time.time_ns() // 1000,
                 header: Optional[Dict[str, Any]] = None):
        self._nv = nv
        self._out = out
        self._clock_us = clock_us
        self._lock = threading.Lock()
        self._handles: Dict[int, str] = {}     # device handle address -> key ("0", "0/mig1", ...)
        self._pointers: Dict[int, int] = {}    # other opaque pointers -> small number
        self._gpm: Dict[int, tuple] = {}       # GPM sample address -> (device key, instance id or None)
        self._last: Dict[tuple, str] = {}      # call key -> last answer written (de-duplication)
        self.start_us = clock_us()
        self._closed = False
        head = {"format": trace.FORMAT, "version": trace.VERSION, "synthetic": False,
                "start_unix_us": self.start_us, "host": socket.gethostname(), "tool": f"teye record {__version__}",
                "ring_capacity": trace.DEFAULT_RING_CAPACITY}
        head.update(header or {})
        self._write(head)

    # ------------------------------------------------------------------ output
    def _write(self, obj: Dict[str, Any]) -> None:
        line = json.dumps(obj, separators=(",", ":"))
        with self._lock:
            self._out.write(line + "\n")

    def write_call(self, t_us: int, fn: str, dev: Optional[str], args, kw, ret=None, err: Optional[int] = None,
                   dedup: bool = True) -> None:
        """Write one call record at t_us (µs since the start); skipped when it repeats the last answer."""
        rec: Dict[str, Any] = {"t": int(t_us), "fn": fn}
        if dev is not None:
            rec["dev"] = dev
        if args:
            rec["args"] = args
        if kw:
            rec["kw"] = kw
        if err is not None:
            rec["err"] = int(err)
        else:
            rec["ret"] = ret
        if dedup:
            key = trace.call_key(fn, dev, args or [], kw or {})
            answer = json.dumps([rec.get("ret"), rec.get("err")], separators=(",", ":"))
            with self._lock:
                if self._last.get(key) == answer:
                    return
                self._last[key] = answer
        self._write(rec)

    def close(self, end_t_us: Optional[int] = None) -> None:
        """Write the end record: the trace covers [0, end_t_us) (default: now), the length of a replay loop."""
        if not self._closed:
            self._closed = True
            end = self._clock_us() - self.start_us if end_t_us is None else int(end_t_us)
            self._write({"t": end, "end": True})
            self._out.flush()

    # ------------------------------------------------------------------ encoding
    @staticmethod
    def _address(p) -> int:
        return ctypes.cast(p, ctypes.c_void_p).value or 0

    def _ref(self, p) -> Dict[str, Any]:
        addr = self._address(p)
        if addr in self._handles:
            return {"$h": self._handles[addr]}
        n = self._pointers.setdefault(addr, len(self._pointers) + 1)
        return {"$p": n}

    def _enc(self, v) -> Any:
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, bytes):
            return v.decode("utf-8", "replace")
        if isinstance(v, ctypes._Pointer):  # noqa: SLF001
            return self._ref(v)
        if isinstance(v, (ctypes.Structure, ctypes.Union)):
            return {f[0]: self._enc(getattr(v, f[0])) for f in v._fields_}
        if isinstance(v, (ctypes.Array, list, tuple)):
            return [self._enc(x) for x in v]
        if isinstance(v, dict):
            return {str(k): self._enc(x) for k, x in v.items()}
        if isinstance(v, ctypes._SimpleCData):  # noqa: SLF001
            return v.value
        if hasattr(v, "__dict__"):  # pynvml's nvmlFriendlyObject
            return {k: self._enc(x) for k, x in vars(v).items() if not k.startswith("_")}
        raise TypeError(f"cannot record a {type(v).__name__}")

    def encode(self, value) -> Any:
        """A value as it is written into the trace (handles as {"$h": key})."""
        return self._enc(value)

    def _enc_timestamped(self, fn: str, ret) -> Any:
        if fn == trace.RING:
            vtype, samples = ret
            field = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(
                int(vtype), "uiVal")
            return {"vt": int(vtype), "s": [[int(s.timeStamp) - self.start_us, getattr(s.sampleValue, field)]
                                            for s in samples]}
        out = []
        for s in ret:
            d = self._enc(s)
            d["timeStamp"] = int(s.timeStamp) - self.start_us
            out.append(d)
        return out

    # ------------------------------------------------------------------ the wrapped module
    def __getattr__(self, name: str):
        attr = getattr(self._nv, name)
        if not (name.startswith("nvml") and callable(attr)):
            return attr
        wrapper = self._wrap(name, attr)
        self.__dict__[name] = wrapper  # cache: next lookups skip __getattr__
        return wrapper

    def _wrap(self, fn: str, real: Callable) -> Callable:
        nv_error = self._nv.NVMLError
        timeout = getattr(self._nv, "NVML_ERROR_TIMEOUT", 10)
        not_found = getattr(self._nv, "NVML_ERROR_NOT_FOUND", 6)

        def call(*args, **kw):
            t = self._clock_us() - self.start_us
            try:
                ret = real(*args, **kw)
            except nv_error as e:
                if fn in trace.EVENT_WAIT and e.value == timeout:
                    raise
                if fn == trace.RING and e.value == not_found:
                    raise  # "no newer sample": replay derives it from the samples themselves
                if fn not in trace.NATIVE:
                    dev, rest = self._split(fn, args)
                    self.write_call(t, fn, dev, rest, self._enc(kw), err=e.value)
                raise
            self._note(fn, args, ret)
            if fn in trace.NATIVE:
                return ret
            if fn in trace.EVENT_WAIT:
                self.write_call(t, fn, None, [], {}, ret=self._enc(ret), dedup=False)
                return ret
            if fn == trace.GPM_METRICS_GET:
                mg = args[0]
                dev, gi = self._gpm.get(self._address(mg.sample2), (None, None))
                metrics = [[int(mg.metrics[i].metricId), int(mg.metrics[i].nvmlReturn), float(mg.metrics[i].value)]
                           for i in range(int(mg.numMetrics))]
                self.write_call(t, fn, dev, [] if gi is None else [gi], {}, ret={"m": metrics})
                return ret
            dev, rest = self._split(fn, args)
            if fn == trace.FIELD_VALUES:  # NVML stamps each value: without the stamps, unchanged answers de-duplicate
                self.write_call(t, fn, dev, rest, self._enc(kw), ret=[
                    {k: v for k, v in d.items() if k not in trace.FIELD_VALUE_STAMPS} for d in self._enc(ret)])
                return ret
            if fn in trace.TIMESTAMPED:
                self.write_call(t, fn, dev, rest, self._enc(kw), ret=self._enc_timestamped(fn, ret), dedup=False)
            else:
                self.write_call(t, fn, dev, rest, self._enc(kw), ret=self._enc(ret))
            return ret

        call.__name__ = fn
        return call

    def _split(self, fn: str, args) -> tuple:
        """(device key of the first argument or None, the other arguments encoded; no last-seen timestamp)."""
        args = list(args)
        dev = None
        if args and isinstance(args[0], ctypes._Pointer) and self._address(args[0]) in self._handles:  # noqa: SLF001
            dev = self._handles[self._address(args.pop(0))]
        if fn in trace.TIMESTAMPED and args:
            args.pop()
        return dev, [self._enc(a) for a in args]

    def _note(self, fn: str, args, ret) -> None:
        """Remember handle keys and which device a GPM sample belongs to."""
        if fn == "nvmlDeviceGetHandleByIndex":
            self._handles[self._address(ret)] = str(int(args[0]))
        elif fn == "nvmlDeviceGetMigDeviceHandleByIndex":
            parent = self._handles.get(self._address(args[0]), "?")
            self._handles.setdefault(self._address(ret), f"{parent}/mig{int(args[1])}")
        elif fn in ("nvmlDeviceGetHandleByUUID", "nvmlDeviceGetHandleByPciBusId",
                    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle"):
            self._handles.setdefault(self._address(ret), f"h{len(self._handles)}")
        elif fn == "nvmlGpmSampleGet":
            self._gpm[self._address(args[1])] = (self._handles.get(self._address(args[0])), None)
        elif fn == "nvmlGpmMigSampleGet":
            self._gpm[self._address(args[2])] = (self._handles.get(self._address(args[0])), int(args[1]))


def record(nv, path: str, duration_s: float, interval_s: float, cfg: Optional[dict] = None,
           clock_us: Callable[[], int] = lambda: time.time_ns() // 1000, sleep: Callable[[float], None] = time.sleep,
           ctx=None, header: Optional[Dict[str, Any]] = None, wall_ns: Callable[[], int] = time.time_ns,
           readings: Optional[list] = None) -> int:
    """Poll the GPU source through a Recorder for duration_s; returns the number of polls written
    (each poll's reading is appended to ``readings`` when given).

    SourceUnavailable (no NVML) propagates; the partial file is removed when nothing was polled."""
    from ..config import defaults
    from .source import GpuSource
    cfg = cfg or defaults()
    g = cfg["gpu"]
    polls = 0
    with open(path, "w", encoding="utf-8") as out:
        rec = Recorder(nv, out, clock_us, header)
        src = GpuSource(lambda: rec, procfs=cfg["procfs"], ctx=ctx, busy_threshold=g["busy_threshold"],
                        idle_gap_buckets=g["idle_gap_buckets"], events=g["events"], gpm=g["gpm"],
                        processes=g["processes"], max_processes=g["max_processes"],
                        reprobe_seconds=g["reprobe_seconds"], wall_ns=wall_ns)
        end_t = None
        try:
            start = clock_us()
            while True:
                end_t = clock_us() - rec.start_us + int(interval_s * 1e6)  # the last answers hold one interval
                reading = src.collect()
                if readings is not None:
                    readings.append(reading)
                polls += 1
                if (clock_us() - start) / 1e6 + interval_s >= duration_s - 1e-9:
                    break
                sleep(interval_s)
        finally:
            src.close()
            rec.close(end_t)
    if polls == 0:
        os.unlink(path)
    return polls
