"""The filesystem collector: the real root filesystem against coreutils' df, fixture mountinfo with statvfs
faked at its one door, a network mount whose server is gone, and 5,000 mount points."""
from __future__ import annotations

import json
import os
import shutil
import sys
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
        pts = {(p.spec.name, p.labels[2]): p.value for p in r.points() if len(p.labels) == 3}
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
    root = tmp_path / "host" / "root"
    (root / "etc").mkdir(parents=True)
    r = FilesystemSource(procfs, rootfs=str(root) + "/",
                         statvfs=lambda p: seen.append(p) or V(1, 1, 1, 1, 1)).collect()
    assert seen == [f"{root}/", f"{root}/scratch"]
    assert [m.mountpoint for m, _ in r.mounts] == ["/", "/scratch"]      # labelled as the host names them


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


# --- a view of the host from a container (--path.rootfs) -------------------------------------------------------

def _states(r):
    return dict(r.states)


def _host_root(tmp_path):
    root = tmp_path / "host" / "root"
    (root / "etc").mkdir(parents=True)
    return str(root)


def test_container_mount_table_keeps_the_hosts_mounts_without_the_prefix(tmp_path):
    """Only the container's own mountinfo readable (no host pid 1): the host's mounts appear under the rootfs
    prefix; exported as the host names them, the container's own mounts beside them left out and counted."""
    root = _host_root(tmp_path)
    procfs = _mountinfo(tmp_path, [
        "600 500 0:90 / / rw - overlay overlay rw\n",                       # the container's own root
        "601 600 8:1 /etc/hosts /etc/hosts rw - ext4 /dev/sda1 rw\n",         # a file podman binds
        "602 600 0:91 / /run/teye rw - tmpfs tmpfs rw\n",
        f"610 600 8:1 / {root} ro,rslave - ext4 /dev/sda1 rw\n",              # -v /:/host/root:ro,rslave
        f"611 610 8:17 / {root}/scratch ro - xfs /dev/sdb1 rw\n",
        f"612 610 0:40 / {root}/proc ro - proc proc rw\n",
        f"613 610 0:44 / {root}/mnt/nfs ro - nfs4 srv:/export rw\n"])
    seen = []

    def statvfs(p):
        seen.append(p)
        return V(10, 5, 4, 3, 2)

    r = FilesystemSource(procfs, rootfs=root, statvfs=statvfs, timeout_s=2).collect()
    assert [(m.mountpoint, m.device, m.fstype) for m, _ in r.mounts] == [
        ("/", "/dev/sda1", "ext4"), ("/scratch", "/dev/sdb1", "xfs"), ("/mnt/nfs", "srv:/export", "nfs4")]
    assert sorted(seen) == sorted([root + "/", root + "/scratch", root + "/mnt/nfs"])
    assert _states(r) == {"exported": 3, "device_error": 0, "stuck": 0, "over_limit": 0, "excluded": 1,
                          "autofs": 0, "rootfs_self": 0, "outside_rootfs": 3}
    labels = {p.labels[2] for p in r.points() if p.spec.name == "teye_filesystem_size_bytes"}
    assert not any(root in lb for lb in labels), labels


def test_rootfs_bound_onto_itself_is_counted_not_statted(tmp_path):
    """The host's / bind-mounted at the rootfs and again inside it (mount --rbind / twice): the copy inside is
    the same filesystems seen twice; it is left out and counted, never statted."""
    root = _host_root(tmp_path)
    procfs = _mountinfo(tmp_path, [
        "21 0 8:1 / / rw - ext4 /dev/sda1 rw\n",
        f"30 21 8:1 / {root} rw - ext4 /dev/sda1 rw\n",                     # the host's own table, the bind seen
        f"31 30 8:1 / {root}{root} rw - ext4 /dev/sda1 rw\n",
        "32 21 8:17 / /scratch rw - xfs /dev/sdb1 rw\n"])
    seen = []
    r = FilesystemSource(procfs, rootfs=root, statvfs=lambda p: seen.append(p) or V(1, 1, 1, 1, 1)).collect()
    # host view from a table that holds the prefix: the mounts under it are the host's; the one inside is the self
    assert [m.mountpoint for m, _ in r.mounts] == ["/"]
    assert _states(r)["rootfs_self"] == 1 and _states(r)["outside_rootfs"] == 2
    assert seen == [root + "/"]


