"""The input cause of real PyTorch jobs whose DataLoader worker (a child process) does the input work:
the agent's probe reads the real /proc of the job and its worker (agent.phases.procstat)."""
from __future__ import annotations

import os
import sys

import pytest

from tests.client.helpers import HERE, LiveAgent, last_json, teye_run

pytest.importorskip("torch")

pytestmark = [pytest.mark.e2e, pytest.mark.measures("CPU shares from /proc against the script's clocks; CPU hogs")]

SCRIPT = os.path.join(HERE, "torch_cause.py")


@pytest.fixture(scope="module")
def datafile(tmp_path_factory):
    """A clean 64 MiB file on the test's temporary filesystem (written and synced: its pages can be dropped)."""
    path = tmp_path_factory.mktemp("cause") / "shard.bin"
    with open(path, "wb") as f:
        for _ in range(64):
            f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())
    yield str(path)
    path.unlink()   # (pytest keeps its last temporary directories: not 64 MiB each)


@pytest.mark.parametrize("mode, cause, says", [
    # the worker burns a core while the training process sleeps in next(): the worker's CPU names it
    # (busy "while it waits", or "busy or runnable, starved of CPU" where this machine's load delays it too)
    ("burn", "host_cpu", "the job's threads are busy"),
    # nothing reads and nothing computes: no evidence of storage, so no storage advice.  The worker naps 6 ms a
    # sample: with 1.5 ms ("sleep") the DataLoader's own per-batch CPU (collating, passing the batch between the
    # processes) is 0.4-0.6 CPU s per s of the wait, astride the 0.5 threshold (CI read host_cpu twice)
    ("nap", "unknown", "idle CPUs and no storage I/O"),
])
def test_the_input_cause_comes_from_the_whole_input_pipeline(agent, datafile, mode, cause, says):
    steps = "60" if mode == "nap" else "150"
    run = teye_run([sys.executable, SCRIPT, mode, steps, datafile], socket_path=agent.path, job=f"cause-{mode}")
    assert run.returncode == 0, run.stderr
    own = last_json(run.stdout)
    assert own["wait_share"] > 0.3, own         # the job is input-bound by its own clock
    if mode == "nap":                             # and its pipeline is as idle as the case says, by its own clock
        assert own["cpu_per_wait_s"] < 0.3, own
    j = agent.jobs()[f"cause-{mode}"]
    v = j.verdict
    assert v.kind == "input" and v.cause == cause, v.evidence
    assert says in v.evidence, v.evidence
    # zero-code phases from a torch DataLoader: the advice is PyTorch's (issue 29, item 4), not tf.data's
    assert j.evidence.source == "torch" and "phases from zero-code: torch DataLoader" in v.evidence
    assert "DataLoader" in v.recommendation and "num_workers" in v.recommendation, v.recommendation
    assert "tf.data" not in v.recommendation and "AUTOTUNE" not in v.recommendation, v.recommendation
    w = j.evidence.input_wait
    if mode == "burn":   # about one core (the worker) per second of wait, not the waiting process's few %
        assert w.cpu_ratio > 0.4, v.evidence   # (less where other jobs take the worker's core from it)
    else:
        assert w.cpu_ratio < 0.5 and w.read_bytes / w.wait_s < 1e6, v.evidence


@pytest.fixture
def cpu_hogs():
    """Neighbours: four busy processes per CPU, at the job's priority, for the test's length."""
    import subprocess
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4 * (os.cpu_count() or 1))]
    yield len(hogs)
    for h in hogs:
        h.kill()
    for h in hogs:
        h.wait()


# The hog test's threshold (input_cpu_busy_ratio, a setting; 0.5 by default).  Beside the neighbours the sleeping
# pipeline's own CPU per second of wait is 0.12-0.24 and with its main thread's whole run-queue wait 0.48 (CI's
# faster CPU, stop 61) to 1.07 (this VM, stop 62): at 0.5 the CI machine's 0.48 could not tell whether teye counts
# that wait as the job's demand; 0.35 lies between the two ranges with a margin on either side.
HOG_BUSY_RATIO = 0.35


@pytest.fixture
def hog_agent(sockdir):
    a = LiveAgent(sockdir, input_cpu_busy_ratio=HOG_BUSY_RATIO)
    yield a
    a.close()


@pytest.mark.parametrize("mode, cause, says", [
    # the pipeline sleeps: its training thread, woken at each batch, queues behind the neighbours for a CPU;
    # that is their load, not the job's demand (issue 39: it read host_cpu once in three runs)
    ("sleep", "unknown", "idle CPUs and no storage I/O"),
    # a decoder in the training thread (num_workers=0), preempted by the neighbours while it works: starved
    ("burn-main", "host_cpu", "the job's threads are busy"),
])
def test_the_cause_is_the_jobs_own_beside_a_cpu_hog(hog_agent, datafile, cpu_hogs, mode, cause, says):
    agent = hog_agent
    steps = "150" if mode == "sleep" else "60"   # (the starved decoder's steps take 10 times longer here)
    run = teye_run([sys.executable, SCRIPT, mode, steps, datafile], socket_path=agent.path, job=f"hog-{mode}")
    assert run.returncode == 0, run.stderr
    own = last_json(run.stdout)
    j = agent.jobs()[f"hog-{mode}"]
    v = j.verdict
    print(cpu_hogs, "hogs; own", own, "teye", v.evidence)
    assert own["wait_share"] > 0.3, own
    if mode == "sleep":
        # the neighbours did load it: the main thread's whole run-queue wait, counted as demand, would have
        # made it host_cpu (CPU + run delay per second of wait over input_cpu_busy_ratio)
        assert own["cpu_per_wait_s"] + own["delay_per_wait_s"] >= HOG_BUSY_RATIO, own
    assert v.kind == "input" and v.cause == cause, v.evidence
    assert says in v.evidence, v.evidence


