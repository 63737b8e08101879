"""The image sees the host, not itself: README.md's `podman run` command, run exactly as written, and the
DaemonSet's mounts and arguments (read from deploy/kubernetes/daemonset.yaml), each against an agent on the
host and a real node_exporter beside them (the oracle for what it covers): the same mount points with the
same sizes and inodes, the same os-release, and `teye doctor`'s cgroup view inside the container the host's.

The README's command needs podman's runtime quirks of this VM (runc, lower rlimits: tests/dist/test_image.py)
in a containers.conf given through CONTAINERS_CONF, not in the command, so the command is the README's to the
byte.  It binds port 9835 and the node's /run/teye, as an admin's would: the test restores /run/teye as it found
it (absent on a fresh node) and fails plainly when something else holds port 9835.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time

import pytest
import yaml

from tests.conftest import parse_exposition
from tests.dist.test_image import UID, image, podman, run_args  # noqa: F401  (image: the fixture)
from tests.procs import REPO, Agent, free_port, http_get, wait_http

pytestmark = pytest.mark.e2e
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
README = os.path.join(REPO, "README.md")
DAEMONSET = os.path.join(REPO, "deploy", "kubernetes", "daemonset.yaml")
README_TAG = "localhost/teye:0.1.0"


def readme_commands() -> list:
    """The fenced code block of README.md that holds the `podman run` command: its lines, as written."""
    with open(README, encoding="utf-8") as fh:
        text = fh.read()
    blocks = re.findall(r"^\s*```[^\n]*\n(.*?)^\s*```", text, re.M | re.S)
    found = [[ln.strip() for ln in b.splitlines() if ln.strip()] for b in blocks if "podman run" in b]
    assert len(found) == 1, f"README.md should show one block with a `podman run` command, found {found}"
    return found[0]


def _series(body: str, name: str, key: str = "mountpoint") -> dict:
    return {dict(lb)[key]: v for (n, lb), v in parse_exposition(body).items() if n == name}


def _labels(body: str, name: str) -> dict:
    got = [dict(lb) for (n, lb), _ in parse_exposition(body).items() if n == name]
    assert len(got) == 1, (name, got)
    return got[0]


def _wait_for(url: str, needle: str, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    body = ""
    while time.monotonic() < deadline:
        try:
            body = http_get(url)
        except OSError:
            body = ""
        if needle in body:
            return body
        time.sleep(0.5)
    raise AssertionError(f"{url} never showed {needle!r}: {body[-2000:]}")


@pytest.fixture(scope="module")
def oracles(tmp_path_factory):
    """The host agent (this checkout, defaults) and node_exporter, scraped once each while the containers run."""
    if NODE_EXPORTER is None:
        pytest.skip("prometheus-node-exporter is not installed (./dev.sh test installs it)")
    host = Agent([])
    ne_port = free_port()
    ne = subprocess.Popen([NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{ne_port}"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{ne_port}/metrics", proc=ne)
        yield host, f"http://127.0.0.1:{ne_port}/metrics"
    finally:
        host.stop()
        ne.terminate()
        ne.wait(10)


def _compare(body: str, host_body: str, ne_body: str) -> None:
    """Filesystems, os-release: the container's agent against the host's and node_exporter."""
    assert 'teye_filesystem_rootfs_state{state="host"} 1' in body.replace(".0\n", "\n"), body[-3000:]
    sizes = _series(body, "teye_filesystem_size_bytes")
    host_sizes = _series(host_body, "teye_filesystem_size_bytes")
    assert sizes == host_sizes                                # same mount points, same sizes
    assert _series(body, "teye_filesystem_files") == _series(host_body, "teye_filesystem_files")
    assert set(_series(body, "teye_filesystem_device_error").values()) == {0.0}
    assert set(_series(host_body, "teye_filesystem_device_error").values()) == {0.0}
    # the labels as the host names them, never with the /host/root prefix
    assert not [k for k in sizes if k.startswith("/host")]
    ne_sizes = _series(ne_body, "node_filesystem_size_bytes")
    both = set(sizes) & set(ne_sizes)
    assert "/" in both and both
    for mp in both:
        assert sizes[mp] == ne_sizes[mp], mp
    ne_avail, avail = _series(ne_body, "node_filesystem_avail_bytes"), _series(body, "teye_filesystem_avail_bytes")
    for mp in both:   # other engineers write while the test runs: free space moves a little between the reads
        assert abs(avail[mp] - ne_avail[mp]) < 2 * 2**30, mp
    os_info = _labels(body, "teye_os_info")
    assert os_info == _labels(host_body, "teye_os_info")
    ne_os = _labels(ne_body, "node_os_info")
    assert (os_info["id"], os_info["version_id"], os_info["pretty_name"]) == \
        (ne_os["id"], ne_os["version_id"], ne_os["pretty_name"])
    with open("/etc/os-release") as fh:
        assert f'PRETTY_NAME="{os_info["pretty_name"]}"' in fh.read()


def _doctor_cgroup_lines(text: str, root: str) -> list:
    return [line.replace(root, "<cgroupfs>") for line in text.splitlines() if line.startswith("jobs (cgroups)")]


def _host_doctor() -> list:
    out = subprocess.run([sys.executable, "-m", "agent", "doctor"], cwd=REPO, capture_output=True, text=True,
                         timeout=120).stdout
    return _doctor_cgroup_lines(out, "/sys/fs/cgroup")


@pytest.fixture
def machine_conf(tmp_path):
    """This VM's container runtime quirks, outside the command (an admin of such a machine sets them once)."""
    conf = tmp_path / "containers.conf"
    rt = 'runtime = "runc"\n' if shutil.which("runc") else ""
    conf.write_text(f'[containers]\ndefault_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]\n[engine]\n{rt}')
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def test_the_readme_command_as_written_sees_the_host(image, oracles, machine_conf):   # noqa: F811
    host, ne_url = oracles
    lines = readme_commands()
    cmd = lines[-1]
    args = shlex.split(cmd)
    assert args[:2] == ["podman", "run"] and args[-1] == README_TAG and "--name" in args
    name = args[args.index("--name") + 1]
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", 9835)) == 0:
            pytest.fail("port 9835 is in use on this machine: the README's command cannot be run as written")
    had = os.path.lexists("/run/teye")
    before = os.stat("/run/teye") if had else None
    podman("tag", image, README_TAG)
    podman("rm", "-f", name, check=False)
    try:
        if had:      # a fresh node has no /run/teye: make it so for the command, put it back afterwards
            os.rename("/run/teye", "/run/teye.container-test")
        for line in lines:      # each line as an admin pastes it, in order
            res = subprocess.run(shlex.split(line), capture_output=True, text=True, timeout=120, env=machine_conf)
            assert res.returncode == 0, f"{line}: {res.stderr}"
        body = _wait_for("http://127.0.0.1:9835/metrics", 'teye_filesystem_size_bytes{')
        time.sleep(6)                                            # every 5 s collector read at least twice
        body = http_get("http://127.0.0.1:9835/metrics")
        host_body = _wait_for(host.url + "/metrics", "teye_os_info{")
        ne_body = http_get(ne_url)
        running = podman("inspect", name, "--format", "{{.State.Running}}").stdout.strip()
        doctor = podman("exec", name, "teye", "doctor", "--procfs=/host/proc", "--sysfs=/host/sys",
                        "--path.rootfs=/host/root", "--cgroupfs=/host/sys/fs/cgroup", check=False, timeout=120)
        logs = podman("logs", name, check=False)
        st = os.stat("/run/teye")
    finally:
        podman("rm", "-f", "-t", "2", name, check=False)
        if os.path.isdir("/run/teye"):
            shutil.rmtree("/run/teye", ignore_errors=True)
        if had:
            os.rename("/run/teye.container-test", "/run/teye")
    assert running == "true", logs.stdout + logs.stderr
    assert (st.st_uid, st.st_gid) == (UID, UID)                  # the socket directory is the agent's
    _compare(body, host_body, ne_body)
    assert doctor.returncode == 0, doctor.stderr
    assert "host root: /host/root (--path.rootfs)" in doctor.stdout
    assert _doctor_cgroup_lines(doctor.stdout, "/host/sys/fs/cgroup") == _host_doctor()
    if had:
        assert os.stat("/run/teye").st_ino == before.st_ino


