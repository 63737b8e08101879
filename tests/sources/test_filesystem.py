"""The filesystem collector: the real root filesystem against coreutils' df, fixture mountinfo with statvfs
faked at its one door, a network mount whose server is gone, and 5,000 mount points."""
from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest
from prometheus_client import generate_latest

from agent.errors import ParseError
from agent.sampler import Sampler
from agent.sources import filesystem as fs
from agent.sources.filesystem import FilesystemSource, parse_mountinfo
from exporters.prometheus import make_registry
from tests.conftest import PROCFS, parse_exposition


class V:
    """An os.statvfs_result's fields."""

    def __init__(self, blocks, bfree, bavail, files, ffree, frsize=4096, flag=0):
        self.f_blocks, self.f_bfree, self.f_bavail = blocks, bfree, bavail
        self.f_files, self.f_ffree, self.f_frsize, self.f_bsize, self.f_flag = files, ffree, frsize, frsize, flag


def _exposition(src):
    s = Sampler({"filesystem": (src, 5.0)})
    st = s.read_once("filesystem")
    return st, parse_exposition(generate_latest(make_registry(lambda: s.snapshot)).decode())


def _by_mount(out, name):
    return {dict(l)["mountpoint"]: v for (n, l), v in out.items() if n == name}


def test_root_filesystem_equals_df():
    """The oracle is coreutils' df on the same mount point (its own statfs call, its own arithmetic)."""
    st, out = _exposition(FilesystemSource("/proc"))
    assert st.up, st.error
    df = subprocess.run(["df", "-B1", "--output=size,avail,itotal,iavail", "/"], capture_output=True, text=True,
                        check=True).stdout.splitlines()[1].split()
    size, avail, itotal, iavail = map(int, df)
    assert _by_mount(out, "teye_filesystem_size_bytes")["/"] == size
    assert _by_mount(out, "teye_filesystem_files")["/"] == itotal
    # other processes write while the test runs: free space and inodes move a little between the two calls
    assert abs(_by_mount(out, "teye_filesystem_avail_bytes")["/"] - avail) < 2 * 2**30
    assert abs(_by_mount(out, "teye_filesystem_files_free")["/"] - iavail) < 100_000
    assert _by_mount(out, "teye_filesystem_readonly")["/"] == 0
    assert _by_mount(out, "teye_filesystem_device_error")["/"] == 0
    # pseudo filesystems are not exported (node_exporter's defaults)
    assert not any(m.startswith(("/proc", "/sys", "/dev")) for m in _by_mount(out, "teye_filesystem_device_error"))


def test_fixture_mounts_with_statvfs_scripted():
    """node_exporter's captured mountinfo: / (ext4) and an NFS mount are exported, /sys, /proc and rootfs not;
    sizes are f_blocks × f_frsize etc.; the NFS mount is statted in a thread of its own."""
    calls = []

    def statvfs(path):
        calls.append((path, threading.current_thread().name))
        if path == "/":
            return V(1000, 400, 300, 50, 20)
        if path == "/mnt/nfs/test":
            return V(10, 5, 5, 7, 3, frsize=1 << 20, flag=os.ST_RDONLY)
        if path == "/mnt/nfs/test-dupe":
            return V(2, 1, 1, 1, 1)
        raise AssertionError(f"statvfs of an excluded mount {path}")

    st, out = _exposition(FilesystemSource(PROCFS, statvfs=statvfs))
    assert st.up, st.error
    assert _by_mount(out, "teye_filesystem_size_bytes") == {"/": 4096000, "/mnt/nfs/test": 10 << 20,
                                                            "/mnt/nfs/test-dupe": 8192}
    assert _by_mount(out, "teye_filesystem_free_bytes") == {"/": 1638400, "/mnt/nfs/test": 5 << 20,
                                                            "/mnt/nfs/test-dupe": 4096}
    assert _by_mount(out, "teye_filesystem_avail_bytes") == {"/": 1228800, "/mnt/nfs/test": 5 << 20,
                                                             "/mnt/nfs/test-dupe": 4096}
    assert _by_mount(out, "teye_filesystem_files") == {"/": 50, "/mnt/nfs/test": 7, "/mnt/nfs/test-dupe": 1}
    assert _by_mount(out, "teye_filesystem_files_free") == {"/": 20, "/mnt/nfs/test": 3, "/mnt/nfs/test-dupe": 1}
    assert _by_mount(out, "teye_filesystem_readonly") == {"/": 0, "/mnt/nfs/test": 1, "/mnt/nfs/test-dupe": 0}
    assert set(_by_mount(out, "teye_filesystem_device_error").values()) == {0}
    labels = {dict(l)["mountpoint"]: dict(l) for (n, l), _ in out.items() if n == "teye_filesystem_size_bytes"}
    assert labels["/"] == {"device": "/dev/sda1", "fstype": "ext4", "mountpoint": "/"}
    assert labels["/mnt/nfs/test"]["device"] == "192.168.1.1:/srv/test" and labels["/mnt/nfs/test"]["fstype"] == "nfs4"
    assert labels["/mnt/nfs/test-dupe"]["fstype"] == "nfs"  # mounted twice: the later (visible) mount
    threads = dict(calls)
    assert threads["/"] != "teye-statvfs" and threads["/mnt/nfs/test"] == "teye-statvfs"


