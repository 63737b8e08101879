"""What the trace tests share."""
from __future__ import annotations

import contextlib
import shutil
import tempfile


@contextlib.contextmanager
def socket_dir(prefix: str):
    """A directory under the system's temporary directory, removed after: a Unix socket's path is at most 107
    bytes, which pytest's tmp_path can exceed."""
    d = tempfile.mkdtemp(prefix=prefix)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
