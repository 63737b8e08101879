"""Cost of the jobs collector (agent/sources/cgroups.py): CPU per read with 8 and 200 jobs on a node.

    python benchmarks/jobs_cgroups.py [--reads 60] [--skip-kernel]

CPU = time.process_time() around ``collect()`` (what one read of the collector costs the agent once
per interval, 5 s by default); median over --reads reads, after one warm-up read; divided by the
number of jobs.  Trees:

1. **kernel v1**: real Slurm-style job cgroups on this machine's cgroup v1 hierarchies (cpuacct, cpu,
   memory, blkio: ``slurm/uid_0/job_<id>/step_0``, a sleeping process in each), created and removed by
   this script (needs root; --skip-kernel skips it).  The kernel generates every file on read.
2. **files v1 / v2**: the same layouts as plain files in a temporary directory (the captured trees'
   formats), the cost of parsing alone.
3. **stale**: the v2 tree of 8 live jobs plus 20,000 job directories without a process (left behind):
   the cost of skipping them.

Peer in the same run: teye's node-wide ``cpu`` collector (/proc/stat of this machine) per read.
Series per job are counted from the reading's points.

Figures (2-core Debian VM shared with four other developers, --reads 40, CPU µs per read / per job):

    kernel v1, 8 jobs          1,638 / 205   8 series per job (no limit, cpuset or blkio I/O set on these)
    kernel v1, 200 jobs       39,845 / 199
    files v1, 8 / 200 jobs     1,078 / 135   25,243 / 126   9 series per job
    files v2, 8 / 200 jobs     1,187 / 148   29,002 / 145   16 series per job (with PSI)
    8 jobs + 20,000 stale    153,235         about 7.5 µs per stale directory
    peer: cpu collector            31 per read

So about 0.2 ms of CPU per job per read, every 5 s by default: 200 jobs cost 40 ms per 5 s (under 1 % of
one core), linear in the jobs; stale directories about 7.5 µs each.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from agent.sources.cgroups import JobsSource  # noqa: E402
from agent.sources.cpu import CpuSource  # noqa: E402

CONTROLLERS = ("cpuacct", "cpu", "memory", "blkio")
GiB = 1 << 30


def cost_us(read, reads: int) -> float:
    read()
    out = []
    for _ in range(reads):
        t = time.process_time()
        read()
        out.append((time.process_time() - t) * 1e6)
    return statistics.median(out)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)


def files_v1(root, n):
    for c in CONTROLLERS:
        write(f"{root}/{c}/cgroup.procs", "1\n")
    for i in range(n):
        rel = f"slurm/uid_1000/job_{1000 + i}"
        write(f"{root}/cpuacct/{rel}/cgroup.procs", "")
        write(f"{root}/cpuacct/{rel}/step_0/cgroup.procs", f"{4000 + i}\n")
        write(f"{root}/cpuacct/{rel}/cpuacct.usage_user", f"{i * 10**9}\n")
        write(f"{root}/cpuacct/{rel}/cpuacct.usage_sys", f"{i * 10**8}\n")
        write(f"{root}/cpuacct/{rel}/cpuacct.usage", f"{i * 11 * 10**8}\n")
        write(f"{root}/cpu/{rel}/cpu.cfs_quota_us", "-1\n")
        write(f"{root}/cpu/{rel}/cpu.cfs_period_us", "100000\n")
        write(f"{root}/memory/{rel}/memory.usage_in_bytes", f"{GiB}\n")
        write(f"{root}/memory/{rel}/memory.max_usage_in_bytes", f"{2 * GiB}\n")
        write(f"{root}/memory/{rel}/memory.limit_in_bytes", f"{8 * GiB}\n")
        write(f"{root}/memory/{rel}/memory.stat", "".join(f"{k} {i}\n" for k in (
            "cache", "rss", "rss_huge", "shmem", "mapped_file", "dirty", "writeback", "swap", "pgpgin", "pgpgout",
            "pgfault", "pgmajfault", "inactive_anon", "active_anon", "inactive_file", "active_file", "unevictable",
            "hierarchical_memory_limit", "total_cache", "total_rss", "total_rss_huge", "total_shmem",
            "total_mapped_file", "total_dirty", "total_writeback", "total_swap")))
        write(f"{root}/blkio/{rel}/blkio.throttle.io_service_bytes_recursive",
              "8:0 Read 100\n8:0 Write 200\n8:0 Sync 300\n8:0 Async 0\n8:0 Total 300\nTotal 300\n")


def files_v2(root, n, stale=0):
    write(f"{root}/cgroup.controllers", "cpuset cpu io memory pids\n")
    scope = f"{root}/system.slice/slurmstepd.scope"
    for i in range(n):
        d = f"{scope}/job_{1000 + i}"
        write(f"{d}/cgroup.procs", "")
        write(f"{d}/cgroup.events", "populated 1\nfrozen 0\n")
        write(f"{d}/cpu.stat", f"usage_usec {i}\nuser_usec {i}\nsystem_usec 0\nnr_periods 0\nnr_throttled 0\n"
                               "throttled_usec 0\nnr_bursts 0\nburst_usec 0\n")
        write(f"{d}/cpuset.cpus.effective", "0-7\n")
        write(f"{d}/cpu.max", "max 100000\n")
        write(f"{d}/memory.current", f"{GiB}\n")
        write(f"{d}/memory.peak", f"{2 * GiB}\n")
        write(f"{d}/memory.max", f"{8 * GiB}\n")
        write(f"{d}/memory.stat", "".join(f"{k} {i}\n" for k in (
            "anon", "file", "kernel", "kernel_stack", "pagetables", "sec_pagetables", "percpu", "sock", "vmalloc",
            "shmem", "file_mapped", "file_dirty", "file_writeback", "swapcached", "anon_thp", "file_thp",
            "shmem_thp", "inactive_anon", "active_anon", "inactive_file", "active_file", "unevictable",
            "slab_reclaimable", "slab_unreclaimable", "slab", "pgfault", "pgmajfault")))
        write(f"{d}/io.stat", "8:0 rbytes=100 wbytes=200 rios=1 wios=2 dbytes=0 dios=0\n")
        for res in ("cpu", "memory", "io"):
            write(f"{d}/{res}.pressure", "some avg10=0.00 avg60=0.00 avg300=0.00 total=10\n"
                                         "full avg10=0.00 avg60=0.00 avg300=0.00 total=5\n")
    for i in range(stale):
        os.makedirs(f"{scope}/job_{100000 + i}")


class KernelJobs:
    """n real v1 job cgroups, a `sleep` in each; removed by close()."""

    def __init__(self, n, base=800000):
        self.paths, self.procs = [], []
        for i in range(n):
            steps = []
            for c in CONTROLLERS:
                path = "/sys/fs/cgroup/" + c
                for part in ("slurm", "uid_0", f"job_{base + i}", "step_0"):
                    path = os.path.join(path, part)
                    if not os.path.isdir(path):
                        os.mkdir(path)
                        self.paths.append(path)
                steps.append(path)
            p = subprocess.Popen(["sleep", "600"])
            for s in steps:
                with open(os.path.join(s, "cgroup.procs"), "w") as fh:
                    fh.write(str(p.pid))
            self.procs.append(p)

    def close(self):
        for p in self.procs:
            p.kill()
            p.wait()
        for path in sorted(self.paths, key=len, reverse=True):
            for _ in range(20):
                try:
                    os.rmdir(path)
                    break
                except OSError:
                    time.sleep(0.05)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reads", type=int, default=60)
    ap.add_argument("--skip-kernel", action="store_true")
    args = ap.parse_args()
    rows = []
    peer = cost_us(CpuSource("/proc").collect, args.reads)
    tmp = tempfile.mkdtemp(prefix="teye-bench-cg-")
    try:
        for n in (8, 200):
            if not args.skip_kernel and os.geteuid() == 0 and os.path.exists("/sys/fs/cgroup/cpuacct/cgroup.procs"):
                k = KernelJobs(n)
                try:
                    src = JobsSource("/sys/fs/cgroup", None)
                    r = src.collect()
                    assert len(r.jobs) >= n, (len(r.jobs), n)
                    series = sum(1 for p in r.points() if p.value is not None and p.spec.name != "teye_jobs_cgroups")
                    rows.append((f"kernel v1, {n} jobs", cost_us(src.collect, args.reads), len(r.jobs), series))
                finally:
                    k.close()
            for kind, make in (("files v1", files_v1), ("files v2", files_v2)):
                root = os.path.join(tmp, f"{kind.split()[1]}-{n}")
                make(root, n)
                src = JobsSource(root, None)
                r = src.collect()
                series = sum(1 for p in r.points() if p.value is not None and p.spec.name != "teye_jobs_cgroups")
                rows.append((f"{kind}, {n} jobs", cost_us(src.collect, args.reads), len(r.jobs), series))
        root = os.path.join(tmp, "stale")
        files_v2(root, 8, stale=20000)
        src = JobsSource(root, None)
        r = src.collect()
        rows.append(("files v2, 8 jobs + 20,000 stale dirs", cost_us(src.collect, max(5, args.reads // 6)),
                     len(r.jobs), sum(1 for p in r.points() if p.value is not None
                                      and p.spec.name != "teye_jobs_cgroups")))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'tree':42} {'CPU us/read':>12} {'jobs':>5} {'us/job':>8} {'series/job':>10}")
    for name, us, jobs, series in rows:
        print(f"{name:42} {us:12.0f} {jobs:5d} {us / max(jobs, 1):8.1f} {series / max(jobs, 1):10.1f}")
    print(f"{'peer: cpu collector (/proc/stat), 1 read':42} {peer:12.0f}")


if __name__ == "__main__":
    main()
