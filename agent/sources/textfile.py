"""The textfile collector: metrics that sites' own scripts write into a directory (node_exporter's
``--collector.textfile.directory``, with its semantics).

Every ``*.prom`` file directly in ``textfile.directory`` is read (at most MAX_FILES files of at most
MAX_FILE_BYTES each, through the bounded reader: a FIFO or a huge file is refused, never waited on) and
parsed as Prometheus' text exposition format by prometheus_client's own parser.  A file that cannot be
read or parsed, that carries client-side timestamps, that declares a family teye exports itself (any
``teye_`` name, or ``process_*``), a family another file declares with another type, or a series
another file already has, is skipped *whole*: ``teye_textfile_scrape_error`` is 1 and the log names the
file and why (once a minute).  The other files' metrics are exported as written.  Each file read is
``teye_textfile_mtime_seconds{file}``.

The log never quotes a file: a file that does not parse is named with the line number and the kind of error
only (a ``*.prom`` that is a symbolic link to a root-only file must not land in the log).  A ``*.prom`` that
is a symbolic link leading out of the directory is skipped unless ``textfile.follow_symlinks`` is on (the file
actually opened is checked, through its descriptor, so a link swapped after a check changes nothing).

Writers should write a temporary file and rename it into place (as node_exporter's docs say); a file
read while half written fails to parse and is skipped for that pass.

Types: gauges and counters keep their type (a counter whose name does not end in ``_total`` is exported
as a gauge, so that its name stays what the file says); untyped samples are exported as gauges;
histograms and summaries are refused (that file skipped: teye does not re-export them yet).
"""
from __future__ import annotations

import glob
import logging
import os
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Tuple

from ..logutil import RateLimitedLog
from ..metrics import COUNTER, GAUGE, MetricSpec, Point, metric, point, registered
from ._files import FileRefused, Outside, read_bytes

MAX_FILES = 1000
MAX_FILE_BYTES = 4 << 20
MAX_SERIES = 100_000  # over all files

MTIME = metric("teye_textfile_mtime_seconds", GAUGE, "Modification time (Unix seconds, whole) of each textfile "
               "collector file that was read and exported, labelled with its path (node_textfile_mtime_seconds).",
               ("file",))
SCRAPE_ERROR = metric("teye_textfile_scrape_error", GAUGE, "1 when a file of the textfile directory was "
                      "skipped on the last read (unreadable, unparseable, a clash, timestamps, over the bounds: "
                      "the log says which and why), else 0 (node_textfile_scrape_error).")

log = RateLimitedLog(logging.getLogger("teye.textfile"))
_OWN_PREFIXES = ("teye_", "process_")


class Skip(Exception):
    """A file the collector leaves out whole, with the one-line reason."""


class _Lines:
    """The file's lines for the parser, counting those it took: where it fails, the count is the line."""

    def __init__(self, text: str):
        self._it = iter(text.splitlines(True))
        self.n = 0

    def __iter__(self):
        return self

    def __next__(self) -> str:
        line = next(self._it)
        self.n += 1
        return line


def _parse(text: str, path: str):
    """[(name, type, help, [(sample name, labels dict, value)])] of one file, or Skip.

    A parse error is said as its line number and the error's kind only: the parser's own message quotes the
    line, and a file that is not metrics at all (a link to a root-only file) must never reach the log."""
    from prometheus_client.parser import text_fd_to_metric_families
    out = []
    lines = _Lines(text)
    try:
        for fam in text_fd_to_metric_families(lines):
            samples = []
            for s in fam.samples:
                if s.timestamp is not None:
                    raise Skip(f"{s.name} has a client-side timestamp (not supported, as in node_exporter)")
                samples.append((s.name, dict(s.labels), s.value))
            out.append((fam.name, fam.type, fam.documentation, samples))
    except Skip:
        raise
    except (ValueError, TypeError, IndexError, KeyError) as e:  # the parser's ways of saying "not the format"
        raise Skip(f"not the Prometheus text format: line {lines.n}: {_KIND.get(type(e), type(e).__name__)}") from None
    return out


_KIND = {ValueError: "a malformed line or a value that is not a number", IndexError: "a malformed line",
         KeyError: "a malformed line", TypeError: "a malformed line"}


@dataclass(frozen=True)
class TextfileReading:
    points_: Tuple[Point, ...]
    mtimes: Tuple[Tuple[str, float], ...]
    error: bool

    def points(self) -> Iterator[Point]:
        yield from self.points_
        for name, mtime in self.mtimes:
            yield point(MTIME, mtime, name)
        yield point(SCRAPE_ERROR, 1 if self.error else 0)