def test_host_mount_table_with_a_bind_of_the_rootfs_at_its_path(tmp_path):
    """hostPID: the host's own table, mount points without the prefix, and a mount at the rootfs path itself
    (another agent's bind on the host): not the host's data, counted rootfs_self."""
    procfs = _mountinfo(tmp_path, [
        "21 0 8:1 / / rw - ext4 /dev/sda1 rw\n",
        "32 21 8:17 / /scratch rw - xfs /dev/sdb1 rw\n"])
    root = _host_root(tmp_path)
    r = FilesystemSource(procfs, rootfs=root, statvfs=lambda p: V(1, 1, 1, 1, 1)).collect()
    assert [m.mountpoint for m, _ in r.mounts] == ["/", "/scratch"]
    assert _states(r)["outside_rootfs"] == 0 and _states(r)["rootfs_self"] == 0


@pytest.mark.parametrize("make,state", [
    (lambda p: None, "missing"),                           # -v /:/host/root left out of the command
    (lambda p: p.mkdir(parents=True), "empty"),            # a mount namespace with an empty /host/root
    (lambda p: (p.parent.mkdir(parents=True), p.write_text("x")), "missing"),   # a file, not a directory
])
def test_no_host_root_is_one_named_state_not_an_error_per_mount(tmp_path, make, state):
    root = tmp_path / "host" / "root"
    make(root)
    procfs = _mountinfo(tmp_path, ["21 0 8:1 / / rw - ext4 /dev/sda1 rw\n",
                                   "32 21 8:17 / /scratch rw - xfs /dev/sdb1 rw\n",
                                   "33 21 0:44 / /mnt/nfs rw - nfs4 srv:/x rw\n"])

    def statvfs(p):
        raise AssertionError(f"statted {p} without a host root")

    st, out = _exposition(FilesystemSource(procfs, rootfs=str(root), statvfs=statvfs))
    assert st.up, st.error
    got = {dict(l)["state"]: v for (n, l), v in out.items() if n == "teye_filesystem_rootfs_state"}
    assert got == {"host": 0, "missing": 0, "empty": 0, state: 1}
    assert not [k for k in out if k[0].startswith("teye_filesystem_") and dict(k[1]).get("mountpoint")]
    from agent.doctor import rootfs_line
    line = rootfs_line(str(root), procfs)
    assert "not the host" in line and str(root) in line


def test_with_the_host_root_the_state_is_host(tmp_path):
    root = _host_root(tmp_path)
    procfs = _mountinfo(tmp_path, ["21 0 8:1 / / rw - ext4 /dev/sda1 rw\n"])
    st, out = _exposition(FilesystemSource(procfs, rootfs=root, statvfs=lambda p: V(1, 1, 1, 1, 1)))
    got = {dict(l)["state"]: v for (n, l), v in out.items() if n == "teye_filesystem_rootfs_state"}
    assert got == {"host": 1, "missing": 0, "empty": 0}
    assert _by_mount(out, "teye_filesystem_device_error") == {"/": 0}


def test_autofs_points_are_never_statted_and_the_mount_on_top_is(tmp_path):
    """An automount point (autofs) is not statted (that would mount it, or hang on a dead server); once the
    automounter mounted NFS on top, the NFS mount is exported, in a thread of its own."""
    root = _host_root(tmp_path)
    procfs = _mountinfo(tmp_path, [
        "21 0 8:1 / / rw - ext4 /dev/sda1 rw\n",
        "40 21 0:50 / /net rw - autofs systemd-1 rw,fd=5\n",
        "41 21 0:51 / /home rw - autofs auto.home rw\n",
        "42 41 0:52 / /home rw - nfs4 srv:/home rw\n"])
    seen = []
    r = FilesystemSource(procfs, rootfs=root, statvfs=lambda p: seen.append(p) or V(1, 1, 1, 1, 1)).collect()
    assert sorted(seen) == [root + "/", root + "/home"]
    assert [(m.mountpoint, m.fstype) for m, _ in r.mounts] == [("/", "ext4"), ("/home", "nfs4")]
    assert _states(r)["autofs"] == 2


@pytest.mark.measures("the pass's wall time against one timeout")
def test_many_stuck_nfs_mounts_cost_one_timeout_and_are_counted_stuck(tmp_path):
    """Ten NFS servers gone: the pass waits one timeout, not ten; the next pass starts no new call for a mount
    still stuck and does not wait at all for them."""
    root = _host_root(tmp_path)
    procfs = _mountinfo(tmp_path, ["21 0 8:1 / / rw - ext4 /dev/sda1 rw\n"] +
                        [f"{30 + i} 21 0:{60 + i} / /mnt/gone{i} rw - nfs4 srv{i}:/x rw\n" for i in range(10)])
    release, calls = threading.Event(), []

    def statvfs(p):
        calls.append(p)
        if "/mnt/gone" in p:
            release.wait(30)
        return V(1, 1, 1, 1, 1)

    src = FilesystemSource(procfs, rootfs=root, statvfs=statvfs, timeout_s=0.3)
    try:
        t0 = time.monotonic()
        r = src.collect()
        first = time.monotonic() - t0
        t0 = time.monotonic()
        r2 = src.collect()
        second = time.monotonic() - t0
    finally:
        release.set()
    assert first < 0.3 * 3, first              # one deadline for the ten (ten in a row would be 3 s)
    assert second < 0.2, second                # nothing new started, nothing waited for
    assert _states(r)["stuck"] == 10 and _states(r)["exported"] == 1
    assert _states(r2)["stuck"] == 10 and len(calls) == 11 + 1
    assert {p.labels[2]: p.value for p in r.points() if p.spec.name == "teye_filesystem_device_error"} == \
        {"/": 0, **{f"/mnt/gone{i}": 1 for i in range(10)}}


