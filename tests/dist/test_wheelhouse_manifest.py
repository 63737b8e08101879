"""deploy/install.sh --from DIR installs exactly the wheelhouse's manifest (issue 36): pip gets a requirements
file of the listed wheels, each pinned by its sha256 (``--require-hashes --no-index``, no ``--find-links``), and
a wheelhouse with anything else in wheels/, or a manifest entry that points outside it, is refused before
anything is changed.  The script under test is this tree's deploy/install.sh, run for real against a copy of
the wheelhouse deploy/wheelhouse.sh built; the oracle is the file system (no venv, config or unit made) and
what pip reports installed."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import zipfile

import pytest

from tests.dist import wheelhouse as wh
from tests.procs import REPO

pytestmark = pytest.mark.e2e
INSTALL = os.path.join(REPO, "deploy", "install.sh")


def install_from(house, root):
    env = wh.clean_env(SYSTEMD_RUNTIME_DIR="/nonexistent-teye-probe/systemd",
                       NVIDIA_DRIVER_FILE="/nonexistent-teye-probe/nvidia")
    args = ["--from", str(house), "--no-user", "--prefix", str(root / "opt"), "--etc", str(root / "etc"),
            "--unit-dir", str(root / "units"), "--python", wh.BASE_PY]
    return subprocess.run(["bash", INSTALL, *args], capture_output=True, text=True, timeout=300, env=env)


def sha256(path):
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def retagged_teye(house, version, dest_dir):
    """A real, installable teye wheel of another version: the wheelhouse's teye with its metadata rewritten."""
    (orig,) = [w for w in os.listdir(os.path.join(house, "wheels")) if w.startswith("teye-")]
    old = orig.split("-")[1]
    name = orig.replace(f"teye-{old}-", f"teye-{version}-")
    src = zipfile.ZipFile(os.path.join(house, "wheels", orig))
    out = os.path.join(dest_dir, name)
    with zipfile.ZipFile(out, "w") as z:
        for item in src.infolist():
            data = src.read(item)
            fname = item.filename.replace(f"teye-{old}.dist-info", f"teye-{version}.dist-info")
            if fname.endswith(("METADATA", "RECORD")):
                data = data.replace(f"teye-{old}.dist-info".encode(), f"teye-{version}.dist-info".encode())
                data = data.replace(f"Version: {old}\n".encode(), f"Version: {version}\n".encode())
            z.writestr(fname, data)
    return out


def installed_version(root):
    """teye's version as pip's metadata has it (the wheel's, not a constant in the code)."""
    py = root / "opt" / "venv" / "bin" / "python"
    out = subprocess.run([str(py), "-I", "-c", "import importlib.metadata as m; print(m.version('teye'))"],
                         capture_output=True, text=True, env=wh.clean_env(), cwd=str(root))
    return out.stdout.strip()


def copy_house(house, dest):
    shutil.copytree(house, dest)
    return dest


def set_wheels(house, wheels):
    path = os.path.join(str(house), "teye-wheelhouse.json")
    with open(path) as fh:
        m = json.load(fh)
    m["wheels"] = wheels
    with open(path, "w") as fh:
        json.dump(m, fh)


def assert_nothing_changed(res, house, root, why):
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"teye-install: error: this wheelhouse does not fit this host: {why}" in res.stderr, res.stderr
    assert f"refusing {house}: nothing was changed" in res.stderr
    assert not root.exists()                                 # no venv, no config, no unit


