"""Zero-code phases without a framework in the way: the interpreter-start hook, `teye run`, job names,
and the bad inputs of issue 22.  In every case the job's own output and exit status are compared with
the same command run without teye (the oracle), not with what teye says about itself."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from teye_client import auto
from teye_client.reporter import BACKSTOP_NS
from tests.client.helpers import HERE, REPO, SITE, LiveAgent, base_env, plain_run, teye_run
from tests.other_uid import SharedCopies
from tests.procs import free_port

PY = sys.executable
SMALL = os.path.join(HERE, "torch_small.py")
needs_torch = pytest.mark.skipif(not __import__("importlib").util.find_spec("torch"),
                                 reason="the torch extra (./dev.sh test installs it)")


def site_env(**extra):
    return base_env(PYTHONPATH=os.pathsep.join([SITE, REPO]), **extra)


# -- job names --------------------------------------------------------------------------------
@pytest.mark.parametrize("env,argv,name", [
    ({"TEYE_TRAIN_JOB": "mine", "SLURM_JOB_ID": "7"}, ["train.py"], "mine"),
    ({"SLURM_JOB_ID": "812", "SLURM_STEP_ID": "0", "KUBERNETES_SERVICE_HOST": "x", "HOSTNAME": "p"}, ["t.py"],
     "slurm-812.0"),
    ({"SLURM_JOB_ID": "900", "SLURM_ARRAY_JOB_ID": "899", "SLURM_ARRAY_TASK_ID": "3"}, ["t.py"], "slurm-899_3"),
    ({"SLURM_JOB_ID": "900"}, ["t.py"], "slurm-900"),
    ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "trainer-0"}, ["/app/t.py"], "trainer-0"),
    # the downward API's names come before HOSTNAME (a pod's hostname may be set to anything: spec.hostname)
    ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "h", "TEYE_POD_NAME": "tp", "POD_NAME": "p"}, ["t.py"],
     "tp"),
    ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "h", "POD_NAME": "p"}, ["t.py"], "p"),
    ({"HOSTNAME": "laptop"}, ["/home/a/resnet_train.py", "--lr", "1"], "resnet_train"),
    ({}, ["/usr/lib/python3/site-packages/mypkg/__main__.py"], "mypkg"),
    ({}, ["-c"], "python"),
])
def test_job_name_order(env, argv, name):
    assert auto.job_name(env, argv) == name


# -- teye run ---------------------------------------------------------------------------------
def test_run_exit_status_output_and_environment_pass_through():
    r = teye_run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    # no agent here: one warning line (tests/client/test_run_says.py), then the command's own output
    assert (r.returncode, r.stdout, r.stderr.split("\n", 1)[1]) == (3, "out\n", "err\n")
    assert r.stderr.startswith("teye: warning: no agent holds the phase socket ")
    r = teye_run([PY, "-c", "import os, sys; print(os.environ['TEYE_TRAIN_JOB'], os.environ['PYTHONPATH']); "
                            "print('teye_client.auto' in sys.modules)"], job="my-job")
    job, pp = r.stdout.splitlines()[0].split(" ")
    assert job == "my-job" and pp.split(os.pathsep) == [SITE, REPO]  # first, once, the caller's path kept
    assert r.stdout.splitlines()[1] == "True" and r.returncode == 0
    # a signal: a shell sees 128+N, as without teye (teye execs the command: same pid, same signals)
    sh = f"{PY} -m agent run -- sh -c 'kill -TERM $$'; echo status=$?"
    assert subprocess.run(["sh", "-c", sh], env=base_env(), capture_output=True, text=True, cwd=REPO).stdout \
        == "status=143\n"


HANDLER = """
import os, signal, sys, time
got = []
signal.signal(signal.SIGUSR1, lambda n, f: got.append(n))
print(os.getpid(), 'teye_client.auto' in sys.modules, flush=True)
deadline = time.monotonic() + 20
while not got and time.monotonic() < deadline:
    time.sleep(0.01)
