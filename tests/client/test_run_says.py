"""`teye run` says what it does (issue 39): a warning, once, where no agent holds the phase socket; the job's
own `Reporter(train_job=...)` keeps its name over `--job`, with a warning where they differ; `TEYE_DEBUG=1`
always says whether the hook loaded and what it instrumented, for a script with no framework too.  Real
processes under `teye run`; the oracle is the same command without teye (its output and exit status) and
the jobs a live phase receiver saw."""
from __future__ import annotations

import os
import socket
import sys
import textwrap

import pytest

from tests.client.helpers import HERE, SITE, REPO, LiveAgent, base_env, plain_run, teye_run

PY = sys.executable
WARN = "teye: warning: no agent holds the phase socket "

# a parent that starts two instrumented Python children (each would warn, were the warning theirs), prints,
# writes to stderr, and exits with its own status
TREE = textwrap.dedent("""
    import subprocess, sys
    for i in range(2):
        subprocess.run([sys.executable, "-c", "import sys; print('child', %d); sys.stderr.write('e%d\\\\n')" % (i, i)],
                       check=True)
    print("parent", flush=True)
    sys.stderr.write("parent err\\n")
    sys.exit(5)
""")


def _others(err: str) -> list:
    return [x for x in err.splitlines() if not x.startswith(WARN)]


def test_no_agent_on_the_socket_is_said_once_and_the_status_is_the_commands(sockdir):
    bare = plain_run([PY, "-c", TREE])
    assert bare.returncode == 5 and bare.stdout == "child 0\nchild 1\nparent\n"
    regular = os.path.join(sockdir, "file")
    open(regular, "w").close()
    stale = os.path.join(sockdir, "stale.sock")   # an agent's socket file left behind: nobody bound to it
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(stale)
    s.close()
    stream = os.path.join(sockdir, "stream.sock")
    t = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    t.bind(stream)
    t.listen(1)
    try:
        cases = {os.path.join(sockdir, "missing.sock"): "it does not exist",
                 os.path.join(regular, "x.sock"): "it does not exist",
                 regular: "it is not a socket",
                 stale: "no process is bound to it: a file an agent left behind",
                 stream: "it is a stream socket, not the agent's datagram socket"}
        for path, why in cases.items():
            r = teye_run([PY, "-c", TREE], socket_path=path)
            warned = [x for x in r.stderr.splitlines() if x.startswith(WARN)]
            assert (r.returncode, r.stdout) == (5, bare.stdout), (path, r.stderr)
            assert warned == [f"{WARN}{path} ({why}): the command runs, its phases are not recorded"], r.stderr
            assert r.stderr.startswith(WARN) and _others(r.stderr) == bare.stderr.splitlines()
        # unset: the default locations (none holds an agent here) are named
        r = teye_run([PY, "-c", TREE], env=base_env(TMPDIR=sockdir, XDG_RUNTIME_DIR=sockdir))
        warned = [x for x in r.stderr.splitlines() if x.startswith(WARN)]
        assert r.returncode == 5 and len(warned) == 1 and "phases.sock" in warned[0], r.stderr
        # the off switch: teye does nothing, so it says nothing
        r = teye_run([PY, "-c", TREE], socket_path=stale, env=base_env(TEYE_AUTO="0"))
        assert (r.returncode, r.stdout, r.stderr) == (5, bare.stdout, bare.stderr)
    finally:
        t.close()


def test_an_agent_on_the_socket_is_no_warning(sockdir):
    agent = LiveAgent(sockdir)
    try:
        r = teye_run([PY, "-c", TREE], socket_path=agent.path)
        assert (r.returncode, r.stderr) == (5, "e0\ne1\nparent err\n")
        # the default path, where the agent is (TEYE_PHASE_SOCKET as a TaskProlog or a pod sets it)
        r = teye_run([PY, "-c", TREE], env=base_env(TEYE_PHASE_SOCKET=agent.path))
        assert (r.returncode, r.stderr) == (5, "e0\ne1\nparent err\n")
    finally:
        agent.close()


OWN = textwrap.dedent("""
    import sys, time
    from teye_client import Reporter
    rep = Reporter(train_job=sys.argv[1] or None, flush_ms=10)
    for i in range(3):
        with rep.phase("data_wait"):
            time.sleep(0.005)
        with rep.phase("compute"):
            time.sleep(0.005)
        rep.step(samples=4)
    rep.close()
    print("done", rep.train_job)
""")


