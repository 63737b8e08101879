"""The phase wire protocol, versions 1 and 2: one JSON object per Unix datagram (see docs/phases.md).

    {"v": 1,
     "job": "resnet50-bs64",
     "phases": [["data_wait", 1200, 1500], ["compute", 1500, 4100]],   # name, start_ns, end_ns
     "steps":  [[1200, 4100, 64]],                                      # start_ns, end_ns, samples
     "cvd": "0,1",                                                      # optional CUDA_VISIBLE_DEVICES
     "dropped": 0}                                                      # optional: records the client dropped

Version 2 adds ``"sums"``: windows of fast steps the client summed (a step and its phases all shorter
than RESOLUTION_NS), each ``[start_ns, end_ns, steps, samples, step_ns, [[name, ns, in_step_ns], ...],
[count per STEP_BUCKETS bucket, ...]]`` over at most RESOLUTION_NS; a version 1 message is what it
always was (no sums; a "sums" key in it is ignored like any unknown key).

Times are CLOCK_MONOTONIC nanoseconds (Python: ``time.monotonic_ns()``), the clock the
agent samples the GPUs with, so no clock synchronisation is needed on one host.  The
sender's identity is never read from the message: the receiver takes pid and uid from
the kernel (SCM_CREDENTIALS).

:func:`decode` turns a datagram into a :class:`Message` or raises :class:`Rejected`
with one of :data:`REASONS`; every rejection is counted by reason in
``teye_phase_messages_total{result}``.  Unknown keys are ignored (forward compatible
within a version); a ``v`` other than 1 or 2 is ``unknown_version``.  One implementation, in
Python (issue 38 removed the compiled mirror).
"""
from __future__ import annotations

import json
import re
from typing import NamedTuple, Optional, Tuple

VERSION = 2                 # what this agent and the teye_client of its release speak
VERSIONS = (1, 2)           # what this agent accepts (docs/phases.md: version 1 until at least 2027-12)
# The resolution of the phase path: a step or phase at least this long is sent as an interval, as in
# version 1; shorter steps are summed by the client over windows no longer than this (teye_client has the
# same constants; tests/phases/test_sums.py holds the two equal).
RESOLUTION_NS = 10_000_000
# The step histogram's bucket bounds (seconds): teye_job_step_seconds, and the buckets a sum window counts.
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# The parts of a step's compute (issue 45): the optional "parts" of a message, [ns, ...] in this order, the
# time of each inside the compute of the message's steps (their sum never above it); the agent's "other" part is
# the rest of the compute (agent.phases.parts).  The optional "mem": the sender's device memory at its last step,
# [allocated, reserved, peak allocated during the step] bytes (CUDA's caching allocator; docs/phases.md).
PARTS = ("forward", "backward", "optimizer", "h2d_copy")
MAX_MEMORY_BYTES = 1 << 56  # 64 PiB: more is not a GPU's
MAX_TRACE_STEPS = 1000      # steps of one trace (teye_client._trace.MAX_STEPS)
TRACE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")

# Documented phase names; anything else is counted as "other".
PHASES = ("data_wait", "compute", "host", "communication", "checkpoint", "eval", "compile", "other")
_PHASE_SET = frozenset(PHASES)

ACCEPTED = "accepted"
# Why a datagram was rejected (the `result` label values besides "accepted").
REASONS = (
    "too_large",        # datagram over phases.max_message_bytes, or more records than max_records_per_message
    "not_json",         # not UTF-8 JSON (or nested absurdly deep, or NaN/Infinity)
    "not_object",       # JSON, but not an object
    "missing_field",    # no "v" or no "job"
    "unknown_version",  # "v" is not a version this agent speaks
    "wrong_type",       # a field or record has the wrong JSON type or shape
    "bad_name",         # job name empty, too long or with characters outside [A-Za-z0-9_.:@+=-]
    "bad_interval",     # negative, reversed or longer than a day
    "bad_clock",        # end time in the future or older than the job expiry: not CLOCK_MONOTONIC ns
    "bad_value",        # negative samples / dropped counts, or absurd values
    "no_credentials",   # the kernel attached no SCM_CREDENTIALS (should not happen with SO_PASSCRED)
    "job_limit",        # a new job refused: its uid at max_jobs_per_user, or the table full and no uid over its share
    "shed",             # discarded unread: the receiver's budget was spent and its sender over its share
    "impossible",       # a sum window whose counts cannot be: more steps than its span holds, more samples than
                        # a step can have, bucket counts that disagree with its step time (issue 48)
)
RESULTS = (ACCEPTED,) + REASONS

JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@+=-]{0,127}\Z")
MAX_INTERVAL_NS = 86_400 * 10**9      # one phase or step lasting over a day is absurd
MAX_NS = 2**63 - 1                    # CLOCK_MONOTONIC fits in a signed 64-bit integer
MAX_SAMPLES = 10**9                   # samples in one step
# What a sum window (version 2) can hold (issue 48): a summed step takes at least MIN_STEP_NS of its process's
# time (a Python training step costs more than a microsecond), so a window holds at most max(1, span //
# MIN_STEP_NS) steps and stands for at least MIN_STEP_NS of time; a summed step (under RESOLUTION_NS) has at
# most MAX_SUMMED_STEP_SAMPLES samples.
MIN_STEP_NS = 1_000
MAX_SUMMED_STEP_SAMPLES = 1 << 20
MAX_CVD_CHARS = 512


# Where a job's phases come from: the optional "src" of a message (sent once per connection by
# teye_client, not per datagram: the per-message path never sees it), exported as
# teye_job_info{source} and named in the verdict's evidence.  Anything else counts as "other".
SOURCES = {
    "client": "client",                                        # a Reporter in the training loop (the default)
    "torch": "zero-code: torch DataLoader",
    "torch-steps": "zero-code: torch optimizer steps (input wait not observed: no DataLoader)",
    "torch-forward": "zero-code: torch, the input is the training thread's time before each forward (its own "
                     "data work: a generator, get_batch, a queue)",
    "tf.data": "zero-code: tf.data",
    "tf-steps": "zero-code: TensorFlow steps (a loop without tf.data, or a Model.fit teye stands aside from: "
                "input wait not observed)",
    "keras": "zero-code: Keras Model.fit (the train function's batch fetch)",
    "other": "other",
}
STEPS_ONLY_SOURCES = frozenset({"torch-steps", "tf-steps"})  # phases that cannot show an input wait
# sources that may not see a batch's size (a get_batch loop's own data work): no samples counted is not "0"
SAMPLES_UNSEEN_SOURCES = STEPS_ONLY_SOURCES | {"torch-forward"}
MAX_SOURCE_CHARS = 32


# The sender's rank in a data-parallel job: the optional "rank" (0 .. world-1) and "world" (ranks in the
# job) of a message, sent once per connection like "src".  The agent keeps the rank per sending pid (docs/phases.md).
MAX_RANK = 1 << 20          # ranks in one job, at most (the largest jobs run tens of thousands)


class Identity(NamedTuple):
    """What a datagram says about its sender once per connection (absent fields: None)."""

    src: Optional[str] = None     # one of SOURCES
    rank: Optional[int] = None    # 0 .. world-1
    world: Optional[int] = None   # ranks in the job (None: not sent)


NO_IDENTITY = Identity()


def identity_of(data: bytes) -> Identity:
    """The "src", "rank" and "world" of an accepted datagram (decode_python has checked them).  Called
    for every datagram accepted, so the usual one (none of the three keys) costs three
    byte searches; the few that carry one are parsed a second time."""
    if b'"src"' not in data and b'"rank"' not in data:
        return NO_IDENTITY
    try:
        obj = json.loads(data)
    except ValueError:
        return NO_IDENTITY
    if type(obj) is not dict:
        return NO_IDENTITY
    src = obj.get("src")
    if type(src) is str:
        src = src if src in SOURCES else "other"
    else:
        src = None
    rank, world = obj.get("rank"), obj.get("world")
    if not (_is_int(rank) and 0 <= rank < MAX_RANK):
        rank = world = None
    elif not (_is_int(world) and rank < world <= MAX_RANK):
        world = None
    return Identity(src, rank, world)