print('handled' if got else 'no signal', flush=True)
sys.exit(7 if got else 1)
"""


def test_teye_run_is_the_job_same_pid_and_its_signals():
    """A scheduler signals the pid it started (SIGUSR1 before a time limit, SIGTERM to a step): under
    `teye run` that pid must be the job itself, or the signal kills the wrapper and never reaches the job."""
    proc = subprocess.Popen([PY, "-m", "agent", "run", "--", PY, "-c", HANDLER], env=base_env(), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pid, hooked = proc.stdout.readline().split()
        assert (int(pid), hooked) == (proc.pid, "True")   # the pid `teye run` was started as, instrumented
        os.kill(proc.pid, signal.SIGUSR1)
        out, err = proc.communicate(timeout=30)
        err = "".join(x for x in err.splitlines(True) if not x.startswith("teye: warning: no agent holds"))
        assert (proc.returncode, out, err) == (7, "handled\n", "")   # the job's handler ran; its exit status
    finally:
        proc.kill()
        proc.wait()
    # a shell's $$ is the pid it was started as too
    sh = subprocess.Popen([PY, "-m", "agent", "run", "--", "sh", "-c", "echo $$"], env=base_env(), cwd=REPO,
                          stdout=subprocess.PIPE, text=True)
    out, _ = sh.communicate(timeout=30)
    assert (sh.returncode, out) == (0, f"{sh.pid}\n")


def test_run_without_a_command_or_with_a_missing_one():
    r = subprocess.run([PY, "-m", "agent", "run"], env=base_env(), capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and "no command given" in r.stderr and r.stdout == ""
    r = teye_run(["no-such-command-teye-xyz", "a"])
    assert r.returncode == 127 and r.stderr == "teye run: command not found: no-such-command-teye-xyz\n"
    r = teye_run(["/etc/passwd"])  # exists, not executable: a shell's 126
    assert r.returncode == 126 and "cannot run /etc/passwd" in r.stderr


def test_print_env_lines_turn_it_on():
    env = base_env(PYTHONPATH="/opt/other")
    r = subprocess.run([PY, "-m", "agent", "run", "--print-env", "--job", "j1"], env={**env, "PYTHONPATH":
                       os.pathsep.join([REPO, "/opt/other"])}, capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0
    assert r.stdout.splitlines() == [f"export PYTHONPATH={SITE}:{REPO}:/opt/other", "export TEYE_TRAIN_JOB=j1"]
    applied = dict(line[len("export "):].split("=", 1) for line in r.stdout.splitlines())  # what slurmstepd does
    # already on (a TaskProlog's export, then `teye run` in the job): still first, and once
    again = subprocess.run([PY, "-m", "agent", "run", "--print-env"], env={**env, "PYTHONPATH": os.pathsep.join(
                           [REPO, SITE + "/", "/opt/other"])}, capture_output=True, text=True, cwd=REPO)
    assert again.stdout.splitlines() == [f"export PYTHONPATH={SITE}:{REPO}:/opt/other"]
    out = plain_run([PY, "-c", "import sys; print('teye_client.auto' in sys.modules)"], env={**env, **applied})
    assert out.stdout == "True\n"


# -- the hook at interpreter start ------------------------------------------------------------
PROBE = """
import sys, threading, os
links = []
for f in os.listdir('/proc/self/fd'):
    try:
        links.append(os.readlink('/proc/self/fd/' + f))
    except OSError:  # the directory's own fd, closed by now
        pass
print(sorted(m for m in sys.modules if m.startswith('teye')), 'torch' in sys.modules, threading.active_count(),
      sum(x.startswith('socket:') for x in links))
