"""Known mutants, kept: each patch in this folder breaks the code on purpose, in a copy of the tree,
and the tests named for it must fail there (issue 25: tests that passed whatever the code did).

A mutant that no longer applies fails here too: update the patch with the code it breaks.  Only
mutants that fail their test within a few seconds are kept; the others are listed in tests/README.md.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.procs import REPO

HERE = os.path.dirname(os.path.abspath(__file__))

# patch -> (tests that must fail on it, whether the C helpers must be rebuilt)
MUTANTS = {
    "input_bound_ratio_plus_2_points.patch": (["tests/phases/test_profile.py::test_input_bound_command"], False),
    "http_budget_logged_not_kept.patch": (["tests/web/test_attack.py"], False),
    "c_decoder_records_limit_per_list.patch": (
        ["tests/phases/test_fast.py::test_mutated_datagrams_agree_with_python"], True),
    "c_table_touching_pieces_not_merged.patch": (
        ["tests/phases/test_fast_table.py::test_generated_histories_leave_the_same_state"], True),
    "merged_1ns_gaps.patch": (["tests/phases/test_shares.py::test_no_share_exceeds_one_for_any_stream"], False),
    "pending_series_vanishes_with_jobs.patch": (
        ["tests/test_series_budget.py::test_jobs_scale_linearly_and_nothing_else_moves"], False),
    "serve_cost_always_python.patch": (["tests/phases/test_bench_serve_cost.py"], False),
    "pmu_bad_alias_keeps_controller.patch": (
        ["tests/pmu/test_source.py::test_unparseable_description_and_unknown_format_field"], False),
}

SKIP_DIRS = {".git", ".venv", "build", "dist", "__pycache__", ".hypothesis", ".pytest_cache", "out"}


def copy_tree(dst) -> None:
    """The working tree (tracked and untracked files git does not ignore, and the built C helpers)."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO, capture_output=True)
    if listed.returncode != 0:   # not a git checkout: everything but the usual junk
        shutil.copytree(REPO, dst, symlinks=True, ignore=lambda d, names: [n for n in names if n in SKIP_DIRS])
        return
    names = [n for n in listed.stdout.decode().split("\0") if n]
    names += [os.path.relpath(os.path.join(REPO, "agent", "phases", n), REPO)
              for n in os.listdir(os.path.join(REPO, "agent", "phases")) if n.startswith("_fast") and n.endswith(".so")]
    for n in names:
        src, to = os.path.join(REPO, n), os.path.join(dst, n)
        if not os.path.lexists(src):   # deleted in the working tree, not yet in git
            continue
        os.makedirs(os.path.dirname(to), exist_ok=True)
        if os.path.islink(src):
            os.symlink(os.readlink(src), to)
        else:
            shutil.copy2(src, to)


def test_every_patch_here_is_listed():
    assert sorted(f for f in os.listdir(HERE) if f.endswith(".patch")) == sorted(MUTANTS)


@pytest.mark.parametrize("patch", sorted(MUTANTS))
def test_the_named_tests_fail_on_the_mutant(tmp_path, patch):
    tests, rebuild = MUTANTS[patch]
    tree = tmp_path / "tree"
    copy_tree(str(tree))
    applied = subprocess.run(["git", "apply", os.path.join(HERE, patch)], cwd=tree, capture_output=True, text=True)
    assert applied.returncode == 0, f"{patch} no longer applies: {applied.stderr}"
    env = {**os.environ, "PYTHONPATH": str(tree), "TEYE_REQUIRE_FAST": "1"}
    env.pop("TEYE_PURE_PYTHON", None)
    if rebuild:
        for so in (tree / "agent" / "phases").glob("_fast*.so"):
            so.unlink()
        built = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree, env=env,
                               capture_output=True, text=True, timeout=300)
        assert built.returncode == 0, built.stderr[-2000:]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                          "-p", "tests.mutants.no_shrink", *tests], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=600)
    # 1: tests ran and some failed (not 2-5: interrupted, internal error, usage, none collected)
    assert run.returncode == 1 and "failed" in run.stdout.splitlines()[-1], \
        f"{patch}: {' '.join(tests)} did not fail on the mutant:\n{run.stdout[-3000:]}\n{run.stderr[-2000:]}"
