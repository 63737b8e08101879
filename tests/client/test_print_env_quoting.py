"""`teye run --print-env` (issue 36): the default form is safe for ``eval "$(teye run --print-env)"`` in a real
shell, whatever PYTHONPATH or the job name hold; ``--print-env=taskprolog`` stays literal for slurmstepd."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.client.helpers import REPO, SITE, base_env

PY = sys.executable
SHELLS = [s for s in ("sh", "bash", "dash") if shutil.which(s)]


def hostile(marker):
    """PYTHONPATH entries a shell would run, split or glob if they reached eval unquoted."""
    return [f"/opt/a b/$(touch {marker})", f"/x/`touch {marker}`", "/it's", "/semi;touch " + marker, "/g/*",
            "/nl\nend", "/dq\"$HOME\"", "/bs\\n", "/tab\tx"]


@pytest.mark.parametrize("shell", SHELLS)
def test_eval_of_the_default_form_keeps_every_value_literal(tmp_path, shell):
    marker = str(tmp_path / "pwned")
    entries = [REPO] + hostile(marker)
    given = os.pathsep.join(entries)
    job = f"j 1 $(touch {marker})"
    env = base_env(PYTHONPATH=given, TEYE_TEST_PY=PY, TEYE_TEST_JOB=job)
    script = ('eval "$("$TEYE_TEST_PY" -m agent run --print-env --job "$TEYE_TEST_JOB" --socket "/s p/x.sock")" '
              '&& printf "%s\\0%s\\0%s" "$PYTHONPATH" "$TEYE_TRAIN_JOB" "$TEYE_PHASE_SOCKET"')
    p = subprocess.run([shell, "-c", script], env=env, capture_output=True, cwd=str(tmp_path), timeout=60)
    assert p.returncode == 0, p.stderr
    assert not os.path.exists(marker)                 # nothing ran
    pythonpath, train_job, sock = p.stdout.decode().split("\0")
    assert pythonpath == os.pathsep.join([SITE] + entries)   # site first, the rest byte for byte
    assert train_job == job and sock == "/s p/x.sock"


def test_plain_values_print_as_before_and_apply_in_a_fresh_python(tmp_path):
    env = base_env(PYTHONPATH=os.pathsep.join([REPO, "/opt/other"]))
    r = subprocess.run([PY, "-m", "agent", "run", "--print-env", "--job", "j1"], env=env, capture_output=True,
                       text=True, cwd=REPO)
    assert r.stdout.splitlines() == [f"export PYTHONPATH={SITE}:{REPO}:/opt/other", "export TEYE_TRAIN_JOB=j1"]


def test_taskprolog_form_is_literal_as_slurmstepd_applies_it(tmp_path):
    marker = str(tmp_path / "pwned")
    entries = [REPO] + [e for e in hostile(marker) if "\n" not in e]
    env = base_env(PYTHONPATH=os.pathsep.join(entries))
    r = subprocess.run([PY, "-m", "agent", "run", "--print-env=taskprolog", "--job", "a b"], env=env,
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    applied = dict(ln[len("export "):].split("=", 1) for ln in r.stdout.splitlines())   # slurmstepd's reading
    assert applied == {"PYTHONPATH": os.pathsep.join([SITE] + entries), "TEYE_TRAIN_JOB": "a b"}


def test_taskprolog_form_refuses_a_line_break_and_a_bad_form_is_a_usage_error():
    env = base_env(PYTHONPATH=os.pathsep.join([REPO, "/a\nexport LD_PRELOAD=/evil.so"]))
    r = subprocess.run([PY, "-m", "agent", "run", "--print-env=taskprolog"], env=env, capture_output=True,
                       text=True, cwd=REPO)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == ("teye run: --print-env=taskprolog: PYTHONPATH holds a line break: a TaskProlog line "
                        "cannot carry it literally\n")
    r = subprocess.run([PY, "-m", "agent", "run", "--print-env=csh"], env=env, capture_output=True, text=True,
                       cwd=REPO)
    assert r.returncode == 2 and r.stdout == "" and "invalid choice: 'csh'" in r.stderr
