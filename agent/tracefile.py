"""JSON-lines trace files with a header line, as ``teye record`` writes them (GPU and PMU traces).

Each backend's trace module checks its own records; this module only reads the lines, checks
the header's format and version, and turns anything malformed into a ParseError naming the line.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Iterator, Tuple

from .errors import ParseError


def records(path: str, fmt: str, version: int) -> Iterator[Tuple[int, Dict[str, Any]]]:
    """The header first, as ``(0, header)``, then ``(line number, object)`` for every further line.

    Raises ParseError for a line that is not a JSON object, a header of another format or version,
    or a file with no header at all.
    """
    header_seen = False
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise ParseError(path, f"line {lineno}: not JSON ({e})") from None
            if not isinstance(obj, dict):
                raise ParseError(path, f"line {lineno}: expected a JSON object")
            if not header_seen:
                check_header(path, lineno, obj, fmt, version)
                header_seen = True
                yield 0, obj
                continue
            yield lineno, obj
    if not header_seen:
        raise ParseError(path, "empty trace (no header)")


def check_header(path: str, lineno: int, obj: Dict[str, Any], fmt: str, version: int) -> None:
    if obj.get("format") != fmt:
        raise ParseError(path, f"line {lineno}: not a {fmt} file (header 'format' is {obj.get('format')!r})")
    if obj.get("version") != version:
        raise ParseError(path, f"line {lineno}: unsupported version {obj.get('version')!r}")
