"""Every file under --procfs, --sysfs and the cgroup root is read bounded and never blocks
(agent/sources/_files.py), and cgroup directory names make a job id only from ASCII digits.

Oracles: the fixture trees' own values (tests/data/node_exporter, node_exporter's goldens;
tests/data/cgroups, written out by hand in test_cgroups.EXPECTED), read from an untouched copy; the
kernel's own file types (mkfifo, /dev/zero, a sparse file larger than the bound); the log records.
A read that blocks is caught by running it in a thread with a deadline (the FIFO is then opened for
writing, which releases it).
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
import tracemalloc
from dataclasses import replace

import pytest

from agent.doctor import nfs_line, perf_line
from agent.errors import ParseError
from agent.gpu.procinfo import owner
from agent.phases.procstat import Gone, ProcReader
from agent.pmu import events as pmu_events
from agent.pmu import sysfs as pmu_sysfs
from agent.sampler import Sampler
from agent.sources import _files
from agent.sources import cgroups as C
from agent.sources.allocation import AllocationSource
from agent.sources.cgroups import JobsSource, doctor_lines
from agent.sources.cpu import CpuSource, parse_stat
from agent.sources.infiniband import InfinibandSource, parse_counter
from agent.sources.memory import MemorySource
from agent.sources.nfs import NfsClientSource, parse_ints
from tests.conftest import DATA, PROCFS, SYSFS, parse_exposition, reading_series
from tests.procs import REPO, Agent
from tests.sources.test_cgroups import EXPECTED, S

TREES = os.path.join(DATA, "cgroups")
JOB_2001 = os.path.join("system.slice", "slurmstepd.scope", "job_2001")
SCOPE = os.path.join("system.slice", "slurmstepd.scope")
REFUSED = "teye_files_refused_total"


def no_block(fn, fifo=None, timeout=10.0):
    """fn() in a thread; fails (and releases the FIFO) when it has not returned within ``timeout``."""
    box = {}

    def run():
        try:
            box["v"] = fn()
        except BaseException as e:   # handed back to the test
            box["e"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        if fifo:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))   # a writer appears: the blocked open returns
        pytest.fail(f"the read blocked for {timeout} s")
    if "e" in box:
        raise box["e"]
    return box["v"]


def refusal_logs(caplog, path):
    return [r.getMessage() for r in caplog.records if r.name == "teye.sources.files" and path in r.getMessage()]


def sparse(path, size):
    """A regular file of ``size`` bytes that takes no disk (zeros)."""
    if os.path.lexists(path):
        os.unlink(path)
    with open(path, "wb") as fh:
        fh.truncate(size)


# ----------------------------------------------------------------------------- the reader itself

def test_regular_files_read_exactly_up_to_the_bound(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(bytes(range(256)) * 4)
    assert _files.read_bytes(str(p), limit=1024) == bytes(range(256)) * 4          # exactly the bound: read
    p.write_bytes(b"x" * 1025)
    with pytest.raises(_files.FileRefused) as e:                                     # one byte over: refused
        _files.read_bytes(str(p), limit=1024)
    assert e.value.reason == "too_large" and e.value.filename == str(p) and "1024 bytes" in e.value.strerror
    big = "cpu  1 2 3\n" + "intr " + "0 " * (3 << 20) + "\n"                          # 6 MiB /proc/stat: legitimate
    p.write_text(big)
    assert _files.read_text(str(p)) == big


def test_fifo_and_device_refused_without_blocking_counted_and_named_once(tmp_path, caplog):
    fifo = str(tmp_path / "memory.stat")
    os.mkfifo(fifo)
    zero = str(tmp_path / "stat")
    os.symlink("/dev/zero", zero)
    ledger = _files.Refusals("jobs")

    def counted(read, path):   # the ledger is the reading thread's, as a collector's read sets it
        with _files.counting(ledger):
            return read(path)
    with caplog.at_level(logging.WARNING, logger="teye.sources.files"):
        for _ in range(3):
            with pytest.raises(_files.FileRefused) as e:
                no_block(lambda: counted(_files.read_bytes, fifo), fifo)
            assert e.value.reason == "not_regular" and "a FIFO" in str(e.value) and e.value.filename == fifo
        with pytest.raises(_files.FileRefused) as e:
            no_block(lambda: counted(_files.read_text, zero))
        assert "a character device" in str(e.value)
    assert ledger.counts() == (("not_regular", 4),)
    assert len(refusal_logs(caplog, fifo)) == 1 and len(refusal_logs(caplog, zero)) == 1   # once per file
    assert "jobs: " in refusal_logs(caplog, fifo)[0] and "refused" in refusal_logs(caplog, fifo)[0]
    # outside a collector's read a refusal is still named, and no collector's counter moves
    with pytest.raises(_files.FileRefused):
        _files.read_head(zero, 100)
    assert ledger.counts() == (("not_regular", 4),)


# ----------------------------------------------------------------------------- procfs collectors

def proc_copy(tmp_path):
    dst = tmp_path / "proc"
    shutil.copytree(PROCFS, dst)
    return str(dst)


def test_stat_linked_to_dev_zero_downs_cpu_only_and_reads_nothing_large(tmp_path):
    proc = proc_copy(tmp_path)
    os.unlink(os.path.join(proc, "stat"))
    os.symlink("/dev/zero", os.path.join(proc, "stat"))
    s = Sampler({"cpu": (CpuSource(proc), 1.0), "memory": (MemorySource(proc), 1.0)})
    tracemalloc.start()
    try:
        st = no_block(lambda: s.read_once("cpu"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not st.up and os.path.join(proc, "stat") in st.error and "character device" in st.error
    assert peak < 1 << 20
    assert s.read_once("memory").up
    assert reading_series(s.snapshot.state("memory").reading) == reading_series(MemorySource(PROCFS).collect())


def test_a_huge_stat_is_refused_after_the_bound_not_read_whole(tmp_path):
    proc = proc_copy(tmp_path)
    sparse(os.path.join(proc, "stat"), 64 << 20)   # 64 MiB of zeros: read whole, 64 MiB of memory
    tracemalloc.start()
    try:
        with pytest.raises(_files.FileRefused) as e:
            CpuSource(proc).collect()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert e.value.reason == "too_large"
    assert peak < 3 * _files.MAX_FILE_BYTES


def test_nfs_rpc_file_as_a_fifo_keeps_the_mounts(tmp_path):
    proc = proc_copy(tmp_path)
    rpc = os.path.join(proc, "net", "rpc", "nfs")
    os.unlink(rpc)
    os.mkfifo(rpc)
    src = NfsClientSource(proc)
    r = no_block(src.collect, rpc)
    want = NfsClientSource(PROCFS).collect()
    assert want.rpc is not None and want.mounts
    assert r.rpc is None and r.mounts == want.mounts
    got = reading_series(r)
    assert got[(REFUSED, (("collector", "nfs"), ("reason", "not_regular")))] == 1
    assert {k: v for k, v in got.items() if k[0] != REFUSED} == reading_series(replace(want, rpc=None))
    assert len(reading_series(want)) > len(reading_series(replace(want, rpc=None))) > 100


def test_per_process_files_as_fifos_and_devices(tmp_path):
    proc = tmp_path / "proc"
    pid = proc / "4242"
    pid.mkdir(parents=True)
    os.mkfifo(pid / "status")
    (pid / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_77/step_0/user/task_0\n")
    os.symlink("/dev/zero", pid / "stat")
    os.mkfifo(pid / "io")
    got = no_block(lambda: owner(str(proc), 4242), str(pid / "status"))
    assert (got.user, got.slurm_job) == ("", "77")       # the status FIFO lost the user only
    reader = ProcReader(str(proc), str(tmp_path / "sys"))
    with pytest.raises(Gone, match="character device"):
        no_block(lambda: reader._stat(4242))
    rb, problem = no_block(lambda: reader.read_bytes(4242), str(pid / "io"))
    assert rb is None and "a FIFO, not a regular file" in problem
    # a cgroup path naming a job with a non-ASCII digit is no job
    (pid / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_\u0664\u0664/step_0\n")
    assert owner(str(proc), 4242).slurm_job == ""


def test_doctor_lines_with_fifos_do_not_block(tmp_path):
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "sys" / "kernel").mkdir(parents=True)
    os.mkfifo(proc / "self" / "mountinfo")
    os.mkfifo(proc / "sys" / "kernel" / "perf_event_paranoid")
    line = no_block(lambda: nfs_line(str(proc)), str(proc / "self" / "mountinfo"))
    assert line.startswith("nfs: cannot read ") and "not a regular file" in line
    line = no_block(lambda: perf_line(str(proc), 0), str(proc / "sys" / "kernel" / "perf_event_paranoid"))
    assert line.startswith("perf events: cannot read ") and "not a regular file" in line


# ----------------------------------------------------------------------------- sysfs collectors

def test_infiniband_counter_linked_to_dev_zero_loses_that_counter_only(tmp_path):
    sysfs = tmp_path / "sys"
    shutil.copytree(os.path.join(SYSFS, "class", "infiniband"), sysfs / "class" / "infiniband")
    counter = sysfs / "class" / "infiniband" / "mlx4_0" / "ports" / "1" / "counters" / "link_downed"
    assert counter.exists()
    os.unlink(counter)
    os.symlink("/dev/zero", counter)
    src = InfinibandSource(str(sysfs))
    got = reading_series(no_block(src.collect))
    want = reading_series(InfinibandSource(SYSFS).collect())
    lost = {k for k in want if k[0] == "teye_infiniband_link_downed_total" and ("device", "mlx4_0") in k[1]
            and ("port", "1") in k[1]}
    assert len(lost) == 1
    assert got.pop((REFUSED, (("collector", "infiniband"), ("reason", "not_regular")))) == 1
    assert got == {k: v for k, v in want.items() if k not in lost}


def test_pmu_attribute_fifo_refused_and_a_huge_cpuinfo_read_by_its_head(tmp_path):
    os.mkfifo(tmp_path / "type")
    with pytest.raises(_files.FileRefused):
        no_block(lambda: pmu_sysfs.read_text(str(tmp_path / "type")), str(tmp_path / "type"))
    proc = tmp_path / "proc"
    proc.mkdir()
    block = ("processor\t: {}\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
             "flags\t\t: fpu " + "x" * 1500 + "\n\n")
    with open(proc / "cpuinfo", "w") as fh:           # 8,192 CPUs: 12 MiB, larger than the bound
        for i in range(8192):
            fh.write(block.format(i))
    assert os.path.getsize(proc / "cpuinfo") > _files.MAX_FILE_BYTES
    m = pmu_events.read_cpuinfo(str(proc))
    assert (m.vendor, m.family, m.model) == ("GenuineIntel", 6, 143)


# ----------------------------------------------------------------------------- the cgroup tree

def cg_copy(tmp_path, name="v2_slurm"):
    dst = tmp_path / name
    shutil.copytree(os.path.join(TREES, name), dst)
    return str(dst)


def without_2001(*families):
    return {k: v for k, v in EXPECTED["v2_slurm"].items()
            if not (k[0] in families and ("slurm_job", "2001") in k[1])}


def test_a_fifo_memory_stat_loses_that_jobs_memory_split_only(tmp_path, caplog):
    root = cg_copy(tmp_path)
    fifo = os.path.join(root, JOB_2001, "memory.stat")
    os.unlink(fifo)
    os.mkfifo(fifo)
    src = JobsSource(root)
    with caplog.at_level(logging.WARNING):
        got = reading_series(no_block(src.collect, fifo))
        again = reading_series(no_block(src.collect, fifo))
    want = without_2001("teye_slurm_job_memory_cache_bytes", "teye_slurm_job_memory_anon_bytes")
    assert got == {**want, **dict([S(REFUSED, 1, collector="jobs", reason="not_regular")])}
    assert again == {**want, **dict([S(REFUSED, 2, collector="jobs", reason="not_regular")])}
    assert len(refusal_logs(caplog, fifo)) == 1
    assert not any("memory.stat" in r.getMessage() for r in caplog.records if r.name == "teye.sources.cgroups")


def test_a_huge_io_stat_is_refused_too_large(tmp_path):
    root = cg_copy(tmp_path)
    sparse(os.path.join(root, JOB_2001, "io.stat"), _files.MAX_FILE_BYTES + 1)
    r = JobsSource(root).collect()
    want = without_2001("teye_slurm_job_read_bytes_total", "teye_slurm_job_written_bytes_total")
    assert reading_series(r) == {**want, **dict([S(REFUSED, 1, collector="jobs", reason="too_large")])}
    assert any("1 file(s) refused (too_large" in ln for ln in doctor_lines(root))


BAD_NAMES = ("job_\u00b2", "job_4444\n", "job_\u0664\u0664", "job_12 ", "job_0x10")


def add_bad_job_dirs(root, names=BAD_NAMES):
    """Job directories with bad names, each a full copy of a live job (so only the name can keep it out)."""
    for name in names:
        shutil.copytree(os.path.join(root, JOB_2001), os.path.join(root, SCOPE, name))


def test_bad_job_dir_names_are_counted_named_and_the_rest_exact(tmp_path, caplog):
    root = cg_copy(tmp_path)
    add_bad_job_dirs(root)
    with caplog.at_level(logging.WARNING, logger="teye.sources.cgroups"):
        src = JobsSource(root)
        r = src.collect()
        src.collect()
    want = dict(EXPECTED["v2_slurm"])
    want.update(dict([S("teye_jobs_cgroups", len(BAD_NAMES), state="bad_name")]))
    assert reading_series(r) == want                        # job 4444 (or 44, or 12) is not read
    assert sorted(u.job.id for u in r.jobs) == ["2001", "2003"]
    assert any(repr(os.path.join(SCOPE, "job_4444\n")) in s for s in r.skipped)
    assert any(repr(os.path.join(SCOPE, "job_\u00b2")) in s for s in r.skipped)
    logged = [m.getMessage() for m in caplog.records]
    assert len([m for m in logged if "job_4444\\n" in m and "not a number" in m]) == 1   # rate-limited


def test_bad_names_in_v1_uid_and_pid_dirs(tmp_path):
    root = cg_copy(tmp_path, "v1_slurm")
    uid_dir = os.path.join(root, "cpuacct", "slurm", "uid_1000")
    assert os.path.isdir(os.path.join(uid_dir, "job_1001"))
    shutil.copytree(os.path.join(uid_dir, "job_1001"), os.path.join(root, "cpuacct", "slurm", "uid_\u0664",
                                                                     "job_1005"))
    shutil.copytree(os.path.join(uid_dir, "job_1001"), os.path.join(uid_dir, "job_\u00b2"))
    r = JobsSource(root).collect()
    want = dict(EXPECTED["v1_slurm"])
    want.update(dict([S("teye_jobs_cgroups", 2, state="bad_name")]))   # abc (the tree's own) and ²
    assert reading_series(r) == want
    proc = tmp_path / "proc"
    for pid in ("\u00b2", "77"):
        (proc / pid).mkdir(parents=True)
        (proc / pid / "cgroup").write_text("4:cpuacct:/slurm/uid_1000/job_1001/step_0\n")
    assert C.jobs_with_processes(str(proc)) == {("slurm", "1001"): 77}


def test_doctor_and_allocation_with_bad_job_dir_names(tmp_path):
    root = cg_copy(tmp_path)
    add_bad_job_dirs(root)
    text = "\n".join(doctor_lines(root, procfs=None))
    assert "1 slurm jobs under system.slice/slurmstepd.scope (2001)" in text
    assert "job id '\u00b2' is not a number" in text and "job id '4444\\n' is not a number" in text
    mapping = tmp_path / "gpus"
    mapping.mkdir()
    (mapping / "0").write_text("2001\n")
    (mapping / "1").write_text("4444\n")          # job_4444\n is no cgroup of job 4444: a stale file
    os.mkfifo(mapping / "2")                       # a FIFO as a mapping file: not a file, passed over unread
    sparse(str(mapping / "3"), 1 << 30)            # 1 GiB: refused after 64 KiB
    src = AllocationSource(str(mapping), root, None, lambda: {"u0": "0", "u1": "1", "u2": "2", "u3": "3"})
    r = no_block(src.collect, str(mapping / "2"))
    assert [(a.gpu, a.slurm_job) for a in r.allocations] == [("0", "2001")]
    assert len(r.problems) == 2
    assert "/1: job 4444 has no cgroup" in r.problems[1]
    assert r.problems[0].endswith("/3: cannot read (larger than 65536 bytes)")


def test_teye_doctor_runs_on_a_tree_with_bad_names_and_fifos(tmp_path):
    root = cg_copy(tmp_path)
    add_bad_job_dirs(root)
    fifo = os.path.join(root, JOB_2001, "memory.stat")
    os.unlink(fifo)
    os.mkfifo(fifo)
    p = subprocess.run([sys.executable, "-m", "agent", "doctor", "--cgroupfs", root, "--procfs", PROCFS,
                        "--sysfs", SYSFS], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "1 slurm jobs under system.slice/slurmstepd.scope (2001)\n" in p.stdout
    assert "job id '\u00b2' is not a number" in p.stdout
    assert "1 file(s) refused (not_regular" in p.stdout


# ----------------------------------------------------------------------------- a real agent

@pytest.mark.e2e
def test_a_real_agent_on_such_trees_keeps_serving(tmp_path):
    proc = proc_copy(tmp_path)
    os.unlink(os.path.join(proc, "stat"))
    os.symlink("/dev/zero", os.path.join(proc, "stat"))
    os.unlink(os.path.join(proc, "pressure", "io"))
    os.mkfifo(os.path.join(proc, "pressure", "io"))
    root = cg_copy(tmp_path)
    add_bad_job_dirs(root)
    fifo = os.path.join(root, JOB_2001, "memory.stat")
    os.unlink(fifo)
    os.mkfifo(fifo)
    log = tmp_path / "agent.log"
    a = Agent(["--procfs", proc, "--sysfs", SYSFS, "--cgroupfs", root], log_path=str(log))
    try:
        import time
        deadline = time.monotonic() + 30
        while True:
            v = parse_exposition(a.metrics())
            if (("teye_collector_up", (("collector", "jobs"),)) in v and
                    ("teye_collector_up", (("collector", "pressure"),)) in v) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        v2 = parse_exposition(a.metrics())   # a second scrape: still answering
    finally:
        assert a.stop() == 0
    up = {dict(k[1])["collector"]: val for k, val in v2.items() if k[0] == "teye_collector_up"}
    assert up["cpu"] == 0 and up["memory"] == 1 and up["jobs"] == 1 and up["pressure"] == 1
    for k, val in EXPECTED["v2_slurm"].items():
        if k[0] in ("teye_slurm_job_memory_cache_bytes", "teye_slurm_job_memory_anon_bytes") and \
                ("slurm_job", "2001") in k[1]:
            assert k not in v2
        elif k[0] == "teye_jobs_cgroups" and k[1] == (("state", "bad_name"),):
            assert v2[k] == len(BAD_NAMES)
        else:
            assert v2[k] == val, k
    assert v2[(REFUSED, (("collector", "jobs"), ("reason", "not_regular")))] >= 1
    assert v2[(REFUSED, (("collector", "pressure"), ("reason", "not_regular")))] >= 1
    assert ("teye_pressure_stalled_seconds_total", (("kind", "some"), ("resource", "memory"))) in v2
    text = log.read_text()
    assert text.count(f"{fifo}: a FIFO, not a regular file") == 1


def test_pod_dirs_with_a_trailing_newline_are_no_pods(tmp_path):
    root = cg_copy(tmp_path, "v2_kube")
    sl = os.path.join(root, "kubepods.slice")
    shutil.copytree(os.path.join(sl, "kubepods-pod0f9c7f2a_1111_4c1d_9d6e_0123456789ab.slice"),
                    os.path.join(sl, "kubepods-pod11111111_1111_4c1d_9d6e_0123456789ab.slice\n"))
    assert reading_series(JobsSource(root).collect()) == EXPECTED["v2_kube"]
    root = cg_copy(tmp_path, "v1_kube")
    for ctl in ("cpuacct", "memory"):
        be = os.path.join(root, ctl, "kubepods", "besteffort")
        shutil.copytree(os.path.join(be, "poddeadbeef-3333-4444-5555-666677778888"),
                        os.path.join(be, "pod11111111-3333-4444-5555-666677778888\n"))
    logs = os.path.join(TREES, "v1_kube", "var_log_pods")
    assert reading_series(JobsSource(root, logs).collect()) == EXPECTED["v1_kube"]


@pytest.mark.parametrize("parse, text", [
    (lambda t: parse_counter(t, "counters/link_downed"), "\u00b2\n"),          # isdigit() but int() fails
    (lambda t: parse_counter(t, "counters/link_downed"), "\u0664\n"),          # int() reads it as 4
    (lambda t: parse_stat(t, "stat"), "cpu  1 2 3 4 5 6 7 8\ncpu\u0664 1 2 3 4 5 6 7 8\nintr 1\nctxt 1\n"),
    (lambda t: parse_ints(t.split(), "net/rpc/nfs", "net"), "1 \u00b2 3"),
], ids=["ib-superscript", "ib-arabic-indic", "stat-cpu-name", "nfs-ints"])
def test_non_ascii_digits_in_kernel_files_are_parse_errors(parse, text):
    with pytest.raises(ParseError):
        parse(text)