def _mountinfo(tmp_path, lines):
    (tmp_path / "1").mkdir(exist_ok=True)
    (tmp_path / "1" / "mountinfo").write_text("".join(lines))
    return str(tmp_path)


@pytest.mark.measures("a timed assertion: the pass is not held by the hung mount")
def test_a_network_mount_that_hangs_never_holds_the_pass_and_is_not_piled_up(tmp_path):
    procfs = _mountinfo(tmp_path, [
        "21 0 8:1 / / rw - ext4 /dev/sda1 rw\n",
        "30 21 0:42 / /mnt/gone rw - nfs4 srv:/gone rw\n",
        "31 21 0:43 / /scratch rw - xfs /dev/sdb rw\n"])
    release, calls = threading.Event(), []

    def statvfs(path):
        calls.append(path)
        if path == "/mnt/gone":
            release.wait(30)  # the server is gone: a hard mount blocks here
        return V(100, 50, 40, 10, 5)

    src = FilesystemSource(procfs, statvfs=statvfs, timeout_s=0.2)
    try:
        t0 = time.monotonic()
        r = src.collect()
        assert time.monotonic() - t0 < 2
        got = {m.mountpoint: s for m, s in r.mounts}
        assert got["/mnt/gone"] is None and got["/"].size == 409600 and got["/scratch"].size == 409600
        pts = {(p.spec.name, p.labels[2]): p.value for p in r.points() if p.labels}
        assert pts[("teye_filesystem_device_error", "/mnt/gone")] == 1
        assert ("teye_filesystem_size_bytes", "/mnt/gone") not in pts
        assert pts[("teye_filesystem_device_error", "/scratch")] == 0
        # the next passes do not start another call while the first has not returned
        src.collect()
        src.collect()
        assert calls.count("/mnt/gone") == 1 and src.stuck() == ["/mnt/gone"]
    finally:
        release.set()
    deadline = time.monotonic() + 5
    while src.stuck() and time.monotonic() < deadline:
        time.sleep(0.01)
    r = src.collect()  # the server is back: sizes again
    assert {m.mountpoint: s for m, s in r.mounts}["/mnt/gone"].size == 409600 and calls.count("/mnt/gone") == 2


def test_a_failing_statvfs_is_a_device_error_for_that_mount_alone(tmp_path):
    procfs = _mountinfo(tmp_path, ["21 0 8:1 / / rw - ext4 /dev/sda1 rw\n",
                                   "31 21 0:43 / /broken rw - xfs /dev/sdb rw\n"])

    def statvfs(path):
        if path == "/broken":
            raise OSError(5, "Input/output error")
        return V(100, 50, 40, 10, 5)

    st, out = _exposition(FilesystemSource(procfs, statvfs=statvfs))
    assert st.up
    assert _by_mount(out, "teye_filesystem_device_error") == {"/": 0, "/broken": 1}
    assert set(_by_mount(out, "teye_filesystem_size_bytes")) == {"/"}


