"""deploy/install.sh --from DIR: a node installed from the wheelhouse alone, and a wheelhouse for another
platform or Python refused before anything is changed."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from tests.dist import wheelhouse as wh

pytestmark = pytest.mark.e2e


def install_from(house, root, check=True):
    env = wh.clean_env(SYSTEMD_RUNTIME_DIR="/nonexistent-teye-probe/systemd",
                       NVIDIA_DRIVER_FILE="/nonexistent-teye-probe/nvidia")
    args = ["--from", str(house), "--no-user", "--prefix", str(root / "opt"), "--etc", str(root / "etc"),
            "--unit-dir", str(root / "units"), "--python", wh.BASE_PY]
    res = subprocess.run(["bash", os.path.join(str(house), "deploy", "install.sh"), *args], capture_output=True,
                         text=True, timeout=300, env=env)
    if check:
        assert res.returncode == 0, res.stdout + res.stderr
    return res


def copy_house(house, dest):
    shutil.copytree(house, dest)
    return dest


def edit_manifest(house, **changes):
    path = os.path.join(str(house), "teye-wheelhouse.json")
    with open(path) as fh:
        m = json.load(fh)
    m.update(changes)
    with open(path, "w") as fh:
        json.dump(m, fh)


def test_install_from_the_wheelhouse_alone(house, tmp_path):
    res = install_from(house, tmp_path)
    assert f"wheelhouse {house} fits this host (teye 0.1.0)" in res.stdout
    teye = tmp_path / "opt" / "venv" / "bin" / "teye"
    out = subprocess.run([str(teye), "--version"], capture_output=True, text=True, env=wh.clean_env())
    assert (out.returncode, out.stdout) == (0, "teye 0.1.0\n")
    # what pip installed is exactly the wheelhouse's teye and dependencies
    frozen = subprocess.run([str(teye.parent / "python"), "-m", "pip", "list", "--format=json"],
                            capture_output=True, text=True, env=wh.clean_env(PIP_CONFIG_FILE=os.devnull))
    have = {p["name"].lower().replace("-", "_"): p["version"] for p in json.loads(frozen.stdout)}
    for wheel in wh.manifest(house)["wheels"]:
        name, version = wheel.split("-")[:2]
        assert have.get(name.lower()) == version, wheel
    assert (tmp_path / "etc" / "teye.yml").is_file() and (tmp_path / "units" / "teye-agent.service").is_file()
    assert (tmp_path / "opt" / "site" / "sitecustomize.py").is_file()


@pytest.mark.parametrize("change, message", [
    ({"python": "cp39", "python_version": "3.9"}, "it was built for cpython 3.9 (cp39)"),
    ({"machine": "aarch64"}, "it was built for aarch64 machines, and this one is x86_64"),
    ({"glibc": "9.99"}, "it needs glibc 9.99 or newer"),
])
def test_a_wheelhouse_for_another_platform_or_python_is_refused_with_nothing_changed(house, tmp_path, change,
                                                                                    message):
    other = copy_house(house, tmp_path / "other")
    edit_manifest(other, **change)
    res = install_from(other, tmp_path / "root", check=False)
    assert res.returncode == 1
    assert "this wheelhouse does not fit this host: " + message in res.stderr, res.stderr
    assert f"refusing {other}: nothing was changed" in res.stderr
    assert not (tmp_path / "root").exists()                 # no venv, no config, no unit


def test_a_damaged_wheel_is_refused(house, tmp_path):
    other = copy_house(house, tmp_path / "other")
    (name,) = [w for w in os.listdir(other / "wheels") if w.startswith("prometheus_client-")]
    with open(other / "wheels" / name, "ab") as fh:
        fh.write(b"x")
    res = install_from(other, tmp_path / "root", check=False)
    assert res.returncode == 1 and f"wheels/{name} is damaged" in res.stderr
    assert not (tmp_path / "root").exists()


def test_a_wheel_whose_tag_does_not_fit_is_refused_by_pip_and_the_new_venv_removed(house, tmp_path):
    """The manifest says this Python, but the teye wheel is tagged for another: pip's own tag check (a dry
    run) refuses it, and the venv just created is removed again."""
    other = copy_house(house, tmp_path / "other")
    (teye,) = [w for w in os.listdir(other / "wheels") if w.startswith("teye-")]
    retagged = teye.replace("py3-none-any", "cp27-cp27mu-linux_x86_64")   # (teye is pure Python: issue 38)
    assert retagged != teye
    os.rename(other / "wheels" / teye, other / "wheels" / retagged)
    m = wh.manifest(str(other))
    m["wheels"][retagged] = m["wheels"].pop(teye)
    edit_manifest(other, wheels=m["wheels"])
    res = install_from(other, tmp_path / "root", check=False)
    assert res.returncode == 1
    assert f"pip finds no installable teye in {other} for this Python and platform; nothing was changed" \
        in res.stderr, res.stderr
    assert not (tmp_path / "root" / "opt").exists() and not (tmp_path / "root" / "etc").exists()


def test_a_directory_that_is_not_a_wheelhouse(tmp_path, house):
    res = subprocess.run(
        ["bash", os.path.join(str(house), "deploy", "install.sh"), "--from", str(tmp_path), "--no-user",
         "--prefix", str(tmp_path / "p"), "--etc", str(tmp_path / "e"), "--unit-dir", str(tmp_path / "u")],
        capture_output=True, text=True, env=wh.clean_env(SYSTEMD_RUNTIME_DIR="/nonexistent"))
    assert res.returncode == 1
    assert f"{tmp_path} is not a teye wheelhouse (teye-wheelhouse.json missing; build one with ./dev.sh dist)" \
        in res.stderr
    assert not (tmp_path / "p").exists()
