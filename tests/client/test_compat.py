"""The code injected into users' jobs runs on Python 3.8+ with the standard library only."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import pytest

from tests.procs import REPO

CLIENT = os.path.join(REPO, "teye_client")


def _vermin(*paths):
    code = "import sys, vermin; sys.argv[0] = 'vermin'; sys.exit(vermin.main())"
    return subprocess.run([sys.executable, "-c", code, "-t=3.8-", "--no-tips", "--violations",
                           "--eval-annotations", *paths], capture_output=True, text=True)


def test_client_and_hook_need_at_most_python_3_8(tmp_path):
    pytest.importorskip("vermin", reason="vermin (the dev extra)")
    r = _vermin(CLIENT)  # teye_client/ and teye_client/_site/sitecustomize.py
    assert r.returncode == 0, r.stdout + r.stderr
    assert int(re.search(r"Analyzing (\d+) files", r.stdout).group(1)) >= 5  # it read the client (+ the hook)
    (tmp_path / "new.py").write_text("import zoneinfo\n")  # 3.9: the check can fail
    assert _vermin(str(tmp_path / "new.py")).returncode != 0


def test_client_imports_only_the_standard_library_and_itself():
    stdlib = set(sys.stdlib_module_names) if hasattr(sys, "stdlib_module_names") else None
    if stdlib is None:
        pytest.skip("needs Python 3.10's sys.stdlib_module_names")
    found = set()
    for root, _, files in os.walk(CLIENT):
        for f in files:
            if f.endswith(".py"):
                tree = ast.parse(open(os.path.join(root, f), encoding="utf-8").read())
                for node in ast.walk(tree):
                    if isinstance(node, ast.Import):
                        found |= {a.name.split(".")[0] for a in node.names}
                    elif isinstance(node, ast.ImportFrom) and not node.level:
                        found.add(node.module.split(".")[0])
    assert found - stdlib - {"teye_client", "__future__", "sitecustomize"} == set()
    assert {"os", "sys", "socket"} <= found  # the walk saw the files
