"""Idle footprint of `teye agent` beside Debian's prometheus-node-exporter, in one run.

    python benchmarks/footprint.py [--seconds 60] [--rounds 3] [--image TAG] [--baseline DIR] [--threads]

Every exporter runs at once for --rounds windows of --seconds each, each scraped every 15 s as Prometheus
would, so the machine's noise (other users of a shared VM) falls on all of them alike:

- node_exporter with its default collectors (the peer);
- teye with the defaults (no GPU: the gpu collector absent) -- "host";
- teye with ``host.node_exporter: true`` (node_exporter keeps the host) -- "ne-mode";
- teye with the defaults on the synthetic 8-GPU replay (tests/data/gpu/make_synthetic_trace.py) -- "8gpu";
- with --image TAG: the image under podman with README.md's mounts (its default command) -- "image";
- with --baseline DIR: teye from another checkout at the defaults -- "before".

For each window: CPU time (utime + stime from /proc/<pid>/stat) over the window as a share of one core, and
VmRSS/VmHWM at its end.  Printed: per-window figures, the medians, and each teye's ratio to node_exporter's
median.  --threads adds, for the "host" agent, each thread's CPU and wakeups (voluntary + involuntary context
switches, /proc/<pid>/task/*/status) per second over the last window, by the thread's name (the sampler names
its threads teye-<collector>), and each collector's read duration from the agent's own
teye_collector_duration_seconds.
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
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.procs import REPO, free_port, wait_http  # noqa: E402
from benchmarks._proc import cpu_seconds, status  # noqa: E402

NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
TRACE_TOOL = os.path.join(REPO, "tests", "data", "gpu", "make_synthetic_trace.py")
TICK = os.sysconf("SC_CLK_TCK")


class Proc:
    def __init__(self, name, argv, url, cwd=None, pid_of=None):
        self.name, self.url = name, url
        self.popen = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_http(url, timeout=90)
        self.pid = pid_of() if pid_of else self.popen.pid

    def scrape(self):
        with urllib.request.urlopen(self.url, timeout=10) as r:
            return r.read()

    def stop(self):
        self.popen.terminate()
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            self.popen.kill()


def teye(name, tree, tmp, extra_conf="", replay=None):
    port = free_port()
    conf = os.path.join(tmp, f"{name}.yml")
    with open(conf, "w") as fh:
        fh.write("log_level: warning\n" + extra_conf)
    argv = [sys.executable, "-m", "agent", "agent", "--config", conf, "--listen", f"127.0.0.1:{port}",
            "--phase-socket", os.path.join(tmp, f"{name}.sock")]
    if replay:
        argv += ["--gpu-replay", replay]
    return Proc(name, argv, f"http://127.0.0.1:{port}/metrics", cwd=tree)


def image(tag, tmp):
    port = free_port()
    run_dir = os.path.join(tmp, "run-teye")
    os.makedirs(run_dir)
    os.chown(run_dir, 65210, 65210)
    cname = f"teye-footprint-{port}"
    rt = ["--runtime", "runc"] if shutil.which("runc") else []
    argv = ["podman", "run", "--rm", "--name", cname, "--network", "host", *rt,
            "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096",
            "-v", "/:/host/root:ro,rslave", "-v", "/proc:/host/proc:ro", "-v", "/sys:/host/sys:ro",
            "-v", f"{run_dir}:/run/teye", tag, "agent", f"--listen=127.0.0.1:{port}", "--procfs=/host/proc",
            "--sysfs=/host/sys", "--path.rootfs=/host/root", "--cgroupfs=/host/sys/fs/cgroup",
            "--phase-socket=/run/teye/phases.sock", "--log-level=warning"]

    def pid():
        return int(subprocess.run(["podman", "inspect", cname, "--format", "{{.State.Pid}}"], capture_output=True,
                                  text=True, check=True).stdout)
    p = Proc("image", argv, f"http://127.0.0.1:{port}/metrics", pid_of=pid)
    p.cname = cname
    return p


def threads(pid):
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as fh:
                comm = fh.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                f = fh.read().rsplit(")", 1)[1].split()
            st = {}
            with open(f"/proc/{pid}/task/{tid}/status") as fh:
                for line in fh:
                    k, _, v = line.partition(":")
                    if k.endswith("ctxt_switches"):
                        st[k] = int(v)
        except OSError:
            continue
        out[tid] = (comm, (int(f[11]) + int(f[12])) / TICK, sum(st.values()))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--image", metavar="TAG")
    ap.add_argument("--baseline", metavar="DIR")
    ap.add_argument("--threads", action="store_true")
    a = ap.parse_args()
    if NODE_EXPORTER is None:
        sys.exit("prometheus-node-exporter is not installed")
    tmp = tempfile.mkdtemp(prefix="teye-footprint-")
    trace = os.path.join(tmp, "gpu8.json")
    subprocess.run([sys.executable, TRACE_TOOL, trace, "--gpus", "8"], check=True, cwd=REPO,
                   stdout=subprocess.DEVNULL)
    procs = []
    try:
        ne_port = free_port()
        procs.append(Proc("node_exporter", [NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{ne_port}"],
                          f"http://127.0.0.1:{ne_port}/metrics"))
        procs.append(teye("host", REPO, tmp))
        procs.append(teye("ne-mode", REPO, tmp, "host:\n  node_exporter: true\n"))
        procs.append(teye("8gpu", REPO, tmp, replay=trace))
        if a.baseline:
            procs.append(teye("before", a.baseline, tmp))
        if a.image:
            procs.append(image(a.image, tmp))
        time.sleep(20)                      # start-up (imports, first reads) out of the windows
        cpu = {p.name: [] for p in procs}
        rss = {p.name: [] for p in procs}
        hwm = {p.name: [] for p in procs}
        host = next(p for p in procs if p.name == "host")
        for r in range(a.rounds):
            c0 = {p.name: cpu_seconds(p.pid) for p in procs}
            t0 = time.monotonic()
            th0 = threads(host.pid)
            next_scrape = t0
            while time.monotonic() - t0 < a.seconds:
                if time.monotonic() >= next_scrape:
                    for p in procs:
                        p.scrape()
                    next_scrape += 15.0
                time.sleep(min(1.0, max(0.0, a.seconds - (time.monotonic() - t0))))
            wall = time.monotonic() - t0
            th1 = threads(host.pid)
            for p in procs:
                cpu[p.name].append(100.0 * (cpu_seconds(p.pid) - c0[p.name]) / wall)
                st = status(p.pid)
                rss[p.name].append(st["VmRSS"] / 1024)
                hwm[p.name].append(st["VmHWM"] / 1024)
            print(f"window {r + 1}: " + ", ".join(f"{n} {v[-1]:.3f} %" for n, v in cpu.items()), flush=True)
        ne = statistics.median(cpu["node_exporter"])
        ne_rss = statistics.median(rss["node_exporter"])
        print(f"\n{'exporter':<14} {'CPU % of a core (median)':>24} {'ratio':>6} {'VmRSS MiB':>10} {'ratio':>6} "
              f"{'VmHWM MiB':>10}   windows")
        for p in procs:
            m = statistics.median(cpu[p.name])
            mr = statistics.median(rss[p.name])
            print(f"{p.name:<14} {m:>24.3f} {m / ne if ne else float('nan'):>6.2f} {mr:>10.1f} "
                  f"{mr / ne_rss:>6.2f} {max(hwm[p.name]):>10.1f}   "
                  + " ".join(f"{v:.3f}" for v in cpu[p.name]))
        if a.threads:
            by = {}
            for tid, (comm, c1, w1) in th1.items():
                c0_, w0_ = (th0[tid][1], th0[tid][2]) if tid in th0 else (0.0, 0)
                agg = by.setdefault(comm, [0, 0.0, 0])
                agg[0] += 1
                agg[1] += c1 - c0_
                agg[2] += w1 - w0_
            print(f"\nthreads of the host agent over the last window ({wall:.0f} s):")
            print(f"{'thread':<18} {'n':>3} {'CPU % of a core':>16} {'wakeups/s':>10}")
            for comm, (n, c, w) in sorted(by.items(), key=lambda kv: -kv[1][1]):
                print(f"{comm:<18} {n:>3} {100 * c / wall:>16.4f} {w / wall:>10.2f}")
            body = host.scrape().decode()
            print("\nread duration per collector (teye_collector_duration_seconds, last read):")
            for line in body.splitlines():
                if line.startswith("teye_collector_duration_seconds{"):
                    print("  " + line)
    finally:
        for p in procs:
            if getattr(p, "cname", None):
                subprocess.run(["podman", "rm", "-f", "-t", "2", p.cname], capture_output=True)
            p.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