def _daemonset_run(tmp_path, port):
    """podman flags for the DaemonSet's hostPath volumes, config and arguments (the agent container)."""
    docs = list(yaml.safe_load_all(open(DAEMONSET, encoding="utf-8")))
    ds = next(d for d in docs if d and d.get("kind") == "DaemonSet")
    cm = next(d for d in docs if d and d.get("kind") == "ConfigMap")
    pod = ds["spec"]["template"]["spec"]
    (c,) = [c for c in pod["containers"] if c["name"] == "teye-agent"]
    vols = {v["name"]: v for v in pod["volumes"]}
    flags = []
    for m in c["volumeMounts"]:
        v = vols[m["name"]]
        if "hostPath" in v:
            src = v["hostPath"]["path"]
            if src == "/run/teye":                  # the node's socket directory: the init container's chown
                src = str(tmp_path / "run-teye")
                os.makedirs(src)
                os.chown(src, UID, UID)
            elif not os.path.exists(src):
                continue                            # a kubelet directory this machine has not
            opts = ["ro"] if m.get("readOnly") else []
            if m.get("mountPropagation") == "HostToContainer":
                opts.append("rslave")
            flags += ["-v", f"{src}:{m['mountPath']}" + (":" + ",".join(opts) if opts else "")]
        elif "configMap" in v:
            d = tmp_path / "config"
            d.mkdir()
            for k, text in cm["data"].items():
                (d / k).write_text(text)
                os.chmod(d / k, 0o644)
            flags += ["-v", f"{d}:{m['mountPath']}:ro"]
        elif "emptyDir" in v:
            flags += ["--tmpfs", m["mountPath"]]
    assert any(f.endswith(":/host/root:ro,rslave") for f in flags), flags
    args = [a if not a.startswith("--listen=") else f"--listen=127.0.0.1:{port}" for a in c["args"]]
    assert "--path.rootfs=/host/root" in args and "--cgroupfs=/host/sys/fs/cgroup" in args
    assert "--path.udev.data=/host/root/run/udev/data" in args   # the disks' properties under the host's /
    return flags + ["--read-only"], c["command"], args


