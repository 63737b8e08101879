"""Reduce a PyTorch profiler trace (Chrome trace JSON) to an HTA-style summary (issue 46).

The input is what ``torch.profiler``'s ``export_chrome_trace`` and ``tensorboard_trace_handler`` write
(``.json`` or ``.json.gz``): ``{"traceEvents": [...]}`` with complete events (``"ph": "X"``, ``ts`` and
``dur`` in microseconds) and one ``ProfilerStep#N`` span per traced step.  Everything here is a pure
function of the events, except :func:`load`, which reads one file with a size bound.

Per step (the ``ProfilerStep#N`` span on the host), every instant of the step is put in exactly one of:
data wait (a DataLoader ``enumerate(DataLoader)#...__next__`` span), exposed communication (a collective
span -- ``nccl:``, ``gloo:``, ``c10d::``, ``record_param_comms`` -- while no other host op runs), compute
(any other host op), or host gap (nothing recorded).  Overlapped communication (a collective while a
host op runs on another thread) is reported beside, inside compute.  Where a device was traced (kernels,
memcpy, memset), the same partition over the device timeline: compute kernels, memory, exposed and
overlapped communication (kernels whose name holds ``nccl``), idle.  docs/trace.md says what each
figure means and what is not covered.
"""
from __future__ import annotations

import bisect
import json
import math
import re
import statistics
import zlib
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

FORMAT = "teye-trace-summary"
VERSION = 1
from .defaults import MAX_TRACE_BYTES, TOP_N  # noqa: E402,F401 (the parser's defaults: agent.trace.defaults)

STEP = re.compile(r"^ProfilerStep#(\d+)$")
DATA_PREFIX = "enumerate(DataLoader)#"
# TensorFlow (teye's conversion of the profiler's XSpace, teye_client/_tftrace.py): the wait for a tf.data
# element, eagerly (the op's execution on the training thread) or inside a graph (the op's kernel)
TF_DATA_PREFIX = "EagerLocalExecute: IteratorGetNext"
TF_DATA_NAMES = frozenset(("IteratorGetNextOp::DoCompute",))
COMM_PREFIXES = ("nccl:", "gloo:", "c10d::", "record_param_comms")
HOST_CATS = frozenset(("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"))
KERNEL_CATS = frozenset(("kernel",))
MEMORY_CATS = frozenset(("gpu_memcpy", "gpu_memset"))
HOST_SHARES = ("data_wait", "compute", "communication_exposed", "communication_overlapped", "gap")
DEVICE_SHARES = ("compute", "memory", "communication_exposed", "communication_overlapped", "idle")

Interval = Tuple[float, float]


class TraceError(ValueError):
    """A file that cannot be summarised: the message is one line naming the file and why."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


# ---------------------------------------------------------------------------------------------- reading

def load(path: str, max_bytes: int = MAX_TRACE_BYTES) -> Dict[str, Any]:
    """The trace's top-level object, read with a bound: at most ``max_bytes`` (of the file, and of a
    ``.gz`` file's decompressed text).  TraceError for an unreadable, oversized, truncated or non-trace file."""
    if path.endswith(".xplane.pb"):
        raise TraceError(path, "a TensorFlow profiler trace (XSpace protobuf): the summary reads Chrome traces; "
                         "`teye trace` writes one beside it (.tf.trace.json, docs/trace.md)")
    try:
        with open(path, "rb") as fh:
            raw = fh.read(max_bytes + 1)
            if len(raw) > max_bytes:
                raise TraceError(path, f"larger than the bound of {max_bytes} bytes (--max-bytes)")
            if raw[:2] == b"\x1f\x8b":
                raw = _gunzip(path, raw, max_bytes)
    except OSError as e:
        raise TraceError(path, f"cannot read: {e.strerror or e}") from None
    return parse(path, raw)


def _gunzip(path: str, raw: bytes, max_bytes: int) -> bytes:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(raw, max_bytes + 1)
    except zlib.error as e:
        raise TraceError(path, f"corrupt gzip ({e})") from None
    if len(out) > max_bytes:
        raise TraceError(path, f"decompresses to more than the bound of {max_bytes} bytes (--max-bytes)")
    if not d.eof:
        raise TraceError(path, "truncated gzip")
    return out


