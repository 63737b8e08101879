"""The kept-mutant harness cannot pass vacuously: on a small tree of its own, it fails when a patch changes
nothing the test sees, when the named test fails without the patch, when the patch no longer applies, when
the failure on the mutant is a collection error or a fixture's; it passes a real mutant.  (Only the named
tests run, so no other test's failure can count: test_what_a_name_covers.)"""
from __future__ import annotations

import os
import subprocess
import textwrap

import pytest

from tests.mutants.harness import Tree, baseline, check, forget_compiled, named, patched_paths, run_tests

CALC = "def add(a, b):\n    return a + b\n"
TESTS = """\
import pytest

from pkg.calc import add


@pytest.fixture
def numbers():
    return add(1, 1)


def test_add():
    assert add(2, 3) == 5


def test_with_fixture(numbers):
    assert numbers == 2


def test_other():
    assert add(0, 0) == 0
"""


def _patch(old: str, new: str, path: str = "pkg/calc.py") -> str:
    """A unified diff of one line of a file (what `git diff` writes for such a change)."""
    return textwrap.dedent(f"""\
        diff --git a/{path} b/{path}
        --- a/{path}
        +++ b/{path}
        @@ -1,2 +1,2 @@
         def add(a, b):
        -{old}
        +{new}
        """)


def _tiny_tree(repo):
    for d in ("pkg", "tests"):
        (repo / d).mkdir(parents=True)
        (repo / d / "__init__.py").write_text("")
    (repo / "pkg" / "calc.py").write_text(CALC)
    (repo / "tests" / "test_calc.py").write_text(TESTS)
    return repo


@pytest.fixture
def tiny(tmp_path):
    """A tree of its own (not a git checkout: the harness copies it whole) and a place for patches."""
    repo = _tiny_tree(tmp_path / "repo")

    def run(patch_text, tests, name="m.patch"):
        patch = tmp_path / name
        patch.write_text(patch_text)
        work = tmp_path / ("work-" + name)
        work.mkdir()
        check(str(repo), str(patch), tests, str(work))
    run.repo = repo
    return run


def test_a_real_mutant_passes(tiny):
    tiny(_patch("    return a + b", "    return a - b"), ["tests/test_calc.py::test_add"])


def test_a_patch_that_changes_nothing_the_test_sees_fails(tiny):
    with pytest.raises(AssertionError, match="did not fail on the mutant"):
        tiny(_patch("    return a + b", "    return a + b  # mutant: a comment"), ["tests/test_calc.py::test_add"])


def test_a_test_that_fails_without_the_patch_fails(tiny):
    (tiny.repo / "tests" / "test_calc.py").write_text(TESTS.replace("== 5", "== 6"))
    with pytest.raises(AssertionError, match="fail without the patch"):
        tiny(_patch("    return a + b", "    return a - b"), ["tests/test_calc.py::test_add"])


def test_a_patch_that_no_longer_applies_fails(tiny):
    with pytest.raises(AssertionError, match="no longer applies"):
        tiny(_patch("    return a * b", "    return a - b"), ["tests/test_calc.py::test_add"])


def test_a_collection_error_is_not_the_named_tests_failure(tiny):
    with pytest.raises(AssertionError, match="not the named test's own"):
        tiny(_patch("    return a + b", "    return a +"), ["tests/test_calc.py::test_add"])


def test_a_failing_fixture_is_not_the_named_tests_failure(tiny):
    # add(1, 1) == 2 breaks in the fixture only: the named test errors in its setup, it does not fail itself
    patch = _patch("    return a + b", "    return a + b if (a, b) != (1, 1) else 1 / 0")
    with pytest.raises(AssertionError, match="not the named test's own"):
        tiny(patch, ["tests/test_calc.py::test_with_fixture"])


CRASHING = """\
import os


def pytest_runtest_makereport(item, call):
    # pytest's own failure while it reports a failing call (as CPython 3.11.7's AST race made one, stop 65):
    # once (TEYE_TEST_CRASH_FLAG is made) or every time (no flag)
    flag = os.environ.get("TEYE_TEST_CRASH_FLAG")
    if call.when == "call" and call.excinfo is not None and not (flag and os.path.exists(flag)):
        if flag:
            open(flag, "w").close()
        raise SystemError("AST constructor recursion depth mismatch (before=129, after=25)")
"""


