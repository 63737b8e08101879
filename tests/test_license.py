"""The LICENSE file the package metadata and the image label claim (issue 40): Apache-2.0, full text."""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys

import pytest

from tests.procs import REPO

LICENSE = os.path.join(REPO, "LICENSE")
DEBIAN = "/usr/share/common-licenses/Apache-2.0"   # the distribution's own copy: an independent oracle


def text() -> str:
    with open(LICENSE, encoding="utf-8") as fh:
        return fh.read()


def test_license_is_the_full_apache_2_0_text():
    t = text()
    assert "Apache License\n" in t and "Version 2.0, January 2004" in t
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in t and "END OF TERMS AND CONDITIONS" in t
    # all nine sections, in order
    found = [int(n) for n in re.findall(r"^\s+(\d)\. [A-Z][a-z]", t, re.M)]
    assert found == list(range(1, 10)), found
    assert "APPENDIX: How to apply the Apache License to your work." in t


def test_license_matches_the_distributions_copy():
    if not os.path.exists(DEBIAN):
        pytest.skip(f"{DEBIAN} not on this machine (Debian's base-files ships it)")
    with open(DEBIAN, "rb") as a, open(LICENSE, "rb") as b:
        assert hashlib.sha256(a.read()).hexdigest() == hashlib.sha256(b.read()).hexdigest()


def test_package_metadata_and_image_label_say_apache_2_0_and_ship_the_file(tmp_path):
    with open(os.path.join(REPO, "pyproject.toml"), encoding="utf-8") as fh:
        py = fh.read()
    assert re.search(r'^license = "Apache-2.0"$', py, re.M)     # (setuptools picks LICENSE up by its name)
    with open(os.path.join(REPO, "deploy", "image", "build.sh"), encoding="utf-8") as fh:
        assert "org.opencontainers.image.licenses=Apache-2.0" in fh.read()
    # the wheel's metadata (setuptools, the project's build backend) names the file and carries it
    code = ("import sys, setuptools.build_meta as b; print(b.prepare_metadata_for_build_wheel(sys.argv[1]))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    dist = tmp_path / out.stdout.strip().splitlines()[-1]
    meta = (dist / "METADATA").read_text()
    assert "License-Expression: Apache-2.0" in meta and "License-File: LICENSE" in meta
    assert (dist / "licenses" / "LICENSE").read_text() == text()