def source_of(data: bytes) -> Optional[str]:
    """The "src" of an accepted datagram (None: it has none), one of SOURCES."""
    return identity_of(data).src if b'"src"' in data else None


class Rejected(ValueError):
    """A datagram that is not a valid message; ``reason`` is one of REASONS."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class Limits(NamedTuple):
    max_bytes: int = 65536
    max_records: int = 1024
    max_age_ns: int = 300 * 10**9      # an end time older than this (the job expiry) is bad_clock
    future_slack_ns: int = 5 * 10**9   # an end time later than now + this is bad_clock


class Message(NamedTuple):
    """A validated message (sender credentials are added by the receiver)."""

    job: str
    phases: Tuple[Tuple[str, int, int], ...]     # (phase, start_ns, end_ns); phase normalised to PHASES
    steps: Tuple[Tuple[int, int, int], ...]      # (start_ns, end_ns, samples)
    cvd: Tuple[str, ...] = ()                    # CUDA_VISIBLE_DEVICES entries, as sent
    dropped: int = 0                             # client-side cumulative dropped records
    sums: Tuple["Window", ...] = ()              # version 2: windows of fast steps, summed by the client
    parts: Optional[Tuple[int, ...]] = None      # ns of PARTS inside the compute of the message's steps
    mem: Optional[Tuple[int, int, int]] = None   # device memory at its last step: allocated, reserved, peak bytes
    trace: Optional[Tuple[int, int, int, str]] = None   # a trace it finished (teye trace): result, first step, steps, id


class Window(NamedTuple):
    """One sum record (version 2): fast steps and their phases over [start_ns, end_ns], at most
    RESOLUTION_NS long."""

    start_ns: int
    end_ns: int
    steps: int
    samples: int
    step_ns: int                                  # the steps' wall time, summed
    phases: Tuple[Tuple[str, int, int], ...]      # (phase, ns as reported, ns inside the steps); one per phase
    hist: Tuple[int, ...]                         # steps per STEP_BUCKETS bucket (+Inf last), trailing zeros cut


_new_message = tuple.__new__  # Message(...) without the generated __new__'s Python frame


def normalize_phase(name: str) -> str:
    return name if name in _PHASE_SET else "other"


def _reject_constant(name):
    raise ValueError(f"{name} is not a number in this protocol")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_SCAN = _DECODER.scan_once
_MISSING = object()
_GOOD_NAMES: set = set()  # job names that matched JOB_NAME (bounded), so a job's messages skip the regex


def _is_int(v) -> bool:
    return type(v) is int  # bool is an int subclass: excluded on purpose


def _span_error(s, e, now_ns: int, limits: Limits, what: str) -> Rejected:
    """Why (s, e) is not a valid interval (called only once the fast check failed)."""
    if not (_is_int(s) and _is_int(e)):
        return Rejected("wrong_type", f"{what}: start/end must be integers (CLOCK_MONOTONIC ns)")
    if s < 0 or e < 0 or s > MAX_NS or e > MAX_NS:
        return Rejected("bad_interval", f"{what}: times must be within 0..2^63-1 ns")
    if e < s:
        return Rejected("bad_interval", f"{what}: end {e} is before start {s}")
    if e - s > MAX_INTERVAL_NS:
        return Rejected("bad_interval", f"{what}: lasts {(e - s) / 1e9:.0f} s (more than a day)")
    if e > now_ns + limits.future_slack_ns:
        return Rejected("bad_clock", f"{what}: ends {(e - now_ns) / 1e9:.1f} s in the future; "
                                     "use CLOCK_MONOTONIC (time.monotonic_ns())")
    return Rejected("bad_clock", f"{what}: ended {(now_ns - e) / 1e9:.0f} s ago; "
                                 "use CLOCK_MONOTONIC (time.monotonic_ns())")


def decode(data: bytes, now_ns: int, limits: Limits = Limits()) -> Message:
    """Validate one datagram; raises Rejected(reason, detail)."""
    if len(data) > limits.max_bytes:
        raise Rejected("too_large", f"{len(data)} bytes (limit {limits.max_bytes})")
    try:
        text = data.decode("utf-8")
        try:
            obj, end = _SCAN(text, 0)  # the C scanner straight away: one whole JSON value, no padding
        except StopIteration:
            end = -1
        if end != len(text):  # whitespace around it, or not JSON: the full decoder (and its error message)
            obj = _DECODER.decode(text)
    except RecursionError:
        raise Rejected("not_json", "nested too deep") from None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise Rejected("not_json", str(e)[:120]) from None
    if type(obj) is not dict:
        raise Rejected("not_object", f"expected a JSON object, got {type(obj).__name__}")

    v, job = _version_and_job(obj)
    phases, steps, sums = _records(obj, v, now_ns, limits)
    cvd, dropped, parts, mem, trace = _extras(obj)
    return _new_message(Message, (job, tuple(phases), tuple(steps), cvd, dropped, sums, parts, mem, trace))


def _version_and_job(obj: dict) -> Tuple[int, str]:
    """A message's protocol version and job name, validated."""
    v = obj.get("v", _MISSING)
    if v is _MISSING:
        raise Rejected("missing_field", "'v' (protocol version) is required")
    if type(v) is not int:  # bool is an int subclass: excluded on purpose
        raise Rejected("wrong_type", "'v' must be an integer")
    if v != 2 and v != 1:
        raise Rejected("unknown_version", f"version {v} (this agent speaks 1 and 2)")

    job = obj.get("job", _MISSING)
    if job is _MISSING:
        raise Rejected("missing_field", "'job' (training job name) is required")
    if type(job) is not str:
        raise Rejected("wrong_type", "'job' must be a string")
    if job not in _GOOD_NAMES:
        if not JOB_NAME.match(job):
            raise Rejected("bad_name", f"job name {job[:40]!r} must match [A-Za-z0-9][A-Za-z0-9_.:@+=-]{{0,127}}")
        if len(_GOOD_NAMES) >= 4096:
            _GOOD_NAMES.clear()
        _GOOD_NAMES.add(job)
    return v, job