def test_5000_mounts_under_a_rootfs_are_bounded_counted_and_quick(tmp_path):
    root = _host_root(tmp_path)
    lines = [f"600 500 0:90 / / rw - overlay overlay rw\n", f"601 600 8:1 / {root} rw - ext4 /dev/sda1 rw\n"]
    lines += [f"{700 + i} 601 0:{50 + i} / {root}/mnt/m{i} rw - ext4 /dev/loop{i} rw\n" for i in range(4999)]
    src = FilesystemSource(_mountinfo(tmp_path, lines), rootfs=root, statvfs=lambda p: V(1, 1, 1, 1, 1))
    r = src.collect()
    assert len(r.mounts) == fs.MAX_MOUNTS and r.skipped == 5000 - fs.MAX_MOUNTS
    assert _states(r) == {"exported": fs.MAX_MOUNTS, "device_error": 0, "stuck": 0, "over_limit": 3976,
                          "excluded": 0, "autofs": 0, "rootfs_self": 0, "outside_rootfs": 1}
    assert r.mounts[-1][0].mountpoint == f"/mnt/m{fs.MAX_MOUNTS - 2}"


_REAL = r'''
import json, os, sys
sys.path.insert(0, sys.argv[3])
from agent.sources.filesystem import FilesystemSource
root, procfs = sys.argv[1], sys.argv[2]
out = {}
for name, src in (("host_table", FilesystemSource("/proc", rootfs=root)),
                  ("own_table", FilesystemSource(procfs, rootfs=root))):
    r = src.collect()
    out[name] = {"mounts": {m.mountpoint: [m.device, m.fstype, s.size if s else None, s.files if s else None]
                            for m, s in r.mounts}, "states": dict(r.states), "rootfs": r.rootfs_state}
print(json.dumps(out))
'''


def test_a_real_bind_mounted_host_root_gives_the_hosts_figures(tmp_path):
    """The host's / bind-mounted (rbind, rslave, as podman's -v /:/host/root:ro,rslave) in a mount namespace of
    the test's own, mounted there twice so the rootfs holds itself: read through the host's table (/proc/1) and
    through the namespace's own (self), the mount points, devices and sizes are the host's, as coreutils' df
    states them outside the namespace; the copies inside the rootfs are counted rootfs_self."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) to make a mount namespace")
    root = tmp_path / "host" / "root"
    root.mkdir(parents=True)
    own = tmp_path / "procfs-own"
    own.mkdir()
    os.symlink("/proc/self", own / "self")         # no "1": the container's own table, as without hostPID
    script = (f"mount --rbind / {root} && mount --make-rslave {root} && mount --rbind / {root} && "
              f"exec {sys.executable} -c \"$0\" {root} {own} {os.getcwd()}")
    res = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, _REAL],
                         capture_output=True, text=True, timeout=60)
    if res.returncode != 0 and "Operation not permitted" in res.stderr:
        pytest.skip(f"mount namespaces refused here: {res.stderr.strip()}")
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    df = subprocess.run(["df", "-B1", "-a", "--output=target,size,itotal"], capture_output=True, text=True,
                        check=True).stdout.splitlines()[1:]
    oracle = {}
    for line in df:
        target, size, itotal = line.rsplit(None, 2)
        if size != "-":
            oracle[target] = (int(size), int(itotal) if itotal != "-" else 0)
    host = FilesystemSource("/proc").collect()
    want = {m.mountpoint: [m.device, m.fstype] for m, s in host.mounts}
    assert "/" in want
    for view in ("host_table", "own_table"):
        g = got[view]
        assert g["rootfs"] == "host"
        assert {mp: v[:2] for mp, v in g["mounts"].items()} == want, view
        for mp, (_, _, size, files) in g["mounts"].items():
            assert (size, files) == oracle[mp], (view, mp)
        assert not any(str(root) in mp for mp in g["mounts"])
    assert got["own_table"]["states"]["rootfs_self"] > 0
    assert got["own_table"]["states"]["outside_rootfs"] > 0