"""


def test_a_process_that_does_not_train_pays_nothing():
    r = plain_run([PY, "-c", PROBE], env=site_env())
    assert r.stdout == "['teye_client', 'teye_client._common', 'teye_client.auto'] False 1 0\n" and r.stderr == ""
    r = plain_run([PY, "-c", PROBE], env=site_env(TEYE_AUTO="0"))  # the off switch
    assert r.stdout == "[] False 1 0\n" and r.stderr == ""


@needs_torch
def test_reading_batches_without_training_sends_nothing_and_starts_no_thread(listener):
    path, s = listener
    code = ("import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
            "for x, in DataLoader(TensorDataset(torch.ones(64, 2)), batch_size=8): pass\n"
            "it = DataLoader(TensorDataset(torch.ones(8, 2)))._get_iterator()\n"
            "print(type(it).__next__._teye, end=' ')\n" + PROBE)  # patched: the test is not vacuous
    r = plain_run([PY, "-c", code], env=site_env(TEYE_PHASE_SOCKET=path))
    # (teye_client._config: the job's configuration beside PyTorch's instrumentor, issue 45; no socket, no thread)
    assert r.stdout.startswith("True ['teye_client', 'teye_client._common', 'teye_client._config', "
                               "'teye_client._torch', 'teye_client.auto'] True 1 0"), r
    s.settimeout(0.3)
    with pytest.raises(socket.timeout):
        s.recv(65536)


def test_a_users_sitecustomize_still_runs_and_its_errors_read_as_without_teye(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    code = "import sys; print('main', 'teye_client.auto' in sys.modules, sys.modules['sitecustomize'].MARK)"
    (user / "sitecustomize.py").write_text("import sys\nprint('user sitecustomize ran')\nMARK = 42\n")
    without = plain_run([PY, "-c", code], env=base_env(PYTHONPATH=str(user)))
    with_ = plain_run([PY, "-c", code], env=base_env(PYTHONPATH=os.pathsep.join([SITE, str(user)])))
    assert without.stdout == "user sitecustomize ran\nmain False 42\n"
    assert with_.stdout == "user sitecustomize ran\nmain True 42\n" and with_.stderr == without.stderr == ""
    (user / "sitecustomize.py").write_text("print('before')\nraise RuntimeError('boom')\n")
    code = "import sys; print('main', 'teye_client.auto' in sys.modules)"
    without = plain_run([PY, "-c", code], env=base_env(PYTHONPATH=str(user)))
    with_ = plain_run([PY, "-c", code], env=base_env(PYTHONPATH=os.pathsep.join([SITE, str(user)])))
    assert without.stderr == "Error in sitecustomize; set PYTHONVERBOSE for traceback:\nRuntimeError: boom\n"
    assert (with_.returncode, with_.stderr) == (without.returncode, without.stderr)
    assert (without.stdout, with_.stdout) == ("before\nmain False\n", "before\nmain True\n")
    (user / "sitecustomize.py").write_text("import no_such_module_teye\n")  # an ImportError of its own
    without = plain_run([PY, "-c", code], env=base_env(PYTHONPATH=str(user)))
    with_ = plain_run([PY, "-c", code], env=base_env(PYTHONPATH=os.pathsep.join([SITE, str(user)])))
    assert "No module named 'no_such_module_teye'" in without.stderr and with_.stderr == without.stderr


def test_the_off_switch_still_runs_the_users_sitecustomize(tmp_path):
    """TEYE_AUTO=0 turns teye's hook off, never the user's own sitecustomize behind it."""
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("print('user sitecustomize ran')\nMARK = 7\n")
    code = "import sys; print('main', 'teye_client.auto' in sys.modules, sys.modules['sitecustomize'].MARK)"
    for off in ("0", "off", "false"):
        r = plain_run([PY, "-c", code], env=base_env(PYTHONPATH=os.pathsep.join([SITE, str(user)]), TEYE_AUTO=off))
        assert (r.returncode, r.stdout, r.stderr) == (0, "user sitecustomize ran\nmain False 7\n", ""), off


def _fake_torch(root, next_src, optimizer_src):
    for d in ("torch", "torch/utils", "torch/utils/data", "torch/optim"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    files = {
        "torch/__init__.py": "import torch.utils.data.dataloader\nimport torch.optim.optimizer\n",
        "torch/utils/__init__.py": "", "torch/utils/data/__init__.py": "", "torch/optim/__init__.py": "",
        "torch/utils/data/dataloader.py": next_src, "torch/optim/optimizer.py": optimizer_src,
    }
    for name, text in files.items():
        with open(os.path.join(root, name), "w") as fh:
            fh.write(textwrap.dedent(text))


def test_a_framework_that_looks_different_is_left_alone(tmp_path):
    """A private function of another shape is not wrapped; one stderr line with TEYE_DEBUG=1, none otherwise."""
    _fake_torch(str(tmp_path), """
        class _BaseDataLoaderIter:
            def __next__(self, timeout=None):  # not the one-argument function teye wraps
                return 1
        """, "def something_else(): pass\n")
    code = "import torch.utils.data.dataloader as d; print(d._BaseDataLoaderIter.__next__.__name__, " \
           "hasattr(d._BaseDataLoaderIter.__next__, '_teye'))"
    pp = os.pathsep.join([SITE, str(tmp_path), REPO])
    quiet = plain_run([PY, "-c", code], env=base_env(PYTHONPATH=pp))
    loud = plain_run([PY, "-c", code], env=base_env(PYTHONPATH=pp, TEYE_DEBUG="1"))
    assert quiet.stdout == loud.stdout == "__next__ False\n" and quiet.stderr == ""
    lines = loud.stderr.splitlines()
    assert len(lines) == 4 and all(x.startswith("teye: ") for x in lines)
    assert "hook loaded in pid" in lines[0]   # the start and the end of the process (test_run_says.py)
    assert "_BaseDataLoaderIter.__next__ is not the function teye expects" in lines[1]
    assert "register_optimizer_step_post_hook" in lines[2]
    assert "instrumented nothing" in lines[3]
    # the same fake with the expected shape is patched (so the check above is what stood aside)
    _fake_torch(str(tmp_path), """
        class _BaseDataLoaderIter:
            def __init__(self, loader):
                pass

            def __next__(self):
                return 1
        """, "def register_optimizer_step_post_hook(hook): pass\n")
    ok = plain_run([PY, "-c", code], env=base_env(PYTHONPATH=pp, TEYE_DEBUG="1"))
    lines = ok.stderr.splitlines()
    assert ok.stdout == "__next__ True\n" and len(lines) == 4, ok.stderr
    assert lines[1:3] == ["teye: zero-code phases: instrumented PyTorch DataLoader input waits "
                          "(torch.utils.data.dataloader)",
                          "teye: zero-code phases: instrumented PyTorch optimizer steps (torch.optim.optimizer)"]
    assert lines[3].endswith(": instrumented PyTorch DataLoader input waits, PyTorch optimizer steps; "
                             "no training step seen: nothing sent")
    # an iterator __init__ of another shape: input waits still observed, the iterators' making times not
    _fake_torch(str(tmp_path), """
        class _BaseDataLoaderIter:
            def __init__(self, loader, extra=None):
                pass

            def __next__(self):
                return 1
        """, "def register_optimizer_step_post_hook(hook): pass\n")
    code2 = code[:-1] + ", hasattr(d._BaseDataLoaderIter.__init__, '_teye'))"
    odd = plain_run([PY, "-c", code2], env=base_env(PYTHONPATH=pp, TEYE_DEBUG="1"))
    lines = odd.stderr.splitlines()
    assert odd.stdout == "__next__ True False\n" and len(lines) == 5, odd.stderr
    assert "_BaseDataLoaderIter.__init__ is not the function teye expects" in lines[1]


# -- bad inputs with a real training loop -----------------------------------------------------
def _losses(out):
    return [line for line in out.splitlines() if line.split(" ")[0] in ("a", "b", "child")]


@needs_torch
def test_bad_sockets_never_change_the_job(sockdir):
    bare = plain_run([PY, SMALL, "6"], env=base_env(EXIT="5"))
    assert bare.returncode == 5 and len(_losses(bare.stdout)) == 6
    regular = os.path.join(sockdir, "file")
    open(regular, "w").close()
    runs = []
    for sock in (os.path.join(sockdir, "missing.sock"), regular, sockdir, "/nonexistent/dir/p.sock", None):
        env = base_env(EXIT="5", TEYE_DEBUG="1")
        if sock is None:  # unset: the client tries the default locations (no agent there in tests)
            env["TMPDIR"] = sockdir
            env["XDG_RUNTIME_DIR"] = sockdir
        cmd = [PY, "-m", "agent", "run"] + (["--socket", sock] if sock else []) + ["--", PY, SMALL, "6"]
        runs.append((sock, subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                            text=True)))
    for sock, proc in runs:  # all at once: they are independent, and the suite stays short
        out, err = proc.communicate(timeout=120)
        assert (proc.returncode, out) == (5, bare.stdout), sock
        assert [x for x in err.splitlines() if not x.startswith("teye: ")] == bare.stderr.splitlines(), sock
        assert "teye: zero-code phases: job 'torch_small'" in err, sock  # it did try to report


@needs_torch
@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run the job as nobody")
def test_a_socket_the_job_may_not_write_never_changes_it(sockdir):
    path = os.path.join(sockdir, "root-only.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    os.chmod(path, 0o600)
    # nobody gets its own copies (this tree may sit in a directory only root can enter): the script, the
    # client package and an interpreter whose site-packages (torch) are a copy of this one's
    shared = SharedCopies()
    try:
        py, small = shared.python(), shared.copy(SMALL)
        client = shared.copy(os.path.join(REPO, "teye_client"))
        site = os.path.join(client, "_site")
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        env = base_env(HOME=sockdir, EXIT="4", TEYE_PHASE_SOCKET=path, PYTHONPATH=shared.root)
        bare = plain_run(nobody + [py, small, "6"], env=env, cwd=shared.root)
        r = plain_run(nobody + [py, small, "6"], env={**env, "PYTHONPATH": os.pathsep.join([site, shared.root]),
                                                      "TEYE_DEBUG": "1"}, cwd=shared.root)
        assert bare.returncode == 4, bare.stderr
        assert (r.returncode, r.stdout) == (4, bare.stdout), r.stderr
        # the hook did load in nobody's job (it tried, and was refused): not a job that never reported at all
        assert "teye: zero-code phases: job 'torch_small'" in r.stderr, r.stderr
        s.settimeout(0.3)
        with pytest.raises(socket.timeout):
            s.recv(65536)
    finally:
        s.close()
        shared.close()


@needs_torch
def test_a_full_agent_queue_never_changes_the_job(sockdir):
    path = os.path.join(sockdir, "hung.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)  # an agent that does not read: the test fills its queue first
    c = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    c.setblocking(False)
    c.connect(path)
    n = 0
    try:
        while True:
            c.send(b"x" * 100)
            n += 1
    except BlockingIOError:
        pass
    try:
        bare = plain_run([PY, SMALL, "6"])
        r = teye_run([PY, SMALL, "6"], socket_path=path)
        assert (r.returncode, r.stdout, r.stderr) == (0, bare.stdout, bare.stderr)
        s.setblocking(False)
        got = 0
        try:
            while True:
                assert s.recv(65536) == b"x" * 100  # only the test's own: the job's datagrams were dropped
                got += 1
        except BlockingIOError:
            pass
        assert got == n
    finally:
        c.close()
        s.close()


@needs_torch
def test_agent_restart_mid_run(sockdir):
    agent = LiveAgent(sockdir)
    bare = plain_run([PY, SMALL, "8", "pause"], input="\n")
    proc = subprocess.Popen([PY, "-m", "agent", "run", "--socket", agent.path, "--job", "restart", "--",
                             PY, SMALL, "8", "pause"], env=base_env(), cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out = []
        while True:
            line = proc.stdout.readline()
            out.append(line)
            if line in ("paused\n", ""):
                break
        # paused, the loop records no more: its last records go with the flush thread's backstop (BACKSTOP_NS)
        first = agent.jobs(settle_s=BACKSTOP_NS / 1e9 + 0.5)["restart"]
        assert (first.steps, first.source) == (8, "torch")
        agent.close()  # the agent stops ... and a new one starts on the same path
        agent = LiveAgent(sockdir)
        rest, err = proc.communicate("\n", timeout=60)
        assert (proc.returncode, "".join(out) + rest, err) == (0, bare.stdout, bare.stderr)
        second = agent.jobs()["restart"]
        assert (second.steps, second.source) == (8, "torch")  # the new agent learns the source again
    finally:
        proc.kill()
        agent.close()


@needs_torch
def test_fork_without_exec(sockdir):
    """The child starts clean: it sends its own steps under its own pid, never the parent's buffer."""
    agent = LiveAgent(sockdir)
    try:
        bare = plain_run([PY, SMALL, "3", "fork"])
        r = teye_run([PY, SMALL, "3", "fork"], socket_path=agent.path, job="forked")
        assert (r.returncode, r.stdout, r.stderr) == (0, bare.stdout, bare.stderr)
        assert len(_losses(r.stdout)) == 8
        j = agent.jobs()["forked"]
        assert (j.steps, j.processes) == (3 + 2 + 3, 2)
    finally:
        agent.close()


