"""deploy/install.sh, run for real into a temporary prefix (no user, no systemctl: this machine is untouched).

One real install (venv + pip from this repository) is shared by the module; the rest
runs install.sh again (idempotency, uninstall) or in --dry-run mode (root paths,
user creation, systemctl calls), with the systemd / NVIDIA probes pointed at
temporary paths to simulate hosts with and without them.

The installs use a fresh interpreter environment that has only what `venv` and `ensurepip`
give (no `wheel`), as a new Debian node has: the result must not depend on this host's
Python packages.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.freshpy import fresh_python
from tests.procs import REPO

SCRIPT = os.path.join(REPO, "deploy", "install.sh")


def run_install(*args, systemd=False, nvidia=False, probe_dir="/nonexistent-teye-probe", check=True):
    env = dict(os.environ)
    env["SYSTEMD_RUNTIME_DIR"] = probe_dir if systemd else "/nonexistent-teye-probe/systemd"
    env["NVIDIA_DRIVER_FILE"] = os.path.join(probe_dir, "version") if nvidia else "/nonexistent-teye-probe/nvidia"
    # What an admin's shell may carry: pip's (inverted) switch that turns build isolation off, which
    # made builds use the host's own setuptools and fail without `wheel`. The installer must ignore it.
    env["PIP_NO_BUILD_ISOLATION"] = "0"
    res = subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, env=env, timeout=300)
    if check:
        assert res.returncode == 0, res.stdout + res.stderr
    return res


def source_copy(dest):
    """The installable part of the repository (pip builds in the source tree: keep build/ out of it)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info", ".*")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        if os.path.exists(os.path.join(REPO, name)):
            shutil.copy(os.path.join(REPO, name), dest / name)
    for name in ("teye", "agent", "exporters", "dashboards", "workloads", "deploy", "teye_client"):
        if os.path.isdir(os.path.join(REPO, name)):
            shutil.copytree(os.path.join(REPO, name), dest / name, ignore=ignore)
    return dest


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """An interpreter environment with only venv + ensurepip (pip, setuptools; no wheel)."""
    return fresh_python(tmp_path_factory.mktemp("fresh-python"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory, fresh):
    root = tmp_path_factory.mktemp("root")
    src = source_copy(tmp_path_factory.mktemp("src"))
    paths = {"prefix": root / "opt" / "teye", "etc": root / "etc" / "teye", "units": root / "etc" / "systemd",
             "src": src}
    args = ["--no-user", "--prefix", str(paths["prefix"]), "--etc", str(paths["etc"]), "--unit-dir",
            str(paths["units"]), "--python", fresh, "--source", str(src)]
    first = run_install(*args)
    return paths, args, first


def test_syntax():
    assert subprocess.run(["bash", "-n", SCRIPT]).returncode == 0


def test_install_creates_venv_config_and_unit(installed):
    paths, _, res = installed
    teye = paths["prefix"] / "venv" / "bin" / "teye"
    out = subprocess.run([str(teye), "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("teye ")
    # config from the example with the built-in collector defaults: no NVIDIA driver on this host, yet the GPU
    # collector is neither turned off nor turned on explicitly (it reports itself absent, which does not alert)
    cfg_path = paths["etc"] / "teye.yml"
    from agent.config import load
    explicit: set = set()
    cfg = load(str(cfg_path), explicit=explicit)
    assert cfg["collectors"]["gpu"]["enabled"] is True and explicit == set()
    assert cfg["collectors"]["nfsd"]["enabled"] is False
    assert cfg["phases"]["socket"] == "/run/teye/phases.sock"
    assert "no NVIDIA driver found" in res.stdout
    # systemd absent: the unit is installed, not enabled, and the manual command is given
    assert "systemd is not running on this host" in res.stdout
    assert f"start the agent by hand: {teye} agent --config {cfg_path}" in res.stdout
    unit = (paths["units"] / "teye-agent.service").read_text()
    assert f"ExecStart={teye} agent --config {cfg_path}\n" in unit
    shipped = open(os.path.join(REPO, "deploy", "systemd", "teye-agent.service")).read()
    assert unit.replace(f"ExecStart={teye} agent --config {cfg_path}",
                        "ExecStart=/opt/teye/venv/bin/teye agent --config /etc/teye/teye.yml") == shipped


def test_zero_code_site_is_installed_read_only_and_loads(installed, tmp_path):
    """The directory a TaskProlog puts on PYTHONPATH: root's, not writable by others, byte-compiled, and it
    loads the teye_client beside it (not a user's, not the venv's) in a Python without teye installed."""
    paths, _, res = installed
    site = paths["prefix"] / "site"
    assert (site / "sitecustomize.py").is_file() and (site / "teye_client" / "auto.py").is_file()
    assert list((site / "teye_client" / "__pycache__").glob("auto.*.pyc"))
    for p in [site, *site.rglob("*")]:
        assert not p.stat().st_mode & 0o022, p
    (tmp_path / "teye_client").mkdir()  # a stray package of the same name later on the path is not used
    (tmp_path / "teye_client" / "__init__.py").write_text("raise SystemExit('wrong teye_client')\n")
    out = subprocess.run([sys.executable, "-c", "import sys; print(sys.modules['teye_client.auto'].__file__)"],
                         env={"PATH": os.environ["PATH"], "PYTHONPATH": f"{site}:{tmp_path}"},
                         capture_output=True, text=True, cwd=str(tmp_path))
    assert (out.returncode, out.stdout, out.stderr) == (0, f"{site}/teye_client/auto.py\n", "")
    assert f"installed {site}" in res.stdout
    # the venv's own copy, the one `teye run` uses: the wheel carries the hook directory
    (hook,) = (paths["prefix"] / "venv").glob("lib/python*/site-packages/teye_client/_site/sitecustomize.py")
    assert hook.read_text() == open(os.path.join(REPO, "teye_client", "_site", "sitecustomize.py")).read()


def test_fresh_python_lacks_wheel(fresh):
    """The premise of this module: the interpreter the installer is given has no `wheel`."""
    res = subprocess.run([fresh, "-c", "import wheel"], capture_output=True, text=True)
    assert res.returncode != 0 and "No module named 'wheel'" in res.stderr


def test_installed_package_carries_the_spdx_license(installed):
    paths, _, _ = installed
    py = str(paths["prefix"] / "venv" / "bin" / "python")
    meta = subprocess.run([py, "-c", "import importlib.metadata as m; d = m.metadata('teye'); "
                           "print(d['Metadata-Version'], d['License-Expression'], d.get('License'))"],
                          capture_output=True, text=True, check=True, cwd=str(paths["prefix"])).stdout
    assert meta.split() == ["2.4", "Apache-2.0", "None"]   # the SPDX field, no legacy License text


def test_editable_install_on_a_fresh_interpreter(fresh, tmp_path):
    """What ./dev.sh does (pip install -e) works with an interpreter lacking wheel, without a deprecation banner."""
    (tmp_path / "src").mkdir()
    src = source_copy(tmp_path / "src")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    res = subprocess.run([fresh, "-m", "pip", "install", "-v", "--no-deps", "--disable-pip-version-check",
                          "-e", str(src)], capture_output=True, text=True, env=env, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "project.license" not in out and "SetuptoolsDeprecationWarning" not in out, out[-3000:]
    # the launcher runs the checkout's own packages (teye.isolate() puts the checkout first)
    run_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    where = subprocess.run([fresh, "-c", "import teye, importlib.metadata as m; teye.isolate(); import agent; "
                            "print(agent.__file__); print(m.version('teye'))"],
                           capture_output=True, text=True, cwd=str(tmp_path), env=run_env)
    assert where.returncode == 0, where.stderr
    file, version = where.stdout.split()
    assert file == str(src / "agent" / "__init__.py") and version == "0.1.0"
    with open(os.path.join(os.path.dirname(fresh), "teye")) as fh:   # the console script is the launcher
        assert "from teye import main" in fh.read()


def test_installed_unit_verifies_clean(installed):
    """The unit as install.sh writes it, with its real ExecStart binary: systemd-analyze verify is silent."""
    paths, _, _ = installed
    res = subprocess.run([shutil.which("systemd-analyze"), "verify", str(paths["units"] / "teye-agent.service")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and not (res.stdout + res.stderr).strip(), res.stdout + res.stderr


def test_installed_agent_validates_its_config(installed):
    paths, _, _ = installed
    teye = str(paths["prefix"] / "venv" / "bin" / "teye")
    bad = paths["etc"].parent / "bad.yml"
    bad.write_text("collectors:\n  gpu:\n    enabled: maybe\n")
    res = subprocess.run([teye, "agent", "--config", str(bad)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "collectors.gpu.enabled" in res.stderr


def test_second_run_is_idempotent_and_keeps_the_admins_config(installed):
    paths, args, _ = installed
    cfg = paths["etc"] / "teye.yml"
    edited = cfg.read_text().replace("log_level: info", "log_level: debug")
    cfg.write_text(edited)
    unit_before = (paths["units"] / "teye-agent.service").read_text()
    res = run_install(*args)
    assert cfg.read_text() == edited                              # never overwritten
    assert (paths["etc"] / "teye.yml.example").read_text() == \
        open(os.path.join(REPO, "deploy", "teye.example.yml")).read()
    assert "reusing venv" in res.stdout and "is up to date" in res.stdout
    assert (paths["units"] / "teye-agent.service").read_text() == unit_before
    assert sorted(os.listdir(paths["units"])) == ["teye-agent.service"]


def test_uninstall_removes_service_and_venv_keeps_config_then_purge(installed, tmp_path):
    paths, args, _ = installed
    # work on a copy so the module fixture stays usable for the other tests
    root = tmp_path / "copy"
    shutil.copytree(paths["etc"].parent.parent, root, symlinks=True)
    etc, units, prefix = root / "etc" / "teye", root / "etc" / "systemd", root / "opt" / "teye"
    common = ["--no-user", "--prefix", str(prefix), "--etc", str(etc), "--unit-dir", str(units)]
    res = run_install("--uninstall", *common)
    assert not (units / "teye-agent.service").exists() and not prefix.exists()
    assert (etc / "teye.yml").exists()
    assert "kept the configuration" in res.stdout
    res = run_install("--uninstall", "--purge", *common)
    assert not etc.exists()
    assert "teye uninstalled" in res.stdout


def test_dry_run_on_a_systemd_gpu_host_plans_user_venv_unit_and_service(tmp_path):
    (tmp_path / "version").write_text("NVRM version: 550.54.15\n")   # a fake NVIDIA driver probe
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "systemctl").write_text("#!/bin/sh\nexit 0\n")       # present, but only printed
    (fake_bin / "systemctl").chmod(0o755)
    env_path = f"{fake_bin}:{os.environ['PATH']}"
    env = {**os.environ, "PATH": env_path, "SYSTEMD_RUNTIME_DIR": str(tmp_path),
           "NVIDIA_DRIVER_FILE": str(tmp_path / "version")}
    watched = ["/opt/teye", "/etc/teye", "/etc/systemd/system/teye-agent.service"]
    before = [os.path.exists(p) for p in watched]
    res = subprocess.run(["bash", SCRIPT, "--dry-run"], capture_output=True, text=True, env=env, timeout=60)
    assert [os.path.exists(p) for p in watched] == before   # a dry run changes nothing
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "no NVIDIA driver" not in out and "systemd is not running" not in out
    expected = [
        "would run: useradd --system --user-group --no-create-home --home-dir /nonexistent "
        "--shell /usr/sbin/nologin --comment teye\\ monitoring\\ agent teye",
        "would run: python3 -m venv /opt/teye/venv",
        f"would run: /opt/teye/venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade {REPO}",
        f"would run: install -m 0644 {REPO}/deploy/teye.example.yml /etc/teye/teye.yml",
        "(dry run) would write /etc/systemd/system/teye-agent.service "
        "(ExecStart=/opt/teye/venv/bin/teye agent --config /etc/teye/teye.yml)",
        "would run: systemctl daemon-reload",
        "would run: systemctl enable teye-agent.service",
        "would run: systemctl restart teye-agent.service",
    ]
    pos = [out.find(line) for line in expected]
    assert all(p >= 0 for p in pos), [l for l, p in zip(expected, pos) if p < 0]
    assert pos == sorted(pos)                     # in this order
    assert "sed -i" not in out                    # GPU present: the GPU collector stays on


def test_bad_option_and_missing_source_are_clear_errors(tmp_path):
    res = run_install("--frobnicate", check=False)
    assert res.returncode == 1 and "unknown option --frobnicate" in res.stderr
    res = run_install("--no-user", "--source", str(tmp_path), "--prefix", str(tmp_path / "p"), "--etc",
                      str(tmp_path / "e"), "--unit-dir", str(tmp_path / "u"), check=False)
    assert res.returncode == 1 and f"no teye source tree at {tmp_path}" in res.stderr
    assert not (tmp_path / "p").exists()
