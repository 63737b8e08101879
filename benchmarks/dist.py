"""Distribution figures: artifact sizes, install time from the wheelhouse against from source, image size, and
the agent's start-up time from the image against from the wheelhouse's venv.  Medians of N runs, side by side.

    python benchmarks/dist.py [--wheelhouse dist/wheelhouse] [--image localhost/teye:0.1.0]
                              [--oci dist/teye-0.1.0.oci.tar] [-n 3]

Needs `./dev.sh dist` first (and podman for the image figures).  Install from source is what deploy/install.sh
did before the wheelhouse: `pip install <checkout>` into a fresh venv (build isolation, PyPI or its cache, gcc).
Start-up: from the command to the first 200 on /metrics.
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def du(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_metrics(port: int, t0: float, timeout: float = 60.0) -> float:
    while time.monotonic() - t0 < timeout:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except OSError:
            time.sleep(0.02)
    raise RuntimeError("no /metrics")


def venv(dest: str) -> str:
    subprocess.run([PY, "-m", "venv", dest], check=True, capture_output=True)
    return os.path.join(dest, "bin")


def time_install(args) -> float:
    with tempfile.TemporaryDirectory() as d:
        b = venv(os.path.join(d, "v"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        t0 = time.monotonic()
        subprocess.run([os.path.join(b, "pip"), "install", "-q", "--disable-pip-version-check", *args],
                       check=True, capture_output=True, env=env)
        return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheelhouse", default=os.path.join(REPO, "dist", "wheelhouse"))
    ap.add_argument("--image", default="localhost/teye:0.1.0")
    ap.add_argument("--oci", default=os.path.join(REPO, "dist", "teye-0.1.0.oci.tar"))
    ap.add_argument("-n", type=int, default=3)
    a = ap.parse_args()
    wheels = os.path.join(a.wheelhouse, "wheels")
    teye = [f for f in os.listdir(wheels) if f.startswith("teye-")][0]
    print("artifact sizes")
    print(f"  wheelhouse (6 wheels + install.sh)  {mib(du(a.wheelhouse))}   teye wheel {mib(du(os.path.join(wheels, teye)))}")
    tgz = [f for f in os.listdir(os.path.dirname(a.wheelhouse)) if f.endswith("-wheelhouse.tar.gz")]
    if tgz:
        print(f"  wheelhouse .tar.gz                  {mib(du(os.path.join(os.path.dirname(a.wheelhouse), tgz[0])))}")
    have_image = shutil.which("podman") and subprocess.run(["podman", "image", "exists", a.image]).returncode == 0
    if have_image:
        size = int(subprocess.run(["podman", "image", "inspect", a.image, "--format", "{{.Size}}"],
                                  capture_output=True, text=True, check=True).stdout)
        print(f"  image {a.image}: {mib(size)} unpacked" + (f", OCI archive {mib(du(a.oci))}" if os.path.exists(a.oci) else ""))

    src = os.path.join(tempfile.mkdtemp(), "src")   # a clean copy: pip must not reuse this checkout's build/
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", "dist", "build", "*.egg-info", "__pycache__",
                                                             "*.so", "node_modules", "tests", "benchmarks", "docs"))
    offline = ["--no-index", "--find-links", wheels, "teye"]
    t_wh = [time_install(offline) for _ in range(a.n)]
    t_src = [time_install([src]) for _ in range(a.n)]
    mw, ms = statistics.median(t_wh), statistics.median(t_src)
    print(f"install into a fresh venv (median of {a.n})")
    print(f"  from the wheelhouse (--no-index)    {mw:6.2f} s")
    print(f"  from source (pip install checkout)  {ms:6.2f} s   ratio source/wheelhouse {ms / mw:.1f}x")

    with tempfile.TemporaryDirectory() as d:
        b = venv(os.path.join(d, "v"))
        subprocess.run([os.path.join(b, "pip"), "install", "-q", *offline], check=True, capture_output=True)
        starts = []
        for _ in range(a.n + 2):
            port = free_port()
            t0 = time.monotonic()
            p = subprocess.Popen([os.path.join(b, "teye"), "agent", f"--listen=127.0.0.1:{port}",
                                  f"--phase-socket={d}/p{port}.sock"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            try:
                starts.append(wait_metrics(port, t0))
            finally:
                p.terminate()
                p.wait()
    print(f"agent start-up to the first /metrics (median of {a.n + 2})")
    print(f"  from the wheelhouse's venv          {statistics.median(starts):6.2f} s")
    if have_image:
        run = tempfile.mkdtemp()
        os.chown(run, 65210, 65210)
        starts = []
        extra = (["--runtime", "runc"] if shutil.which("runc") else []) + \
            ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]
        for _ in range(a.n + 2):
            port = free_port()
            name = f"teye-bench-{port}"
            t0 = time.monotonic()
            subprocess.run(["podman", "run", "-d", "--name", name, "--network", "host", *extra,
                            "-v", "/proc:/host/proc:ro", "-v", "/sys:/host/sys:ro", "-v", f"{run}:/run/teye", a.image,
                            "agent", f"--listen=127.0.0.1:{port}", "--procfs=/host/proc", "--sysfs=/host/sys",
                            "--phase-socket=/run/teye/phases.sock"], check=True, capture_output=True)
            try:
                starts.append(wait_metrics(port, t0))
            finally:
                subprocess.run(["podman", "rm", "-f", "-t", "1", name], capture_output=True)
        print(f"  from the image (podman run)         {statistics.median(starts):6.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
