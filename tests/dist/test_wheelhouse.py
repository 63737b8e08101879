"""The wheelhouse (deploy/wheelhouse.sh, ./dev.sh dist) installed with ``pip --no-index`` into a fresh venv, and
teye's commands run from it inside a user's environment full of packages named like teye's."""
from __future__ import annotations

import glob
import hashlib
import http.server
import json
import os
import re
import subprocess
import sys
import sysconfig
import threading
import urllib.parse
import zipfile

import pytest

from tests.dist import wheelhouse as wh
from tests.procs import REPO, free_port, wait_http

pytestmark = pytest.mark.e2e
PRIVATE = ("agent", "exporters", "workloads", "dashboards")


@pytest.fixture(scope="module")
def venv_bin(house, tmp_path_factory):
    return wh.install(house, tmp_path_factory.mktemp("venv") / "v")


@pytest.fixture
def user(tmp_path):
    return wh.user_tree(tmp_path / "project")


def site_packages(venv_bin: str) -> str:
    out = subprocess.run([os.path.join(venv_bin, "python"), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_wheelhouse_holds_teye_for_this_python_and_every_dependency(house):
    m = wh.manifest(house)
    files = sorted(os.listdir(os.path.join(house, "wheels")))
    assert sorted(m["wheels"]) == files
    for name, digest in m["wheels"].items():
        with open(os.path.join(house, "wheels", name), "rb") as fh:
            assert hashlib.sha256(fh.read()).hexdigest() == digest
    tag = "cp%d%d" % sys.version_info[:2]
    (teye,) = [f for f in files if f.startswith("teye-")]
    assert teye == "teye-0.1.0-py3-none-any.whl"                    # pure Python (issue 38: no C helpers)
    assert (m["python"], m["machine"]) == (tag, os.uname().machine)
    names = zipfile.ZipFile(os.path.join(house, "wheels", teye)).namelist()
    assert not any(n.endswith(".so") for n in names)                # nothing compiled
    tops = {n.split("/")[0] for n in names if not n.startswith("teye-0.1.0.dist-info")}
    assert tops == {"teye", "teye_client"}                          # no generic top-level name
    # every runtime dependency of pyproject.toml is there as a wheel
    deps = {"psutil", "nvidia_ml_py", "prometheus_client", "pyyaml", "bcrypt"}
    assert deps <= {f.split("-")[0].lower() for f in files}
    for f in ("install.sh", "teye.example.yml", "systemd/teye-agent.service"):
        assert os.path.isfile(os.path.join(house, "deploy", f)), f


def test_install_puts_no_generic_top_level_name_into_the_environment(venv_bin):
    sp = site_packages(venv_bin)
    present = set(os.listdir(sp))
    assert not present & set(PRIVATE), present & set(PRIVATE)
    assert {"teye", "teye_client"} <= present
    for name in PRIVATE:
        res = subprocess.run([os.path.join(venv_bin, "python"), "-I", "-c", f"import {name}"],
                             capture_output=True, text=True, cwd="/")
        assert f"No module named '{name}'" in res.stderr
    assert not glob.glob(os.path.join(sp, "teye", "_lib", "agent", "phases", "*.so"))   # pure Python


def _trap_env(user: str, **extra) -> dict:
    return wh.clean_env(PYTHONPATH=os.pathsep.join([user, user + "/nonexistent"]), **extra)


def test_agent_from_the_wheelhouse_serves_metrics_with_a_hostile_pythonpath(venv_bin, user, tmp_path):
    port = free_port()
    log = open(tmp_path / "agent.log", "w")
    proc = subprocess.Popen([os.path.join(venv_bin, "teye"), "agent", "--listen", f"127.0.0.1:{port}",
                             "--phase-socket", str(tmp_path / "phases.sock")],
                            env=_trap_env(user), cwd=user, stdout=log, stderr=subprocess.STDOUT)
    try:
        body = wait_http(f"http://127.0.0.1:{port}/metrics", timeout=60, proc=proc)
    finally:
        proc.terminate()
        rc = proc.wait(30)
        log.close()
    text = (tmp_path / "agent.log").read_text()
    assert rc == 0, text
    assert 'teye_build_info{version="0.1.0"} 1.0' in body
    # the host's CPUs, counted from /proc/stat independently of the agent
    with open("/proc/stat") as fh:
        cpus = {line.split()[0][3:] for line in fh if re.match(r"cpu\d+ ", line)}
    seen = set(re.findall(r'teye_cpu_seconds_total\{cpu="(\d+)"', body))
    assert seen == cpus
    assert "process_resident_memory_bytes" in body
    assert "imported" not in text, text


def _run(venv_bin, args, user, **kw):
    return subprocess.run([os.path.join(venv_bin, "teye"), *args], capture_output=True, text=True, cwd=user,
                          timeout=120, **kw)


def test_teye_version_and_help_with_a_hostile_pythonpath(venv_bin, user):
    res = _run(venv_bin, ["--version"], user, env=_trap_env(user))
    assert (res.returncode, res.stdout, res.stderr) == (0, "teye 0.1.0\n", "")
    res = _run(venv_bin, ["catalog"], user, env=_trap_env(user))
    assert res.returncode == 0 and res.stdout == open(os.path.join(REPO, "docs", "metrics.md")).read()


def test_teye_run_gives_the_job_the_users_path_and_only_teyes_site_dir(venv_bin, user):
    """The job imports the *user's* agent (its PYTHONPATH is the user's, with teye's zero-code directory in
    front) and never sees teye's private directory."""
    probe = ("import os, sys, json; import agent; "
             "print(json.dumps({'pp': os.environ['PYTHONPATH'], 'path': sys.path}))")
    res = _run(venv_bin, ["run", "--job", "j", "--", sys.executable, "-c", probe], user,
               env=_trap_env(user, USER_JOB="1", TEYE_AUTO="0"))
    assert res.returncode == 0, res.stderr
    first, last = res.stdout.strip().splitlines()
    assert first == f"user agent from {user}/agent/__init__.py"
    got = json.loads(last)
    site = os.path.join(site_packages(venv_bin), "teye_client", "_site")
    assert got["pp"].split(os.pathsep) == [site, user, user + "/nonexistent"]
    assert not [p for p in got["path"] + [got["pp"]] if "_lib" in p]


class _EmptyPrometheus(http.server.BaseHTTPRequestHandler):
    """A Prometheus that never saw the job: ``time()`` is a scalar, every other query an empty vector."""

    def _answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        asked = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        asked.update(urllib.parse.parse_qs(self.rfile.read(n).decode() if n else ""))
        if asked.get("query") == ["time()"]:
            data = {"resultType": "scalar", "result": [1700000000, "1700000000"]}
        else:
            data = {"resultType": "vector", "result": []}
        body = json.dumps({"status": "success", "data": data}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *a):
        pass


def test_teye_report_with_a_hostile_pythonpath_answers_as_from_source(venv_bin, user):
    """Oracle: the same report run from the source tree in a clean environment."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EmptyPrometheus)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    args = ["report", "--prometheus", url, "--slurm-job", "4242", "--format", "json"]
    try:
        got = _run(venv_bin, args, user, env=_trap_env(user))
        want = subprocess.run([sys.executable, "-m", "agent", *args], capture_output=True, text=True, timeout=120,
                              cwd=REPO, env=wh.clean_env(PYTHONPATH=REPO))
    finally:
        srv.shutdown()
    assert "imported" not in got.stderr and "Traceback" not in got.stderr, got.stderr
    assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr)
    assert "4242" in got.stdout + got.stderr


# What the READMEs tell admins to install: every file (or every file of a directory) under deploy/ or
# dashboards/json they name.  Build tools they name for developers need the source tree, not an install.
READMES = ("README.md", "deploy/slurm/README.md", "deploy/kubernetes/README.md")
BUILD_TOOLS = {"deploy/image/build.sh", "deploy/wheelhouse.sh", "deploy/kubernetes/generate.py",
               "deploy/prometheus/generate.py"}
_NAMED = re.compile(r"(?<![\w./-])((?:deploy|dashboards)/[\w./*-]*|[\w.-]+\.(?:sh|yml|yaml|json|service))")


def readme_files() -> set:
    out = set()
    for readme in READMES:
        with open(os.path.join(REPO, readme), encoding="utf-8") as fh:
            text = fh.read()
        for tok in _NAMED.findall(text):
            tok = tok.rstrip(".")
            for rel in (tok, os.path.join(os.path.dirname(readme), tok)):
                rel = os.path.normpath(rel)
                if rel in ("dashboards", "dashboards/json"):
                    rel = "dashboards/json"       # the package's code is in the wheel; its JSON is what admins use
                path = os.path.join(REPO, rel)
                files = [path] if os.path.isfile(path) else glob.glob(os.path.join(path, "**", "*"), recursive=True) \
                    if os.path.isdir(path) else glob.glob(path)
                for f in files:
                    r = os.path.relpath(f, REPO)
                    if os.path.isfile(f) and r.startswith(("deploy/", "dashboards/json/")) and "__pycache__" not in r:
                        out.add(r)
                if files:
                    break
    return out - BUILD_TOOLS


def test_the_wheelhouse_holds_every_file_its_readmes_tell_admins_to_install(house):
    named = readme_files()
    # the oracle is not empty: the Slurm scripts, rules, dashboards and Kubernetes objects are named
    for must in ("deploy/slurm/teye-gpu-prolog.sh", "deploy/slurm/teye-gpu-epilog.sh", "deploy/slurm/taskprolog.sh",
                 "deploy/slurm/teye-epilog.sh", "deploy/prometheus/rules/teye-alerts.yml",
                 "dashboards/json/teye-job.json", "deploy/kubernetes/daemonset.yaml", "deploy/install.sh"):
        assert must in named, must
    missing = sorted(r for r in named if not os.path.isfile(os.path.join(house, r)))
    assert missing == [], missing
    # copied as they are in the tree, executables still executable
    for r in named:
        with open(os.path.join(REPO, r), "rb") as a, open(os.path.join(house, r), "rb") as b:
            assert a.read() == b.read(), r
        assert os.access(os.path.join(house, r), os.X_OK) == os.access(os.path.join(REPO, r), os.X_OK), r
    assert not os.path.exists(os.path.join(house, "deploy", "image"))    # build tools stay in the tree


def test_the_installed_teye_workloads_trains_a_reference_model_for_a_few_steps(venv_bin, user, tmp_path):
    """`teye workloads train` from the wheelhouse install (an install has no `python -m workloads.train`: its
    packages are private).  TensorFlow, the workloads extra, is lent from this test venv (a path appended after
    the install's own site-packages: teye itself still comes from the wheelhouse), so the install is not
    downloaded again; the user's directory holds a package named ``workloads`` that must not be picked."""
    pytest.importorskip("tensorflow")
    tf_site = os.path.dirname(os.path.dirname(__import__("tensorflow").__file__))
    with open(os.path.join(site_packages(venv_bin), "zz-lend-tensorflow.pth"), "w") as fh:
        fh.write(tf_site + "\n")
    res_file = tmp_path / "run.json"
    p = subprocess.run([os.path.join(venv_bin, "teye"), "workloads", "train", "--model", "simple_cnn",
                        "--batch-size", "8", "--synthetic-samples", "64", "--pipeline", "naive", "--steps", "3",
                        "--no-progress", "--results", str(res_file)],
                       cwd=user, capture_output=True, text=True, timeout=600, env=wh.clean_env(PYTHONPATH=user))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    rec = json.loads(res_file.read_text())
    assert rec["steps"] == 3 and rec["model"] == "simple_cnn" and rec["batch_size"] == 8, rec
    assert "simple_cnn bs=8 pipeline=naive" in p.stdout and "measured steps" in p.stdout
    # the code that ran is the install's, not the user's nor this checkout's
    where = subprocess.run([os.path.join(venv_bin, "python"), "-c", "import teye, sys; teye.isolate(); "
                            "import workloads.train as t; print(t.__file__)"], cwd=user, capture_output=True,
                           text=True, env=wh.clean_env(PYTHONPATH=user))
    assert where.stdout.strip().startswith(os.path.join(site_packages(venv_bin), "teye", "_lib")), where
