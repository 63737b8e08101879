"""The kept-mutant harness: a patch breaks the code on purpose in a copy of the tree, and the tests named
for it must fail there, each for its own reason (issues 25 and 33).

:func:`check` on one patch, in one copy of the tree:

1. runs the named tests on the copy as it is: they must pass (a test that already fails, or only skips,
   would "catch" any patch);
2. applies the patch (one that no longer applies fails: update it with the code it breaks);
3. runs the named tests again: pytest must report a failure, and every failure must be in the call of a
   named test: a collection error, a failing fixture or another test's failure is not the mutant caught.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import List, Optional, Sequence

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP_DIRS = {".git", ".venv", "build", "dist", "__pycache__", ".hypothesis", ".pytest_cache", "out"}


def _copy_pycache(repo: str, dst: str) -> None:
    """The repo's compiled modules (and pytest's rewritten tests) beside their sources in the copy, their times
    kept: valid for every file the patch leaves alone (Python and pytest check a source's mtime and size), so
    a mutant's run compiles only what the patch changed."""
    for d, dirs, _ in os.walk(repo):
        dirs[:] = [x for x in dirs if x not in SKIP_DIRS or x == "__pycache__"]
        if os.path.basename(d) == "__pycache__":
            rel = os.path.relpath(d, repo)
            if os.path.isdir(os.path.join(dst, os.path.dirname(rel))):
                shutil.copytree(d, os.path.join(dst, rel), dirs_exist_ok=True)
            dirs[:] = []


def copy_tree(repo: str, dst: str) -> None:
    """The working tree (tracked and untracked files git does not ignore), and its compiled modules."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=repo, capture_output=True)
    if listed.returncode != 0:   # not a git checkout: everything but the usual junk
        shutil.copytree(repo, dst, symlinks=True, ignore=lambda d, names: [n for n in names if n in SKIP_DIRS])
        return
    names = [n for n in listed.stdout.decode().split("\0") if n]
    for n in names:
        src, to = os.path.join(repo, n), os.path.join(dst, n)
        if not os.path.lexists(src):   # deleted in the working tree, not yet in git
            continue
        os.makedirs(os.path.dirname(to), exist_ok=True)
        if os.path.islink(src):
            os.symlink(os.readlink(src), to)
        else:
            shutil.copy2(src, to)
    _copy_pycache(repo, dst)


class Tree:
    """A copy of the working tree that patch after patch is applied to and taken back from.  Copying the tree
    (1,820 files) cost 1.1-1.5 s a patch, more than most patches' test runs (stop 63's timing of each check):
    :meth:`restore` takes the patch back instead, and copies the tree again only when anything else in it
    changed (a test that wrote into it), so each patch still starts from the working tree as it is."""

    def __init__(self, repo: str, path: str) -> None:
        self.repo, self.path = repo, path
        self.copies = 0
        self.written: List[str] = []   # what the runs wrote into the tree (each cost a copy again)
        self._copy()

    def _copy(self) -> None:
        if os.path.lexists(self.path):
            shutil.rmtree(self.path)
        copy_tree(self.repo, self.path)
        self.copies += 1
        self.stamps = self._stamps()

    def _stamps(self) -> dict:
        """Every file of the copy but the compiled ones and the run's junk: path -> (size, mtime)."""
        out = {}
        for d, dirs, files in os.walk(self.path):
            dirs[:] = [x for x in dirs if x not in SKIP_DIRS]
            for f in files:
                p = os.path.join(d, f)
                st = os.lstat(p)
                out[os.path.relpath(p, self.path)] = (st.st_size, st.st_mtime_ns)
        return out

    def restore(self, patch: Optional[str]) -> None:
        """The tree as the working tree is again, after a run (and ``patch``, applied before it)."""
        shutil.rmtree(os.path.join(self.path, ".hypothesis"), ignore_errors=True)   # (examples of the mutant)
        changed: List[str] = []
        if patch is not None:
            changed = patched_paths(self.path, patch)
            back = subprocess.run(["git", "apply", "-R", os.path.abspath(patch)], cwd=self.path,
                                  capture_output=True, text=True)
            forget_compiled(self.path, changed)
            if back.returncode != 0 or not all(_same_file(os.path.join(self.repo, c), os.path.join(self.path, c))
                                               for c in changed):
                return self._copy()
        now = self._stamps()
        for c in changed:   # taken back: the same bytes as the working tree's, stamped now
            if c in now:
                self.stamps[c] = now[c]
        if now != self.stamps:   # a test wrote into the tree: start again from a copy
            self.written += sorted(k for k in set(now) | set(self.stamps) if now.get(k) != self.stamps.get(k))[:5]
            self._copy()


