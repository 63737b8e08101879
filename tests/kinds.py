"""The suite's two kinds of test and the two passes of ``./dev.sh test`` (issue 50).

A test whose oracle measures time or CPU (the script's own ``perf_counter``, ``process_time`` or
``getrusage``, a loop's clock, a timed assertion) or that loads the CPU on purpose (a hog) is marked
``measures``: ``./dev.sh test`` runs those in a serial pass, alone, after the others ran on three
pytest-xdist workers (``--teye-pass=parallel``, then ``--teye-pass=serial``; a plain ``pytest`` runs
both kinds in one process, as before).

The check: every collected test is read for the signs of measuring (:func:`signals`: its own code, its
fixtures', the helpers under tests/ they call, the scripts they run and the inline scripts they write);
a test with a sign and neither ``measures`` nor ``not_measuring("why the sign misleads")`` fails at its
setup, naming the sign, in whichever pass or run it is.  The signs are a heuristic: a test that measures
by a clock the heuristic does not see (``time.monotonic`` deadlines are everywhere and are not signs) is
marked by hand.

Also here, for the parallel pass: a worker that dies fails the run with its name, and so does a run
that reports fewer tests than its workers collected; ``--teye-shuffle SEED`` runs the modules, and the
tests inside each, in a random order (issue 50's leak hunt).
"""
from __future__ import annotations

import ast
import inspect
import os
import random
import re
import textwrap
import types
from typing import Dict, Iterable, List, Optional, Set

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = [TESTS]   # where the code read for signs lies (pytest_configure)

# code that measures: a clock of CPU or wall time read as an oracle, the rusage of a process, a busy loop
CODE_SIGNS = re.compile(
    r"\b(?:perf_counter|process_time|thread_time)(?:_ns)?\b"
    r"|\bgetrusage\b|\bos\.times\(|\bcpu_times\("
    r"|while True:\s*pass|\bcpu_hogs?\b|\bloop_clock\b")
# in a script a test runs (its training loop), an elapsed time read off the monotonic clock is the loop's clock
SCRIPT_SIGNS = re.compile(r"monotonic(?:_ns)?\(\)\s*-\s*[A-Za-z_(]")
CLOCKS = {"monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "process_time", "process_time_ns",
          "thread_time", "thread_time_ns", "time", "time_ns"}
CLOCK_CALL = re.compile(r"\b(?:%s)\s*\(" % "|".join(sorted(CLOCKS)))   # a call of one of CLOCKS, as text
LOCAL_IMPORT = re.compile(r"^\s*(?:from\s+([A-Za-z_][\w.]*)\s+import|import\s+([A-Za-z_][\w.]*))", re.M)

MEASURES_HELP = ("measures(what): the test's oracle measures time or CPU shares, or it loads the CPU on purpose: "
                 "./dev.sh test runs it in the serial pass, with nothing beside it")
NOT_MEASURING_HELP = ("not_measuring(why): the test shows a sign of measuring (tests/kinds.py) but its oracle does "
                      "not: it runs in the parallel pass")


def _under_tests(path: Optional[str]) -> bool:
    """Code of the project's tests (under ROOT, not in a virtual environment's packages)."""
    if not path:
        return False
    p = os.path.abspath(path)
    return p.startswith(ROOT[0] + os.sep) and "site-packages" not in p and os.sep + ".venv" + os.sep not in p


def _rel(path: str) -> str:
    """A path as the run names it (tests/client/torch_job.py; in a small tree, from its root)."""
    base = os.path.dirname(ROOT[0]) if os.path.basename(ROOT[0]) == "tests" else ROOT[0]
    return os.path.relpath(path, base)


def _file_of(obj) -> Optional[str]:
    try:
        return inspect.getsourcefile(obj)
    except TypeError:
        return None


def _codes(code: types.CodeType) -> Iterable[types.CodeType]:
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _codes(c)


