"""`teye doctor`: one line per capability, exit 0, plain about a machine without a GPU."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from agent.config import defaults
from agent.doctor import device_line, nfs_line, perf_line, report
from tests.conftest import DATA, PROCFS, SYSFS
from tests.gpu.fake_pynvml import FakeGpu, FakeNvml
from tests.procs import REPO


def test_doctor_on_this_machine_exits_0_and_says_whether_there_is_a_gpu():
    p = subprocess.run([sys.executable, "-m", "agent", "doctor"], cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    topics = [line.split(":", 1)[0] for line in lines]
    for topic in ("nvml", "infiniband", "nfs", "perf events", "permissions"):
        assert topic in topics
    if shutil.which("nvidia-smi") is None:
        assert lines[0].startswith("nvml: not available")
        assert "No NVIDIA GPU/NVML on this machine" in lines[0]
        assert 'teye_collector_absent{collector="gpu"} = 1, no alert' in lines[0]
        absent = next(x for x in lines if x.startswith("collectors absent ("))
        assert "gpu (NVML init failed: " in absent
    else:
        assert lines[0].startswith("nvml: ok")
    # the phase path: one implementation, in Python (issue 38)
    assert lines[-1] == "phase path: Python, protocol versions 1, 2 (clients sum steps shorter than 10 ms)"


def test_doctor_report_with_gpus_and_fixture_trees(tmp_path):
    fake = FakeNvml([FakeGpu(0), FakeGpu(1, name="NVIDIA A100-SXM4-80GB"), FakeGpu(2)])
    fake.gpus[1].gpm = False
    fake.gpus[1].memory_temperature = None                          # a GDDR board: no memory sensor
    fake.gpus[1].not_supported = {"nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetDecoderUtilization"}
    fake.gpus[2].enable_mig([1, 5])
    fake.gpus[2].lost = True
    dev = tmp_path / "dev"
    dev.mkdir()
    for name, mode in (("nvidiactl", 0o666), ("nvidia0", 0o666), ("nvidia1", 0o000)):
        (dev / name).write_text("")
        os.chmod(dev / name, mode)
    cfg = defaults()
    cfg["procfs"], cfg["sysfs"] = PROCFS, SYSFS
    cfg["cgroupfs"] = os.path.join(DATA, "cgroups", "v2_kube")
    lines = report(cfg, loader=lambda: fake, dev_root=str(dev), euid=1000)
    assert lines[0] == "nvml: ok: driver 550.54.15, NVML 12.550.54.15, CUDA 12.4, 3 GPU(s)"
    assert lines[1].startswith("gpu 0: NVIDIA H100 80GB HBM3 (GPU-00000000-aaaa-bbbb-cccc-000000000000, "
                               "pci 00000000:18:00.0); GPM supported; utilization ring ok (100 samples over 16.5 s)")
    assert "XID events ok" in lines[1] and "MIG off" in lines[1] and "ECC counters ok" in lines[1]
    assert "GPM not supported on this GPU (needs Hopper or newer): SM, tensor, DRAM and graphics-engine activity" \
        in lines[2]
    assert "are absent: NVML has no other way to them on this GPU" in lines[2]
    assert "teye_gpu_utilization_ratio (DCGM_FI_DEV_GPU_UTIL" in lines[2]
    # dcgm-exporter's defaults: what each GPU reports, what it leaves out (absent, not a failure)
    assert "; memory ok; memory temperature, PCIe replay counter, encoder utilization, decoder utilization ok;" \
        in lines[1]
    assert "; memory ok; encoder utilization ok; memory temperature, PCIe replay counter, decoder utilization " \
        "not supported (absent);" in lines[2]
    assert lines[3] == "gpu 2: not answering: nvmlDeviceGetHandleByIndex: GPU is lost"
    assert lines[4] == "infiniband: 2 device(s): i40iw0 (port 1), mlx4_0 (ports 1,2)"
    assert lines[5].startswith("nfs: 3 NFS mount(s): /mnt/nfs/test (nfs4 192.168.1.1:/srv/test)")
    assert lines[5].endswith("mountstats): readable")
    assert lines[6].startswith("perf events: not available")
    assert lines[7].startswith("permissions: nvidia0 -rw-rw-rw- ")
    assert "nvidia1 ---------- " in lines[7] and lines[7].count("NOT read/writable") in (0, 1)
    assert lines[8] == "host root: / (the agent's own root: pass --path.rootfs where the host's / is mounted elsewhere)"
    assert [line.split(":")[0] for line in lines[9:13]] == [  # then one line per hardware-counter group
        "pmu core cycles/instructions", "pmu floating point", "pmu memory bandwidth", "pmu PCIe bandwidth"]
    assert all("not supported: no hardware PMU" in line for line in lines[9:13])
    assert lines[13].startswith("jobs (cgroups): cgroup v2 (unified) at ")   # then the job cgroups found
    assert lines[14].startswith("jobs (cgroups): 2 pods under kubepods.slice (systemd driver)")
    assert lines[15].startswith("jobs (cgroups): job(s) deadbeef-3333-4444-5555-666677778888: cpuset.cpus.effective")
    assert lines[16].startswith("gpu allocation (Slurm): /run/teye/gpu-jobs does not exist")
    assert lines[17].startswith("gpu allocation (Kubernetes): off: ")   # no kubelet here (or no grpcio)
    assert lines[18] == "phase path: Python, protocol versions 1, 2 (clients sum steps shorter than 10 ms)"
    assert len(lines) == 19  # one line each
    fake.gpus[2].lost = False
    lines = report(cfg, loader=lambda: fake, dev_root=str(dev), euid=1000)
    assert "MIG on (2 instances: 2/1, 2/5)" in lines[3]
    assert fake.initialized is False  # doctor shuts NVML down again


def test_doctor_perf_and_nfs_lines(tmp_path):
    proc = tmp_path / "proc"
    (proc / "sys" / "kernel").mkdir(parents=True)
    (proc / "sys" / "kernel" / "perf_event_paranoid").write_text("3\n")
    assert perf_line(str(proc), 1000) == ("perf events: kernel.perf_event_paranoid=3: unprivileged users may not "
                                          "use perf events at all; teye does not run as root: this restriction "
                                          "applies (unless it has CAP_PERFMON)")
    (proc / "sys" / "kernel" / "perf_event_paranoid").write_text("-1\n")
    assert perf_line(str(proc), 0).endswith("all users may use all perf events; teye runs as root: not restricted")
    (proc / "self").mkdir()
    (proc / "self" / "mountinfo").write_text("21 0 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n")
    assert nfs_line(str(proc)) == "nfs: no NFS mounts"
    assert nfs_line(str(tmp_path / "nowhere")).startswith("nfs: cannot read ")
    assert device_line(str(tmp_path)) == f"permissions: no {tmp_path}/nvidia* device nodes (no NVIDIA driver here)"