@needs_torch
def test_fork_between_next_and_the_optimizer_step(sockdir):
    """The child starts empty: the batch its parent read before the fork is the parent's step, never the child's
    (the session's pending waits and step start are reset in the child, as the reporter's buffer is)."""
    agent = LiveAgent(sockdir)
    try:
        bare = plain_run([PY, SMALL, "3", "forkmid"])
        r = teye_run([PY, SMALL, "3", "forkmid"], socket_path=agent.path, job="forkmid")
        assert (r.returncode, r.stdout, r.stderr) == (0, bare.stdout, bare.stderr)
        tags = [line.split(" ")[0] for line in r.stdout.splitlines()]
        assert sorted(tags) == sorted(["a"] * 3 + ["child"] * 2 + ["m"] + ["b"] * 3)   # the steps each took
        steps = len(tags)
        j = agent.jobs()["forkmid"]
        # one batch of 8 per step taken, in either process: the parent's pre-fork batch counted once
        assert (j.steps, j.samples, j.processes) == (steps, 8 * steps, 2)
    finally:
        agent.close()


@needs_torch
def test_profile_instruments_an_unmodified_script(tmp_path):
    bare = plain_run([PY, SMALL, "6"], env=base_env(EXIT="3"))
    r = subprocess.run([PY, "-m", "agent", "profile", "--output", str(tmp_path / "p"), "--", PY, SMALL, "6"],
                       env=base_env(EXIT="3"), capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 3 and r.stdout.startswith(bare.stdout)  # the job's own output first, then the overview
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())
    (job,) = summary["jobs"]
    assert (job["train_job"], job["source"], job["steps"], job["samples"]) == ("torch_small", "torch", 6, 48)
    assert "phases from torch" in r.stdout