def _timed_asserts(src: str, where: str) -> List[str]:
    """Assertions on a clock's reading: ``assert time.perf_counter() - t0 < 1`` or on a name holding one."""
    if "assert" not in src or not CLOCK_CALL.search(src):   # (most tests: not parsed, 1-2 s of each collection)
        return []
    try:
        tree = ast.parse(textwrap.dedent(src))
    except SyntaxError:
        return []

    def clock_call(node) -> bool:
        for n in ast.walk(node):
            if isinstance(n, ast.Call):
                f = n.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                if name in CLOCKS:
                    return True
        return False

    elapsed: Set[str] = set()   # names assigned a difference involving a clock's reading
    for n in ast.walk(tree):
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and n.value is not None:
            diff = any(isinstance(b, ast.BinOp) and isinstance(b.op, ast.Sub) and clock_call(b)
                       for b in ast.walk(n.value))
            if diff:
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                elapsed.update(t.id for tg in targets for t in ast.walk(tg) if isinstance(t, ast.Name))
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Assert):
            subs = [b for b in ast.walk(n.test) if isinstance(b, ast.BinOp) and isinstance(b.op, ast.Sub)]
            if any(clock_call(b) for b in subs) or any(
                    isinstance(x, ast.Name) and x.id in elapsed for x in ast.walk(n.test)):
                out.append(f"a timed assertion in {where} (line {n.lineno} of its source)")
    return out


class _Reader:
    """The signs of measuring in a test and everything under tests/ it reaches (cached across tests)."""

    def __init__(self) -> None:
        self.cache: Dict[object, List[str]] = {}
        self.files: Dict[str, List[str]] = {}

    def item(self, item: pytest.Item) -> List[str]:
        found: List[str] = []
        seen: Set[object] = set()
        func = getattr(item, "function", None)
        if func is not None:
            found += self.obj(func, seen, test=True)
        info = getattr(item, "_fixtureinfo", None)
        for defs in (info.name2fixturedefs.values() if info else ()):
            for fd in defs:
                if _under_tests(_file_of(fd.func)):
                    found += self.obj(fd.func, seen, test=True)
        return sorted(set(found))

    def obj(self, obj, seen: Set[object], test: bool = False) -> List[str]:
        obj = inspect.unwrap(obj) if callable(obj) else obj
        if obj in seen:
            return []
        seen.add(obj)
        path = _file_of(obj)
        if not _under_tests(path):
            return []
        key = (obj, test)
        if key in self.cache:
            return self.cache[key]
        self.cache[key] = []   # (recursion)
        name = f"{_rel(path)}::{getattr(obj, '__qualname__', obj)}"
        try:
            src = inspect.getsource(obj)
        except (OSError, TypeError):
            return []
        out = [f"{m.group(0)!r} in {name}" for m in CODE_SIGNS.finditer(src)][:1]
        if test:
            out += _timed_asserts(src, name)[:1]
        funcs = [obj] if inspect.isfunction(obj) else [
            m for m in vars(obj).values() if inspect.isfunction(m)] if inspect.isclass(obj) else []
        for f in funcs:
            glb = f.__globals__
            for code in _codes(f.__code__):
                for const in code.co_consts:
                    if isinstance(const, str):
                        out += self.string(const, os.path.dirname(path), name)
                for n in code.co_names:
                    v = glb.get(n)
                    if isinstance(v, str):
                        out += self.string(v, os.path.dirname(path), name)
                    elif isinstance(v, types.ModuleType) and _under_tests(getattr(v, "__file__", None)):
                        for attr in code.co_names:
                            a = getattr(v, attr, None)
                            if inspect.isfunction(a) or inspect.isclass(a):
                                out += self.obj(a, seen)
                    elif inspect.isfunction(v) or inspect.isclass(v):
                        out += self.obj(v, seen)
        self.cache[key] = out
        return out

    def string(self, s: str, here: str, name: str) -> List[str]:
        if s.endswith(".py") and "\n" not in s and len(s) < 300:
            for p in (s, os.path.join(here, s), os.path.join(ROOT[0], s)):
                if os.path.isfile(p) and _under_tests(p):
                    return self.script(os.path.abspath(p))
            return []
        if "\n" in s and len(s) > 80:   # an inline script the test writes or hands to python -c
            m = CODE_SIGNS.search(s) or SCRIPT_SIGNS.search(s)
            return [f"{m.group(0)!r} in a script written by {name}"] if m else []
        return []

    def script(self, path: str) -> List[str]:
        if path in self.files:
            return self.files[path]
        self.files[path] = []
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        rel = _rel(path)
        m = CODE_SIGNS.search(text) or SCRIPT_SIGNS.search(text)
        out = [f"{m.group(0)!r} in {rel}"] if m else []
        here = os.path.dirname(path)
        for mod in LOCAL_IMPORT.finditer(text):   # the script's own helpers beside it (own_clock.py, ddp_clock.py)
            dotted = mod.group(1) or mod.group(2)
            for cand in (os.path.join(here, dotted.split(".")[-1] + ".py"),
                         os.path.join(os.path.dirname(ROOT[0]), dotted.replace(".", os.sep) + ".py")):
                if os.path.isfile(cand) and _under_tests(cand) and not out:
                    out += self.script(cand)
        self.files[path] = out
        return out


