"""The /metrics body, prepared ahead of the scrape.

prometheus_client rebuilds metric-family objects and formats every sample on every scrape
(about 10 µs a series).  Here each source *reading* is formatted once, the first time a
scrape sees it, into sample lines shared by both formats (the Prometheus text format and
OpenMetrics write a sample line the same way; only the family headers differ).  A scrape
then joins prepared pieces: the body for one set of source states is composed once and
kept, and only what depends on the scrape's own clock is formatted per scrape:

- ``teye_collector_last_read_age_seconds`` (the age grows with every scrape), and
- ``teye_collector_up`` with a stuck read marked down after ``stale_after_s`` (the up flags
  are part of the cache key, so a source turning stale recomposes the body without it), and
- the ``extra`` series (the web server's own counters, :mod:`exporters.webstats`), written
  right after the age family (at the end when there is none), as the collector places them.
  Their producer gives a :class:`exporters.specs.Layout` (which series, in order) and the
  values; the text around the values is prepared once per layout, so a scrape formats only
  the numbers.  The families whose values change with every scrape (the request counts)
  join the age lines in the per-scrape gzip piece; the rest is compressed again only when
  one of its values changed.

The gzip body is one ordinary gzip member built from raw-deflate pieces: the static pieces
are compressed once (each ends on a byte boundary with a sync flush and uses no history
from the others), the per-scrape piece is compressed per scrape, and the CRC is computed
over the whole body.

The output is byte for byte what ``prometheus_client``'s ``generate_latest`` (text) and
``openmetrics.exposition.generate_latest`` produce for the same snapshot through
:class:`exporters.prometheus.SnapshotCollector` (tests/test_render.py checks it).  The few
cases this fast path does not cover (an Accept header asking for a name escaping that
rewrites legacy names, a metric or label name outside the legacy character set, the same
series exported by two collectors) go through prometheus_client's own encoder instead.
"""
from __future__ import annotations

import logging
import math
import re
import struct
import time
import zlib
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

from agent import __version__
from agent.logutil import RateLimitedLog
from agent.metrics import COUNTER, HISTOGRAM, MetricSpec

from .specs import (BUILD_INFO, COLLECTOR_ABSENT, COLLECTOR_AGE, COLLECTOR_DURATION, COLLECTOR_FAILURES, COLLECTOR_UP,
                    Layout)

log = logging.getLogger("teye.exporter")

_LEGACY_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LEGACY_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
# Name escapings under which a legacy name is written unchanged (others rewrite it: slow path).
_PLAIN_ESCAPINGS = ("underscores", "allow-utf-8")
_OM = "application/openmetrics-text"
_TEXT_004 = "text/plain; version=0.0.4; charset=utf-8"
_ESCAPINGS = ("allow-utf-8", "underscores", "dots", "values")


def _version(v: str) -> Optional[tuple]:
    """'1.0.0' -> (1, 0, 0); None where a part is not a number (prometheus_client decides those)."""
    try:
        return tuple(int(part) for part in v.split("."))
    except ValueError:
        return None


def negotiate(accept: str) -> Optional[Tuple[str, str, str]]:
    """(format "text" or "om", Content-Type, name escaping) for this Accept header, as prometheus_client's
    ``choose_encoder`` picks them (tests/test_render.py holds the two equal), or None for a version that
    is not all numbers (prometheus_client's own encoder answers those).  Negotiated here so that an agent
    never imports prometheus_client for a scrape: its package brings http.server, wsgiref and email
    (docs/operations.md "Agent footprint")."""
    for accepted in (accept or "").split(","):
        toks = accepted.split(";")
        kind = toks[0].strip()
        if kind not in (_OM, "text/plain"):
            continue
        params = {}
        for tok in toks:
            if "=" in tok:
                key, value = tok.strip().split("=", 1)
                params.setdefault(key, value)
        version = params.get("version", "")
        escaping = params.get("escaping", "underscores")
        if escaping not in _ESCAPINGS:
            escaping = "underscores"
        if kind == _OM and not version:
            return "om", _OM + "; version=1.0.0; charset=utf-8", "underscores"
        if not version:
            continue
        parsed = _version(version)
        if parsed is None:
            return None
        if parsed >= (1, 0, 0):
            if kind == _OM:
                return "om", f"{_OM}; version={version}; charset=utf-8; escaping={escaping}", escaping
            return "text", f"text/plain; version=1.0.0; charset=utf-8; escaping={escaping}", escaping
    return "text", _TEXT_004, "underscores"