def test_the_daemonsets_mounts_and_arguments_see_the_host(image, oracles, tmp_path):   # noqa: F811
    host, ne_url = oracles
    port = free_port()
    flags, command, args = _daemonset_run(tmp_path, port)
    name = f"teye-test-ds-{port}"
    podman("run", "-d", "--name", name, "--network", "host", "--pid", "host", "--user", f"{UID}:{UID}",
           *run_args(), *flags, "--entrypoint", command[0], image, *args)
    try:
        body = _wait_for(f"http://127.0.0.1:{port}/metrics", 'teye_filesystem_size_bytes{')
        time.sleep(6)
        body = http_get(f"http://127.0.0.1:{port}/metrics")
        host_body = _wait_for(host.url + "/metrics", "teye_os_info{")
        ne_body = http_get(ne_url)
    finally:
        logs = podman("logs", name, check=False)
        podman("rm", "-f", "-t", "2", name, check=False)
    assert 'teye_collector_up{collector="filesystem"} 1' in body, logs.stdout + logs.stderr
    _compare(body, host_body, ne_body)


def test_without_the_hosts_root_the_image_says_not_the_host_once(image, tmp_path):   # noqa: F811
    """The old command (no -v /:/host/root): one named state, no device error per mount point."""
    port = free_port()
    run_dir = tmp_path / "run-teye"
    run_dir.mkdir()
    os.chown(run_dir, UID, UID)
    name = f"teye-test-noroot-{port}"
    podman("run", "-d", "--name", name, "--network", "host", *run_args(), "-v", "/proc:/host/proc:ro",
           "-v", "/sys:/host/sys:ro", "-v", f"{run_dir}:/run/teye", image, "agent",
           f"--listen=127.0.0.1:{port}", "--procfs=/host/proc", "--sysfs=/host/sys", "--path.rootfs=/host/root",
           "--cgroupfs=/host/sys/fs/cgroup", "--phase-socket=/run/teye/phases.sock")
    try:
        body = _wait_for(f"http://127.0.0.1:{port}/metrics", "teye_filesystem_rootfs_state{")
        doctor = podman("exec", name, "teye", "doctor", "--procfs=/host/proc", "--sysfs=/host/sys",
                        "--path.rootfs=/host/root", check=False, timeout=120)
    finally:
        podman("rm", "-f", "-t", "2", name, check=False)
    got = _series(body, "teye_filesystem_rootfs_state", "state")
    assert got == {"host": 0, "missing": 1, "empty": 0}
    assert "teye_filesystem_device_error{" not in body
    assert 'teye_collector_up{collector="filesystem"} 1' in body
    assert "host root: /host/root does not exist: not the host" in doctor.stdout


