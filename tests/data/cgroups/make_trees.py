"""Writes the captured cgroup trees beside this script (run once; the trees are committed).

File formats follow the kernel's documentation (Documentation/admin-guide/cgroup-v1/{cpuacct,memory,
blkio-controller,cpusets}.rst, Documentation/admin-guide/cgroup-v2.rst, Documentation/accounting/psi.rst);
the numbers are chosen so every exported value is easy to check by hand: tests/sources/test_cgroups.py
holds the expected values, written out, not computed from these files.
"""
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
GiB = 1 << 30
NOLIMIT = 9223372036854771712


def w(root, rel, text):
    path = os.path.join(HERE, root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)


def mkdir(root, rel):
    """A directory with no cgroup file (git keeps it through an empty .keep)."""
    w(root, f"{rel}/.keep", "")


def v1_job(root, rel, usage_user=None, usage_sys=None, stat=None, cpuset=None, quota=-1, period=100000,
           mem=None, blkio=None, pid=None):
    """One job's files in each v1 hierarchy; the process sits in step_0 (as Slurm's task plugin puts it)."""
    a = f"cpuacct/{rel}"
    w(root, f"{a}/cgroup.procs", "")
    w(root, f"{a}/step_0/cgroup.procs", f"{pid}\n" if pid else "")
    if usage_user is not None:
        w(root, f"{a}/cpuacct.usage_user", f"{usage_user}\n")
        w(root, f"{a}/cpuacct.usage_sys", f"{usage_sys}\n")
        w(root, f"{a}/cpuacct.usage", f"{usage_user + usage_sys}\n")
    if stat is not None:   # an older kernel: no usage_user/usage_sys; the exact total is in cpuacct.usage
        w(root, f"{a}/cpuacct.stat", f"user {stat[0]}\nsystem {stat[1]}\n")
        w(root, f"{a}/cpuacct.usage", f"{(stat[0] + stat[1]) * 10**7}\n")   # USER_HZ 100: 10 ms a tick
    w(root, f"cpu/{rel}/cpu.cfs_quota_us", f"{quota}\n")
    w(root, f"cpu/{rel}/cpu.cfs_period_us", f"{period}\n")
    if cpuset:
        w(root, f"cpuset/{rel}/cpuset.cpus", cpuset + "\n")
    if mem:
        usage, peak, limit, cache, rss = mem
        w(root, f"memory/{rel}/memory.usage_in_bytes", f"{usage}\n")
        w(root, f"memory/{rel}/memory.max_usage_in_bytes", f"{peak}\n")
        w(root, f"memory/{rel}/memory.limit_in_bytes", f"{limit}\n")
        # the job's own (non-hierarchical) cache/rss differ from total_*: only total_* count children
        w(root, f"memory/{rel}/memory.stat",
          f"cache 0\nrss 0\nmapped_file 0\nswap 0\npgfault 10\nhierarchical_memory_limit {limit}\n"
          f"total_cache {cache}\ntotal_rss {rss}\ntotal_mapped_file 4096\ntotal_swap 0\n")
    if blkio:
        w(root, f"blkio/{rel}/blkio.throttle.io_service_bytes_recursive", blkio)


def v1_roots(root):
    for c in ("cpuacct", "cpu", "cpuset", "memory", "blkio"):
        w(root, f"{c}/cgroup.procs", "1\n")


def v2_job(root, rel, cpu_stat, cpuset=None, cpu_max="max 100000", current=None, peak=None, mx="max",
           stat=None, io=None, psi=True, populated=1):
    w(root, f"{rel}/cgroup.procs", "")
    w(root, f"{rel}/cgroup.events", f"populated {populated}\nfrozen 0\n")
    w(root, f"{rel}/cpu.stat", cpu_stat)
    if cpuset:
        w(root, f"{rel}/cpuset.cpus.effective", cpuset + "\n")
    w(root, f"{rel}/cpu.max", cpu_max + "\n")
    if current is not None:
        w(root, f"{rel}/memory.current", f"{current}\n")
    if peak is not None:
        w(root, f"{rel}/memory.peak", f"{peak}\n")
    w(root, f"{rel}/memory.max", f"{mx}\n")
    if stat:
        w(root, f"{rel}/memory.stat", stat)
    if io is not None:
        w(root, f"{rel}/io.stat", io)
    if psi:
        w(root, f"{rel}/cpu.pressure", "some avg10=1.00 avg60=0.50 avg300=0.10 total=2500000\n"
                                      "full avg10=0.00 avg60=0.00 avg300=0.00 total=1000000\n")
        w(root, f"{rel}/memory.pressure", "some avg10=0.00 avg60=0.00 avg300=0.00 total=300000\n"
                                         "full avg10=0.00 avg60=0.00 avg300=0.00 total=200000\n")
        w(root, f"{rel}/io.pressure", "some avg10=2.00 avg60=1.00 avg300=0.50 total=7000000\n"
                                     "full avg10=1.00 avg60=0.50 avg300=0.25 total=4000000\n")


MEMSTAT2 = ("anon {anon}\nfile {file}\nkernel 8192\nkernel_stack 16384\nsock 0\nshmem 0\nfile_mapped 4096\n"
            "file_dirty 0\npgfault 100\n")