READER = _Reader()


def signals(item: pytest.Item) -> List[str]:
    """The signs that ``item`` measures (empty: none seen)."""
    return READER.item(item)


def kind(item: pytest.Item) -> str:
    return "serial" if item.get_closest_marker("measures") else "parallel"


def pytest_addoption(parser):
    g = parser.getgroup("teye", "teye's suite (tests/kinds.py)")
    g.addoption("--teye-pass", choices=("all", "parallel", "serial"), default="all",
                help="run only the tests of one kind: parallel (not marked measures) or serial (marked measures)")
    g.addoption("--teye-serial-list", default=None, metavar="FILE",
                help="--teye-pass=parallel writes the files holding tests of the serial kind into FILE, a line each; "
                     "--teye-pass=serial, given no file or test to run, collects those (tests/passes.sh)")
    g.addoption("--teye-shuffle", type=int, default=None, metavar="SEED",
                help="run the modules, and the tests inside each module, in an order drawn from SEED")


def pytest_configure(config):
    config.addinivalue_line("markers", MEASURES_HELP)
    config.addinivalue_line("markers", NOT_MEASURING_HELP)
    config.stash[_STATE] = _State()
    if not config.pluginmanager.has_plugin("teye-run-ids"):
        config.pluginmanager.register(_RunIds(), "teye-run-ids")
    listing = config.getoption("teye_serial_list")
    if (listing and config.getoption("teye_pass") == "serial" and config.args_source != pytest.Config.ArgsSource.ARGS
            and os.path.isfile(listing) and os.path.getsize(listing)):
        # the whole suite's serial pass: the files the parallel pass found tests of this kind in, not every
        # file again (importing and reading all of them cost 3-5 s; -k, -m and the like select among these)
        with open(listing, encoding="utf-8") as fh:
            config.args = [ln.rstrip("\n") for ln in fh if ln.strip()]
    # the tests' own code (their folder; a small tree of a test's own: its root), never the code under test
    ROOT[0] = str(config.rootpath / "tests") if (config.rootpath / "tests").is_dir() else str(config.rootpath)


class _State:
    def __init__(self) -> None:
        self.collected: Dict[str, List[str]] = {}   # worker -> the ids it collected
        self.reported: Set[str] = set()
        self.down: List[str] = []


_STATE = pytest.StashKey[_State]()
_UNMARKED = pytest.StashKey[str]()