def _same_file(a: str, b: str) -> bool:
    if not (os.path.isfile(a) and os.path.isfile(b)):
        return os.path.lexists(a) == os.path.lexists(b)
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def forget_compiled(tree: str, paths: Sequence[str]) -> List[str]:
    """Removes the compiled copies (Python's and pytest's rewritten tests) of the given source files in the tree;
    returns what it removed.  A patch applied in the second the copy's compiled module was stamped with, that
    keeps the file's size (``+`` for ``-``), would otherwise run the unpatched code: the pyc is checked against
    the source's mtime in whole seconds and its size only (CI, stop 54: the harness's own tiny mutant passed)."""
    gone = []
    for rel in paths:
        if not rel.endswith(".py"):
            continue
        cache = os.path.join(tree, os.path.dirname(rel), "__pycache__")
        stem = os.path.basename(rel)[:-3] + "."
        if os.path.isdir(cache):
            for n in sorted(os.listdir(cache)):
                if n.startswith(stem) and n.endswith(".pyc"):
                    os.unlink(os.path.join(cache, n))
                    gone.append(os.path.join(cache, n))
    return gone


def patched_paths(tree: str, patch: str) -> List[str]:
    """The files a patch changes, as ``git apply --numstat`` names them (relative to the tree)."""
    stat = subprocess.run(["git", "apply", "--numstat", "-z", os.path.abspath(patch)], cwd=tree,
                          capture_output=True, text=True)
    return [f.split("\t")[-1] for f in stat.stdout.split("\0") if f.strip()]


def named(nodeid: str, tests: Sequence[str]) -> bool:
    """Whether a test id is one of the named tests (a file names all of its tests, a test all its cases)."""
    return any(nodeid == t or nodeid.startswith(t + "::") or nodeid.startswith(t + "[") for t in tests)


# plugins a mutant's run never uses (its tests run in one process): each costs its import at every run's start
PLUGINS_OFF = ("cacheprovider", "xdist", "xdist.looponfail", "anyio")


def _uses_hypothesis(tree: str, tests: Sequence[str]) -> bool:
    """Whether a named test's file mentions Hypothesis (its plugin and profile are then loaded: 0.3 s a run)."""
    for t in tests:
        try:
            with open(os.path.join(tree, t.split("::")[0]), encoding="utf-8") as fh:
                if "hypothesis" in fh.read():
                    return True
        except OSError:
            return True
    return False


def run_tests(tree: str, tests: Sequence[str], out: str, first_failure: bool) -> List[dict]:
    """The named tests' outcomes in the tree (see mutant_plugin.py), with the run's exit status as the last entry."""
    if os.path.exists(out):
        os.unlink(out)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tree, HERE]), "TEYE_MUTANT_OUTCOMES": out}
    off = list(PLUGINS_OFF)
    if not _uses_hypothesis(tree, tests):
        off.append("hypothesispytest")
        env["TEYE_MUTANT_HYPOTHESIS"] = "0"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", *[a for p in off for a in ("-p", "no:" + p)],
                          "-p", "mutant_plugin", *(["-x"] if first_failure else []), *tests], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=600)
    recs = []
    if os.path.exists(out):
        with open(out, encoding="utf-8") as fh:
            recs = [json.loads(line) for line in fh]
    recs.append({"rc": run.returncode, "stdout": run.stdout[-3000:], "stderr": run.stderr[-2000:]})
    return recs


# pytest's exit status for its own failure (INTERNALERROR).  CPython 3.11.7 raised one while pytest formatted a
# named test's failure on a mutant (x38b, stop 65): "SystemError: AST constructor recursion depth mismatch", the
# AST conversion's depth count shared by threads (gh-106905), here pytest's formatting and a thread of the test
# printing a traceback (3.11's traceback parses each line for its carets) at the same moment.
INTERNAL_ERROR = 3


def kinds(recs: List[dict]) -> dict:
    """nodeid -> its kind in tests/kinds.py ("measures" or "parallel"), as the run's collection marked it."""
    return {r["nodeid"]: r["outcome"] for r in recs[:-1] if r["when"] == "kind"}


