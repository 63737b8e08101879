"""The phase socket's directory is the agent's (issue 36), tested as two real uids with ``setpriv``:
the agent runs as ``daemon`` (uid 1) without XDG_RUNTIME_DIR, so its socket goes to
``<TMPDIR>/teye-1/phases.sock``; the attacker is ``nobody`` (65534).  Oracles: the kernel (lstat of the
directory and socket, which uid can unlink or bind), the datagrams a real ``teye_client.Reporter`` sent
(as nobody) counted in the agent's /metrics, and the agent's exit status and log."""
from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

import pytest

from tests.conftest import PROCFS, parse_exposition
from tests.other_uid import SharedCopies
from tests.procs import REPO, free_port, http_get, wait_http

pytestmark = pytest.mark.e2e

VICTIM, ATTACKER = 1, 65534          # daemon, nobody
OTHERS = ("memory", "disk", "network", "infiniband", "nfs", "nfsd", "pressure", "gpu")
PY = sys.executable      # replaced by _shared: an interpreter both uids may run
ROOT = REPO              # ... and a copy of the packages they may read
PROCFS_COPY = PROCFS

if os.geteuid() != 0 or not shutil.which("setpriv"):
    pytest.skip("needs root and setpriv to run two real uids", allow_module_level=True)


@pytest.fixture(scope="module", autouse=True)
def _shared():
    """The tree may sit where neither daemon nor nobody can enter (root's 0700 home): they run copies."""
    global PY, ROOT, PROCFS_COPY
    s = SharedCopies()
    try:
        for pkg in ("agent", "exporters", "teye", "teye_client"):
            if os.path.isdir(os.path.join(REPO, pkg)):
                s.copy(os.path.join(REPO, pkg))
        PROCFS_COPY = s.copy(PROCFS, "procfs")
        PY, ROOT = s.python(), s.root
        yield
    finally:
        PY, ROOT, PROCFS_COPY = sys.executable, REPO, PROCFS
        s.close()


def as_uid(uid):
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]


def sh_as(uid, script, **kw):
    return subprocess.run(as_uid(uid) + ["sh", "-c", script], capture_output=True, text=True, timeout=30, **kw)


@pytest.fixture
def tmpdir_1777():
    """A /tmp-like directory (1777) both uids reach: the agent's TMPDIR."""
    d = tempfile.mkdtemp(prefix="teye-sockdir-", dir="/tmp")
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def agent_env(tmpdir):
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    env.update(TMPDIR=tmpdir, HOME=tmpdir, PYTHONPATH=ROOT)
    return env


def conf_file(tmpdir, interval=0.2):
    path = os.path.join(tmpdir, "teye.yaml")
    with open(path, "w") as fh:
        fh.write("collectors:\n" + "".join(f"  {c}: {{enabled: false}}\n" for c in OTHERS)
                 + f"  phases: {{interval_seconds: {interval}}}\n")
    os.chmod(path, 0o644)
    return path


def start_agent(tmpdir, *extra):
    port = free_port()
    log = open(os.path.join(tmpdir, "agent.log"), "w+")
    p = subprocess.Popen(as_uid(VICTIM) + [PY, "-m", "agent", "agent", "--listen", f"127.0.0.1:{port}",
                                           "--config", conf_file(tmpdir), "--procfs", PROCFS_COPY, *extra],
                         cwd=ROOT, env=agent_env(tmpdir), stdout=log, stderr=subprocess.STDOUT)
    p.url, p.logfile = f"http://127.0.0.1:{port}", log
    return p


def stop(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    p.logfile.close()
    return p.returncode


def log_text(p):
    p.logfile.seek(0)
    return p.logfile.read()


def phases_up(p):
    m = parse_exposition(http_get(p.url + "/metrics"))
    return m.get(("teye_collector_up", (("collector", "phases"),)))


def wait_up(p, want, timeout=20.0):
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        v = phases_up(p)
        seen.append(v)
        if v == want:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"teye_collector_up{{collector=\"phases\"}} never {want}: {seen[-5:]}\n{log_text(p)}")


SENDER = """
import sys, time
from teye_client import Reporter
r = Reporter(train_job=sys.argv[1], socket_path=sys.argv[2], flush_ms=10)
for _ in range(int(sys.argv[3])):
    with r.phase("compute"):
        time.sleep(0.002)
    r.step()
r.close()
"""


