"""The client trusts only its own directory (issue 48), as two real uids with ``setpriv``: ``nobody`` (65534)
plants ``<TMPDIR>/teye-2/`` (0755, its own) with a datagram socket it receives on; a job of ``bin`` (uid 2)
on the default path must send it nothing, count the drop and, with TEYE_DEBUG=1 and under `teye run`, say
why.  Oracles: the datagrams the planted receiver itself got (counted in its own process, as nobody), the
kernel's owners and modes of what the test made, and the job's own count of the records it made."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

from tests.other_uid import SharedCopies
from tests.procs import REPO

JOB, ATTACKER = 2, 65534          # bin, nobody
STEPS = 25

if os.geteuid() != 0 or not shutil.which("setpriv"):
    pytest.skip("needs root and setpriv to run two real uids", allow_module_level=True)
if os.path.exists("/run/teye/phases.sock"):
    pytest.skip("a real agent holds /run/teye/phases.sock, the first default location", allow_module_level=True)

PY = sys.executable
ROOT = REPO

RECEIVER = textwrap.dedent("""
    import os, socket, sys, time
    path, ready, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    os.chmod(path, 0o666)
    open(ready, "w").close()
    s.settimeout(0.1)
    got, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            got.append(s.recv(65536))
        except socket.timeout:
            pass
    print(len(got), sum(len(g) for g in got))
""")

# The job: STEPS steps of 20 ms (each goes as its intervals), its reporter's own counts on stdout.
JOBSCRIPT = textwrap.dedent("""
    import json, time
    from teye_client.reporter import Reporter
    rep = Reporter(train_job="victim", flush_ms=0)
    t = time.monotonic_ns()
    for i in range(%d):
        rep.record_step(['"compute"', t, t + 20_000_000], t, t + 20_000_000, 8)
        t += 20_000_000
    rep.close()
    print(json.dumps({"sent": rep.sent, "dropped": rep.dropped, "dropped_messages": rep.dropped_messages,
                      "last_error": rep.last_error, "refused": rep.refused, "path": rep.socket_path}))