def main():
    for d in ("v1_slurm", "v2_slurm", "v1_kube", "v2_kube"):
        shutil.rmtree(os.path.join(HERE, d), ignore_errors=True)
    # --- Slurm on cgroup v1
    r = "v1_slurm"
    v1_roots(r)
    v1_job(r, "slurm/uid_1000/job_1001", usage_user=12_500_000_000, usage_sys=2_250_000_000, cpuset="0-3",
           mem=(3 * GiB, 4 * GiB, 8 * GiB, 1 * GiB, 2 * GiB), pid=4242,
           blkio="8:0 Read 1000\n8:0 Write 2000\n8:0 Sync 2500\n8:0 Async 500\n8:0 Total 3000\n"
                 "8:16 Read 500\n8:16 Write 0\n8:16 Total 500\nTotal 3500\n")
    # an older kernel (no usage_user/usage_sys): cpuacct.stat in USER_HZ; a CPU quota of 2; no limit; blkio
    # not enabled for this job
    v1_job(r, "slurm/uid_1001/job_1002", stat=(300, 50), cpuset="0-15", quota=200000, period=100000,
           mem=(512 << 20, 768 << 20, NOLIMIT, 256 << 20, 200 << 20), pid=4343)
    mkdir(r, "cpuacct/slurm/uid_1001/job_1003")            # left behind: a directory with no cgroup files
    v1_job(r, "slurm/uid_1001/job_1004", stat=(1, 1), mem=(4096, 4096, NOLIMIT, 0, 4096))  # no process: stale
    mkdir(r, "cpuacct/slurm/uid_1000/job_abc")              # not a job id
    # --- Slurm on cgroup v2: slurmstepd.scope layout, and the older slurm/uid_* one
    r = "v2_slurm"
    w(r, "cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n")
    w(r, "cgroup.procs", "1\n")
    v2_job(r, "system.slice/slurmstepd.scope/job_2001",
           "usage_usec 40000000\nuser_usec 30000000\nsystem_usec 10000000\nnr_periods 0\nnr_throttled 0\n"
           "throttled_usec 0\n", cpuset="0-1,4", current=6 * GiB, peak=7 * GiB, mx=str(16 * GiB),
           stat=MEMSTAT2.format(anon=5 * GiB, file=GiB // 2),
           io="8:0 rbytes=1048576 wbytes=2097152 rios=10 wios=20 dbytes=0 dios=0\n"
              "259:0 rbytes=1048576 wbytes=0 rios=5 wios=0 dbytes=0 dios=0\n")
    v2_job(r, "system.slice/slurmstepd.scope/job_2002", "usage_usec 1\nuser_usec 1\nsystem_usec 0\n",
           current=0, populated=0)                          # ended, directory not removed yet
    # the older layout; no memory.peak (kernel < 5.19); no io controller enabled; quota 1.5 CPUs; no PSI
    v2_job(r, "slurm/uid_1000/job_2003", "usage_usec 2000000\nuser_usec 1500000\nsystem_usec 500000\n",
           cpu_max="150000 100000", current=100 << 20, stat=MEMSTAT2.format(anon=60 << 20, file=40 << 20),
           psi=False)
    mkdir(r, "system.slice/slurmstepd.scope/system")        # slurmstepd's own cgroup: not a job
    # --- Kubernetes, cgroup v1, cgroupfs driver: guaranteed pods directly under kubepods
    r = "v1_kube"
    v1_roots(r)
    g, b, be = "0f9c7f2a-1111-4c1d-9d6e-0123456789ab", "a1b2c3d4-2222-4e5f-8a9b-abcdefabcdef", \
        "deadbeef-3333-4444-5555-666677778888"
    v1_job(r, f"kubepods/pod{g}", usage_user=1_000_000_000, usage_sys=500_000_000, quota=400000, period=100000,
           mem=(GiB, 2 * GiB, 4 * GiB, 100 << 20, 900 << 20), pid=77,
           blkio="8:0 Read 4096\n8:0 Write 8192\n8:0 Total 12288\nTotal 12288\n")
    v1_job(r, f"kubepods/burstable/pod{b}", usage_user=2_000_000_000, usage_sys=0, mem=(GiB, GiB, NOLIMIT, 0, GiB),
           pid=78)
    v1_job(r, f"kubepods/besteffort/pod{be}", usage_user=0, usage_sys=250_000_000, mem=(4096, 8192, NOLIMIT, 0, 4096),
           pid=79)
    mkdir(r, "var_log_pods/default_trainer-0_" + g)
    mkdir(r, "var_log_pods/ml_loader-7f9_" + b)
    # --- Kubernetes, cgroup v2, systemd driver
    r = "v2_kube"
    w(r, "cgroup.controllers", "cpuset cpu io memory pids\n")
    w(r, "cgroup.procs", "1\n")
    v2_job(r, "kubepods.slice/kubepods-pod" + g.replace("-", "_") + ".slice",
           "usage_usec 9000000\nuser_usec 8000000\nsystem_usec 1000000\n", cpu_max="800000 100000",
           cpuset="0-15", current=2 * GiB, peak=3 * GiB, mx=str(2 * GiB + GiB // 2),
           stat=MEMSTAT2.format(anon=GiB + GiB // 2, file=GiB // 2), io="8:0 rbytes=10 wbytes=20\n")
    v2_job(r, "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + be.replace("-", "_") + ".slice",
           "usage_usec 3000000\nuser_usec 2000000\nsystem_usec 1000000\n", current=1 << 20, peak=2 << 20,
           stat=MEMSTAT2.format(anon=1 << 20, file=0), io="")


if __name__ == "__main__":
    main()
