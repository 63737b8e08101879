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


def _pythons(*versions):
    """Interpreters of these versions on this machine (pyenv's, or python3.X on PATH)."""
    import glob
    import shutil
    found = {}
    for v in versions:
        cands = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{v}.*/bin/python{v}"))) + \
            [shutil.which(f"python{v}") or ""]
        for c in cands:
            if c and os.access(c, os.X_OK):
                found[v] = c
                break
    return found


def test_the_client_runs_on_python_3_8(listener):
    """Not only the static check: the hook, the session and the reporter under a real 3.8 interpreter."""
    py = _pythons("3.8").get("3.8")
    if py is None:
        pytest.skip("no Python 3.8 interpreter here")
    path, s = listener
    code = ("import sys, time\nfrom teye_client import auto\nassert 'teye_client.auto' in sys.modules\n"
            "s = auto.session\ns.wait_source = 'torch'\nt = time.monotonic_ns()\n"
            "s.wait(t, t + 1000, 8)\ns.step(t + 5000, 1)\ns.wait(t + 6000, t + 6500, 8)\n"
            "s.wait(t + 7000, t + 7200, 4)\ns.step(t + 9000, 1)\ns.wait(t + 9500, t + 9800, 8)\ns.step(t + 10000, 1)\n"
            "print('ok', t)\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.path.join(CLIENT, "_site"), "TEYE_PHASE_SOCKET": path,
           "TEYE_TRAIN_JOB": "py38", "TEYE_SUM_STEPS": "0"}   # every step's intervals: the wire checked below
    r = subprocess.run([py, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    ok, t = r.stdout.split()
    assert ok == "ok"
    t = int(t)   # the times the script gave, not the ones sent: the steps' bounds and phases follow from them
    import json
    got = []
    s.settimeout(1.0)
    try:
        while True:
            got.append(json.loads(s.recv(65536)))
    except OSError:
        pass
    assert {m["job"] for m in got} == {"py38"} and got[0]["src"] == "torch"
    assert [st for m in got for st in m["steps"]] == [[t, t + 5000, 8], [t + 5000, t + 9000, 12],
                                                      [t + 9000, t + 10000, 8]]
    assert [p for m in got for p in m["phases"]] == [
        ["data_wait", t, t + 1000], ["compute", t + 1000, t + 5000],                  # one batch per step
        ["compute", t + 5000, t + 6000], ["data_wait", t + 6000, t + 6500],           # two batches in one step
        ["compute", t + 6500, t + 7000], ["data_wait", t + 7000, t + 7200], ["compute", t + 7200, t + 9000],
        ["compute", t + 9000, t + 9500], ["data_wait", t + 9500, t + 9800], ["compute", t + 9800, t + 10000]]


def test_older_pythons_are_left_alone():
    """The hook is on PYTHONPATH of every process, old interpreters included: they run as without it."""
    olds = _pythons("2.7", "3.6", "3.7")
    if not olds:
        pytest.skip("no Python older than 3.8 here")
    for v, py in olds.items():
        code = "import sys; print(sorted(m for m in sys.modules if m.startswith('teye')))"
        r = subprocess.run([py, "-c", code], env={"PATH": os.environ["PATH"],
                           "PYTHONPATH": os.path.join(CLIENT, "_site")}, capture_output=True, text=True, timeout=60)
        assert (r.returncode, r.stdout, r.stderr) == (0, "[]\n", ""), v
