"""The suite's own machinery (issue 50, tests/kinds.py and tests/passes.sh), each on a small tree of its own:
a test that measures and is not marked so fails, naming its sign (also one of the suite's real measuring
tests with its mark taken off); the two passes run each kind once, in the pass of its kind, whatever
arguments select it, and exit 5 handling holds across both; a worker that dies fails the run with its name,
also where it dies after its tests reported; the shuffle keeps every test and each module's tests together."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.procs import REPO

# the signs of measuring read here are those of the small trees these tests write (their clocks bound nothing)
pytestmark = pytest.mark.not_measuring("the signs are in the small trees the tests write and run")

CONFTEST = 'pytest_plugins = ["tests.kinds"]\n'
MEASURING = textwrap.dedent('''\
    import os
    import subprocess
    import sys
    import time

    import pytest

    SCRIPT = os.path.join(os.path.dirname(__file__), "loop.py")


    def test_plain():
        assert sum(range(4)) == 6


    def test_timed_assertion():
        t0 = time.monotonic()
        sum(range(1000))
        assert time.monotonic() - t0 < 5


    def _elapsed_share():
        a = time.perf_counter()
        return time.perf_counter() - a


    def test_through_a_helper():
        assert _elapsed_share() >= 0


    @pytest.fixture
    def hog():
        p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        yield p
        p.kill()
        p.wait()


    def test_beside_a_hog(hog):
        assert hog.poll() is None


    def test_a_script_with_its_own_clock():
        out = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, check=True).stdout
        assert float(out) >= 0


    @pytest.mark.measures("the script's own clock")
    def test_marked():
        out = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, check=True).stdout
        assert float(out) >= 0


    @pytest.mark.not_measuring("the deadline only bounds the wait")
    def test_told_apart():
        deadline = time.monotonic() + 5
        assert deadline - time.monotonic() > -1
''')
LOOP = "import time\nt0 = time.monotonic()\nprint(time.monotonic() - t0)\n"


def _tree(tmp_path, files):
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def _env():
    """This process's environment without what xdist and pytest set in a worker (the trees' runs are their own)."""
    own = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST_", "PYTEST_CURRENT_TEST"))}
    return {**own, "PYTHONPATH": REPO, "PYTHONDONTWRITEBYTECODE": "1"}


def _pytest(tree, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "pytest", "-rA", *args], cwd=tree, env=_env(),
                          capture_output=True, text=True, timeout=timeout)


def _outcomes(out: str):
    """test name -> PASSED/FAILED/ERROR from -rA's short summary (the last word of the id)."""
    got = {}
    for m in re.finditer(r"^(PASSED|FAILED|ERROR|SKIPPED) \S+::(\w+)", out, re.M):
        got[m.group(2)] = m.group(1)
    return got


def test_each_unmarked_test_with_a_sign_of_measuring_fails_naming_it_and_the_marked_ones_run(tmp_path):
    tree = _tree(tmp_path, {"test_a.py": MEASURING, "loop.py": LOOP})
    run = _pytest(tree)
    got = _outcomes(run.stdout)
    assert run.returncode == 1, run.stdout[-3000:]
    assert got == {"test_plain": "PASSED", "test_marked": "PASSED", "test_told_apart": "PASSED",
                   "test_timed_assertion": "ERROR", "test_through_a_helper": "ERROR", "test_beside_a_hog": "ERROR",
                   "test_a_script_with_its_own_clock": "ERROR"}, run.stdout[-3000:]
    text = run.stdout
    assert re.search(r"test_timed_assertion measures \(a timed assertion in test_a\.py::test_timed_assertion", text)
    assert re.search(r"test_through_a_helper measures \('perf_counter' in test_a\.py::_elapsed_share", text)
    assert re.search(r"test_beside_a_hog measures \('while True: pass' in test_a\.py::hog", text)
    assert re.search(r"test_a_script_with_its_own_clock measures \('monotonic\(\) - t' in loop\.py", text)
    assert "but is not marked so" in text


PHASES_CONFTEST = CONFTEST + "from tests.phases.conftest import listener, sockdir  # noqa: F401\n"


def test_a_real_measuring_test_with_its_mark_taken_off_fails(tmp_path):
    """The check on one of the suite's own: tests/phases/test_client.py times the loop's sends (perf_counter)."""
    name = "test_full_socket_buffer_drops_without_blocking_and_reports_the_count"
    with open(os.path.join(REPO, "tests", "phases", "test_client.py"), encoding="utf-8") as fh:
        src = fh.read()
    mark = re.search(r"^@pytest\.mark\.measures\(.*\)\n(?=def " + name + r"\()", src, re.M)
    assert mark, f"{name} is marked measures"
    (tmp_path / "off").mkdir()
    (tmp_path / "on").mkdir()
    off = _tree(tmp_path / "off", {"test_client_copy.py": src[:mark.start()] + src[mark.end():],
                                       "conftest.py": PHASES_CONFTEST})
    run = _pytest(off, "-k", name)
    assert run.returncode == 1 and re.search(rf"^ERROR \S+::{name}\b", run.stdout, re.M), run.stdout[-3000:]
    assert f"{name} measures ('perf_counter' in test_client_copy.py::{name}" in run.stdout, run.stdout[-3000:]
    # with its mark it is of the serial kind: the parallel pass leaves it out, the serial pass runs it
    on = _tree(tmp_path / "on", {"test_client_copy.py": src, "conftest.py": PHASES_CONFTEST})
    assert _pytest(on, "--teye-pass=parallel", "-k", name).returncode == 5
    serial = _pytest(on, "--teye-pass=serial", "-k", name)
    assert serial.returncode == 0 and re.search(rf"^PASSED \S+::{name}\b", serial.stdout, re.M), serial.stdout[-3000:]


