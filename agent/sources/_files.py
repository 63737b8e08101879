"""Small helpers for reading files under a procfs/sysfs root."""
from __future__ import annotations

import os

from ..errors import ParseError


def under(root: str, *parts: str) -> str:
    """Join parts under root (parts are relative, e.g. 'net/dev')."""
    return os.path.join(root, *parts)


def read_text(path: str, allow_empty: bool = False) -> str:
    """Read a whole (small) file; an empty file is a ParseError unless allowed. OSError propagates."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    if not allow_empty and not text.strip():
        raise ParseError(path, "file is empty")
    return text


def read_value(path: str) -> str:
    """A one-line sysfs attribute, stripped."""
    return read_text(path).strip()