def _records(obj: dict, v: int, now_ns: int, limits: Limits):
    """A message's phases, steps and (version 2) sum windows, validated: (phases, steps, sums)."""
    raw_phases = obj.get("phases", [])
    raw_steps = obj.get("steps", [])
    raw_sums = obj.get("sums", []) if v == 2 else []   # (version 1: an unknown key, ignored)
    if type(raw_sums) is not list:
        raise Rejected("wrong_type", "'sums' must be a list of [start_ns, end_ns, steps, samples, step_ns, "
                                     "[[name, ns, in_step_ns], ...], [bucket counts]]")
    if type(raw_phases) is not list:
        raise Rejected("wrong_type", "'phases' must be a list of [name, start_ns, end_ns]")
    if type(raw_steps) is not list:
        raise Rejected("wrong_type", "'steps' must be a list of [start_ns, end_ns, samples]")
    n = len(raw_phases) + len(raw_steps) + len(raw_sums)
    if n > limits.max_records:
        raise Rejected("too_large", f"{n} records (limit {limits.max_records})")

    # A valid interval: integers (not bools), start <= end, at most a day long, ending within
    # [now - max_age, now + future_slack].  One expression on the fast path; _span_error says why.
    lo = now_ns - limits.max_age_ns
    hi = now_ns + limits.future_slack_ns
    phases = []
    for i, rec in enumerate(raw_phases):
        if type(rec) is not list or len(rec) != 3 or type(rec[0]) is not str:
            raise Rejected("wrong_type", f"phases[{i}] must be [name, start_ns, end_ns]")
        name, s, e = rec
        if not (type(s) is int and type(e) is int and 0 <= s <= e <= hi and e >= lo
                and e - s <= MAX_INTERVAL_NS):
            raise _span_error(s, e, now_ns, limits, f"phases[{i}]")
        phases.append((name if name in _PHASE_SET else "other", s, e))

    steps = []
    for i, rec in enumerate(raw_steps):
        if type(rec) is not list or len(rec) != 3:
            raise Rejected("wrong_type", f"steps[{i}] must be [start_ns, end_ns, samples]")
        s, e, samples = rec
        if not (type(s) is int and type(e) is int and 0 <= s <= e <= hi and e >= lo
                and e - s <= MAX_INTERVAL_NS):
            raise _span_error(s, e, now_ns, limits, f"steps[{i}]")
        if type(samples) is not int:
            raise Rejected("wrong_type", f"steps[{i}]: samples must be an integer")
        if not 0 <= samples <= MAX_SAMPLES:
            raise Rejected("bad_value", f"steps[{i}]: samples {samples} outside 0..{MAX_SAMPLES}")
        steps.append((s, e, samples))

    sums = tuple(_window(rec, i, lo, hi, now_ns, limits) for i, rec in enumerate(raw_sums)) if raw_sums else ()
    return phases, steps, sums