def _show(recs: List[dict]) -> str:
    rows = [f"{r['when']} {r['outcome']} {r['nodeid']}\n{r['text'][-800:]}" for r in recs[:-1] if r["when"] != "kind"]
    return "\n".join(rows) + f"\n--- pytest exit {recs[-1]['rc']}:\n{recs[-1]['stdout']}\n{recs[-1]['stderr']}"


def baseline(repo: str, tests: Sequence[str], workdir: str) -> List[dict]:
    """Step 1 for many patches at once: the outcomes of all their named tests in one run on one copy of the
    tree (each patch's own run of them cost a pytest start and the tests again: minutes over the kept set).
    Hand the result to :func:`check` as ``base``; it takes the records of its own tests from it."""
    tree = os.path.join(workdir, "tree")
    copy_tree(repo, tree)
    return run_tests(tree, sorted(set(tests)), os.path.join(workdir, "outcomes.jsonl"), first_failure=False)


def check(repo: str, patch: str, tests: Sequence[str], workdir: str, base: Optional[List[dict]] = None,
          tree: Optional[Tree] = None) -> None:
    """Raises AssertionError unless the named tests pass on the tree and fail, themselves, on the patched tree;
    pytest.skip where they only skip here (the machine lacks what they need).  ``base``: the outcomes of a
    :func:`baseline` run that included these tests (step 1 is then not run again).  ``tree``: a :class:`Tree`
    of ``repo`` to run in (restored before this returns) instead of a copy of its own in ``workdir``."""
    if tree is None:
        tree = Tree(repo, os.path.join(workdir, "tree"))
    applied: List[bool] = []
    try:
        _check(patch, tests, workdir, base, tree.path, applied)
    finally:
        tree.restore(patch if applied else None)


def _check(patch: str, tests: Sequence[str], workdir: str, base: Optional[List[dict]], tree: str,
           applied: List[bool]) -> None:
    name = os.path.basename(patch)
    out = os.path.join(workdir, "outcomes.jsonl")
    # 1. without the patch: the named tests pass
    if base is None:
        base = run_tests(tree, tests, out, first_failure=False)
        rc = base[-1]["rc"]
    else:   # this patch's records of the shared run; its exit status stands for them only if none failed
        mine = [r for r in base[:-1] if named(r["nodeid"], tests) and r["when"] != "kind"]
        rc = 0 if mine and not [r for r in mine if r["outcome"] == "failed"] else base[-1]["rc"] or 1
        base = mine + [base[-1]]
    bad = [r for r in base[:-1] if r["outcome"] == "failed"]
    assert not bad and rc == 0, f"{name}: {' '.join(tests)} fail without the patch:\n{_show(base)}"
    ran = [r for r in base[:-1] if r["when"] == "call" and r["outcome"] == "passed"]
    if not ran:
        pytest.skip(f"{name}: its tests only skip here: " + "; ".join(r["text"][-200:] for r in base[:-1]))
    # 2. the patch applies
    done = subprocess.run(["git", "apply", os.path.abspath(patch)], cwd=tree, capture_output=True, text=True)
    assert done.returncode == 0, f"{name} no longer applies: {done.stderr}"
    applied.append(True)
    forget_compiled(tree, patched_paths(tree, patch))
    # 3. with the patch: a named test fails, in its own call (1: tests ran and some failed)
    mut = run_tests(tree, tests, out, first_failure=True)
    if mut[-1]["rc"] == INTERNAL_ERROR:   # pytest's own failure is no verdict on the mutant: once more
        mut = run_tests(tree, tests, out, first_failure=True)
    assert mut[-1]["rc"] != INTERNAL_ERROR, f"{name}: pytest failed internally, twice, on the mutant:\n{_show(mut)}"
    failed = [r for r in mut[:-1] if r["outcome"] == "failed"]
    if not failed and mut[-1]["rc"] == 0 and not [r for r in mut[:-1] if r["when"] == "call"]:
        # every named test skipped (a ``base`` vouched for by the run itself cannot say so beforehand)
        pytest.skip(f"{name}: its tests only skip here: " + "; ".join(r["text"][-200:] for r in mut[:-1]))
    foreign = [r for r in failed if r["when"] != "call" or not named(r["nodeid"], tests)]
    assert not foreign, (f"{name}: the failure on the mutant is not the named test's own (a collection error, "
                         f"a fixture, another test):\n{_show(mut)}")
    assert failed and mut[-1]["rc"] == 1, f"{name}: {' '.join(tests)} did not fail on the mutant:\n{_show(mut)}"
