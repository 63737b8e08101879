"""The jobs collector (agent/sources/cgroups.py) against captured cgroup trees with known values.

The trees (tests/data/cgroups, written by make_trees.py from the kernel's documented formats) hold
round numbers; the expected series below are written out by hand from those numbers, never computed
by the code under test.
"""
from __future__ import annotations

import logging
import os
import shutil

import pytest
from prometheus_client import generate_latest

from agent.errors import SourceUnavailable
from agent.sampler import Sampler
from agent.sources import cgroups as C
from agent.sources.cgroups import JobsSource, doctor_lines
from exporters.prometheus import make_registry
from tests.conftest import DATA, parse_exposition, reading_series

TREES = os.path.join(DATA, "cgroups")
GiB = 1 << 30
G, B, BE = "0f9c7f2a-1111-4c1d-9d6e-0123456789ab", "a1b2c3d4-2222-4e5f-8a9b-abcdefabcdef", \
    "deadbeef-3333-4444-5555-666677778888"


def S(name, value, **labels):
    return (name, tuple(sorted(labels.items()))), float(value)


def slurm(job, user, system, cpus=None, used=None, peak=None, limit=None, cache=None, anon=None, read=None,
          written=None, psi=None):
    p = "teye_slurm_job"
    out = [S(f"{p}_cpu_seconds_total", user, slurm_job=job, mode="user"),
           S(f"{p}_cpu_seconds_total", system, slurm_job=job, mode="system")]
    for name, v in (("cpus", cpus), ("memory_used_bytes", used), ("memory_peak_bytes", peak),
                    ("memory_limit_bytes", limit), ("memory_cache_bytes", cache), ("memory_anon_bytes", anon),
                    ("read_bytes_total", read), ("written_bytes_total", written)):
        if v is not None:
            out.append(S(f"{p}_{name}", v, slurm_job=job))
    for (res, kind), v in (psi or {}).items():
        out.append(S(f"{p}_pressure_stalled_seconds_total", v, slurm_job=job, resource=res, kind=kind))
    return out


def pod(uid, user, system, cpus=None, used=None, peak=None, limit=None, cache=None, anon=None, read=None,
        written=None, psi=None, ns="", name="", qos=""):
    out = []
    for (n, labels), v in slurm(uid, user, system, cpus, used, peak, limit, cache, anon, read, written, psi):
        out.append(((n.replace("teye_slurm_job_", "teye_pod_"),
                     tuple(sorted(("pod_uid", v_) if k_ == "slurm_job" else (k_, v_) for k_, v_ in labels))), v))
    out.append(S("teye_pod_info", 1, pod_uid=uid, namespace=ns, pod=name, qos=qos))
    return out


def counts(read=0, empty=0, bad_name=0, vanished=0, over_limit=0):
    return [S("teye_jobs_cgroups", v, state=s) for s, v in (("read", read), ("empty", empty), ("bad_name", bad_name),
                                                             ("vanished", vanished), ("over_limit", over_limit))]


PSI = {("cpu", "some"): 2.5, ("cpu", "full"): 1.0, ("memory", "some"): 0.3, ("memory", "full"): 0.2,
       ("io", "some"): 7.0, ("io", "full"): 4.0}