def _extras(obj: dict):
    """A message's other fields, validated: (cvd, dropped, parts, mem, trace); src, rank and world are checked
    here too (their values are read by the job table's intake)."""
    cvd: Tuple[str, ...] = ()
    raw_cvd = obj.get("cvd")
    if raw_cvd is not None:
        if type(raw_cvd) is not str:
            raise Rejected("wrong_type", "'cvd' must be a string (CUDA_VISIBLE_DEVICES)")
        if len(raw_cvd) > MAX_CVD_CHARS:
            raise Rejected("too_large", f"'cvd' is {len(raw_cvd)} characters (limit {MAX_CVD_CHARS})")
        cvd = tuple(p.strip() for p in raw_cvd.split(",") if p.strip())

    dropped = obj.get("dropped", 0)
    if type(dropped) is not int:
        raise Rejected("wrong_type", "'dropped' must be an integer")
    if not 0 <= dropped <= MAX_NS:
        raise Rejected("bad_value", f"'dropped' {dropped} is negative or absurd")

    src = obj.get("src")
    if src is not None:
        if type(src) is not str:
            raise Rejected("wrong_type", "'src' must be a string (where the phases come from)")
        if len(src) > MAX_SOURCE_CHARS:
            raise Rejected("too_large", f"'src' is {len(src)} characters (limit {MAX_SOURCE_CHARS})")

    rank = obj.get("rank")
    world = obj.get("world")
    if rank is not None or world is not None:
        if rank is None:
            raise Rejected("missing_field", "'world' without 'rank': send both (or neither)")
        if not _is_int(rank) or (world is not None and not _is_int(world)):
            raise Rejected("wrong_type", "'rank' and 'world' must be integers (the sender's rank, ranks in the job)")
        if not 0 <= rank < MAX_RANK:
            raise Rejected("bad_value", f"'rank' {rank} outside 0..{MAX_RANK - 1}")
        if world is not None and not rank < world <= MAX_RANK:
            raise Rejected("bad_value", f"'world' {world} must exceed 'rank' {rank} (at most {MAX_RANK})")

    parts = obj.get("parts")
    if parts is not None:
        if type(parts) is not list or len(parts) != len(PARTS) or not all(_is_int(x) for x in parts):
            raise Rejected("wrong_type", f"'parts' must be [{', '.join(PARTS)}] integer ns")
        if not all(0 <= x <= MAX_NS for x in parts):
            raise Rejected("bad_value", "'parts': ns must be within 0..2^63-1")
        parts = tuple(parts)
    mem = obj.get("mem")
    if mem is not None:
        if type(mem) is not list or len(mem) != 3 or not all(_is_int(x) for x in mem):
            raise Rejected("wrong_type", "'mem' must be [allocated, reserved, peak] integer bytes")
        if not all(0 <= x <= MAX_MEMORY_BYTES for x in mem):
            raise Rejected("bad_value", f"'mem': bytes must be within 0..{MAX_MEMORY_BYTES}")
        mem = tuple(mem)
    trace = obj.get("trace")
    if trace is not None:
        trace = _trace(trace)
    return cvd, dropped, parts, mem, trace


