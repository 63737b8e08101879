"""The phase path's optional compiled helpers (``agent/phases/_fast.c``), or why they are not used.

``setup.py`` builds them where a C compiler and Python's headers are present; without them the
agent runs the same path in Python (``protocol.decode_python`` and the receiver's ``recvmsg``
loop), which stays the specification and the tests' oracle.  ``TEYE_PURE_PYTHON=1`` in the
environment turns the compiled helpers off (benchmarks/phases.py compares the two that way).
"""
from __future__ import annotations

import os
from types import ModuleType
from typing import Optional, Tuple


def _load() -> Tuple[Optional[ModuleType], str]:
    if os.environ.get("TEYE_PURE_PYTHON", "") not in ("", "0"):
        return None, "off: TEYE_PURE_PYTHON is set"
    try:
        from . import _fast
    except ImportError as e:
        if isinstance(e, ModuleNotFoundError) or "cannot import name" in str(e):
            return None, ("not built: this install has no agent/phases/_fast extension (building it needs a C "
                          "compiler and Python's headers); the Python path is used")
        return None, f"unusable ({e}); the Python path is used"
    return _fast, "compiled"


module, STATUS = _load()