EXPECTED = {
    # job 1001: cpuacct.usage_user/sys in ns; cpuset 0-3; total_cache/total_rss (not cache/rss); Read/Write summed
    # over 8:0 and 8:16 (Sync/Async/Total lines ignored).  job 1002: cpuacct.stat ticks / USER_HZ (100); quota
    # 200000/100000 = 2 CPUs (cpuset 0-15 is wider); the "no limit" value is absent; blkio not enabled: no I/O.
    "v1_slurm": dict(
        slurm("1001", 12.5, 2.25, cpus=4, used=3 * GiB, peak=4 * GiB, limit=8 * GiB, cache=GiB, anon=2 * GiB,
              read=1500, written=2000)
        + slurm("1002", 3.0, 0.5, cpus=2, used=512 << 20, peak=768 << 20, cache=256 << 20, anon=200 << 20)
        + counts(read=2, empty=2, bad_name=1)),
    # job 2001: cpu.stat usec; cpuset 0-1,4 = 3 CPUs, cpu.max unlimited; io.stat summed over 8:0 and 259:0; PSI.
    # job 2002: populated 0 (skipped).  job 2003 (slurm/uid_* layout): cpu.max 1.5; no memory.peak: the largest
    # memory.current seen; no io.stat, no PSI files.
    "v2_slurm": dict(
        slurm("2001", 30.0, 10.0, cpus=3, used=6 * GiB, peak=7 * GiB, limit=16 * GiB, cache=GiB // 2, anon=5 * GiB,
              read=2 * 1048576, written=2097152, psi=PSI)
        + slurm("2003", 1.5, 0.5, cpus=1.5, used=100 << 20, peak=100 << 20, cache=40 << 20, anon=60 << 20)
        + counts(read=2, empty=1)),
    "v1_kube": dict(
        pod(G, 1.0, 0.5, cpus=4, used=GiB, peak=2 * GiB, limit=4 * GiB, cache=100 << 20, anon=900 << 20, read=4096,
            written=8192, ns="default", name="trainer-0", qos="guaranteed")
        + pod(B, 2.0, 0.0, used=GiB, peak=GiB, cache=0, anon=GiB, ns="ml", name="loader-7f9", qos="burstable")
        + pod(BE, 0.0, 0.25, used=4096, peak=8192, cache=0, anon=4096, qos="besteffort")
        + counts(read=3)),
    # systemd driver; the guaranteed pod: cpu.max 8 of a 16-CPU cpuset; besteffort: io.stat empty (0 bytes)
    "v2_kube": dict(
        pod(G, 8.0, 1.0, cpus=8, used=2 * GiB, peak=3 * GiB, limit=2 * GiB + GiB // 2, cache=GiB // 2,
            anon=GiB + GiB // 2, read=10, written=20, psi=PSI, qos="guaranteed")
        + pod(BE, 2.0, 1.0, used=1 << 20, peak=2 << 20, cache=0, anon=1 << 20, read=0, written=0, psi=PSI,
              qos="besteffort")
        + counts(read=2)),
}


def copy_tree(tmp_path, name):
    dst = tmp_path / name
    shutil.copytree(os.path.join(TREES, name), dst)
    return str(dst)


@pytest.mark.parametrize("tree", sorted(EXPECTED))
def test_every_exported_value_equals_the_tree(tree):
    logs = os.path.join(TREES, tree, "var_log_pods")     # only v1_kube has one: v2_kube's pods go unnamed
    got = reading_series(JobsSource(os.path.join(TREES, tree), logs).collect())
    assert got == EXPECTED[tree]


def test_through_the_exporter_with_help_and_type():
    s = Sampler({"jobs": (JobsSource(os.path.join(TREES, "v2_slurm")), 5.0)})
    assert s.read_once("jobs").up
    text = generate_latest(make_registry(lambda: s.snapshot)).decode()
    assert "# TYPE teye_slurm_job_cpu_seconds_total counter" in text
    assert "# HELP teye_slurm_job_memory_peak_bytes" in text
    got = parse_exposition(text)
    for k, v in EXPECTED["v2_slurm"].items():
        assert got[k] == v, k


def test_hybrid_machine_reads_the_v1_controllers(tmp_path):
    root = copy_tree(tmp_path, "v1_slurm")
    os.makedirs(os.path.join(root, "unified"))
    with open(os.path.join(root, "unified", "cgroup.controllers"), "w") as fh:
        fh.write("\n")   # systemd's hierarchy, no controller in it
    r = JobsSource(root).collect()
    assert r.layout.version == "hybrid"
    assert reading_series(r) == EXPECTED["v1_slurm"]
    assert any("hybrid" in line and "not read" in line for line in doctor_lines(root))


def test_a_job_that_ends_while_read_is_left_out_and_its_series_go(tmp_path, monkeypatch):
    root = copy_tree(tmp_path, "v2_slurm")
    job = os.path.join(root, "system.slice", "slurmstepd.scope", "job_2001")
    real = C._JobReader.text

    def ending(self, base, name):
        out = real(self, base, name)
        if name == "memory.current" and base == job:
            shutil.rmtree(job)     # the job ends between two of its files
        return out
    monkeypatch.setattr(C._JobReader, "text", ending)
    src = JobsSource(root)
    got = reading_series(src.collect())
    assert not [k for k in got if ("slurm_job", "2001") in k[1]]           # no half-read job
    assert {k: v for k, v in got.items() if ("slurm_job", "2003") in k[1]} == \
        {k: v for k, v in EXPECTED["v2_slurm"].items() if ("slurm_job", "2003") in k[1]}
    assert got[("teye_jobs_cgroups", (("state", "vanished"),))] == 1
    # next read: the job is simply gone, and with it every series of it
    got = reading_series(src.collect())
    assert not [k for k in got if ("slurm_job", "2001") in k[1]]
    assert got[("teye_jobs_cgroups", (("state", "vanished"),))] == 0


def test_peak_without_a_peak_file_is_the_largest_seen_and_forgotten_when_the_job_ends(tmp_path):
    root = copy_tree(tmp_path, "v2_slurm")
    job = os.path.join(root, "slurm", "uid_1000", "job_2003")
    src = JobsSource(root)
    key = ("teye_slurm_job_memory_peak_bytes", (("slurm_job", "2003"),))
    assert reading_series(src.collect())[key] == 100 << 20
    with open(os.path.join(job, "memory.current"), "w") as fh:
        fh.write(f"{50 << 20}\n")
    got = reading_series(src.collect())
    assert got[key] == 100 << 20 and got[("teye_slurm_job_memory_used_bytes", (("slurm_job", "2003"),))] == 50 << 20
    shutil.rmtree(job)
    assert key not in reading_series(src.collect())
    assert src._peaks == {}


def test_unreadable_and_garbled_files_leave_out_that_value_only(tmp_path, monkeypatch, caplog):
    root = copy_tree(tmp_path, "v2_slurm")
    job = os.path.join(root, "system.slice", "slurmstepd.scope", "job_2001")
    with open(os.path.join(job, "memory.current"), "w") as fh:
        fh.write("lots\n")
    real_read = C.read_bytes   # the tests run as root: a chmod would not stop the read

    def guarded(path, *a, **k):
        if str(path).endswith(os.path.join("job_2001", "io.stat")):
            raise PermissionError(13, "Permission denied", path)
        return real_read(path, *a, **k)
    monkeypatch.setattr(C, "read_bytes", guarded)
    src = JobsSource(root)
    with caplog.at_level(logging.WARNING, logger="teye.sources.cgroups"):
        got = reading_series(src.collect())
        src.collect()
    want = {k: v for k, v in EXPECTED["v2_slurm"].items()
            if k[0] not in ("teye_slurm_job_memory_used_bytes", "teye_slurm_job_read_bytes_total",
                            "teye_slurm_job_written_bytes_total") or ("slurm_job", "2003") in k[1]}
    assert got == want
    msgs = [r.getMessage() for r in caplog.records]
    assert len([m for m in msgs if "io.stat" in m and "Permission denied" in m]) == 1     # rate-limited
    assert len([m for m in msgs if "memory.current" in m and "'lots'" in m]) == 1


def test_no_cgroup_tree_is_a_down_collector_with_a_reason(tmp_path):
    s = Sampler({"jobs": (JobsSource(str(tmp_path / "none")), 5.0)})
    st = s.read_once("jobs")
    assert not st.up and "no cgroup tree mounted" in st.error
    with pytest.raises(SourceUnavailable, match="neither cgroup v2"):
        JobsSource(str(tmp_path)).collect()      # a directory, but no hierarchy in it
    assert "not available" in doctor_lines(str(tmp_path / "none"))[0]


def test_tens_of_thousands_of_stale_job_dirs_cost_one_check_each(tmp_path, monkeypatch):
    root = copy_tree(tmp_path, "v2_slurm")
    scope = os.path.join(root, "system.slice", "slurmstepd.scope")
    for i in range(20000):
        os.mkdir(os.path.join(scope, f"job_{100000 + i}"))        # left behind, no cgroup file in them
    opened = []
    real_open = os.open   # every file under the root is opened by agent/sources/_files.py through os.open

    def counting(path, *a, **k):
        opened.append(path)
        return real_open(path, *a, **k)
    monkeypatch.setattr(os, "open", counting)
    got = reading_series(JobsSource(root).collect())
    assert got[("teye_jobs_cgroups", (("state", "empty"),))] == 20001
    assert {k: v for k, v in got.items() if k[0] != "teye_jobs_cgroups"} == \
        {k: v for k, v in EXPECTED["v2_slurm"].items() if k[0] != "teye_jobs_cgroups"}
    assert len(opened) <= 20001 + 40     # one attempt per stale dir, the two live jobs' files, the root


def test_more_jobs_than_max_jobs_reads_the_newest():
    r = JobsSource(os.path.join(TREES, "v1_slurm"), max_jobs=1).collect()
    assert [u.job.id for u in r.jobs] == ["1002"]
    assert r.counts["over_limit"] == 1
    assert any("max_jobs=1" in s for s in r.skipped)


def test_doctor_names_the_layout_and_why_jobs_are_not_seen():
    lines = doctor_lines(os.path.join(TREES, "v1_slurm"))
    text = "\n".join(lines)
    assert "cgroup v1" in lines[0]
    assert "2 slurm jobs under slurm/uid_* (1001, 1002)" in text
    assert "job id 'abc' is not a number" in text
    assert "2 job cgroup(s) without a process" in text
    assert "1002: blkio.throttle.io_service_bytes_recursive absent" in text
    v2 = "\n".join(doctor_lines(os.path.join(TREES, "v2_slurm")))
    assert "system.slice/slurmstepd.scope (2001)" in v2 and "2003: cpu.pressure" in v2 and "memory.peak" in v2
    kube = "\n".join(doctor_lines(os.path.join(TREES, "v2_kube")))
    assert "systemd driver" in kube
    assert "cgroupfs driver" in "\n".join(doctor_lines(os.path.join(TREES, "v1_kube")))


def test_agent_cli_flag_reaches_the_collector():
    from agent.cli import build_parser, load_config
    cfg = load_config(build_parser().parse_args(["agent", "--cgroupfs", "/x/cg"]))
    assert cfg["cgroupfs"] == "/x/cg"
    src = __import__("agent.sources", fromlist=["build"]).build("jobs", cfg)
    assert src.cgroupfs == "/x/cg" and src.max_jobs == cfg["jobs"]["max_jobs"]


def test_doctor_names_a_job_whose_processes_have_no_cgroup_in_the_tree(tmp_path):
    procfs = tmp_path / "proc"
    for pid, path in ((4242, "/slurm/uid_1000/job_1001/step_0/task_0"),          # read: not named
                      (777, "/system.slice/slurmstepd.scope/job_31337/step_0/user/task_0"),   # no such cgroup
                      (1, "/init.scope")):
        (procfs / str(pid)).mkdir(parents=True)
        (procfs / str(pid) / "cgroup").write_text(f"0::{path}\n")
    lines = doctor_lines(os.path.join(TREES, "v1_slurm"), procfs=str(procfs))
    unseen = [ln for ln in lines if "has processes" in ln]
    assert unseen == [f"jobs (cgroups): Slurm job 31337 has processes ({procfs}/777/cgroup names it) but no cgroup "
                      f"read under {os.path.join(TREES, 'v1_slurm')}: is --cgroupfs the host's cgroup tree (in a "
                      f"container, mount it), and was it skipped above (not a number, beyond jobs.max_jobs)?"]


def test_v1_cpu_time_is_the_exact_total_split_like_getrusage(tmp_path):
    """cpuacct.usage is exact; usage_user/usage_sys (tick-based on recent kernels) only give the proportion.
    Each mode stays a counter even when the proportion moves the other way."""
    root = copy_tree(tmp_path, "v1_slurm")
    acct = os.path.join(root, "cpuacct", "slurm", "uid_1000", "job_1001")

    def write(usage, user, sys_):
        for name, v in (("cpuacct.usage", usage), ("cpuacct.usage_user", user), ("cpuacct.usage_sys", sys_)):
            with open(os.path.join(acct, name), "w") as fh:
                fh.write(f"{v}\n")
    src = JobsSource(root)
    key = lambda mode: ("teye_slurm_job_cpu_seconds_total", (("mode", mode), ("slurm_job", "1001")))  # noqa: E731
    write(40 * 10**9, 3 * 10**9, 1 * 10**9)          # ticks saw a tenth of the time, 3:1
    got = reading_series(src.collect())
    assert (got[key("user")], got[key("system")]) == (30.0, 10.0)
    write(44 * 10**9, 3 * 10**9, 3 * 10**9)          # +4 s, and the ticks now say 1:1 overall
    got = reading_series(src.collect())
    # 1:1 of 44 would take user back to 22: user stays at 30, the 4 new seconds go to system, the sum stays exact
    assert (got[key("user")], got[key("system")]) == (30.0, 14.0)
    write(44 * 10**9, 3 * 10**9, 3 * 10**9)          # no time passed: nothing moves
    got = reading_series(src.collect())
    assert (got[key("user")], got[key("system")]) == (30.0, 14.0)
    shutil.rmtree(os.path.join(root, "cpuacct", "slurm", "uid_1000", "job_1001"))
    src.collect()
    assert ("slurm", "1001") not in src._cputime      # forgotten with the job