def _trace(rec) -> Tuple[int, int, int, str]:
    """A message's ``trace``: [result (1 written, 2 failed), first step, steps, id], validated."""
    if type(rec) is not list or len(rec) != 4 or not all(_is_int(x) for x in rec[:3]) or type(rec[3]) is not str:
        raise Rejected("wrong_type", "'trace' must be [result, first_step, steps, id]")
    if rec[0] not in (1, 2) or not 0 <= rec[1] <= MAX_NS or not 1 <= rec[2] <= MAX_TRACE_STEPS:
        raise Rejected("bad_value", f"'trace': result 1 or 2, first_step 0..2^63-1, steps 1..{MAX_TRACE_STEPS}")
    if not TRACE_ID.match(rec[3]):
        raise Rejected("bad_value", "'trace': its id must be 1-64 letters, digits, '_' or '-'")
    return (rec[0], rec[1], rec[2], rec[3])


_N_BUCKETS = len(STEP_BUCKETS) + 1
MAX_WINDOW_PHASES = 64      # phase names in one window (teye_client closes a window at 32)


def _window(rec, i: int, lo: int, hi: int, now_ns: int, limits: Limits) -> Window:
    """One sum record of a version 2 message, validated (see Window)."""
    what = f"sums[{i}]"
    if type(rec) is not list or len(rec) != 7 or type(rec[5]) is not list or type(rec[6]) is not list:
        raise Rejected("wrong_type", f"{what} must be [start_ns, end_ns, steps, samples, step_ns, "
                                     "[[name, ns, in_step_ns], ...], [bucket counts]]")
    s, e, steps, samples, step_ns, raw_ph, raw_hist = rec
    if not (type(s) is int and type(e) is int and 0 <= s <= e <= hi and e >= lo and e - s <= MAX_INTERVAL_NS):
        raise _span_error(s, e, now_ns, limits, what)
    if e - s > RESOLUTION_NS:
        raise Rejected("bad_interval", f"{what}: a window of {(e - s) / 1e6:.3f} ms, longer than the resolution "
                                       f"{RESOLUTION_NS / 1e6:g} ms")
    if not (_is_int(steps) and _is_int(samples) and _is_int(step_ns)):
        raise Rejected("wrong_type", f"{what}: steps, samples and step_ns must be integers")
    if not (1 <= steps <= MAX_SAMPLES and 0 <= samples <= MAX_SAMPLES * steps
            and 0 <= step_ns < steps * RESOLUTION_NS):
        raise Rejected("bad_value", f"{what}: {steps} steps of {step_ns} ns with {samples} samples: not steps "
                                    f"shorter than {RESOLUTION_NS} ns each")
    if len(raw_hist) > _N_BUCKETS or not all(_is_int(c) and c >= 0 for c in raw_hist) or sum(raw_hist) != steps:
        raise Rejected("bad_value", f"{what}: the bucket counts {raw_hist[:_N_BUCKETS + 1]} are not "
                                    f"{steps} steps in {_N_BUCKETS} buckets")
    if len(raw_ph) > MAX_WINDOW_PHASES:
        raise Rejected("too_large", f"{what}: {len(raw_ph)} phase names (limit {MAX_WINDOW_PHASES})")
    _possible(what, e - s, steps, samples, step_ns, raw_hist)
    got = {}
    for k, p in enumerate(raw_ph):
        if type(p) is not list or len(p) != 3 or type(p[0]) is not str or not _is_int(p[1]) or not _is_int(p[2]):
            raise Rejected("wrong_type", f"{what}: phases[{k}] must be [name, ns, in_step_ns]")
        name, ns, inside = p
        if not 0 <= inside <= ns <= MAX_INTERVAL_NS:
            raise Rejected("bad_value", f"{what}: phase {name[:40]!r} of {ns} ns with {inside} ns inside steps")
        name = name if name in _PHASE_SET else "other"
        had = got.get(name)
        # inside the steps: at most the steps' time (a phase overlapping itself, as the interval path merges)
        got[name] = (ns, min(step_ns, inside)) if had is None else (had[0] + ns, min(step_ns, had[1] + inside))
    # a phase's time in a window: at most the window's span (a phase overlapping itself, or names normalised to
    # "other" together, merged as the interval path merges; the client sums a window's phases unmerged)
    span = e - s
    return Window(s, e, steps, samples, step_ns,
                  tuple((n, a if a <= span else span, b if b <= span else span) for n, (a, b) in got.items()),
                  tuple(raw_hist))


