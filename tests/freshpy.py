"""A fresh interpreter environment, as a new Debian node has: only what `venv` and `ensurepip` provide.

Tests that install teye use it so that they never lean on packages the test host happens to
carry (`wheel`, a newer setuptools, the test venv's own site-packages).
"""
from __future__ import annotations

import os
import subprocess
import sys


def fresh_python(dest) -> str:
    """Create ``dest`` with `python -m venv --without-pip` + `ensurepip`; return its interpreter path.

    Raises AssertionError when the result is not fresh (it can import `wheel`), since a test
    relying on it would then prove nothing.
    """
    dest = str(dest)
    base = getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([base, "-m", "venv", "--without-pip", dest], check=True, capture_output=True, timeout=120)
    py = os.path.join(dest, "bin", "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    subprocess.run([py, "-m", "ensurepip", "--default-pip"], check=True, capture_output=True, timeout=300, env=env)
    probe = subprocess.run([py, "-c", "import wheel"], capture_output=True, env=env)
    assert probe.returncode != 0, f"{py} can import wheel: not a fresh interpreter"
    return py
