"""Zero-code phases without a framework in the way: the interpreter-start hook, `teye run`, job names,
and the bad inputs of issue 22.  In every case the job's own output and exit status are compared with
the same command run without teye (the oracle), not with what teye says about itself."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from teye_client import auto
from tests.client.helpers import HERE, REPO, SITE, LiveAgent, base_env, plain_run, teye_run
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
    ({"HOSTNAME": "laptop"}, ["/home/a/resnet_train.py", "--lr", "1"], "resnet_train"),
    ({}, ["/usr/lib/python3/site-packages/mypkg/__main__.py"], "mypkg"),
    ({}, ["-c"], "python"),
])
def test_job_name_order(env, argv, name):
    assert auto.job_name(env, argv) == name


# -- teye run ---------------------------------------------------------------------------------
def test_run_exit_status_output_and_environment_pass_through():
    r = teye_run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (r.returncode, r.stdout, r.stderr) == (3, "out\n", "err\n")
    r = teye_run([PY, "-c", "import os, sys; print(os.environ['TEYE_TRAIN_JOB'], os.environ['PYTHONPATH']); "
                            "print('teye_client.auto' in sys.modules, os.getpid() == int(sys.argv[1]) or 'x')", "0"],
                 job="my-job")
    job, pp = r.stdout.splitlines()[0].split(" ")
    assert job == "my-job" and pp.split(os.pathsep) == [SITE, REPO]  # first, once, the caller's path kept
    assert r.stdout.splitlines()[1].startswith("True")
    # a signal: a shell sees 128+N, as without teye (teye execs the command: same pid, same signals)
    sh = f"{PY} -m agent run -- sh -c 'kill -TERM $$'; echo status=$?"
    assert subprocess.run(["sh", "-c", sh], env=base_env(), capture_output=True, text=True, cwd=REPO).stdout \
        == "status=143\n"
    r = teye_run(["sh", "-c", "echo $$"])
    assert r.returncode == 0 and int(r.stdout)  # the command's own pid (exec), printed


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
    assert r.stdout == "['teye_client', 'teye_client.auto'] False 1 0\n" and r.stderr == ""
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
    assert r.stdout.startswith("True ['teye_client', 'teye_client._torch', 'teye_client.auto'] True 1 0"), r
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
    assert len(lines) == 2 and all(x.startswith("teye: ") for x in lines)
    assert "_BaseDataLoaderIter.__next__ is not the function teye expects" in lines[0]
    assert "register_optimizer_step_post_hook" in lines[1]
    # the same fake with the expected shape is patched (so the check above is what stood aside)
    _fake_torch(str(tmp_path), """
        class _BaseDataLoaderIter:
            def __next__(self):
                return 1
        """, "def register_optimizer_step_post_hook(hook): pass\n")
    ok = plain_run([PY, "-c", code], env=base_env(PYTHONPATH=pp, TEYE_DEBUG="1"))
    assert ok.stdout == "__next__ True\n" and ok.stderr == ""


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
    try:
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        env = base_env(HOME=sockdir, EXIT="4", TEYE_PHASE_SOCKET=path)
        bare = plain_run(nobody + [PY, SMALL, "6"], env=env)
        r = plain_run(nobody + [PY, SMALL, "6"], env={**env, "PYTHONPATH": os.pathsep.join([SITE, REPO]),
                                                      "TEYE_DEBUG": "1"})
        assert bare.returncode == 4 and (r.returncode, r.stdout) == (4, bare.stdout)
        s.settimeout(0.3)
        with pytest.raises(socket.timeout):
            s.recv(65536)
    finally:
        s.close()


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
        first = agent.jobs()["restart"]
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
def test_a_loop_without_a_dataloader_reports_steps_only(sockdir):
    """Its input wait cannot be seen: steps, no ratio, and the evidence says so (never a 0 % guess)."""
    agent = LiveAgent(sockdir)
    code = ("import time, torch\nm = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
            "for i in range(7):\n    time.sleep(0.02)  # reading its own batches\n"
            "    x = torch.ones(8, 4)\n    opt.zero_grad(); m(x).sum().backward(); opt.step()\n")
    try:
        r = teye_run([PY, "-c", code], socket_path=agent.path, job="manual")
        assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
        j = agent.jobs()["manual"]
        assert (j.source, j.steps, j.input_bound_ratio, dict(j.phase_seconds).get("data_wait", 0)) == \
            ("torch-steps", 7, None, 0)
        assert "input wait not observed" in j.verdict.evidence
    finally:
        agent.close()