FAST_EDGE_NS = round(STEP_BUCKETS[0] * 1e9)   # 5 ms: a summed step is in the first bucket (<= 5 ms) or the second


def _possible(what: str, span: int, steps: int, samples: int, step_ns: int, hist) -> None:
    """Rejected("impossible") unless a window's counts can be: at most max(1, span // MIN_STEP_NS) steps, at most
    MAX_SUMMED_STEP_SAMPLES samples a step, no step above RESOLUTION_NS in the buckets (only the first two can
    hold a summed step), and a step time the bucket counts allow: each step of the second bucket over 5 ms,
    each under RESOLUTION_NS, those over 5 ms fitting in the span (one process's steps never overlap)."""
    if steps > max(1, span // MIN_STEP_NS):
        raise Rejected("impossible", f"{what}: {steps} steps in {span} ns (at least {MIN_STEP_NS} ns a step)")
    if samples > steps * MAX_SUMMED_STEP_SAMPLES:
        raise Rejected("impossible", f"{what}: {samples} samples in {steps} steps (at most "
                                     f"{MAX_SUMMED_STEP_SAMPLES} a summed step)")
    if any(hist[2:]):
        raise Rejected("impossible", f"{what}: steps counted above {STEP_BUCKETS[1]} s in a window of steps "
                                     f"shorter than {RESOLUTION_NS} ns")
    fast = hist[0] if hist else 0
    slow = steps - fast
    lo = slow * (FAST_EDGE_NS + 1)
    hi = fast * FAST_EDGE_NS + slow * (RESOLUTION_NS - 1)
    if not lo <= step_ns <= hi or lo > span:
        raise Rejected("impossible", f"{what}: {fast} steps of at most 5 ms and {slow} over it in {step_ns} ns of "
                                     f"steps and {span} ns of span")


def encode(job: str, phases=(), steps=(), cvd=None, dropped: int = 0, rank=None, world=None, sums=None,
           v: int = None, parts=None, mem=None) -> bytes:
    """The datagram for a message (used by tests and the reference client's docs): version 2 with ``sums``
    (Window tuples or lists), else version 1."""
    obj = {"v": v or (2 if sums else 1), "job": job, "phases": [list(p) for p in phases],
           "steps": [list(s) for s in steps]}
    if sums:
        obj["sums"] = [[w[0], w[1], w[2], w[3], w[4], [list(p) for p in w[5]], list(w[6])] for w in sums]
    if cvd is not None:
        obj["cvd"] = cvd
    if dropped:
        obj["dropped"] = dropped
    if rank is not None:
        obj["rank"] = rank
    if world is not None:
        obj["world"] = world
    if parts is not None:
        obj["parts"] = list(parts)
    if mem is not None:
        obj["mem"] = list(mem)
    return json.dumps(obj, separators=(",", ":")).encode()


decode_python = decode   # the name decode had while a compiled decoder stood in front of it (tests use it)