@pytest.mark.parametrize("once", [True, False])
def test_pytest_failing_internally_on_the_mutant_is_run_again_once(tiny, tmp_path, monkeypatch, once):
    """An INTERNALERROR (exit 3) is pytest's failure, no verdict on the mutant: its tests run once more; a
    second one fails the check, saying so."""
    (tiny.repo / "tests" / "conftest.py").write_text(CRASHING)
    monkeypatch.setenv("TEYE_TEST_CRASH_FLAG", str(tmp_path / "crashed") if once else "")
    mutant = _patch("    return a + b", "    return a - b")
    if once:
        tiny(mutant, ["tests/test_calc.py::test_add"])
        assert (tmp_path / "crashed").exists()
    else:
        with pytest.raises(AssertionError, match="pytest failed internally, twice, on the mutant"):
            tiny(mutant, ["tests/test_calc.py::test_add"])


def test_a_shared_baseline_stands_for_step_one_of_each_patch(tiny, tmp_path):
    """One baseline run of several patches' tests: each patch reads its own tests' records from it, so a test
    of another patch failing there does not fail this one, and its own failing there does."""
    (tiny.repo / "tests" / "test_calc.py").write_text(TESTS.replace("assert add(0, 0) == 0", "assert add(0, 0) == 1"))
    base = baseline(str(tiny.repo), ["tests/test_calc.py::test_add", "tests/test_calc.py::test_other"],
                    str(tmp_path / "base"))
    assert [r["outcome"] for r in base[:-1] if r["when"] == "call"] == ["passed", "failed"] and base[-1]["rc"] == 1
    patch = tmp_path / "m.patch"
    patch.write_text(_patch("    return a + b", "    return a - b"))
    for i, (tests, fails) in enumerate([(["tests/test_calc.py::test_add"], None),
                                        (["tests/test_calc.py::test_other"], "fail without the patch")]):
        work = tmp_path / f"w{i}"
        work.mkdir()
        if fails:
            with pytest.raises(AssertionError, match=fails):
                check(str(tiny.repo), str(patch), tests, str(work), base=base)
        else:
            check(str(tiny.repo), str(patch), tests, str(work), base=base)
    # a patch whose tests the baseline never ran (collected nothing of them) is not taken as passing
    work = tmp_path / "w9"
    work.mkdir()
    with pytest.raises(AssertionError, match="fail without the patch"):
        try:
            check(str(tiny.repo), str(patch), ["tests/test_calc.py::test_with_fixture"], str(work), base=base)
        except pytest.skip.Exception as e:   # "its tests only skip here" would hide the hole as a skip
            pytest.fail(f"a baseline without the patch's tests taken as passing: {e}")


def test_what_a_name_covers():
    assert named("tests/a.py::test_x", ["tests/a.py"]) and named("tests/a.py::test_x[1-2]", ["tests/a.py::test_x"])
    assert not named("tests/a.py::test_x_more", ["tests/a.py::test_x"]) and not named("tests/ab.py::t", ["tests/a"])