def parse(path: str, raw: bytes) -> Dict[str, Any]:
    """The top-level object of a Chrome trace (the object form, or the bare array form of the format)."""
    try:
        doc = json.loads(raw)
    except UnicodeDecodeError:
        raise TraceError(path, "not UTF-8 text") from None
    except ValueError as e:
        msg = getattr(e, "msg", str(e))
        cut = getattr(e, "pos", -1) >= len(raw.rstrip()) or msg.startswith("Unterminated string")
        where = f": line {e.lineno} column {e.colno}" if hasattr(e, "lineno") else ""
        raise TraceError(path, f"{'truncated JSON' if cut else 'not JSON'} ({msg}{where})") from None
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError(path, "not a Chrome trace: no traceEvents list (is it a PyTorch profiler trace?)")
    return doc


# ------------------------------------------------------------------------------------------- intervals

def union(intervals: Iterable[Interval]) -> List[Interval]:
    """Sorted, disjoint intervals covering exactly what the given ones cover (touching ones merged)."""
    out: List[List[float]] = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def length(u: Sequence[Interval]) -> float:
    return sum(e - s for s, e in u)


def intersect(a: Sequence[Interval], b: Sequence[Interval]) -> List[Interval]:
    """The intersection of two unions (each sorted and disjoint)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Sequence[Interval], b: Sequence[Interval]) -> List[Interval]:
    """What of union ``a`` union ``b`` does not cover."""
    out, j = [], 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        k, cur = j, s
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def clip(u: Sequence[Interval], window: Interval, ends: Optional[Sequence[float]] = None) -> List[Interval]:
    """The part of union ``u`` inside ``window``.  ``ends``: the union's end points, precomputed (sorted, as the
    union is disjoint), so that a step looks only at its own intervals, not at the whole trace's."""
    if ends is None:
        ends = [e for _, e in u]
    out, i = [], bisect.bisect_right(ends, window[0])
    while i < len(u) and u[i][0] < window[1]:
        s, e = max(u[i][0], window[0]), min(u[i][1], window[1])
        if e > s:
            out.append((s, e))
        i += 1
    return out


# -------------------------------------------------------------------------------------------- events

class Events:
    """The complete events of one trace, sorted into what the summary needs."""

    def __init__(self, doc: Dict[str, Any]):
        self.steps: Dict[int, Interval] = {}
        self.device_steps: Dict[int, Interval] = {}
        self.data: List[Interval] = []
        self.comm: List[Interval] = []
        self.host_ops: List[Tuple[Any, Any, float, float, str]] = []    # (pid, tid, start, end, name)
        self.kernels: List[Tuple[float, float, str]] = []
        self.comm_kernels: List[Interval] = []
        self.memory: List[Interval] = []
        self.device_events: List[Tuple[float, float, str]] = []    # every kernel, memcpy and memset
        self.skipped = 0
        inside: Dict[Tuple[Any, Any], List[Interval]] = {}     # data and comm spans per thread
        for ev in doc["traceEvents"]:
            if not isinstance(ev, dict) or ev.get("ph") != "X":
                continue
            name, cat, ts, dur = ev.get("name"), ev.get("cat"), ev.get("ts"), ev.get("dur")
            if not (isinstance(name, str) and _number(ts) and _number(dur) and dur >= 0):
                self.skipped += 1
                continue
            span = (float(ts), float(ts) + float(dur))
            m = STEP.match(name)
            if m:
                if cat == "gpu_user_annotation":
                    self.device_steps[int(m.group(1))] = span
                else:
                    self.steps[int(m.group(1))] = span
            elif cat in KERNEL_CATS or cat in MEMORY_CATS:
                self.device_events.append((span[0], span[1], name))
                if cat in MEMORY_CATS:
                    self.memory.append(span)
                elif "nccl" in name.lower():
                    self.comm_kernels.append(span)
                else:
                    self.kernels.append((span[0], span[1], name))
            elif cat in HOST_CATS:
                key = (ev.get("pid"), ev.get("tid"))
                if is_data(name):
                    self.data.append(span)
                    inside.setdefault(key, []).append(span)
                elif name.startswith(COMM_PREFIXES):
                    self.comm.append(span)
                    inside.setdefault(key, []).append(span)
                self.host_ops.append((key[0], key[1], span[0], span[1], name))
        self.data_u = union(self.data)
        self.comm_u = union(self.comm)
        # compute: host ops that are neither data nor collectives, nor run inside one on their own thread
        unions = {k: union(v) for k, v in inside.items()}
        starts = {k: [s for s, _ in u] for k, u in unions.items()}
        compute = []
        for pid, tid, s, e, name in self.host_ops:
            if name.startswith(COMM_PREFIXES) or is_data(name):
                continue
            u = unions.get((pid, tid))
            if u:
                i = bisect.bisect_right(starts[(pid, tid)], s) - 1
                if i >= 0 and u[i][0] <= s and e <= u[i][1]:
                    continue
            compute.append((s, e))
        self.compute_u = union(compute)
        self.device = bool(self.kernels or self.comm_kernels or self.memory)
        self.kernel_u = union((s, e) for s, e, _ in self.kernels)
        self.memory_u = union(self.memory)
        self.comm_kernel_u = union(self.comm_kernels)
        self.ends = {k: [e for _, e in getattr(self, k)] for k in
                     ("data_u", "comm_u", "compute_u", "kernel_u", "memory_u", "comm_kernel_u")}