# -- storage: reads past the page cache --------------------------------------------------------------------
BLKIO = "/sys/fs/cgroup/blkio"
THROTTLE_BPS = 20 << 20


def _disk_of(path):
    """MAJ:MIN of the whole disk holding path (blk-throttle takes disks, not partitions), or None."""
    st = os.stat(path)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    sysdev = f"/sys/dev/block/{dev}"
    if not os.path.exists(sysdev):
        return None   # not a block device (tmpfs, overlay, NFS)
    if os.path.exists(os.path.join(sysdev, "partition")):
        with open(os.path.join(os.path.realpath(sysdev), "..", "dev")) as f:
            return f.read().strip()
    return dev


@pytest.fixture
def throttled(datafile):
    """A cgroup v1 blkio child whose reads from the data file's disk are throttled to THROTTLE_BPS, and a
    preexec_fn that moves the job into it; skipped with the reason where that cannot be made."""
    disk = _disk_of(datafile)
    if not os.path.isdir(BLKIO) or disk is None:
        pytest.skip(f"no cgroup v1 blkio controller at {BLKIO} or no block device under {datafile}")
    cg = os.path.join(BLKIO, f"teye-test-{os.getpid()}")
    try:
        os.mkdir(cg)
        with open(os.path.join(cg, "blkio.throttle.read_bps_device"), "w") as f:
            f.write(f"{disk} {THROTTLE_BPS}")
    except OSError as e:
        if os.path.isdir(cg):
            os.rmdir(cg)
        pytest.skip(f"cannot throttle reads in a blkio cgroup: {e}")

    def enter():
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    yield enter, cg
    try:
        os.rmdir(cg)
    except OSError:
        pass


def _direct_ok(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    try:
        import mmap
        return os.preadv(fd, [mmap.mmap(-1, 4096)], 0) == 4096
    except OSError:
        return False
    finally:
        os.close(fd)


@pytest.mark.parametrize("variant", ["fadvise", "direct", "throttled"])
def test_reads_past_the_page_cache_are_storage(agent, datafile, request, variant):
    """A worker that reads its samples from storage (the file's pages dropped from the page cache with
    posix_fadvise, or read with O_DIRECT, or read with its disk throttled to 20 MiB/s in a blkio cgroup):
    the read_bytes of the worker (a child process) are the evidence, at the script's own rate; the cause
    is `storage`.  Buffered reads cost CPU (the kernel copies every page: on this kind of VM about 0.3 CPU s
    per s of reading at ~0.8 GB/s, plus the DataLoader's ~0.2): where the script's own CPU per second
    of wait (with its main thread's wait for a CPU) nears the 0.5 threshold the wait is partly the CPU's,
    and either cause is right (printed)."""
    job = f"cause-{variant}"
    kw = {}
    mode, piece_kib, reads = "read", 1024, 2
    if variant == "direct":
        if not _direct_ok(datafile):
            pytest.skip(f"the filesystem under {datafile} does not take O_DIRECT")
        mode, piece_kib, reads = "direct", 4096, 1
    elif variant == "throttled":
        enter, cg = request.getfixturevalue("throttled")
        kw["preexec_fn"] = enter
        piece_kib, reads, steps = 64, 1, 60     # 512 KiB a step: 25 ms at 20 MiB/s
    steps = 60
    run = teye_run([sys.executable, SCRIPT, mode, str(steps), datafile, str(piece_kib), str(reads)],
                   socket_path=agent.path, job=job, **kw)
    assert run.returncode == 0, run.stderr
    own = last_json(run.stdout)
    assert own["wait_share"] > 0.5, own
    j = agent.jobs()[job]
    v, w = j.verdict, j.evidence.input_wait
    own_rate = own["read_bytes"] / own["wait_s"]
    print(variant, "own", own, "own read rate %.0f MB/s" % (own_rate / 1e6), "teye", v.cause, v.evidence)
    assert v.kind == "input", v.evidence
    # the worker's reads are in the evidence, at the rate the script itself read while its loop waited
    assert 0.6 * own_rate <= w.read_bytes / w.wait_s <= 1.4 * own_rate, (w, own)
    # and so is the CPU both processes spent meanwhile, to the script's own (process_time of each)
    assert abs(w.cpu_ratio - own["cpu_per_wait_s"]) <= 0.15, (w, own)
    if variant == "throttled":
        assert w.read_bytes / w.wait_s <= 1.15 * THROTTLE_BPS, w     # the kernel held it to the throttle
    busy = own["cpu_per_wait_s"] + own["delay_per_wait_s"]    # the job's own CPU use and starvation
    if busy < 0.4:   # (throttled: about 0.2)
        assert v.cause == "storage", v.evidence
        assert "reads or stalls on I/O" in v.evidence, v.evidence
    else:   # the reads cost as much CPU as they wait for the disk (a fast disk): CPU or storage, never unknown
        assert v.cause in ("storage", "host_cpu"), v.evidence
    # the advice is PyTorch's, for a storage wait its storage layout too
    if v.cause == "storage":
        assert "DataLoader" in v.recommendation and "tf.data" not in v.recommendation, v.recommendation
