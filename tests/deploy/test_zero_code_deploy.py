"""deploy/slurm/taskprolog.sh and deploy/kubernetes/zero-code-pod.yaml turn zero-code phases on (docs/zero-code.md)."""
from __future__ import annotations

import os
import subprocess
import sys

import yaml

from tests.procs import REPO

PROLOG = os.path.join(REPO, "deploy", "slurm", "taskprolog.sh")
SITE = os.path.join(REPO, "teye_client", "_site")


def _prolog(env):
    return subprocess.run(["sh", PROLOG], env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True)


def test_taskprolog_prints_the_line_slurmstepd_applies():
    r = _prolog({"TEYE_SITE": SITE, "PYTHONPATH": REPO})
    assert (r.returncode, r.stdout, r.stderr) == (0, f"export PYTHONPATH={SITE}:{REPO}\n", "")
    name, value = r.stdout.strip()[len("export "):].split("=", 1)  # slurmstepd: literal NAME=value
    out = subprocess.run([sys.executable, "-c", "import sys; print('teye_client.auto' in sys.modules)"],
                         env={"PATH": os.environ["PATH"], name: value}, capture_output=True, text=True)
    assert (out.stdout, out.stderr) == ("True\n", "")
    assert _prolog({"TEYE_SITE": SITE}).stdout == f"export PYTHONPATH={SITE}\n"
    assert _prolog({"TEYE_SITE": SITE, "PYTHONPATH": f"/a:{SITE}"}).stdout == ""  # already on: nothing twice
    assert _prolog({"TEYE_SITE": "/nonexistent/teye"}).stdout == ""              # not installed: no change


def test_pod_snippet_mounts_the_site_first_on_the_path_and_the_socket():
    with open(os.path.join(REPO, "deploy", "kubernetes", "zero-code-pod.yaml"), encoding="utf-8") as fh:
        pod = yaml.safe_load(fh)
    (c,) = pod["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert env["PYTHONPATH"]["value"].split(":")[0] == mounts["teye-site"]["mountPath"] == "/opt/teye/site"
    assert mounts["teye-site"]["readOnly"] is True and vols["teye-site"]["hostPath"]["path"] == "/opt/teye/site"
    assert os.path.dirname(env["TEYE_PHASE_SOCKET"]["value"]) == mounts["teye-run"]["mountPath"] == "/run/teye"
    assert vols["teye-run"]["hostPath"]["path"] == "/run/teye"
    # issue 36: a pod sends to the node's socket but can neither replace it nor create the directory
    assert mounts["teye-run"]["readOnly"] is True and vols["teye-run"]["hostPath"]["type"] == "Directory"


def test_a_read_only_mount_of_the_socket_directory_still_sends_but_cannot_replace(tmp_path):
    """What the pod's readOnly mount of /run/teye means, on a real read-only bind mount (a private mount
    namespace, root only): sending to the socket works (connecting needs write permission on the socket
    file, which a read-only mount keeps), unlinking or binding another socket there fails (EROFS)."""
    import shutil
    import socket
    import pytest
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private read-only bind mount")
    d = tmp_path / "run"
    d.mkdir()
    path = str(d / "phases.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(path)
    srv.settimeout(5)
    script = ("import errno, os, socket, sys\n"
              "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
              "s.sendto(b'hello', sys.argv[1])\n"
              "for act in (lambda: os.unlink(sys.argv[1]), lambda: socket.socket(socket.AF_UNIX, "
              "socket.SOCK_DGRAM).bind(sys.argv[1] + '.2')):\n"
              "    try:\n        act()\n        print('changed')\n"
              "    except OSError as e:\n        print(errno.errorcode[e.errno])\n")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        f'mount --bind -o ro "$1" "$1" && exec "{sys.executable}" -c "$2" "$3"', "sh",
                        str(d), script, path], capture_output=True, text=True, timeout=30)
    try:
        assert (r.returncode, r.stdout, r.stderr) == (0, "EROFS\nEROFS\n", "")
        assert srv.recv(64) == b"hello" and os.path.exists(path)
    finally:
        srv.close()