def is_data(name: str) -> bool:
    """Whether a host span is a wait for input: a DataLoader iterator's ``__next__``, a tf.data ``IteratorGetNext``."""
    return (name.startswith(DATA_PREFIX) and "__next__" in name) or name.startswith(TF_DATA_PREFIX) or \
        name in TF_DATA_NAMES


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# ------------------------------------------------------------------------------------------ reduction

def host_breakdown(ev: Events, window: Interval) -> Dict[str, float]:
    """Seconds of one host step window in each of HOST_SHARES (all but the overlapped part sum to it)."""
    data = clip(ev.data_u, window, ev.ends['data_u'])
    comm = subtract(clip(ev.comm_u, window, ev.ends['comm_u']), data)
    compute = subtract(clip(ev.compute_u, window, ev.ends['compute_u']), data)
    busy = length(data) + length(compute) + length(subtract(comm, compute))
    return {
        "data_wait": length(data) / 1e6,
        "compute": length(compute) / 1e6,
        "communication_exposed": length(subtract(comm, compute)) / 1e6,
        "communication_overlapped": length(intersect(comm, compute)) / 1e6,
        "gap": max(0.0, (window[1] - window[0]) - busy) / 1e6,
    }


def device_breakdown(ev: Events, window: Interval) -> Dict[str, float]:
    """Seconds of one device step window in each of DEVICE_SHARES (all but the overlapped part sum to it)."""
    kernels = clip(ev.kernel_u, window, ev.ends['kernel_u'])
    memory = subtract(clip(ev.memory_u, window, ev.ends['memory_u']), kernels)
    work = union(kernels + memory)
    comm = clip(ev.comm_kernel_u, window, ev.ends['comm_kernel_u'])
    busy = union(work + comm)
    return {
        "compute": length(kernels) / 1e6,
        "memory": length(memory) / 1e6,
        "communication_exposed": length(subtract(comm, work)) / 1e6,
        "communication_overlapped": length(intersect(comm, work)) / 1e6,
        "idle": max(0.0, (window[1] - window[0]) - length(busy)) / 1e6,
    }


def self_times(ops: Sequence[Tuple[Any, Any, float, float, str]], windows: Sequence[Interval]):
    """Per op name: (calls, self microseconds) over the host ops that start inside a step window.  An op's
    self time is its duration less its direct children's (spans nested in it on the same thread)."""
    starts = [w[0] for w in windows]

    def in_steps(t: float) -> bool:
        i = bisect.bisect_right(starts, t) - 1
        return i >= 0 and t < windows[i][1]

    by_thread: Dict[Tuple[Any, Any], List[Tuple[float, float, str]]] = {}
    for pid, tid, s, e, name in ops:
        if not STEP.match(name):
            by_thread.setdefault((repr(pid), repr(tid)), []).append((s, e, name))
    calls: Dict[str, int] = {}
    self_us: Dict[str, float] = {}
    for spans in by_thread.values():
        spans.sort(key=lambda x: (x[0], -x[1]))
        stack: List[List[Any]] = []          # [end, name, children's time, start]

        def close(item):
            _, name, child, start = item[0], item[1], item[2], item[3]
            if in_steps(start):
                calls[name] = calls.get(name, 0) + 1
                self_us[name] = self_us.get(name, 0.0) + max(0.0, (item[0] - start) - child)

        for s, e, name in spans:
            while stack and stack[-1][0] <= s:
                close(stack.pop())
            if stack:
                stack[-1][2] += min(e, stack[-1][0]) - s
            stack.append([e, name, 0.0, s])
        while stack:
            close(stack.pop())
    return calls, self_us