""" % STEPS)


@pytest.fixture(scope="module", autouse=True)
def _shared():
    global PY, ROOT
    s = SharedCopies()
    try:
        for pkg in ("agent", "exporters", "teye_client"):
            s.copy(os.path.join(REPO, pkg))
        PY, ROOT = s.python(), s.root
        yield
    finally:
        PY, ROOT = sys.executable, REPO
        s.close()


@pytest.fixture
def tmp1777():
    d = tempfile.mkdtemp(prefix="teye-sec-trust-", dir="/tmp")
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def as_uid(uid):
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]


def env_for(tmpdir, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEYE_", "XDG_"))}
    env.update(TMPDIR=tmpdir, HOME=tmpdir, PYTHONPATH=ROOT, **extra)
    return env


class Receiver:
    """A datagram socket bound at ``path`` by ``uid``, counting what it gets for ``seconds``."""

    def __init__(self, uid, path, tmpdir, seconds=4.0):
        ready = os.path.join(tmpdir, "ready-%d" % os.getpid())
        self.proc = subprocess.Popen(as_uid(uid) + [PY, "-c", RECEIVER, path, ready, str(seconds)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env_for(tmpdir))
        for _ in range(200):
            if os.path.exists(ready):
                os.unlink(ready)
                return
            if self.proc.poll() is not None:
                raise RuntimeError(self.proc.stderr.read())
            import time
            time.sleep(0.05)
        raise TimeoutError("receiver not ready")

    def count(self):
        out, err = self.proc.communicate(timeout=30)
        assert self.proc.returncode == 0, err
        n, nbytes = map(int, out.split())
        return n, nbytes


def run_job(tmpdir, uid=JOB, **env):
    r = subprocess.run(as_uid(uid) + [PY, "-c", JOBSCRIPT], capture_output=True, text=True, timeout=60,
                       env=env_for(tmpdir, **env))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), r.stderr


def plant(tmpdir, owner, mode=0o755, name=None):
    d = os.path.join(tmpdir, name or f"teye-{JOB}")
    os.mkdir(d)
    os.chown(d, owner, owner)
    os.chmod(d, mode)
    return d


def test_a_directory_planted_by_another_uid_gets_nothing_and_the_drop_is_counted_and_said(tmp1777):
    d = plant(tmp1777, ATTACKER)
    sock = os.path.join(d, "phases.sock")
    rx = Receiver(ATTACKER, sock, tmp1777)
    got, err = run_job(tmp1777, TEYE_DEBUG="1")
    assert rx.count() == (0, 0)                                     # nobody received nothing
    assert got["sent"] == 0 and got["dropped"] == STEPS * 2 and got["dropped_messages"] >= 1
    assert got["last_error"] == "untrusted_dir"
    why = f"the directory {d} is not trusted: it is owned by uid {ATTACKER}, not this job's uid {JOB}, root or the agent's"
    assert got["refused"] == why and got["path"] == sock
    said = [x for x in err.splitlines() if x.startswith("teye: not sending phases")]
    assert said == [f"teye: not sending phases to {sock}: {why} (TEYE_PHASE_SOCKET={sock} sends there anyway)"]
    quiet, err = run_job(tmp1777)                                   # without TEYE_DEBUG the job's stderr is its own
    assert err == "" and quiet["sent"] == 0


def test_teye_run_says_why_before_the_command(tmp1777):
    d = plant(tmp1777, ATTACKER)
    sock = os.path.join(d, "phases.sock")
    rx = Receiver(ATTACKER, sock, tmp1777, seconds=8.0)
    r = subprocess.run(as_uid(JOB) + [PY, "-m", "agent", "run", "--", PY, "-c", JOBSCRIPT], capture_output=True,
                       text=True, timeout=60, env=env_for(tmp1777), cwd=tmp1777)
    assert r.returncode == 0, r.stderr
    assert rx.count() == (0, 0)
    lines = [x for x in r.stderr.splitlines() if x.startswith("teye: warning:")]
    assert lines == [f"teye: warning: the phase socket {sock} is not used: the directory {d} is not trusted: it is "
                     f"owned by uid {ATTACKER}, not this job's uid {JOB}, root or the agent's; the command runs, its "
                     f"phases are not sent (TEYE_PHASE_SOCKET={sock} sends there anyway)"]
    assert json.loads(r.stdout.splitlines()[-1])["last_error"] == "untrusted_dir"


@pytest.mark.parametrize("case", ["own", "root", "explicit"])
def test_the_jobs_own_or_roots_directory_and_an_explicit_socket_get_every_record(tmp1777, case):
    """The positive controls: the same job, the same receiver code, a directory it may trust (or the socket
    named explicitly) -> every datagram arrives."""
    owner = {"own": JOB, "root": 0, "explicit": ATTACKER}[case]
    d = plant(tmp1777, owner)
    sock = os.path.join(d, "phases.sock")
    rx = Receiver(owner, sock, tmp1777)
    got, _ = run_job(tmp1777, **({"TEYE_PHASE_SOCKET": sock} if case == "explicit" else {}))
    n, _ = rx.count()
    assert got["dropped"] == 0 and got["refused"] is None and got["sent"] == n >= 1


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o777])
def test_a_directory_others_may_write_is_refused_even_when_it_is_the_jobs(tmp1777, mode):
    d = plant(tmp1777, JOB, mode=mode)
    sock = os.path.join(d, "phases.sock")
    rx = Receiver(JOB, sock, tmp1777)
    got, _ = run_job(tmp1777)
    assert rx.count() == (0, 0)
    assert got["refused"] == f"the directory {d} is not trusted: group or others may write to it (mode {mode:04o})"


@pytest.mark.parametrize("link_owner, delivered", [(0, True), (JOB, True), (ATTACKER, False)])
def test_a_symlinked_directory_is_followed_only_when_root_or_the_job_made_the_link(tmp1777, link_owner, delivered):
    """`<TMPDIR>/teye-2` a symbolic link to a root-owned 0755 directory holding the socket: followed when the
    link is root's or the job's own (no one else can place or replace it in a sticky directory), refused when
    another uid made it (it could point it anywhere, any time)."""
    target = plant(tmp1777, 0, name="real")
    link = os.path.join(tmp1777, f"teye-{JOB}")
    os.symlink(target, link)
    os.lchown(link, link_owner, link_owner)
    rx = Receiver(0, os.path.join(target, "phases.sock"), tmp1777)
    got, _ = run_job(tmp1777)
    n, _ = rx.count()
    if delivered:
        assert got["refused"] is None and got["dropped"] == 0 and got["sent"] == n >= 1
    else:
        assert n == 0 and got["refused"] == (f"the directory {link} is not trusted: it is a symbolic link made by "
                                             f"uid {ATTACKER}")
