"""One wheelhouse and one venv installed from it with ``pip --no-index``, shared by the tests of tests/dist.

The wheelhouse is built by deploy/wheelhouse.sh (what ``./dev.sh dist`` runs) unless TEYE_WHEELHOUSE
names one already built for this interpreter (``./dev.sh test`` builds it first, once).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.freshpy import fresh_python
from tests.procs import REPO

BUILD = os.path.join(REPO, "deploy", "wheelhouse.sh")
BASE_PY = getattr(sys, "_base_executable", None) or sys.executable
# pip reads only the wheelhouse: no index, no find-links or constraints from this host's pip config
OFFLINE_ENV = {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIP_", "PYTHON")) and k not in ("VIRTUAL_ENV", "TEYE_SITE_DIR")}
    env.update(extra)
    return env


def build(dest) -> str:
    given = os.environ.get("TEYE_WHEELHOUSE")
    if given and os.path.isfile(os.path.join(given, "teye-wheelhouse.json")):
        return given
    out = os.path.join(str(dest), "wheelhouse")
    res = subprocess.run(["bash", BUILD, "--python", BASE_PY, out], capture_output=True, text=True,
                         timeout=600, env=clean_env())
    assert res.returncode == 0, res.stdout + res.stderr
    return out


def manifest(wheelhouse: str) -> dict:
    with open(os.path.join(wheelhouse, "teye-wheelhouse.json"), encoding="utf-8") as fh:
        return json.load(fh)


def install(wheelhouse: str, dest) -> str:
    """A fresh venv (venv + ensurepip only) with teye installed from the wheelhouse alone; its bin/ dir."""
    py = fresh_python(dest)
    res = subprocess.run([py, "-m", "pip", "install", "--no-index", "--find-links",
                          os.path.join(wheelhouse, "wheels"), "teye"],
                         capture_output=True, text=True, timeout=300, env=clean_env(**OFFLINE_ENV))
    assert res.returncode == 0, res.stdout + res.stderr
    return os.path.dirname(py)


def user_tree(root) -> str:
    """A user's project whose packages are named like teye's: importing any of them from teye is a failure
    that names itself; ``import agent`` in the user's own job prints where it came from."""
    root = str(root)
    for name in ("agent", "exporters", "workloads", "dashboards"):
        os.makedirs(os.path.join(root, name), exist_ok=True)
    for name in ("exporters", "workloads", "dashboards"):
        with open(os.path.join(root, name, "__init__.py"), "w") as fh:
            fh.write(f"raise ImportError('the user\\'s {name} package was imported')\n")
    with open(os.path.join(root, "agent", "__init__.py"), "w") as fh:
        fh.write("import os, sys\n"
                 "if not os.environ.get('USER_JOB'):\n"
                 "    raise ImportError(\"the user's agent package was imported\")\n"
                 "print('user agent from', __file__)\n")
    for name in ("cli", "config", "run"):   # modules teye's own commands import
        with open(os.path.join(root, "agent", f"{name}.py"), "w") as fh:
            fh.write(f"raise ImportError(\"the user's agent.{name} was imported\")\n")
    return root