def summarize(doc: Dict[str, Any], path: str = "", top: int = TOP_N) -> Dict[str, Any]:
    """The summary of one trace (a dict with stable keys; durations in seconds, shares as ratios 0-1).

    TraceError where the trace holds no ProfilerStep#N span."""
    ev = Events(doc)
    if not ev.steps:
        raise TraceError(path, "no steps found: no ProfilerStep#N span in the trace (the profiler must be "
                         "stepped with prof.step() on every iteration)")
    steps = []
    totals_host = dict.fromkeys(HOST_SHARES, 0.0)
    totals_dev = dict.fromkeys(DEVICE_SHARES, 0.0)
    total = dev_total = 0.0
    for n in sorted(ev.steps):
        w = ev.steps[n]
        dur = (w[1] - w[0]) / 1e6
        host = host_breakdown(ev, w)
        row: Dict[str, Any] = {"step": n, "duration_s": dur, "host": _shares(host, dur), "device": None}
        total += dur
        for k in HOST_SHARES:
            totals_host[k] += host[k]
        if ev.device:
            dw = ev.device_steps.get(n, w)
            ddur = (dw[1] - dw[0]) / 1e6
            dev = device_breakdown(ev, dw)
            row["device"] = _shares(dev, ddur)
            row["device_duration_s"] = ddur
            dev_total += ddur
            for k in DEVICE_SHARES:
                totals_dev[k] += dev[k]
        steps.append(row)
    durations = [r["duration_s"] for r in steps]
    calls, self_us = self_times(ev.host_ops, sorted(ev.steps.values()))
    top_ops = [{"name": name, "calls": calls[name], "self_s": us / 1e6, "share": (us / 1e6) / total if total else 0.0}
               for name, us in sorted(self_us.items(), key=lambda kv: (-kv[1], kv[0]))[:top]]
    kernel_time: Dict[str, float] = {}
    kernel_calls: Dict[str, int] = {}
    dwindows = sorted(ev.device_steps.get(n, ev.steps[n]) for n in ev.steps)
    dstarts = [w[0] for w in dwindows]
    for s, e, name in ev.device_events:
        i = bisect.bisect_right(dstarts, s) - 1
        if i >= 0 and s < dwindows[i][1]:
            kernel_time[name] = kernel_time.get(name, 0.0) + (e - s)
            kernel_calls[name] = kernel_calls.get(name, 0) + 1
    top_kernels = [{"name": name, "calls": kernel_calls[name], "time_s": us / 1e6}
                   for name, us in sorted(kernel_time.items(), key=lambda kv: (-kv[1], kv[0]))[:top]]
    dist = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    rank = dist.get("rank")
    host_name = doc.get("host_name")
    return {
        "file": path,
        "rank": rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
        "host_name": host_name if isinstance(host_name, str) else None,
        "device_traced": ev.device,
        "steps": steps,
        "overall": {
            "steps": len(steps),
            "step_time_s": {"total": total, "mean": total / len(steps), "median": statistics.median(durations),
                            "min": min(durations), "max": max(durations)},
            "host": _shares(totals_host, total),
            "device": _shares(totals_dev, dev_total) if ev.device else None,
        },
        "top_ops": top_ops,
        "top_kernels": top_kernels,
        "skipped_events": ev.skipped,
    }


def _shares(seconds: Dict[str, float], total: float) -> Dict[str, float]:
    return {k: (v / total if total > 0 else 0.0) for k, v in seconds.items()}