def _encode(registry, accept: str) -> Tuple[bytes, str]:
    """prometheus_client's own encoding of ``registry`` for this Accept header (the slow path, imported
    only when needed)."""
    from prometheus_client.exposition import choose_encoder
    encoder, ctype = choose_encoder(accept)
    return encoder(registry), ctype


def go_float(f: float) -> str:
    """A sample value as Go's strconv (and prometheus_client's floatToGoString) writes it: +Inf, -Inf, NaN,
    Python's shortest repr, but an exponent from 1e+07 up where Python writes digits up to 1e16."""
    if f != f:
        return "NaN"
    if f in (math.inf, -math.inf):
        return "+Inf" if f > 0 else "-Inf"
    s = repr(f)
    dot = s.find(".")
    if f > 0 and dot > 6:   # 12345678.0 -> 1.2345678e+07
        return f"{s[0]}.{(s[1:dot] + s[dot + 1:]).rstrip('0')}".rstrip(".") + f"e+{dot - 1:02d}"
    return s


class _Unsupported(Exception):
    """This snapshot needs prometheus_client's own encoder (see the module docstring)."""


def _esc(v: str) -> str:
    """Label value escaping (both formats)."""
    if "\\" in v or "\n" in v or '"' in v:
        return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return v


_VALUES: Dict[float, str] = {}
_CACHE_MAX = 1 << 14  # entries per cache; a full cache starts over (label sets and values recur per reading)


def _value(v) -> str:
    """floatToGoString(v), remembered: counters and gauges repeat the same values reading after reading."""
    f = float(v)
    if f == 0.0:  # the commonest value; -0.0 == 0.0 as a key, so never cached
        return "0.0" if math.copysign(1.0, f) > 0 else "-0.0"
    s = _VALUES.get(f)
    if s is None:
        if len(_VALUES) >= _CACHE_MAX:
            _VALUES.clear()
        s = _VALUES[f] = go_float(f)
    return s


class _Family:
    """Per-spec constants: both headers and the sample-line templates, and the formatted label sets."""

    __slots__ = ("spec", "text_head", "om_head", "line", "bucket", "count", "sum", "histogram", "prefixes")

    def __init__(self, spec: MetricSpec):
        if not _LEGACY_NAME.match(spec.name) or not all(_LEGACY_LABEL.match(lb) for lb in spec.labels):
            raise _Unsupported(spec.name)
        name = spec.name
        doc = spec.help
        if spec.kind == COUNTER:
            fam = name[:-6] if name.endswith("_total") else name  # prometheus_client's CounterMetricFamily
            text_name, sample = fam + "_total", fam + "_total"
        else:
            fam = text_name = sample = name
        kind = spec.kind
        text_doc = doc.replace("\\", r"\\").replace("\n", r"\n")
        om_doc = text_doc.replace('"', r"\"")
        self.spec = spec
        self.text_head = f"# HELP {text_name} {text_doc}\n# TYPE {text_name} {kind}\n"
        self.om_head = f"# HELP {fam} {om_doc}\n# TYPE {fam} {kind}\n"
        self.histogram = kind == HISTOGRAM
        self.prefixes: Dict[tuple, object] = {}  # label values -> line prefix (histograms: prefixes per line)
        if self.histogram:
            if "le" in spec.labels:
                raise _Unsupported(spec.name)
            self.bucket = self._template(fam + "_bucket", spec.labels + ("le",))
            self.count = self._template(fam + "_count", spec.labels)
            self.sum = self._template(fam + "_sum", spec.labels)
            self.line = None
        else:
            self.line = self._template(sample, spec.labels)

    @staticmethod
    def _template(sample: str, labels: Tuple[str, ...]) -> str:
        """'name{a="{0}",b="{1}"} ' with labels sorted by name (as prometheus_client writes them)."""
        if not labels:
            return sample + " "
        order = sorted(range(len(labels)), key=lambda i: labels[i])
        return sample + "{{" + ",".join(f'{labels[i]}="{{{i}}}"' for i in order) + "}} "

    def lines(self, labels: Tuple[str, ...], value) -> str:
        prefix = self.prefixes.get(labels)
        if not self.histogram:
            if prefix is None:
                prefix = self._remember(labels, self.line.format(*[_esc(v) for v in labels]))
            return prefix + _value(value) + "\n"
        bounds = tuple(le for le, _ in value.buckets)
        if prefix is None or prefix[0] != bounds:
            lv = [_esc(v) for v in labels]
            les = ["+Inf" if math.isinf(le) else repr(float(le)) for le in bounds]
            prefix = self._remember(labels, (bounds, [self.bucket.format(*lv, le) for le in les],
                                             float(les[0]) >= 0, self.count.format(*lv), self.sum.format(*lv)))
        _, bucket_prefixes, nonnegative, count, total = prefix
        out = [p + _value(c) + "\n" for p, (_, c) in zip(bucket_prefixes, value.buckets)]
        if nonnegative and value.sum is not None:
            out.append(count + _value(value.buckets[-1][1]) + "\n")
            out.append(total + _value(value.sum) + "\n")
        return "".join(out)

    def _remember(self, labels, prefix):
        if len(self.prefixes) >= _CACHE_MAX:
            self.prefixes.clear()
        self.prefixes[labels] = prefix
        return prefix