def test_a_mutant_of_a_module_compiled_as_it_was_still_runs_the_mutant(tmp_path):
    """A compiled copy of the unpatched module beside the patched source is not what the mutant's run imports.
    Made certain with a pyc that Python never checks against its source (unchecked-hash): without the harness
    forgetting it, the mutant's run imports the unpatched add and passes (as a same-second, same-size patch did
    against an ordinary pyc on CI, stop 54)."""
    import py_compile
    import subprocess
    repo = _tiny_tree(tmp_path / "repo")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    pyc = py_compile.compile(str(repo / "pkg" / "calc.py"), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    assert os.path.exists(pyc)
    (tmp_path / "m.patch").write_text(_patch("    return a + b", "    return a - b"))
    (tmp_path / "work").mkdir()
    check(str(repo), str(tmp_path / "m.patch"), ["tests/test_calc.py::test_add"], str(tmp_path / "work"))
    # only the patched module's compiled copies go (not a module whose name it begins)
    tree = tmp_path / "work" / "tree"
    cache = tree / "pkg" / "__pycache__"
    for n in ("calc.cpython-311.pyc", "calc.cpython-311-pytest-9.2.0.pyc", "calculator.cpython-311.pyc",
              "other.cpython-311.pyc"):
        (cache / n).write_bytes(b"")
    gone = forget_compiled(str(tree), patched_paths(str(tree), str(tmp_path / "m.patch")))
    assert sorted(os.path.basename(g) for g in gone) == ["calc.cpython-311-pytest-9.2.0.pyc", "calc.cpython-311.pyc"]
    left = os.listdir(cache)   # (with whatever the runs compiled beside them: pkg/__init__'s, where bytecode is written)
    assert {"calculator.cpython-311.pyc", "other.cpython-311.pyc"} <= set(left)
    assert not [n for n in left if n.startswith("calc.")], left


def test_one_tree_serves_patch_after_patch_each_on_the_working_tree_as_it_is(tmp_path):
    """harness.Tree: a patch is taken back after its check, so the next applies to the working tree's code
    (this one's context is the line the first changed: it would not apply on the first mutant) and the tree
    is copied once."""
    repo = _tiny_tree(tmp_path / "repo")
    tree = Tree(str(repo), str(tmp_path / "tree"))
    for i, new in enumerate(["    return a - b", "    return a * b", "    return a - b"]):
        (tmp_path / f"m{i}.patch").write_text(_patch("    return a + b", new))
        (tmp_path / f"w{i}").mkdir()
        check(str(repo), str(tmp_path / f"m{i}.patch"), ["tests/test_calc.py::test_add"], str(tmp_path / f"w{i}"),
              tree=tree)
    assert (tmp_path / "tree" / "pkg" / "calc.py").read_text() == CALC and tree.copies == 1
    # a patch that fails its check is taken back too
    (tmp_path / "same.patch").write_text(_patch("    return a + b", "    return b + a"))
    (tmp_path / "w9").mkdir()
    with pytest.raises(AssertionError, match="did not fail on the mutant"):
        check(str(repo), str(tmp_path / "same.patch"), ["tests/test_calc.py::test_add"], str(tmp_path / "w9"),
              tree=tree)
    assert (tmp_path / "tree" / "pkg" / "calc.py").read_text() == CALC and tree.copies == 1


def test_a_patch_taken_back_leaves_no_compiled_mutant(tmp_path):
    """The mutant's compiled module goes with the patch: made certain with a pyc Python never checks against
    its source (unchecked-hash), which the working tree's test would otherwise import and fail on."""
    import py_compile
    repo = _tiny_tree(tmp_path / "repo")
    tree = Tree(str(repo), str(tmp_path / "tree"))
    patch = tmp_path / "m.patch"
    patch.write_text(_patch("    return a + b", "    return a - b"))
    assert subprocess.run(["git", "apply", str(patch)], cwd=tree.path).returncode == 0
    py_compile.compile(os.path.join(tree.path, "pkg", "calc.py"),
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    tree.restore(str(patch))
    recs = run_tests(tree.path, ["tests/test_calc.py::test_add"], str(tmp_path / "out.jsonl"), first_failure=False)
    assert recs[-1]["rc"] == 0, recs
    assert tree.copies == 1


@pytest.mark.parametrize("how", ["new file", "tracked file changed", "tracked file removed"])
def test_a_tree_a_test_wrote_into_is_copied_again(tmp_path, how):
    repo = _tiny_tree(tmp_path / "repo")
    tree = Tree(str(repo), str(tmp_path / "tree"))
    calc = os.path.join(tree.path, "pkg", "calc.py")
    if how == "new file":
        with open(os.path.join(tree.path, "tests", "left.txt"), "w") as fh:
            fh.write("x")
    elif how == "tracked file changed":   # the same size: only its time tells
        with open(calc, "w") as fh:
            fh.write(CALC.replace("+", "-"))
    else:
        os.unlink(calc)
    tree.restore(None)
    assert tree.copies == 2 and tree.written == ["tests/left.txt" if how == "new file" else "pkg/calc.py"]
    assert sorted(os.listdir(os.path.join(tree.path, "tests"))) == ["__init__.py", "test_calc.py"]
    assert open(calc).read() == CALC
    tree.restore(None)   # and nothing changed: no copy
    assert tree.copies == 2
