"""The serial pass's bare runs, made ahead in the first pass (tests/reference.py, issue 50): each measuring
module that declares ``reference.Bare`` runs is imported here, and each run made into the invocation's
directory, where its test in the serial pass reads it.  Each run must end as its test expects (its declared
exit status), or the test that would compare with it fails here first, with the job's stderr."""
from __future__ import annotations

import glob
import importlib
import importlib.util
import os

import pytest

from tests import reference
from tests.procs import REPO

pytestmark = pytest.mark.not_measuring("it makes bare runs whose output, not time, is compared later")


def _declaring_modules():
    """Test modules that declare bare runs, by their text: importing them declares their runs."""
    out = []
    for path in sorted(glob.glob(os.path.join(REPO, "tests", "**", "test_*.py"), recursive=True)):
        with open(path) as f:
            text = f.read()
        if "reference.Bare(" in text and os.path.abspath(path) != os.path.abspath(__file__):
            out.append(os.path.relpath(path, REPO)[:-3].replace(os.sep, "."))
    return out


MODULES = _declaring_modules()
for _m in MODULES:
    try:
        importlib.import_module(_m)
    except pytest.skip.Exception:   # its framework is not installed: its tests skip too, nothing to make
        pass


def test_the_declaring_modules_are_found():
    """The scan above finds the modules that declare runs (a module it missed would have its runs made in the
    serial pass again, silently slower)."""
    assert "tests.client.test_parts" in MODULES
    owners = {b.module for b in reference.declared().values()}
    assert owners <= set(MODULES), sorted(owners - set(MODULES))


@pytest.mark.parametrize("name", sorted(reference.declared()))
def test_a_bare_run_of_the_serial_pass_is_made_ahead(name):
    d = os.environ.get(reference.DIR_ENV)
    if not d:
        pytest.skip(f"no ${reference.DIR_ENV}: tests/passes.sh makes one per invocation; the serial pass's tests "
                    "make their bare runs themselves")
    bare = reference.find(name)
    if bare.needs and importlib.util.find_spec(bare.needs) is None:
        pytest.skip(f"{bare.needs} is not installed: the test that compares with {name} skips too")
    r = bare.store(d)
    assert r.returncode == bare.status, (r.returncode, r.stderr[-3000:])
