"""Reference runs: a measuring test's job run bare (without teye), whose output the test holds the run under teye
to (same losses, same status, same lines).  The bare run's output is the oracle; its time is not (a test that
times its bare run uses plain_run, never this).

Issue 50: the serial pass runs alone because its tests measure, but about a third of a zero-code test's time
was its bare run, which measures nothing.  So a module declares its bare runs (``Bare`` at import time), the
first pass makes them on a worker (tests/test_reference_runs.py) into the directory tests/passes.sh made for
this one invocation ($TEYE_TEST_REFERENCES), and the serial pass's tests read them from there.  A run the
directory does not hold (a test run alone, the first pass deselected or stopped, another environment) is made
where the test asks for it, as before: same command, same environment, same result.

What is kept is what the test compares: exit status, stdout, stderr and, for a job that writes its results to a
file (an ``OUT`` argument), that file's text.  It is found by the run's whole description (the command with
its port and file placeholders, the environment less pytest's own variables, the directory) so that a bare run
made under another environment is never taken for this one."""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

from tests.procs import REPO, free_port

DIR_ENV = "TEYE_TEST_REFERENCES"
PORT = "{port}"     # an argument holding it gets a free TCP port of its own at each run (torchrun's master port)
OUT = "{out}"       # an argument holding it gets a fresh file path; the file's text is kept with the output


def session_env(environ) -> dict:
    """The environment the session started with, as the serial pass has it.  An xdist worker starts with
    COLUMNS=80 and LINES=24 set (x35: every bare run the first pass made missed for them); the serial pass, one
    process without xdist, has the invocation's own (none, in CI).  Were they the invocation's, the run is
    only made again: a key never matches across a difference."""
    env = dict(environ)
    if "PYTEST_XDIST_WORKER" in env:
        env.pop("COLUMNS", None)
        env.pop("LINES", None)
    return env


# the environment the session started with (tests/conftest.py imports this module first): importing TensorFlow,
# Lightning or torch._inductor sets variables in os.environ (TF2_BEHAVIOR, TORCHINDUCTOR_CACHE_DIR, ...), so
# os.environ at a module's import depends on which modules came before it, and differs between the passes
SESSION_ENV = session_env(os.environ)

_declared: Dict[str, "Bare"] = {}
MADE = {"ahead": 0, "here": 0}    # the runs this process's tests took: from the first pass, or made themselves


def job_env(environ: Optional[dict] = None, **extra) -> dict:
    """A test job's environment: ``environ`` (os.environ) without any teye switch of the caller's (the child's
    output is the oracle), this tree on PYTHONPATH, then ``extra``."""
    env = {k: v for k, v in (os.environ if environ is None else environ).items()
           if not k.startswith(("TEYE_", "SLURM_", "KUBERNETES_"))}
    env["PYTHONPATH"] = REPO  # this tree's agent and teye_client
    env.update(extra)
    return env


def _env_key(env: dict) -> dict:
    # pytest's own variables name the test that is running (PYTEST_CURRENT_TEST) or the worker (xdist's):
    # they differ between the two passes and no job reads them
    return {k: v for k, v in env.items() if not k.startswith(("PYTEST_", "TEYE_TEST_"))}


class Result(subprocess.CompletedProcess):
    """A bare run's CompletedProcess, with ``out``: the text of its OUT file (None without one) and ``made``:
    where it was made ("ahead": by the first pass; "here": by the test that asked)."""

    def __init__(self, args, returncode, stdout, stderr, out=None, made="here"):
        super().__init__(args, returncode, stdout, stderr)
        self.out, self.made = out, made


class Bare:
    """One bare run a measuring test compares with.  ``name``: unique in the suite (the first pass's test id);
    ``args``: the command, where PORT and OUT may stand inside arguments; ``env``: the variables the test sets
    (its base_env(...)'s), over the session's environment (SESSION_ENV); ``timeout``: seconds, as plain_run's;
    ``status``: the exit status its test expects (the first pass fails on another); ``needs``: a module the job
    imports, without which its test skips (so does the first pass's run)."""

    def __init__(self, name: str, args: List[str], env: Optional[dict] = None, timeout: float = 300, cwd: str = REPO,
                 status: int = 0, needs: Optional[str] = None):
        if name in _declared:
            raise ValueError(f"bare run {name!r} is declared twice (each name once in the suite)")
        self.name, self.args, self.env, self.timeout, self.cwd = (name, list(map(str, args)),
                                                             job_env(SESSION_ENV, **(env or {})), timeout, cwd)
        self.status, self.needs = status, needs
        self.module = sys._getframe(1).f_globals.get("__name__", "?")   # the declaring test module
        _declared[name] = self

    @property
    def key(self) -> str:
        desc = json.dumps([self.args, sorted(_env_key(self.env).items()), self.cwd])
        return hashlib.sha256(desc.encode()).hexdigest()[:32]

    def _path(self, directory: str) -> str:
        return os.path.join(directory, f"{re.sub(r'[^A-Za-z0-9_.-]', '_', self.name)}-{self.key}.json")

    def command(self, out: Optional[str] = None) -> List[str]:
        """The command to run now: PORT a free port, OUT ``out`` (the run under teye: the same command)."""
        port = str(free_port()) if any(PORT in a for a in self.args) else None
        if out is None and any(OUT in a for a in self.args):
            raise ValueError(f"bare run {self.name!r} writes a file (OUT): say where this run's goes")
        return [a.replace(PORT, port or PORT).replace(OUT, out or OUT) for a in self.args]

    def make(self) -> Result:
        """Run it now (a fresh port and OUT file for this run)."""
        with tempfile.TemporaryDirectory(prefix="teye-bare-") as tmp:
            outp = os.path.join(tmp, "out")
            args = self.command(outp)
            r = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=self.timeout,
                               cwd=self.cwd)
            out = None
            if any(OUT in a for a in self.args) and os.path.exists(outp):
                with open(outp) as f:
                    out = f.read()
        return Result(args, r.returncode, r.stdout, r.stderr, out)

    def store(self, directory: str) -> Result:
        """Make it and keep it in ``directory`` (the first pass)."""
        r = self.make()
        tmp = self._path(directory) + ".part"
        with open(tmp, "w") as f:
            json.dump({"args": r.args, "returncode": r.returncode, "stdout": r.stdout, "stderr": r.stderr,
                       "out": r.out}, f)
        os.replace(tmp, self._path(directory))   # whole or absent: the serial pass never reads half of one
        return r

    def result(self) -> Result:
        """The run the first pass made for this invocation, else one made now."""
        d = os.environ.get(DIR_ENV)
        if d:
            try:
                with open(self._path(d)) as f:
                    got = json.load(f)
            except FileNotFoundError:
                pass
            else:
                MADE["ahead"] += 1
                return Result(got["args"], got["returncode"], got["stdout"], got["stderr"], got["out"], "ahead")
        MADE["here"] += 1
        return self.make()


def declared() -> Dict[str, Bare]:
    return dict(_declared)


def find(name: str) -> Optional[Bare]:
    return _declared.get(name)