class TextfileSource:
    name = "textfile"

    def __init__(self, directory: Optional[str], follow_symlinks: bool = False):
        self.directory = directory
        self.follow_symlinks = follow_symlinks
        self._specs: Dict[Tuple[str, str, str, Tuple[str, ...]], MetricSpec] = {}  # reused between reads

    def _spec(self, name: str, kind: str, help_: str, labels: Tuple[str, ...]) -> MetricSpec:
        key = (name, kind, help_, labels)
        spec = self._specs.get(key)
        if spec is None:
            if len(self._specs) > 4 * MAX_SERIES:
                self._specs.clear()
            # not declared with metric(): these families are the site's, not teye's (not in the catalog)
            spec = self._specs[key] = MetricSpec(name, kind, help_ or f"{name} (textfile collector)", labels,
                                                 "", "textfile")
        return spec

    def collect(self) -> TextfileReading:
        if not self.directory:
            return TextfileReading((), (), False)
        paths = sorted(glob.glob(os.path.join(glob.escape(self.directory), "*.prom")))
        error = False
        if not os.path.isdir(self.directory):
            log.warning("nodir", "textfile: %s: no such directory", self.directory)
            return TextfileReading((), (), True)
        if len(paths) > MAX_FILES:
            log.warning("toomany", "textfile: %s holds %d *.prom files; the first %d (by name) are read",
                        self.directory, len(paths), MAX_FILES)
            paths, error = paths[:MAX_FILES], True
        own = registered()
        real_dir = os.path.realpath(self.directory)
        types: Dict[str, str] = {}
        series: Dict[Tuple[str, Tuple[Tuple[str, str], ...]], str] = {}
        pts: List[Point] = []
        mtimes: List[Tuple[str, float]] = []
        for path in paths:
            base = os.path.basename(path)
            try:
                mtime = os.stat(path).st_mtime
                text = read_bytes(path, MAX_FILE_BYTES, within=None if self.follow_symlinks else real_dir
                                  ).decode("utf-8")
                fams = _parse(text, path)
                got, keys = self._file_points(fams, own, types, series, base)
            except (Skip, OSError, UnicodeDecodeError, Outside) as e:
                if isinstance(e, Outside):
                    why = "a symbolic link leading out of the directory (textfile.follow_symlinks is off)"
                elif isinstance(e, UnicodeDecodeError):
                    why = f"not UTF-8 (byte {e.start})"   # (never the bytes themselves)
                else:
                    why = e if isinstance(e, Skip) else (e.strerror or type(e).__name__)
                log.warning(f"skip:{base}", "textfile: %s skipped: %s", path, why)
                error = True
                continue
            if len(series) + len(keys) > MAX_SERIES:
                log.warning(f"skip:{base}", "textfile: %s skipped: more than %d series in the directory",
                            path, MAX_SERIES)
                error = True
                continue
            for k in keys:
                series[k] = base
            for p in got:
                fam = p.spec.name[:-6] if p.spec.kind == COUNTER else p.spec.name
                types.setdefault(fam, p.spec.kind)
            pts.extend(got)
            mtimes.append((path, float(int(mtime))))  # as node_exporter: the path, whole seconds
        return TextfileReading(tuple(pts), tuple(mtimes), error)

    def _file_points(self, fams, own, types, series, base):
        got: List[Point] = []
        keys = []
        for name, ftype, help_, samples in fams:
            if name.startswith(_OWN_PREFIXES) or name in own:
                raise Skip(f"family {name} is one teye exports itself")
            if ftype in ("histogram", "summary", "gaugehistogram"):
                raise Skip(f"family {name} is a {ftype} (not supported yet)")
            kind = COUNTER if ftype == "counter" else GAUGE
            sample_name = name + "_total" if kind == COUNTER else name
            if kind == COUNTER and not any(s[0] == sample_name for s in samples):
                kind, sample_name = GAUGE, name   # a counter written without _total keeps its name
            full = sample_name
            if types.get(name, kind) != kind:  # by family name: OpenMetrics names a counter without _total
                raise Skip(f"family {name} is a {kind} here and a {types[name]} in another file")
            labels = tuple(sorted({k for _, lb, _ in samples for k in lb}))
            spec = self._spec(full, kind, help_, labels)
            for sname, lb, value in samples:
                if sname != sample_name:
                    raise Skip(f"sample {sname} does not belong to family {name} ({ftype})")
                key = (full, tuple(sorted(lb.items())))
                if key in series or key in keys:
                    other = series.get(key, base)
                    raise Skip(f"series {full}{dict(key[1])} is also in {other}")
                keys.append(key)
                got.append(Point(spec, tuple(lb.get(k, "") for k in labels), value))
        return got, keys


def from_config(cfg, ctx=None) -> TextfileSource:
    return TextfileSource(cfg["textfile"]["directory"], cfg["textfile"].get("follow_symlinks", False))