def rank_spread(summaries: Sequence[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """Step-time spread between the traces of several ranks (None for fewer than two): each trace's mean
    step time, the slowest and fastest, their difference, and the difference relative to the fastest;
    over the step numbers every trace holds, the largest per-step difference too."""
    if len(summaries) < 2:
        return None
    rows = []
    for i, s in enumerate(summaries):
        rows.append({"rank": s["rank"] if s["rank"] is not None else i, "file": s["file"],
                     "mean_step_s": s["overall"]["step_time_s"]["mean"]})
    slow = max(rows, key=lambda r: (r["mean_step_s"], -r["rank"]))
    fast = min(rows, key=lambda r: (r["mean_step_s"], r["rank"]))
    per_step = [{r["step"]: r["duration_s"] for r in s["steps"]} for s in summaries]
    common = sorted(set.intersection(*(set(p) for p in per_step)))
    worst = None
    for n in common:
        d = max(p[n] for p in per_step) - min(p[n] for p in per_step)
        if worst is None or d > worst["spread_s"]:
            worst = {"step": n, "spread_s": d}
    spread = slow["mean_step_s"] - fast["mean_step_s"]
    return {
        "count": len(rows),
        "by_rank": rows,
        "slowest_rank": slow["rank"],
        "fastest_rank": fast["rank"],
        "spread_s": spread,
        "spread_ratio": spread / fast["mean_step_s"] if fast["mean_step_s"] > 0 else 0.0,
        "common_steps": len(common),
        "worst_step": worst,
    }


def summarize_files(paths: Sequence[str], max_bytes: int = MAX_TRACE_BYTES, top: int = TOP_N) -> Dict[str, Any]:
    """Every file's summary (or its one-line error), and the spread between them."""
    traces, errors = [], []
    for p in paths:
        try:
            traces.append(summarize(load(p, max_bytes), p, top))
        except TraceError as e:
            errors.append({"file": p, "reason": e.reason})
    return {"format": FORMAT, "version": VERSION, "traces": traces, "ranks": rank_spread(traces), "errors": errors}


# ------------------------------------------------------------------------------------------- rendering

def _pct(x: float) -> str:
    return f"{100 * x:5.1f} %"


def render_text(result: Dict[str, Any]) -> str:
    out: List[str] = []
    for t in result["traces"]:
        o = t["overall"]
        st = o["step_time_s"]
        who = f"rank {t['rank']}" if t["rank"] is not None else "rank ?"
        out.append(f"{t['file']} ({who}{', ' + t['host_name'] if t['host_name'] else ''}): {o['steps']} steps "
                   f"traced, step time mean {st['mean'] * 1e3:.1f} ms (min {st['min'] * 1e3:.1f}, "
                   f"max {st['max'] * 1e3:.1f})")
        h = o["host"]
        out.append(f"  host     data wait {_pct(h['data_wait'])}  compute {_pct(h['compute'])}  "
                   f"communication exposed {_pct(h['communication_exposed'])} "
                   f"(overlapped {_pct(h['communication_overlapped'])})  gap {_pct(h['gap'])}")
        d = o["device"]
        if d is not None:
            out.append(f"  device   idle {_pct(d['idle'])}  compute {_pct(d['compute'])}  memory {_pct(d['memory'])}  "
                       f"communication exposed {_pct(d['communication_exposed'])} "
                       f"(overlapped {_pct(d['communication_overlapped'])})")
        else:
            out.append("  device   not traced")
        out.append("  per step:")
        for r in t["steps"]:
            line = (f"    #{r['step']:<6} {r['duration_s'] * 1e3:9.1f} ms  data {_pct(r['host']['data_wait'])}  "
                    f"compute {_pct(r['host']['compute'])}  comm {_pct(r['host']['communication_exposed'])}  "
                    f"gap {_pct(r['host']['gap'])}")
            if r["device"] is not None:
                line += f"  device idle {_pct(r['device']['idle'])}"
            out.append(line)
        if t["top_ops"]:
            out.append("  top ops by self time:")
            for op in t["top_ops"]:
                out.append(f"    {op['self_s'] * 1e3:9.1f} ms {_pct(op['share'])} {op['calls']:6d}x  {op['name']}")
        if t["top_kernels"]:
            out.append("  top kernels:")
            for k in t["top_kernels"]:
                out.append(f"    {k['time_s'] * 1e3:9.1f} ms {k['calls']:6d}x  {k['name']}")
    r = result["ranks"]
    if r is not None:
        out.append(f"ranks: {r['count']} traces, step time spread {r['spread_s'] * 1e3:.1f} ms "
                   f"({_pct(r['spread_ratio']).strip()} of the fastest): slowest rank {r['slowest_rank']}, "
                   f"fastest rank {r['fastest_rank']}"
                   + (f"; largest on step {r['worst_step']['step']}: {r['worst_step']['spread_s'] * 1e3:.1f} ms"
                      if r["worst_step"] else "; no step number in common"))
    for e in result["errors"]:
        out.append(f"teye trace summarize: {e['file']}: {e['reason']}")
    return "\n".join(out) + "\n"