def test_the_manifest_installs_pinned_and_exactly(house, tmp_path):
    res = install_from(house, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    py = tmp_path / "opt" / "venv" / "bin" / "python"
    frozen = subprocess.run([str(py), "-m", "pip", "list", "--format=json"], capture_output=True, text=True,
                            env=wh.clean_env(PIP_CONFIG_FILE=os.devnull))
    have = {p["name"].lower().replace("-", "_"): p["version"] for p in json.loads(frozen.stdout)}
    want = {w.split("-")[0].lower(): w.split("-")[1] for w in wh.manifest(house)["wheels"]}
    assert {k: have.get(k) for k in want} == want
    assert set(have) - set(want) <= {"pip", "setuptools", "wheel"}     # nothing else came in


def test_an_unlisted_newer_teye_wheel_is_refused_before_anything_changes(house, tmp_path):
    other = copy_house(house, tmp_path / "other")
    rogue = retagged_teye(str(other), "9.9.9", str(other / "wheels"))
    res = install_from(other, tmp_path / "root")
    assert_nothing_changed(res, other, tmp_path / "root",
                           f"wheels/{os.path.basename(rogue)} is not listed in teye-wheelhouse.json")


def test_a_listed_wheel_is_installed_by_its_pin_even_beside_a_newer_one_elsewhere(house, tmp_path):
    """The requirements file names each wheel's path and hash: a newer teye placed where --find-links would
    look (the wheels/ directory's parent, a second directory) changes nothing."""
    other = copy_house(house, tmp_path / "other")
    retagged_teye(str(other), "9.9.9", str(other))
    res = install_from(other, tmp_path / "root")
    assert res.returncode == 0, res.stderr
    assert installed_version(tmp_path / "root") == wh.manifest(house)["teye"]


@pytest.mark.parametrize("entry", ["../evil-1.0-py3-none-any.whl", "wheels/../../evil-1.0-py3-none-any.whl",
                                   "/tmp/evil-1.0-py3-none-any.whl", "..whl", "a..b-1.0-py3-none-any.whl",
                                   "evil-1.0-py3-none-any.tar.gz"])
def test_a_manifest_entry_outside_wheels_is_refused(house, tmp_path, entry):
    other = copy_house(house, tmp_path / "other")
    evil = retagged_teye(str(other), "9.9.9", str(other))            # a real wheel where '../' points, hash right
    m = wh.manifest(str(other))
    set_wheels(other, {**m["wheels"], entry: sha256(evil)})
    res = install_from(other, tmp_path / "root")
    assert_nothing_changed(res, other, tmp_path / "root",
                           f"its manifest lists {entry!r}, which is not a wheel file name in wheels/")


def test_a_symlinked_or_unhashed_listed_wheel_is_refused(house, tmp_path):
    other = copy_house(house, tmp_path / "other")
    (dep,) = [w for w in os.listdir(other / "wheels") if w.startswith("prometheus_client-")]
    outside = tmp_path / dep
    shutil.move(str(other / "wheels" / dep), outside)
    os.symlink(outside, other / "wheels" / dep)                     # same bytes, right hash, but a link
    res = install_from(other, tmp_path / "root")
    assert_nothing_changed(res, other, tmp_path / "root", f"wheels/{dep} is a symbolic link")
    os.unlink(other / "wheels" / dep)
    shutil.move(str(outside), other / "wheels" / dep)
    m = wh.manifest(str(other))
    set_wheels(other, {**m["wheels"], dep: ""})
    res = install_from(other, tmp_path / "root")
    assert_nothing_changed(res, other, tmp_path / "root", f"its manifest gives wheels/{dep} no sha256 ('')")


def test_a_wheel_added_after_the_check_is_not_taken(house, tmp_path):
    """The window between the check and pip: an interpreter wrapper drops a newer teye into wheels/ when
    install.sh creates the venv (after the check, before pip).  pip installs what was pinned, not it."""
    other = copy_house(house, tmp_path / "other")
    stash = tmp_path / "stash"
    stash.mkdir()
    rogue = retagged_teye(str(other), "9.9.9", str(stash))
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f'#!/bin/sh\n[ "$1 $2" = "-m venv" ] && cp {rogue} {other / "wheels"}/\n'
                       f'exec {wh.BASE_PY} "$@"\n')
    os.chmod(wrapper, 0o755)
    env = wh.clean_env(SYSTEMD_RUNTIME_DIR="/nonexistent-teye-probe/systemd",
                       NVIDIA_DRIVER_FILE="/nonexistent-teye-probe/nvidia")
    root = tmp_path / "root"
    res = subprocess.run(["bash", INSTALL, "--from", str(other), "--no-user", "--prefix", str(root / "opt"),
                          "--etc", str(root / "etc"), "--unit-dir", str(root / "units"), "--python", str(wrapper)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert os.path.exists(other / "wheels" / os.path.basename(rogue))    # it was there when pip ran
    assert installed_version(root) == wh.manifest(house)["teye"]