def test_5000_mount_points_are_bounded_and_counted(tmp_path):
    lines = ["21 0 8:1 / / rw - ext4 /dev/sda1 rw\n"]
    lines += [f"{100 + i} 21 0:{50 + i} / /mnt/m{i} rw - ext4 /dev/loop{i} rw\n" for i in range(4999)]
    src = FilesystemSource(_mountinfo(tmp_path, lines), statvfs=lambda p: V(1, 1, 1, 1, 1))
    r = src.collect()
    assert len(r.mounts) == fs.MAX_MOUNTS and r.skipped == 5000 - fs.MAX_MOUNTS
    assert r.mounts[0][0].mountpoint == "/" and r.mounts[-1][0].mountpoint == f"/mnt/m{fs.MAX_MOUNTS - 2}"
    assert {p.value for p in r.points() if p.spec.name == "teye_filesystem_mounts_skipped"} == {3976}


def test_mount_points_escaped_overmounted_and_excluded(tmp_path):
    procfs = _mountinfo(tmp_path, [
        "21 0 8:1 / / rw - ext4 /dev/sda1 rw\n",
        "40 21 0:60 / /data\\040set rw - ext4 /dev/sdc rw\n",      # a space in the mount point
        "41 21 0:61 / /data rw - ext4 /dev/sdd rw\n",
        "42 41 0:62 / /data rw - xfs /dev/sde rw\n",                # mounted over: the last one is seen
        "43 21 0:63 / /var/lib/docker/overlay2/x/merged rw - ext4 /dev/sdf rw\n",
        "44 21 0:64 / /run/user/0 rw - tmpfs tmpfs rw\n",
        "45 21 0:65 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n",
        "46 21 0:66 / /proc/sys/fs/binfmt_misc rw - binfmt_misc binfmt_misc rw\n",
        "47 21 0:67 / /devices rw - ext4 /dev/sdg rw\n"])          # /devices is not under /dev
    r = FilesystemSource(procfs, statvfs=lambda p: V(1, 1, 1, 1, 1)).collect()
    got = [(m.mountpoint, m.fstype, m.device) for m, _ in r.mounts]
    assert got == [("/", "ext4", "/dev/sda1"), ("/data set", "ext4", "/dev/sdc"), ("/data", "xfs", "/dev/sde"),
                   ("/run/user/0", "tmpfs", "tmpfs"), ("/devices", "ext4", "/dev/sdg")]


def test_rootfs_prefix_is_where_mount_points_are_statted(tmp_path):
    procfs = _mountinfo(tmp_path, ["21 0 8:1 / / rw - ext4 /dev/sda1 rw\n",
                                   "31 21 0:43 / /scratch rw - xfs /dev/sdb rw\n"])
    seen = []
    FilesystemSource(procfs, rootfs="/host/root", statvfs=lambda p: seen.append(p) or V(1, 1, 1, 1, 1)).collect()
    assert seen == ["/host/root/", "/host/root/scratch"]


@pytest.mark.parametrize("text,why", [
    ("", "no mounts"),
    ("21 0 8:1 / / rw ext4 /dev/sda1 rw\n", "no ' - ' separator"),
    ("21 0 8:1 / / rw - ext4\n", "expected 'fstype source options'"),
])
def test_garbled_mountinfo_is_a_parse_error_and_the_collector_down(tmp_path, text, why):
    with pytest.raises(ParseError, match=why):
        parse_mountinfo(text, "mountinfo")
    st, out = _exposition(FilesystemSource(_mountinfo(tmp_path, [text]), statvfs=lambda p: V(1, 1, 1, 1, 1)))
    assert not st.up and out[("teye_collector_up", (("collector", "filesystem"),))] == 0