PASSES = textwrap.dedent('''\
    import os

    import pytest


    def test_waits():
        assert os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw")


    @pytest.mark.measures("alone")
    def test_alone():
        assert "PYTEST_XDIST_WORKER" not in os.environ


    @pytest.mark.measures("alone, and wrong")
    def test_alone_failing():
        assert os.environ.get("TEYE_FAIL_ALONE") != "1"
''')


def _passes(tree, *args, env=None):
    return subprocess.run(["bash", os.path.join(REPO, "tests", "passes.sh"), sys.executable, "-rA", *args],
                          cwd=tree, env={**_env(), **(env or {})}, capture_output=True, text=True, timeout=300)


def test_the_two_passes_run_each_kind_in_its_own_and_exit_5_only_when_both_find_nothing(tmp_path):
    tree = _tree(tmp_path, {"test_p.py": PASSES, "test_q.py": "def test_q():\n    pass\n"})
    both = _passes(tree)
    assert both.returncode == 0, both.stdout[-3000:] + both.stderr[-2000:]
    out = both.stdout
    # the whole suite: the serial pass collects only the files the first pass listed as holding serial tests
    # (test_p.py: its three tests, one deselected; not test_q.py's too)
    assert re.search(r"^collected 3 items / 1 deselected / 2 selected", out, re.M), out[-3000:]
    assert re.search(r"^PASSED test_q.py::test_q$", out, re.M), out[-3000:]
    # the parallel pass on workers (test_waits asserts it), the serial one in the main process
    assert re.search(r"^PASSED test_p.py::test_waits", out, re.M) and re.search(
        r"^PASSED test_p.py::test_alone$", out, re.M), out[-3000:]
    assert out.count("slowest 25 durations") == 2 or out.count("slowest durations") == 2, out[-3000:]
    # a test named alone runs in the pass of its kind (the other pass finds nothing: 5, not a failure)
    # (four workers unless TEYE_TEST_WORKERS says otherwise)
    one = _passes(tree, "test_p.py::test_alone", env={"TEYE_TEST_WORKERS": ""})
    assert one.returncode == 0 and re.search(r"^PASSED test_p.py::test_alone$", one.stdout, re.M), one.stdout[-3000:]
    assert "parallel pass (4 workers) exit 5" in one.stderr, one.stderr
    other = _passes(tree, "test_p.py::test_waits")
    assert other.returncode == 0 and "serial pass exit 5" in other.stderr, other.stdout[-3000:] + other.stderr
    # nothing selected in either: a failure
    none = _passes(tree, "-k", "no_such_test")
    assert none.returncode == 1 and "no tests in either pass" in none.stderr, none.stderr
    # a failure in the second pass after a clean first one
    bad = _passes(tree, env={"TEYE_FAIL_ALONE": "1"})
    assert bad.returncode == 1 and re.search(r"^FAILED test_p.py::test_alone_failing", bad.stdout, re.M), \
        bad.stdout[-3000:]


DYING = textwrap.dedent('''\
    import os
    import signal

    import pytest


    @pytest.fixture(scope="module")
    def dies_after():
        yield
        if os.environ.get("TEYE_DIE") == "teardown":
            os.kill(os.getpid(), signal.SIGKILL)


    def test_one(dies_after):
        if os.environ.get("TEYE_DIE") == "call":
            os.kill(os.getpid(), signal.SIGKILL)


    def test_two(dies_after):
        pass
''')
OTHER = "def test_elsewhere():\n    pass\n"


@pytest.mark.parametrize("when", ["call", "teardown"])
def test_a_worker_that_dies_fails_the_run_with_its_name(tmp_path, when):
    tree = _tree(tmp_path, {"test_dying.py": DYING, "test_other.py": OTHER})
    env = {**_env(), "TEYE_DIE": when}
    run = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadfile",
                          "--max-worker-restart", "1", "-rA"], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout[-3000:]
    assert re.search(r"teye: worker gw\d died", run.stdout), run.stdout[-3000:]
    if when == "call":   # xdist's own report names the worker and the test it ran
        assert re.search(r"worker 'gw\d' crashed while running 'test_dying.py::test_one'", run.stdout), \
            run.stdout[-3000:]


def test_the_shuffle_keeps_every_test_and_each_module_together_and_a_seed_gives_one_order(tmp_path):
    files = {f"test_m{i}.py": "".join(f"def test_{j}():\n    pass\n\n\n" for j in range(6)) for i in range(5)}
    tree = _tree(tmp_path, files)
    plain = _pytest(tree, "--collect-only", "-q").stdout.split("\n\n")[0].splitlines()
    a = _pytest(tree, "--collect-only", "-q", "--teye-shuffle", "7").stdout.split("\n\n")[0].splitlines()
    b = _pytest(tree, "--collect-only", "-q", "--teye-shuffle", "7").stdout.split("\n\n")[0].splitlines()
    c = _pytest(tree, "--collect-only", "-q", "--teye-shuffle", "8").stdout.split("\n\n")[0].splitlines()
    assert len(plain) == 30 and sorted(a) == sorted(plain) and a == b and a != plain and c != a
    mods = [t.split("::")[0] for t in a]
    assert [m for i, m in enumerate(mods) if i == 0 or mods[i - 1] != m] == list(dict.fromkeys(mods)), mods
