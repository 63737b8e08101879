"""uname and os-release: this machine against coreutils' uname and the shell's own reading of os-release,
and fixture files for the formats os-release(5) allows and the ones it does not."""
from __future__ import annotations

import os
import subprocess

import pytest
from prometheus_client import generate_latest

from agent.errors import ParseError
from agent.sampler import Sampler
from agent.sources.osinfo import MAX_OS_RELEASE, OsInfoSource, parse_os_release
from exporters.prometheus import make_registry
from tests.conftest import parse_exposition


def _labels(src, name):
    s = Sampler({"os": (src, 60.0)})
    st = s.read_once("os")
    assert st.up, st.error
    out = parse_exposition(generate_latest(make_registry(lambda: s.snapshot)).decode())
    rows = [dict(l) for (n, l), v in out.items() if n == name and v == 1]
    assert len(rows) <= 1
    return rows[0] if rows else None


def _values(src, name):
    s = Sampler({"os": (src, 60.0)})
    assert s.read_once("os").up
    out = parse_exposition(generate_latest(make_registry(lambda: s.snapshot)).decode())
    return {tuple(v for _, v in sorted(l, key=lambda kv: ("id", "id_like", "name").index(kv[0]))): val
            for (n, l), val in out.items() if n == name}


def test_os_version_equals_node_exporters_golden_output(node_exporter_golden):
    """node_exporter's fixture os-release (Ubuntu 20.04) and its golden node_os_version."""
    from tests.conftest import NODE_EXPORTER
    gold = {tuple(v for _, v in sorted(l, key=lambda kv: ("id", "id_like", "name").index(kv[0]))): val
            for (n, l), val in node_exporter_golden.items() if n == "node_os_version"}
    assert _values(OsInfoSource("/proc", rootfs=NODE_EXPORTER), "teye_os_version") == gold == \
        {("ubuntu", "debian", "Ubuntu"): 20.04}


def test_uname_equals_coreutils():
    got = _labels(OsInfoSource("/proc"), "teye_uname_info")
    u = lambda flag: subprocess.run(["uname", flag], capture_output=True, text=True, check=True).stdout.strip()  # noqa
    assert (got["sysname"], got["release"], got["version"], got["machine"], got["nodename"]) == \
        (u("-s"), u("-r"), u("-v"), u("-m"), u("-n"))
    with open("/proc/sys/kernel/domainname") as fh:
        assert got["domainname"] == fh.read().strip()


def test_os_release_equals_the_shells_reading():
    """os-release(5) is shell-compatible: the oracle is sh sourcing the same file."""
    path = "/etc/os-release" if os.path.exists("/etc/os-release") else "/usr/lib/os-release"
    sh = subprocess.run(["sh", "-c", f'. {path}; printf "%s\\n" "$ID" "$NAME" "$PRETTY_NAME" "$VERSION_ID"'],
                        capture_output=True, text=True, check=True).stdout.splitlines()
    got = _labels(OsInfoSource("/proc"), "teye_os_info")
    assert [got["id"], got["name"], got["pretty_name"], got["version_id"]] == sh


def test_quoting_comments_and_the_usr_lib_fallback(tmp_path):
    (tmp_path / "usr" / "lib").mkdir(parents=True)
    (tmp_path / "usr" / "lib" / "os-release").write_text(
        '# a comment\n\nNAME="Rocky Linux"\nID=rocky\nID_LIKE="rhel centos fedora"\nVERSION_ID=\'9.4\'\n'
        'PRETTY_NAME="Rocky \\"Blue\\" Onyx"\nUNKNOWN_KEY=x\n')
    src = OsInfoSource("/proc", rootfs=str(tmp_path))
    got = _labels(src, "teye_os_info")
    assert got == {"id": "rocky", "id_like": "rhel centos fedora", "name": "Rocky Linux",
                   "pretty_name": 'Rocky \\"Blue\\" Onyx',  # as the exposition escapes it
                   "version": "", "version_id": "9.4", "version_codename": "",
                   # node_exporter 1.5's other os-release labels, empty where the file has none
                   "build_id": "", "image_id": "", "image_version": "", "variant": "", "variant_id": ""}
    assert src.collect().release["PRETTY_NAME"] == 'Rocky "Blue" Onyx'
    assert _values(src, "teye_os_version") == {("rocky", "rhel centos fedora", "Rocky Linux"): 9.4}



def test_no_os_release_exports_uname_alone(tmp_path):
    assert _labels(OsInfoSource("/proc", rootfs=str(tmp_path)), "teye_os_info") is None
    assert _labels(OsInfoSource("/proc", rootfs=str(tmp_path)), "teye_uname_info")["sysname"] == "Linux"


@pytest.mark.parametrize("text,why", [
    ("ID debian\n", "expected KEY=value"),
    ('NAME="unterminated\n', "No closing quotation"),
    ("BAD-KEY=1\n", "expected KEY=value"),
])
def test_garbled_os_release_is_a_parse_error(text, why):
    with pytest.raises(ParseError, match=why):
        parse_os_release(text, "os-release")


def test_an_oversized_os_release_is_refused_and_only_that_collector_is_down(tmp_path):
    (tmp_path / "etc").mkdir()
    with open(tmp_path / "etc" / "os-release", "w") as fh:
        fh.write("ID=x\n" + "#" * MAX_OS_RELEASE + "\n")
    s = Sampler({"os": (OsInfoSource("/proc", rootfs=str(tmp_path)), 60.0)})
    st = s.read_once("os")
    assert not st.up and "larger than 65536 bytes" in st.error


def test_label_values_are_cut_to_256_characters(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "os-release").write_text("ID=x\nPRETTY_NAME=" + "a" * 1000 + "\n")
    got = _labels(OsInfoSource("/proc", rootfs=str(tmp_path)), "teye_os_info")
    assert got["pretty_name"] == "a" * 256