def send_steps(uid, job, path, n):
    p = subprocess.run(as_uid(uid) + [PY, "-c", SENDER, job, path, str(n)], cwd=ROOT, env={"PYTHONPATH": ROOT},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def steps(p, job):
    m = parse_exposition(http_get(p.url + "/metrics"))
    return m.get(("teye_job_steps_total", (("train_job", job),)), 0)


def wait_steps(p, job, n, timeout=15.0):
    deadline = time.monotonic() + timeout
    while steps(p, job) < n and time.monotonic() < deadline:
        time.sleep(0.1)
    return steps(p, job)


def refused(tmpdir):
    p = start_agent(tmpdir)
    try:
        rc = p.wait(60)
    finally:
        out = log_text(p)
        stop(p)
    return rc, out


# ---------------------------------------------------------------- a directory another user made first

def test_a_directory_another_user_made_first_is_refused(tmpdir_1777):
    d = os.path.join(tmpdir_1777, f"teye-{VICTIM}")
    r = sh_as(ATTACKER, f"mkdir {d} && chmod 0777 {d}")
    assert r.returncode == 0, r.stderr
    rc, out = refused(tmpdir_1777)
    assert rc == 2
    errs = [ln for ln in out.splitlines() if "phase socket directory" in ln]
    assert errs == [ln for ln in errs if f"{d} is writable by others (owner uid {ATTACKER}, mode 0777)" in ln]
    assert len(errs) == 1, out
    assert os.listdir(d) == []                      # nothing bound in the attacker's directory


def test_a_directory_another_user_owns_not_writable_is_refused(tmpdir_1777):
    d = os.path.join(tmpdir_1777, f"teye-{VICTIM}")
    assert sh_as(ATTACKER, f"mkdir -m 0755 {d}").returncode == 0
    rc, out = refused(tmpdir_1777)
    assert rc == 2 and f"{d} is owned by uid {ATTACKER}, not this agent's uid {VICTIM}" in out, out


def test_a_symlink_is_refused_even_to_the_agents_own_directory(tmpdir_1777):
    own = os.path.join(tmpdir_1777, "victims-own")
    os.mkdir(own, 0o755)
    os.chown(own, VICTIM, VICTIM)
    d = os.path.join(tmpdir_1777, f"teye-{VICTIM}")
    assert sh_as(ATTACKER, f"ln -s {own} {d}").returncode == 0
    rc, out = refused(tmpdir_1777)
    assert rc == 2 and f"phase socket directory {d} is a symbolic link" in out, out
    assert os.listdir(own) == []


def test_the_agents_own_directory_open_to_others_is_refused(tmpdir_1777):
    d = os.path.join(tmpdir_1777, f"teye-{VICTIM}")
    os.mkdir(d)
    os.chmod(d, 0o775)                              # group-writable: as bad as world-writable
    os.chown(d, VICTIM, VICTIM)
    rc, out = refused(tmpdir_1777)
    assert rc == 2 and f"{d} is writable by others (owner uid {VICTIM}, mode 0775)" in out, out


# ---------------------------------------------------------------- the agent's own directory, then lost

def test_own_directory_holds_a_0666_socket_the_attacker_cannot_take_and_a_lost_socket_is_rebound(tmpdir_1777):
    d = os.path.join(tmpdir_1777, f"teye-{VICTIM}")
    path = os.path.join(d, "phases.sock")
    p = start_agent(tmpdir_1777)
    try:
        wait_http(p.url + "/healthz", proc=p)
        wait_up(p, 1)
        st_d, st_s = os.lstat(d), os.lstat(path)
        assert (st_d.st_uid, stat.S_IMODE(st_d.st_mode), stat.S_ISDIR(st_d.st_mode)) == (VICTIM, 0o755, True)
        assert (st_s.st_uid, stat.S_IMODE(st_s.st_mode), stat.S_ISSOCK(st_s.st_mode)) == (VICTIM, 0o666, True)
        # the attacker can send (credentials name it) but can neither unlink nor bind there
        r = sh_as(ATTACKER, f"rm -f {path}")
        assert r.returncode != 0 and "Permission denied" in r.stderr
        send_steps(ATTACKER, "victim-job", path, 5)
        assert wait_steps(p, "nobody/victim-job", 5) == 5
        # the file removed (a /tmp cleaner): one pass says 0, the agent binds again, the job's datagrams arrive
        os.unlink(path)
        wait_up(p, 0)
        wait_up(p, 1)
        st2 = os.lstat(path)
        assert (st2.st_uid, stat.S_IMODE(st2.st_mode)) == (VICTIM, 0o666) and st2.st_ino != st_s.st_ino
        send_steps(ATTACKER, "victim-job", path, 7)
        assert wait_steps(p, "nobody/victim-job", 12) == 12
        assert f"phase socket {path} is gone (removed while the agent ran); bound it again" in log_text(p)
        # the directory itself removed and remade by the attacker: down, the agent serving, nothing bound there
        shutil.rmtree(d)
        assert sh_as(ATTACKER, f"mkdir {d} && chmod 0777 {d}").returncode == 0
        seen = wait_up(p, 0)
        time.sleep(1.0)
        assert phases_up(p) == 0 and os.listdir(d) == [] and p.poll() is None
        assert f"cannot bind it again: phase socket directory {d} is writable by others" in log_text(p)
    finally:
        assert stop(p) == 0, log_text(p)
    assert seen


def test_a_replaced_socket_says_0_until_the_agent_can_bind_again(tmpdir_1777):
    shared = os.path.join(tmpdir_1777, "shared")      # a configured path in a directory others may write
    os.mkdir(shared)
    os.chmod(shared, 0o777)
    path = os.path.join(shared, "phases.sock")
    p = start_agent(tmpdir_1777, "--phase-socket", path)
    thief = None
    try:
        wait_http(p.url + "/healthz", proc=p)
        wait_up(p, 1)
        send_steps(ATTACKER, "j", path, 3)
        assert wait_steps(p, "nobody/j", 3) == 3
        # the attacker unlinks the agent's socket and binds its own: the agent says so and cannot bind again
        thief = subprocess.Popen(as_uid(ATTACKER) + [PY, "-c", (
            "import os, socket, sys, time\n"
            f"os.unlink({path!r}); s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.bind({path!r}); os.chmod({path!r}, 0o666)\n"
            "print('bound', flush=True); sys.stdin.read()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True)
        assert thief.stdout.readline() == "bound\n"
        wait_up(p, 0)
        time.sleep(1.0)
        assert phases_up(p) == 0
        out = log_text(p)
        assert f"phase socket {path} was replaced (now uid {ATTACKER}'s" in out
        assert "cannot bind it again: another process (a running teye agent?) receives on" in out
        # the attacker leaves (its socket file stays, stale: a connect is refused): the agent binds again
        # (a socket the agent may not even connect to is taken as live: it would stay down, saying so)
        thief.stdin.close()
        thief.wait(10)
        wait_up(p, 1)
        assert os.lstat(path).st_uid == VICTIM
        send_steps(ATTACKER, "j", path, 4)
        assert wait_steps(p, "nobody/j", 7) == 7
    finally:
        if thief is not None and thief.poll() is None:
            thief.kill()
        assert stop(p) == 0, log_text(p)


# ---------------------------------------------------------------- the mode is set on the file bound, not a path

def test_set_mode_never_follows_a_swapped_path(tmp_path):
    from agent.errors import ConfigError
    from agent.phases.receiver import _set_mode
    target = tmp_path / "secret"
    target.write_text("x")
    os.chmod(target, 0o600)
    link = tmp_path / "phases.sock"
    os.symlink(target, link)                      # what an attacker swaps in between bind() and chmod
    with pytest.raises(ConfigError, match=r"phases\.sock was replaced while it was being bound"):
        _set_mode(str(link), 0o666)
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
    import socket
    other = tmp_path / "other.sock"               # a socket, but another uid's
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(other))
    os.chmod(other, 0o600)
    os.chown(other, ATTACKER, ATTACKER)
    try:
        with pytest.raises(ConfigError, match=f"now uid {ATTACKER}'s"):
            _set_mode(str(other), 0o666)
        assert stat.S_IMODE(os.lstat(other).st_mode) == 0o600
    finally:
        s.close()
