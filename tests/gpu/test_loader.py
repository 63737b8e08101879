"""NVML's door: pynvml is imported only where NVIDIA's library loads (a node without GPUs keeps the 2 MiB)."""
from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

from agent.errors import HardwareAbsent
from agent.gpu import nvml

REPO = __file__.rsplit("/tests/", 1)[0]

_CHILD = r"""
import sys
from agent.errors import HardwareAbsent
from agent.gpu.nvml import load_pynvml
try:
    load_pynvml()
    print("loaded")
except HardwareAbsent as e:
    print("absent:", e)
print("pynvml" in sys.modules)
"""


def _library_loads() -> bool:
    try:
        ctypes.CDLL(nvml.NVML_LIBRARY)      # the machine's own answer, not teye's
        return True
    except OSError:
        return False


def test_without_nvidias_library_the_gpu_is_absent_and_pynvml_never_imported():
    if _library_loads():
        pytest.skip("this machine has NVIDIA's library: the other test covers it")
    p = subprocess.run([sys.executable, "-c", _CHILD], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    said, imported = p.stdout.splitlines()
    assert said.startswith("absent: NVML init failed: libnvidia-ml.so.1 cannot be loaded (") and \
        said.endswith("): no NVIDIA driver on this machine"), said
    assert imported == "False"


def test_where_the_library_loads_pynvml_is_the_module_returned(monkeypatch):
    loaded = []
    monkeypatch.setattr(nvml.ctypes, "CDLL", lambda name: loaded.append(name))   # (dlopen answers)
    mod = nvml.load_pynvml()
    assert loaded == ["libnvidia-ml.so.1"] and mod.__name__ == "pynvml" and hasattr(mod, "nvmlInit")


def test_a_library_that_does_not_load_is_absent_not_down(monkeypatch):
    def refuse(name):
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(nvml.ctypes, "CDLL", refuse)
    with pytest.raises(HardwareAbsent, match="no NVIDIA driver on this machine"):
        nvml.load_pynvml()