@pytest.mark.parametrize("given, job, name, warned", [
    ("mine", "other", "mine", True),     # the script's own name wins, and teye says so
    ("mine", "mine", "mine", False),
    ("mine", None, "mine", False),
    ("", "other", "other", False),       # a Reporter without a name takes --job
])
def test_a_scripts_own_job_name_wins_over_job_and_a_difference_is_said(sockdir, given, job, name, warned):
    agent = LiveAgent(sockdir)
    try:
        r = teye_run([PY, "-c", OWN, given], socket_path=agent.path, job=job)
        assert (r.returncode, r.stdout) == (0, f"done {name}\n"), r.stderr
        jobs = agent.jobs()
        assert {n: j.steps for n, j in jobs.items()} == {name: 3}
        lines = r.stderr.splitlines()
        if warned:
            assert len(lines) == 1 and lines[0].startswith("teye: warning: pid "), r.stderr
            assert lines[0].endswith(f"reports as job 'mine', its own Reporter's name, not 'other' "
                                     f"(teye run --job / TEYE_TRAIN_JOB)")
        else:
            assert lines == []
    finally:
        agent.close()


def test_debug_says_the_hook_loaded_and_what_it_instrumented_without_a_framework(sockdir):
    agent = LiveAgent(sockdir)
    try:
        code = "import os; print(os.getpid())"
        r = teye_run([PY, "-c", code], socket_path=agent.path, env=base_env(TEYE_DEBUG="1"))
        pid = r.stdout.strip()
        assert r.returncode == 0 and r.stderr.splitlines() == [
            f"teye: zero-code phases: hook loaded in pid {pid} (Python {sys.version_info[0]}.{sys.version_info[1]}): "
            "it instruments PyTorch, TensorFlow, Keras, Horovod and multiprocessing when the program imports them",
            f"teye: zero-code phases in pid {pid}: instrumented nothing (the process imported none of PyTorch, "
            "TensorFlow, Keras, Horovod, multiprocessing.pool); no training step seen: nothing sent"]
        # without TEYE_DEBUG: nothing
        r = teye_run([PY, "-c", code], socket_path=agent.path)
        assert (r.returncode, r.stderr) == (0, "")
        # off: it says that it is off and why
        r = plain_run([PY, "-c", code], env=base_env(PYTHONPATH=os.pathsep.join([SITE, REPO]), TEYE_DEBUG="1",
                                                      TEYE_AUTO="off"))
        pid = r.stdout.strip()
        assert r.stderr == f"teye: zero-code phases off in pid {pid}: TEYE_AUTO=off\n"
        # a multiprocessing Pool (the flush per task is all it instruments there) under a job that does not train
        pool = ("import multiprocessing as mp\nif __name__ == '__main__':\n"
                "    with mp.get_context('spawn').Pool(1) as p: print(p.map(abs, [-1, -2]))\n")
        r = teye_run([PY, "-c", pool], socket_path=agent.path, env=base_env(TEYE_DEBUG="1"))
        ends = [x for x in r.stderr.splitlines() if " instrumented " in x and x.startswith("teye: zero-code phases in")]
        assert r.stdout == "[1, 2]\n" and ends, r.stderr
        assert ends[0].endswith("instrumented multiprocessing Pool flush per task; no training step seen: nothing sent")
        assert agent.jobs() == {}
    finally:
        agent.close()


@pytest.mark.skipif(not __import__("importlib").util.find_spec("torch"), reason="the torch extra")
def test_debug_names_what_a_torch_job_instrumented_and_where_it_reported(sockdir):
    agent = LiveAgent(sockdir)
    try:
        r = teye_run([PY, os.path.join(HERE, "torch_small.py"), "4"], socket_path=agent.path, job="small",
                     env=base_env(TEYE_DEBUG="1"))
        assert r.returncode == 0, r.stderr
        end = [x for x in r.stderr.splitlines() if x.startswith("teye: zero-code phases in pid")]
        assert len(end) == 1, r.stderr
        done = end[0].split(": instrumented ", 1)[1].split("; ")[0].split(", ")
        assert {"PyTorch DataLoader input waits", "PyTorch optimizer steps"} <= set(done), end
        assert end[0].endswith(f"reported job 'small' to {agent.path}")
        assert agent.jobs()["small"].steps == 4
    finally:
        agent.close()
