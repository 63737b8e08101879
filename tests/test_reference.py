"""tests/reference.py: a bare run made by the first pass is the one its test gets, and only for the same
command and environment; anything else is made where it is asked for."""
from __future__ import annotations

import json
import sys

import pytest

from tests import reference

# a job that prints its arguments and the one variable that tells runs apart, writes OUT when given one, exits 3
JOB = ("import json, os, sys; a = sys.argv[1:]; print(json.dumps([a, os.environ.get('WHO')])); "
       "[open(x, 'w').write('out of ' + os.environ.get('WHO', '')) for x in a if x.endswith('/out')]; sys.exit(3)")


@pytest.fixture
def names(request):
    """Fresh names for this test's declarations, forgotten after it (each name is declared once a process)."""
    made = []

    def name(n):
        made.append(f"{request.node.name}-{n}")
        return made[-1]
    yield name
    for n in made:
        reference._declared.pop(n, None)


def _bare(name, who="a", *extra, **kw):
    return reference.Bare(name, [sys.executable, "-c", JOB, *extra], env={"WHO": who}, status=3, **kw)


def test_a_run_made_ahead_is_the_one_its_test_gets(tmp_path, monkeypatch, names):
    b = _bare(names("x"), "a", "--port", reference.PORT, reference.OUT)
    made = b.store(str(tmp_path))
    argv, who = json.loads(made.stdout)
    assert made.returncode == 3 and who == "a" and made.out == "out of a"
    assert argv[1].isdigit() and 0 < int(argv[1]) < 65536 and argv[2].endswith("/out")   # placeholders filled
    monkeypatch.setenv(reference.DIR_ENV, str(tmp_path))
    before = dict(reference.MADE)
    got = b.result()
    assert got.made == "ahead" and (got.returncode, got.stdout, got.stderr, got.out) == \
        (made.returncode, made.stdout, made.stderr, made.out)
    assert reference.MADE["ahead"] == before["ahead"] + 1


def test_another_environment_or_command_is_made_here(tmp_path, monkeypatch, names):
    _bare(names("a"), "a").store(str(tmp_path))
    monkeypatch.setenv(reference.DIR_ENV, str(tmp_path))
    other_env = _bare(names("b"), "b").result()        # (another name too: the name alone never matches)
    assert other_env.made == "here" and json.loads(other_env.stdout)[1] == "b"
    same_name_dir = tmp_path / "again"
    same_name_dir.mkdir()
    x = _bare(names("c"), "a")
    x.store(str(same_name_dir))
    monkeypatch.setenv(reference.DIR_ENV, str(same_name_dir))
    x.env["WHO"] = "z"                                    # the same name, run under another environment
    got = x.result()
    assert got.made == "here" and json.loads(got.stdout)[1] == "z"
    x.env["WHO"] = "a"
    assert x.result().made == "ahead"
    x.args.append("more")                                  # or another command
    got = x.result()
    assert got.made == "here" and json.loads(got.stdout)[0] == ["more"]


def test_pytests_own_variables_do_not_tell_runs_apart(tmp_path, monkeypatch, names):
    b = _bare(names("p"), "a")
    b.env["PYTEST_XDIST_WORKER"] = "gw2"
    b.store(str(tmp_path))
    b.env.pop("PYTEST_XDIST_WORKER")
    b.env["PYTEST_CURRENT_TEST"] = "tests/x.py::y (call)"
    monkeypatch.setenv(reference.DIR_ENV, str(tmp_path))
    assert b.result().made == "ahead"


def test_what_an_import_puts_in_the_environment_does_not_tell_runs_apart(tmp_path, monkeypatch, names):
    """TensorFlow sets TF2_BEHAVIOR and more in os.environ when imported (Lightning, torch._inductor their
    own): a run declared after such an import is the same run as one declared before it (x35: 13 of 30 bare
    runs were made twice for that), and its job gets the session's environment, not the import's."""
    before = _bare(names("before"), "a")
    monkeypatch.setenv("TF2_BEHAVIOR", "1")
    after = _bare(names("after"), "a")
    assert after.key == before.key and "TF2_BEHAVIOR" not in after.env
    before.store(str(tmp_path))
    monkeypatch.setenv(reference.DIR_ENV, str(tmp_path))
    assert reference.Bare.result(after).made == "here"     # (its name is its own: a file of its own)
    after.name = before.name
    assert after.result().made == "ahead"


def test_an_xdist_workers_terminal_size_is_not_the_sessions():
    """What an xdist worker's os.environ holds at its start (x35's first pass, against its serial pass): the
    same environment but PYTEST_XDIST_* and COLUMNS=80, LINES=24.  The worker's session environment, keyed,
    is the serial pass's; the invocation's own COLUMNS stays where there is no worker."""
    serial = {"PATH": "/usr/bin", "HOME": "/root"}
    worker = dict(serial, COLUMNS="80", LINES="24", PYTEST_XDIST_WORKER="gw0", PYTEST_XDIST_WORKER_COUNT="4",
                  PYTEST_XDIST_TESTRUNUID="49e3fd81")
    assert reference._env_key(reference.session_env(worker)) == reference._env_key(reference.session_env(serial))
    assert reference.session_env(dict(serial, COLUMNS="132"))["COLUMNS"] == "132"


def test_without_a_directory_or_a_finished_run_it_is_made_here(tmp_path, monkeypatch, names):
    b = _bare(names("n"), "a")
    monkeypatch.delenv(reference.DIR_ENV, raising=False)
    assert b.result().made == "here"
    monkeypatch.setenv(reference.DIR_ENV, str(tmp_path))
    assert b.result().made == "here"                       # nothing made ahead
    path = b._path(str(tmp_path))
    with open(path + ".part", "w") as f:                   # one the first pass was still writing
        f.write('{"args": [')
    assert b.result().made == "here"


def test_a_name_is_declared_once(names):
    n = names("d")
    _bare(n)
    with pytest.raises(ValueError, match="declared twice"):
        _bare(n)
