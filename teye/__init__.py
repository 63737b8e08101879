"""The `teye` command's launcher: teye's own code first, whatever the user's environment holds.

An installed teye keeps its packages (``agent``, ``exporters``, ``workloads``, ``dashboards``:
generic names a user's project often has too) in a private directory, ``teye/_lib`` inside
site-packages, which is on no ``sys.path`` but the one this launcher builds.  :func:`main` puts that
directory first, drops what the user's environment added in front of the interpreter's own entries
(``PYTHONPATH``, the current directory, the script's directory) and forgets any module of those
names that was imported from elsewhere before it ran (a user's ``sitecustomize``), then runs the
CLI.  ``os.environ`` is left alone: ``teye run`` hands the user's job its own ``PYTHONPATH``, with
only teye's zero-code directory (teye_client/_site) in front of it, never this one.

In a source checkout (no ``_lib`` beside this file) the checkout's root plays that part.
Standard library only; nothing here imports the packages it isolates before :func:`isolate` ran.
"""
from __future__ import annotations

import os
import sys
from typing import Iterable, List, Mapping, Optional

# teye's top-level packages that live in the private directory
PRIVATE = ("agent", "exporters", "workloads", "dashboards")


def lib_dir() -> str:
    """The directory holding teye's private packages."""
    here = os.path.dirname(os.path.abspath(__file__))
    lib = os.path.join(here, "_lib")
    return lib if os.path.isdir(lib) else os.path.dirname(here)


def _norm(p: str) -> str:
    return os.path.normcase(os.path.realpath(p or os.curdir))


def clean_path(path: Iterable[str], lib: str, environ: Mapping[str, str], cwd: str,
               script_dir: Optional[str] = None) -> List[str]:
    """``path`` as teye's commands need it: ``lib`` first, without the user's additions.

    Dropped: entries from ``PYTHONPATH``, the current directory (``''`` or its path) and the
    launching script's directory (a console script's bin/ may hold a user's ``agent.py``).
    """
    user = {_norm(p) for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    user.add(_norm(cwd))
    if script_dir:
        user.add(_norm(script_dir))
    lib_n = _norm(lib)
    out = [lib]
    for p in path:
        n = _norm(p)
        if n == lib_n or n in user or not p:
            continue
        out.append(p)
    return out


def _foreign(name: str, lib: str) -> bool:
    top = name.partition(".")[0]
    if top not in PRIVATE:
        return False
    f = getattr(sys.modules.get(name), "__file__", None)
    return not (f and _norm(f).startswith(_norm(lib) + os.sep))


def isolate(environ: Optional[Mapping[str, str]] = None) -> str:
    """Make this interpreter import teye's packages from :func:`lib_dir`; return that directory."""
    lib = lib_dir()
    env = os.environ if environ is None else environ
    script = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c", "-m") else None
    script_dir = os.path.dirname(os.path.abspath(script)) if script and os.path.exists(script) else None
    if script_dir and _norm(script_dir) == _norm(lib):
        script_dir = None
    try:
        cwd = os.getcwd()
    except OSError:  # the current directory was removed
        cwd = ""
    sys.path[:] = clean_path(sys.path, lib, env, cwd, script_dir)
    for name in [n for n in sys.modules if _foreign(n, lib)]:
        del sys.modules[name]
    import importlib
    importlib.invalidate_caches()
    return lib


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``teye`` console script."""
    isolate()
    from agent.cli import main as cli_main
    return cli_main(argv)
