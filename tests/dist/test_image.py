"""The OCI image (deploy/image/build.sh: mmdebstrap + the wheelhouse + podman import), run with podman against
this host's /proc and /sys mounted as the DaemonSet mounts them.

Runs where podman and mmdebstrap are installed (./dev.sh test installs them), and says plainly when it cannot.
The image is rebuilt only when the wheelhouse's teye wheel changed (its hash is an image label): about 90 s
on this 2-core VM, a few seconds otherwise.

Container runtime notes for this kind of VM (hybrid cgroup v1/v2, no CAP_SYS_RESOURCE): crun refuses hybrid
cgroups, so runc is used when installed, and the rlimits are lowered (podman's defaults are above this
machine's hard limits, which only CAP_SYS_RESOURCE may raise).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time

import pytest

from tests.dist import wheelhouse as wh
from tests.procs import REPO, free_port, http_get

pytestmark = pytest.mark.e2e
BUILD = os.path.join(REPO, "deploy", "image", "build.sh")
TAG = "localhost/teye-test:0.1.0"
UID = 65210


def _need(tool):
    if shutil.which(tool) is None:
        pytest.skip(f"cannot build or run the teye image here: {tool} is not installed "
                    f"(./dev.sh test installs podman, mmdebstrap and runc)")


def podman(*args, check=True, timeout=120):
    res = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check:
        assert res.returncode == 0, f"podman {' '.join(args)}: {res.stderr}"
    return res


def run_args():
    out = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]
    if shutil.which("runc"):
        out = ["--runtime", "runc"] + out
    return out


def source_key(house) -> str:
    """What the image is made of: the files a wheel is built from, the build scripts and the dependencies'
    wheels (the teye wheel's own bytes differ from build to build)."""
    h = hashlib.sha256()
    names = ["pyproject.toml", "setup.py", "deploy/image/build.sh"]
    for top in ("teye", "agent", "exporters", "workloads", "dashboards", "teye_client"):
        for root, dirs, files in os.walk(os.path.join(REPO, top)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            names += [os.path.relpath(os.path.join(root, f), REPO) for f in sorted(files)
                      if not f.endswith((".pyc", ".so"))]
    for name in names:
        h.update(name.encode() + b"\0")
        with open(os.path.join(REPO, name), "rb") as fh:
            h.update(hashlib.sha256(fh.read()).digest())
    deps = {k: v for k, v in wh.manifest(house)["wheels"].items() if not k.startswith("teye-")}
    h.update(json.dumps(deps, sort_keys=True).encode())
    return h.hexdigest()


@pytest.fixture(scope="module")
def image(house, tmp_path_factory):
    _need("podman")
    _need("mmdebstrap")
    key = source_key(house)
    have = podman("image", "inspect", TAG, "--format", "{{json .Labels}}", check=False)
    if have.returncode == 0 and (json.loads(have.stdout) or {}).get("teye.source.sha256") == key:
        return TAG
    out = tmp_path_factory.mktemp("image") / "teye.oci.tar"
    res = subprocess.run(["bash", BUILD, "--tag", TAG, "--label", f"teye.source.sha256={key}", house, str(out)],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    probe = podman("run", "--rm", *run_args(), TAG, "--version", check=False)
    if probe.returncode != 0:
        pytest.fail(f"the image was built but this machine cannot run containers: {probe.stderr.strip()}")
    return TAG


class Container:
    def __init__(self, image, tmp_path, mounts=True, extra=(), volumes=()):
        self.port = free_port()
        run_dir = tmp_path / "run-teye"
        run_dir.mkdir()
        os.chown(run_dir, UID, UID)          # what the DaemonSet's init container does
        vols = ["-v", f"{run_dir}:/run/teye"]
        if mounts:
            vols += ["-v", "/proc:/host/proc:ro", "-v", "/sys:/host/sys:ro"]
        for v in volumes:
            vols += ["-v", v]
        self.name = f"teye-test-{self.port}"
        podman("run", "-d", "--name", self.name, "--network", "host", *run_args(), *vols, image,
               "agent", f"--listen=127.0.0.1:{self.port}", "--procfs=/host/proc", "--sysfs=/host/sys",
               "--phase-socket=/run/teye/phases.sock", *extra)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait(self, timeout=60):
        deadline = time.monotonic() + timeout
        while True:
            try:
                return http_get(self.url + "/metrics")
            except OSError:
                state = podman("inspect", self.name, "--format", "{{.State.Running}}").stdout.strip()
                if state != "true" or time.monotonic() > deadline:
                    raise AssertionError(f"the container stopped or never answered: {self.logs()}")
                time.sleep(0.2)

    def logs(self):
        r = podman("logs", self.name, check=False)
        return r.stdout + r.stderr

    def remove(self):
        podman("rm", "-f", "-t", "2", self.name, check=False)


def test_image_runs_non_root_from_debian_packages(image):
    cfg = json.loads(podman("image", "inspect", image).stdout)[0]["Config"]
    assert cfg["User"] == f"{UID}:{UID}"
    assert cfg["Entrypoint"] == ["/opt/teye/venv/bin/teye"]
    res = podman("run", "--rm", *run_args(), "--entrypoint", "/bin/sh", image, "-c",
                 "id -u; dpkg-query -W -f '${Package}\\n' python3; ls /opt/teye/venv/lib/python3*/site-packages")
    uid, pkg, *site = res.stdout.split()
    assert (uid, pkg) == (str(UID), "python3")
    assert "teye" in site and not {"agent", "exporters", "workloads", "dashboards"} & set(site)
    assert "pip" not in site                                  # the installer is not shipped


def test_metrics_answer_with_the_hosts_cpus(image, tmp_path):
    c = Container(image, tmp_path)
    try:
        body = c.wait()
        time.sleep(1.5)
        body = http_get(c.url + "/metrics")
    finally:
        logs = c.logs()
        c.remove()
    with open("/proc/stat") as fh:
        cpus = {line.split()[0][3:] for line in fh if re.match(r"cpu\d+ ", line)}
    assert set(re.findall(r'teye_cpu_seconds_total\{cpu="(\d+)",mode="user"\}', body)) == cpus
    assert 'teye_collector_up{collector="cpu"} 1.0' in body
    assert 'teye_collector_up{collector="memory"} 1.0' in body
    with open("/proc/meminfo") as fh:
        total = int(fh.readline().split()[1]) * 1024
    assert float(re.search(r"^teye_memory_total_bytes (\S+)$", body, re.M).group(1)) == total
    assert "process_resident_memory_bytes" in body
    assert "collectors running: " in logs and "cpu" in logs.split("collectors running: ")[1].split(";")[0]


def test_without_proc_and_sys_mounted_the_collectors_say_so_and_the_agent_stays_up(image, tmp_path):
    c = Container(image, tmp_path, mounts=False)
    try:
        c.wait()
        time.sleep(1.5)
        body = http_get(c.url + "/metrics")
        health = http_get(c.url + "/healthz")
        running = podman("inspect", c.name, "--format", "{{.State.Running}}").stdout.strip()
    finally:
        logs = c.logs()
        c.remove()
    assert running == "true" and health == "ok\n"
    assert 'teye_collector_up{collector="cpu"} 0.0' in body and 'teye_collector_up{collector="memory"} 0.0' in body
    assert "--procfs /host/proc does not exist: is the host's /proc mounted there?" in logs
    assert "--sysfs /host/sys does not exist: is the host's /sys mounted there?" in logs
    assert "collector cpu down: /host/proc/stat: No such file or directory" in logs


def test_oci_labels_one_per_key_with_the_packages_version(image, house):
    """The labels read back with podman: each its own key, the version the package's (the wheel's metadata, as
    the wheelhouse manifest records it; build.sh hard-codes none)."""
    labels = json.loads(podman("image", "inspect", image, "--format", "{{json .Labels}}").stdout)
    assert labels["org.opencontainers.image.version"] == wh.manifest(house)["teye"]
    assert labels["org.opencontainers.image.title"] == "teye"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.description"].startswith("teye agent: host, GPU and training-job")
    assert all(" org.opencontainers" not in v for v in labels.values()), labels   # no label swallowed another
    with open(BUILD, encoding="utf-8") as fh:
        assert "0.1.0" not in fh.read()


def test_the_pod_mapping_works_inside_the_image(image, tmp_path):
    """grpcio is in the image (the kubernetes extra): the agent inside it asks a fake kubelet pod-resources
    server (tests/sources/test_allocation.py's, answers encoded by the protobuf library) on a socket mounted
    where the DaemonSet mounts the kubelet's, and says it answered."""
    pytest.importorskip("grpc")
    from tests.sources.test_allocation import PODS, FakeKubelet, response
    kl = FakeKubelet(response(PODS))
    os.chmod(kl.dir, 0o755)
    os.chmod(kl.path, 0o777)       # the kubelet's own is root-only: the README says how the agent's uid gets it
    cfg = tmp_path / "teye.yml"
    cfg.write_text("allocation:\n  slurm_mapping_dir: null\n  kubelet_socket: /var/lib/kubelet/pod-resources/"
                   "kubelet.sock\n  kubelet_refresh_seconds: 1.0\n")
    os.chmod(cfg, 0o644)
    c = Container(image, tmp_path, extra=["--config", "/etc/teye/teye.yml"],
                  volumes=[f"{kl.dir}:/var/lib/kubelet/pod-resources:ro", f"{cfg}:/etc/teye/teye.yml:ro"])
    try:
        c.wait()
        deadline = time.monotonic() + 30
        while True:
            body = http_get(c.url + "/metrics")
            if "teye_kubelet_pod_resources_up 1.0" in body or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        grpc_in_image = podman("run", "--rm", *run_args(), "--entrypoint", "/opt/teye/venv/bin/python", image,
                               "-c", "import grpc; print(grpc.__version__)", check=False)
    finally:
        logs = c.logs()
        c.remove()
        calls = kl.calls
        kl.stop()
    assert grpc_in_image.returncode == 0, grpc_in_image.stderr
    assert "teye_kubelet_pod_resources_up 1.0" in body, logs[-3000:]
    assert calls >= 1
    assert "grpcio is not installed" not in logs