# modules that take minutes: handed to a worker first, so the parallel pass does not end on one of them
SLOW_FIRST = [
    "tests/mutants/test_mutants.py",
    "tests/test_reference_runs.py",   # the serial pass's bare runs (tests/reference.py)
]


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    for item in items:
        m, n = item.get_closest_marker("measures"), item.get_closest_marker("not_measuring")
        if m and n:
            item.stash[_UNMARKED] = f"{item.nodeid} is marked both measures and not_measuring"
        elif not m and not n:
            signs = signals(item)
            if signs:
                item.stash[_UNMARKED] = (
                    f"{item.nodeid} measures ({'; '.join(signs[:3])}) but is not marked so: mark it "
                    "@pytest.mark.measures(\"what it measures\") (the serial pass), or "
                    "@pytest.mark.not_measuring(\"why the sign misleads\") (tests/kinds.py)")
        elif n and not (n.args or n.kwargs.get("reason")):
            item.stash[_UNMARKED] = f"{item.nodeid}: not_measuring needs its reason"
    which = config.getoption("teye_pass")
    listing = config.getoption("teye_serial_list")
    if which == "parallel" and listing:
        _list_serial_modules(listing, items)
    if which != "all":
        keep = [it for it in items if kind(it) == which]
        drop = [it for it in items if kind(it) != which]
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep
    seed = config.getoption("teye_shuffle")
    if seed is not None:
        rng = random.Random(seed)
        groups: Dict[str, List[pytest.Item]] = {}
        for it in items:
            groups.setdefault(_module(it), []).append(it)
        order = list(groups)
        rng.shuffle(order)
        items[:] = [it for mod in order for it in rng.sample(groups[mod], len(groups[mod]))]
    if which == "parallel":   # (shuffled too: a shuffled run's parallel pass ended on the mutants, 15 min alone)
        rank = {m: i for i, m in enumerate(SLOW_FIRST)}
        items.sort(key=lambda it: rank.get(_module(it), len(rank)))   # (stable: the rest in their order)


def _list_serial_modules(path: str, items: List[pytest.Item]) -> None:
    """The files of the tests of the serial kind, a line each, into ``path`` (tests/passes.sh: the serial pass
    then collects those, not the whole suite again; every worker writes the same list, each whole)."""
    mods = sorted({str(it.path) for it in items if kind(it) == "serial"})
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write("".join(m + "\n" for m in mods))
    os.replace(tmp, path)


_RUN = pytest.StashKey[Dict[str, str]]()


class _RunIds:
    """A plugin of its own (a module has one hook of a name): records what this run will run, after -k, -m
    and the pass have deselected, each test's kind by id (``measures`` or ``parallel``): :func:`run_ids`."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        config.stash[_RUN] = {it.nodeid: "measures" if it.get_closest_marker("measures") else "parallel"
                              for it in items}


def run_ids(config) -> Dict[str, str]:
    """The tests this run (this pass, on every worker of it) runs, after every selection: id -> kind.  The
    mutant check leaves out its baseline of the named tests that are here: the run itself shows they pass."""
    return dict(config.stash.get(_RUN, {}))


def pytest_report_header(config):
    seed = config.getoption("teye_shuffle")
    if seed is not None:
        return [f"teye: modules and tests in random order, --teye-shuffle {seed}"]
    return None


def pytest_runtest_setup(item):
    msg = item.stash.get(_UNMARKED, None)
    if msg:
        pytest.fail(msg, pytrace=False)


# ---- the parallel pass's controller: no worker dies unsaid, no run passes short ----

@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    node.config.stash[_STATE].collected[node.gateway.id] = list(ids)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    if error is not None:
        node.config.stash[_STATE].down.append(f"worker {node.gateway.id} died: {error}")


def pytest_runtest_logreport(report):
    if getattr(report, "node", None) is not None:   # (on the controller: a worker's report)
        report.node.config.stash[_STATE].reported.add(report.nodeid)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    st = session.config.stash.get(_STATE, None)
    if st is None or not st.collected:
        return
    ids = set(next(iter(st.collected.values())))
    missing = sorted(ids - st.reported)
    lines = list(st.down)
    if missing and session.exitstatus in (0, 5):   # (a run stopped early, -x or an interrupt, fails anyway)
        lines.append(f"{len(missing)} of {len(ids)} collected tests never reported, e.g. {', '.join(missing[:5])}")
    if lines:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        for line in lines:
            if tr is not None:
                tr.write_line(f"teye: {line}", red=True, bold=True)
        if session.exitstatus in (0, 5):
            session.exitstatus = 1