_FAMILIES: Dict[str, _Family] = {}


def _family(spec: MetricSpec) -> _Family:
    f = _FAMILIES.get(spec.name)
    if f is None or f.spec is not spec:
        f = _FAMILIES[spec.name] = _Family(spec)
    return f


# A prepared reading: [(family, sample lines, frozenset of label tuples)] in first-seen order.
_Prepared = List[Tuple[_Family, str, frozenset]]


def prepare(points) -> _Prepared:
    """Format one reading's points (absent values and repeated series dropped, as families() does)."""
    fams: Dict[str, list] = {}
    spec = ent = None
    for p_spec, labels, v in points:
        if v is None or (isinstance(v, float) and v != v):  # absent, or NaN
            continue
        if p_spec is not spec:  # points of one family usually come together
            spec = p_spec
            ent = fams.get(spec.name)
            if ent is None:
                ent = fams[spec.name] = [_family(spec), [], set()]
            fam, out, keys = ent
        if labels in keys:
            continue
        keys.add(labels)
        prefix = None if fam.histogram else fam.prefixes.get(labels)
        if prefix is not None:
            out.append(prefix + _value(v) + "\n")
        else:
            out.append(fam.lines(labels, v))
    return [(f, "".join(lines), frozenset(keys)) for f, lines, keys in fams.values()]


def _equal(a, b) -> bool:
    """Whether reading ``b`` writes the same lines as ``a``: equal values of one type (frozen dataclasses and named
    tuples compare field by field).  Values that compare equal are written alike (1 and 1.0 both as 1.0; NaN is
    never equal, so it is formatted again) but for -0.0 and 0.0, which no reading tells apart."""
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:   # a value that cannot be compared: formatted again
        return False


class _Pieces(dict):
    """fmt -> (before_age bytes, age header bytes, after_age bytes), joined on the first scrape asking for that
    format (a Prometheus asks for one: the other is never joined)."""

    def __init__(self, order, age_f):
        super().__init__()
        self._order, self._age_f = order, age_f

    def __missing__(self, fmt: str):
        before: List[str] = []
        after: List[str] = []
        age_head = ""
        part = before
        for fam, texts, _ in self._order.values():
            head = fam.text_head if fmt == "text" else fam.om_head
            if fam is self._age_f:
                age_head, part = head, after
                continue
            part.append(head)
            part.extend(texts)
        if fmt == "om":
            after.append("# EOF\n")
        got = self[fmt] = ("".join(before).encode(), age_head.encode(), "".join(after).encode())
        return got


class _Composed:
    """The body for one tuple of source states and up flags: static text around the age family."""

    __slots__ = ("states", "ups", "pieces", "ages", "gz")

    def __init__(self, states, ups, pieces, ages):
        self.states = states
        self.ups = ups
        self.pieces = pieces   # fmt -> (before_age bytes, age header bytes, after_age bytes)
        self.ages = ages       # ((line prefix, updated_ns), ...) for the age family
        self.gz: Dict[str, Tuple[bytes, bytes, int, int, int]] = {}