def test_the_daemonsets_container_under_the_shipped_rules_fires_no_alert(image, tmp_path):   # noqa: F811
    """Issue 49: tests/deploy/test_fresh_agent_alerts.py's check against the image run with the DaemonSet's
    mounts and arguments (the host's / at /host/root, --path.rootfs, --cgroupfs): a real Prometheus scraping it
    every second with every shipped rule file, each ``for:`` divided by 60; after ~30 s no alert may have fired
    but those this machine itself confirms (its clock not synchronised, its saturation during the run).  Before
    the rootfs option, every mount point but / was a device error in the container: four
    TeyeFilesystemDeviceError alerts fired."""
    from tests.deploy.test_fresh_agent_alerts import CONFIRMED_BY_THE_MACHINE, MachineWatch, shortened_rules
    from tests.procs import Prometheus
    watch = MachineWatch()
    port = free_port()
    flags, command, args = _daemonset_run(tmp_path, port)
    name = f"teye-test-alerts-{port}"
    podman("run", "-d", "--name", name, "--network", "host", "--pid", "host", "--user", f"{UID}:{UID}",
           *run_args(), *flags, "--entrypoint", command[0], image, *args)
    prom = None
    try:
        _wait_for(f"http://127.0.0.1:{port}/metrics", "teye_build_info")
        (tmp_path / "prom").mkdir()
        prom = Prometheus(str(tmp_path / "prom"), targets=[f"127.0.0.1:{port}"],
                          rule_files=shortened_rules(tmp_path / "prom"))
        prom.wait_for('count_over_time(teye_build_info[1m]) >= 25', timeout=90)
        time.sleep(2.5)    # two more evaluations after the last of those scrapes
        alerts = [r for g in prom.api("rules")["groups"] for r in g["rules"] if r["type"] == "alerting"]
        assert len(alerts) >= 30 and [r["name"] for r in alerts if r.get("health") == "err"] == []
        end = time.time()
        firing = prom.api("query_range", query='ALERTS{alertstate="firing"}', start=end - 90, end=end,
                          step="1s")["result"]
        seen = {s["metric"]["alertname"] for s in firing}
        mounts = prom.api("query", query="count(teye_filesystem_size_bytes)")["result"]
        errors = prom.api("query", query="sum(teye_filesystem_device_error)")["result"]
        watch.stop()
    finally:
        watch.stop()
        if prom:
            prom.stop()
        logs = podman("logs", name, check=False)
        podman("rm", "-f", "-t", "2", name, check=False)
    # the check is not blind to the filesystems: the host's mounts are there, none in error
    assert float(mounts[0]["value"][1]) >= 1 and float(errors[0]["value"][1]) == 0, (mounts, errors)
    unexplained = {a for a in seen if not CONFIRMED_BY_THE_MACHINE.get(a, lambda w: False)(watch)}
    assert unexplained == set(), (sorted(seen), [s["metric"] for s in firing], logs.stdout[-2000:] + logs.stderr[-2000:])