@needs_torch
def test_ddp_ranks_report_under_one_job_with_their_own_pids(sockdir):
    agent = LiveAgent(sockdir)
    try:
        r = teye_run([PY, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
                      os.path.join(HERE, "torch_ddp.py"), "5"], socket_path=agent.path,
                     env=base_env(OMP_NUM_THREADS="1"), timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        assert sorted(re.findall(r"rank (\d) loss", r.stdout)) == ["0", "1"]  # (the ranks' lines may interleave)
        jobs = agent.jobs()
        assert list(jobs) == ["torch_ddp"]  # the script's name, one job for both ranks (torchrun itself sends nothing)
        j = jobs["torch_ddp"]
        # 5 global steps (each rank's fifth step is the job's fifth), the samples of both ranks (issue 30)
        assert (j.processes, j.steps, j.samples, j.source) == (2, 5, 80, "torch")
        assert sorted((r.rank, r.steps) for r in j.ranks) == [(0, 5), (1, 5)] and j.world_size == 2
    finally:
        agent.close()


@needs_torch
@pytest.mark.parametrize("parts", ["0", "1"])
def test_a_loop_without_a_dataloader_reports_steps_only_or_its_own_input(sockdir, parts):
    """Without the forward's start (the parts off) its input wait cannot be seen: steps, no ratio, and the
    evidence says so (never a 0 % guess).  With it, the time before each forward is its own input (issue 47):
    at least the 20 ms it sleeps before each of its 7 forwards, the verdict input."""
    agent = LiveAgent(sockdir)
    code = ("import time, torch\nm = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
            "for i in range(7):\n    time.sleep(0.02)  # reading its own batches\n"
            "    x = torch.ones(8, 4)\n    opt.zero_grad(); m(x).sum().backward(); opt.step()\n")
    try:
        r = teye_run([PY, "-c", code], socket_path=agent.path, job="manual", env=base_env(TEYE_STEP_PARTS=parts))
        assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
        j = agent.jobs()["manual"]
        if parts == "0":
            # no phase counters, no sample count, no ratio (absent, not 0); no GPU samples: not_observed, never
            # compute
            assert (j.source, j.steps, j.input_bound_ratio, j.phase_seconds, j.samples, j.verdict.kind) == \
                ("torch-steps", 7, None, (), None, "not_observed")
            assert "input wait not observed" in j.verdict.evidence
            return
        ph = dict(j.phase_seconds)
        assert (j.source, j.steps, j.samples, j.verdict.kind) == ("torch-forward", 7, None, "input"), j.verdict
        assert ph["data_wait"] >= 7 * 0.02 and j.input_bound_ratio > 0.5, (ph, j.input_bound_ratio)
    finally:
        agent.close()


# -- one training job per process -------------------------------------------------------------
OWN = os.path.join(HERE, "own_client.py")


@needs_torch
@pytest.mark.parametrize("late", [False, True])
def test_a_script_with_its_own_reporter_is_one_job_under_teye_run(sockdir, late):
    """The explicit client wins: zero-code phases stand aside for that process (TEYE_DEBUG=1 says so), and
    the agent sees exactly one training job, the script's own, with all its steps.  Made late (after
    zero-code steps had started), the zero-code reporter stops: its job has only the steps before."""
    args = [PY, OWN, "5"] + (["late"] if late else [])
    bare = plain_run(args)
    agent = LiveAgent(sockdir)
    try:
        r = teye_run(args, socket_path=agent.path, env=base_env(TEYE_DEBUG="1"))
        assert (r.returncode, r.stdout) == (0, bare.stdout)
        assert "zero-code phases stand aside in pid" in r.stderr and "'own-client'" in r.stderr
        jobs = agent.jobs()
        own = jobs.pop("own-client")
        assert (own.source, own.steps, own.samples) == ("client", 5, 40)
        if late:  # the 5 zero-code steps before the Reporter existed, and not one after
            assert {n: (j.source, j.steps) for n, j in jobs.items()} == {"own_client": ("torch", 5)}
        else:
            assert jobs == {}
    finally:
        agent.close()


@needs_torch
def test_a_script_with_its_own_reporter_is_one_job_under_teye_profile(tmp_path):
    bare = plain_run([PY, OWN, "6"])
    r = subprocess.run([PY, "-m", "agent", "profile", "--output", str(tmp_path / "p"), "--", PY, OWN, "6"],
                       env=base_env(), capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith(bare.stdout)
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())
    assert [(j["train_job"], j["source"], j["steps"], j["samples"]) for j in summary["jobs"]] == \
        [("own-client", "client", 6, 48)]
    assert r.stdout.count("\nJob ") == 1


# -- Keras Model.fit: the shape check of TensorFlowTrainer._make_function -----------------------
def _fake_keras_trainer(closure_names, spe=1):
    """A module shaped like keras.src.backend.tensorflow.trainer: _make_function returns a function whose
    closure holds closure_names (Keras' holds one_step_on_data and multi_step_on_iterator)."""
    import types
    calls = []

    class Iterator:
        def get_next(self):
            return "batch"

    strategy = object()
    tf = types.SimpleNamespace(data=types.SimpleNamespace(Iterator=Iterator),
                               distribute=types.SimpleNamespace(has_strategy=lambda: False,
                                                                get_strategy=lambda: strategy))

    def one_step_on_data(data):
        calls.append(("one_step", data))
        return {"loss": 1.0}

    def multi_step_on_iterator(iterator):
        return one_step_on_data(iterator.get_next())

    env = {"one_step_on_data": one_step_on_data, "multi_step_on_iterator": multi_step_on_iterator}
    src = "def make(%s):\n    def function(iterator):\n        return (%s,)\n    return function\n" % (
        ", ".join(closure_names), ", ".join(closure_names))
    ns = {}
    exec(src, ns)

    class TensorFlowTrainer:
        steps_per_execution = spe
        distribute_strategy = strategy

        def _make_function(self, step_function):
            return ns["make"](*[env.get(n, n) for n in closure_names])

        def train_step(self, data):
            return data

        def evaluate(self, x=None, y=None):   # and Keras' evaluation entry points (wrapped as eval)
            return x

        predict = test_on_batch = predict_on_batch = evaluate

    return types.SimpleNamespace(TensorFlowTrainer=TensorFlowTrainer, tf=tf), calls


@pytest.mark.parametrize("names, spe, why", [
    (("one_step_on_data", "multi_step_on_iterator", "self"), 1, None),
    (("multi_step_on_iterator", "self"), 1, "no one_step_on_data in its closure"),
    (("one_step_on_data", "multi_step_on_iterator", "self"), 8, "steps_per_execution is 8"),
])
def test_keras_train_function_of_another_shape_is_left_as_keras_made_it(monkeypatch, capsys, names, spe, why):
    from teye_client import _common, _tf
    monkeypatch.setattr(_common, "_DEBUG", True)
    mod, calls = _fake_keras_trainer(names, spe)
    assert _tf.patch_keras_trainer(mod) is True
    model = mod.TensorFlowTrainer()
    keras_fn = mod.TensorFlowTrainer._make_function.__wrapped__(model, model.train_step)
    fn = mod.TensorFlowTrainer._make_function(model, model.train_step)
    err = capsys.readouterr().err
    if why is None:   # the expected shape: teye's function, Keras' own kept behind it
        assert getattr(fn, "_teye", False) and fn.__wrapped__.__code__ is keras_fn.__code__ and err == ""
    else:             # Keras' function itself, and the reason
        assert not getattr(fn, "_teye", False) and fn.__code__ is keras_fn.__code__
        assert f"Model.fit input wait not observed (steps only): " in err and why in err
    # evaluate / predict functions are never replaced
    test_fn = mod.TensorFlowTrainer._make_function(model, lambda data: data)
    assert not getattr(test_fn, "_teye", False)


@needs_torch
def test_profile_of_a_steps_only_loop_says_not_observed(tmp_path):
    """`teye profile` of a loop teye sees steps of only: no data_wait/compute split made up (the step time is
    untracked), no input-bound line, and the verdict not_observed (no GPU collector), never compute."""
    code = ("import time, torch\nm = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
            "for i in range(8):\n    time.sleep(0.03)  # its own slow input\n"
            "    x = torch.ones(8, 4)\n    opt.zero_grad(); m(x).sum().backward(); opt.step()\n")
    (tmp_path / "teye.yaml").write_text("collectors:\n  gpu: {enabled: false}\n")
    r = subprocess.run([PY, "-m", "agent", "profile", "--output", str(tmp_path / "p"), "--config",
                        str(tmp_path / "teye.yaml"), "--", PY, "-c", code],
                       env=base_env(TEYE_STEP_PARTS="0"),   # (with the parts on, its input is placed: below)
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    (job,) = json.loads((tmp_path / "p" / "summary.json").read_text())["jobs"]
    assert (job["source"], job["steps"], job["samples"], job["input_bound_ratio"]) == ("torch-steps", 8, None, None)
    assert list(job["step_time_breakdown"]) == ["untracked"] and job["step_time_breakdown"]["untracked"]["share"] == 1
    assert job["verdict"]["kind"] == "not_observed"
    assert "verdict: NOT_OBSERVED" in r.stdout and "steps only: the job's input wait is not observed" in r.stdout
    assert "input-bound:" not in r.stdout