def _deflate(data: bytes, final: bool) -> bytes:
    c = zlib.compressobj(1, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush(zlib.Z_FINISH if final else zlib.Z_SYNC_FLUSH)


class Exposition:
    """Renders a Snapshot for /metrics; what :class:`SnapshotCollector` yields, prepared once."""

    def __init__(self, get_snapshot: Callable, stale_after_s: float = 10.0,
                 clock: Callable[[], int] = time.monotonic_ns, fallback=None,
                 extra: Optional[Callable[[], Tuple[Layout, Sequence[float]]]] = None,
                 hidden: FrozenSet[str] = frozenset()):
        """``extra``: series formatted on every scrape besides the snapshot's, as (Layout, values)
        (:meth:`exporters.webstats.WebStats.state`); ``hidden``: collectors whose own families are left out
        (as :class:`exporters.prometheus.SnapshotCollector`)."""
        self._get = get_snapshot
        self._hidden = hidden
        self._extra = extra
        self._templates: Optional[Tuple[Layout, Dict[str, Tuple[str, str]]]] = None
        self._rest: Dict[str, tuple] = {}  # fmt -> (layout, values, text, deflate or None) of the others
        self._stale = stale_after_s
        self._clock = clock
        # a registry for prometheus_client's encoder, or a function that makes one on first need (the agent's:
        # an idle agent never imports prometheus_client, docs/operations.md "Agent footprint")
        self._fallback = fallback
        self._rlog = RateLimitedLog(log)
        self._readings: Dict[str, Tuple[object, Optional[_Prepared]]] = {}
        self._composed: Optional[_Composed] = None
        self._build = _family(BUILD_INFO).lines((__version__,), 1.0)

    # -- per reading -----------------------------------------------------------------------
    def _reading(self, name: str, reading) -> Optional[_Prepared]:
        """The prepared reading (cached per reading object); None when its points() fail."""
        hit = self._readings.get(name)
        if hit is not None and (hit[0] is reading or hit[1] is not None and _equal(hit[0], reading)):
            if hit[0] is not reading:   # a new reading equal to the last (an idle node's link state): its lines
                self._readings[name] = (reading, hit[1])
            return hit[1]
        try:
            prepared = prepare(reading.points())
        except _Unsupported:
            raise
        except Exception:  # a formatting bug in one source must not fail the scrape
            self._rlog.error(f"{name}:points", "formatting collector %s failed", name, exc_info=True)
            prepared = None
        self._readings[name] = (reading, prepared)
        return prepared

    # -- per set of source states ----------------------------------------------------------
    def _compose(self, states, ups) -> _Composed:
        order: Dict[str, list] = {}   # family name -> [_Family, [text pieces], {origin: [key sets]}]

        def add(fam: _Family, text: str, origin: str, keys) -> None:
            ent = order.get(fam.spec.name)
            if ent is None:
                order[fam.spec.name] = [fam, [text], {origin: [keys]}]
                return
            owners = ent[2]
            mine = owners.get(origin)
            if mine is None:   # a second collector writes this family: none of its series may be another's
                for other in owners.values():
                    for ks in other:
                        if not ks.isdisjoint(keys):
                            raise _Unsupported("a series exported by two collectors")
                owners[origin] = [keys]
            else:               # (the key sets are kept, not copied into one: a scrape composes often)
                mine.append(keys)
            ent[1].append(text)

        up_f, dur_f, abs_f = _family(COLLECTOR_UP), _family(COLLECTOR_DURATION), _family(COLLECTOR_ABSENT)
        age_f, fail_f = _family(COLLECTOR_AGE), _family(COLLECTOR_FAILURES)
        add(_family(BUILD_INFO), self._build, "", {(__version__,)})
        ages = []
        for st, up in zip(states, ups):
            name = st.name
            key = {(name,)}
            body = None
            if up and st.reading is not None and name not in self._hidden:
                body = self._reading(name, st.reading)
                if body is None:
                    up = False
            add(up_f, up_f.lines((name,), 1.0 if up else 0.0), "", key)
            add(abs_f, abs_f.lines((name,), 1.0 if st.absent else 0.0), "", key)
            add(dur_f, dur_f.lines((name,), st.duration_s), "", key)
            if st.updated_ns:
                add(age_f, "", "", key)  # formatted per scrape
                ages.append((age_f.line.format(_esc(name)), st.updated_ns))
            add(fail_f, fail_f.lines((name,), float(st.failures)), "", key)
            for fam, text, keys in body or ():
                add(fam, text, name, keys)
        return _Composed(states, ups, _Pieces(order, age_f), tuple(ages))

    @staticmethod
    def _prepare(layout: Layout) -> Dict[str, Tuple[str, str]]:
        """fmt -> (%-format string of the per-scrape families, of the others): headers and line prefixes
        with a %s for each value in order (a % of the text itself doubled).  Counters and gauges."""
        out = {}
        for fmt in ("text", "om"):
            parts: List[List[str]] = [[], []]
            spec = None
            for i, (sp, labels) in enumerate(layout.entries):
                part = parts[i >= layout.per_scrape]
                fam = _family(sp)
                if sp is not spec:
                    spec = sp
                    part.append((fam.text_head if fmt == "text" else fam.om_head).replace("%", "%%"))
                prefix = fam.line.format(*[_esc(v) for v in labels])
                part.append(prefix.replace("%", "%%") + "%s\n")
            out[fmt] = ("".join(parts[0]), "".join(parts[1]))
        return out

    def _extras(self, fmt: str) -> Tuple[bytes, bytes, Optional[bytes]]:
        """(the per-scrape families' text, the others' text, their deflate when kept from a previous scrape)."""
        layout, values = self._extra()
        t = self._templates
        if t is None or t[0] is not layout:
            t = self._templates = (layout, self._prepare(layout))
        now_fmt, rest_fmt = t[1][fmt]
        k = layout.per_scrape
        now = (now_fmt % tuple([_value(v) for v in values[:k]])).encode()
        rest_values = values[k:]
        kept = self._rest.get(fmt)
        if kept is not None and kept[0] is layout and kept[1] == rest_values:
            return now, kept[2], kept[3]
        rest = (rest_fmt % tuple([_value(v) for v in rest_values])).encode()
        self._rest[fmt] = (layout, rest_values, rest, None)
        return now, rest, None

    def _body(self, fmt: str, gzip: bool) -> bytes:
        snap = self._get()
        now = self._clock()
        states = tuple(snap.sources.values())
        ups = tuple(snap.is_up(st.name, now, self._stale) for st in states)
        c = self._composed
        if c is None or c.ups != ups or len(c.states) != len(states) or \
                not all(a is b for a, b in zip(c.states, states)):
            c = self._composed = self._compose(states, ups)
        before, age_head, after = c.pieces[fmt]
        age = age_head + "".join(prefix + _value(max(0.0, (now - t) / 1e9)) + "\n"
                                 for prefix, t in c.ages).encode()
        changed, unchanged, z_unchanged = self._extras(fmt) if self._extra is not None else (b"", b"", b"")
        age += changed
        if not gzip:
            return b"".join((before, age, unchanged, after))
        gz = c.gz.get(fmt)
        if gz is None:
            gz = c.gz[fmt] = (_deflate(before, False), _deflate(after, True), zlib.crc32(before),
                              len(before), len(after))
        z_before, z_after, crc, n_before, n_after = gz
        if z_unchanged is None:   # compressed once for as long as these values stay
            z_unchanged = _deflate(unchanged, False) if unchanged else b""
            kept = self._rest.get(fmt)
            if kept is not None and kept[2] == unchanged:
                self._rest[fmt] = kept[:3] + (z_unchanged,)
        crc = zlib.crc32(after, zlib.crc32(unchanged, zlib.crc32(age, crc)))
        size = (n_before + len(age) + len(unchanged) + n_after) & 0xFFFFFFFF
        # RFC 1952 member: magic, deflate, no flags, mtime 0, xfl 0, OS unknown (255)
        return b"".join((b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff", z_before, _deflate(age, False),
                         z_unchanged, z_after, struct.pack("<II", crc, size)))

    def render(self, accept: str = "", accept_encoding: str = "") -> Tuple[bytes, str, List[Tuple[str, str]]]:
        """(body, Content-Type, extra headers) for a GET /metrics with these request headers."""
        chosen = negotiate(accept)
        gzip = "gzip" in (accept_encoding or "")
        body = None
        if chosen is not None and chosen[2] in _PLAIN_ESCAPINGS:
            ctype = chosen[1]
            try:
                body = self._body(chosen[0], gzip)
            except _Unsupported:
                self._composed = None
        if body is None:
            if callable(self._fallback) and not hasattr(self._fallback, "collect"):
                self._fallback = self._fallback()   # made on first need (see exposition())
            body, ctype = _encode(self._fallback, accept)
            if gzip:
                body = zlib.compress(body, 1, wbits=31)
        return body, ctype, [("Content-Encoding", "gzip")] if gzip else []


def render(registry, accept: str = "", accept_encoding: str = "") -> Tuple[bytes, str, List[Tuple[str, str]]]:
    """What the HTTP server answers to GET /metrics: (body, Content-Type, extra headers).

    A registry made by :func:`exporters.prometheus.make_registry` carries a prepared
    :class:`Exposition`; any other registry is encoded by prometheus_client.
    """
    prepared = getattr(registry, "teye_exposition", None)
    if prepared is not None:
        return prepared.render(accept, accept_encoding)
    body, ctype = _encode(registry, accept)
    if "gzip" in (accept_encoding or ""):
        return zlib.compress(body, 1, wbits=31), ctype, [("Content-Encoding", "gzip")]
    return body, ctype, []

