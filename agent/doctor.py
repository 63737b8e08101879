"""`teye doctor`: what this node supports and why not, one line each; always exits 0.

Covers NVML (library, driver, CUDA, each GPU: GPM, MIG, utilization ring, ECC, XID events),
InfiniBand devices (<sysfs>/class/infiniband), NFS mounts (<procfs>/self/mountinfo and
mountstats), perf events (<procfs>/sys/kernel/perf_event_paranoid), the permissions of
/dev/nvidia*, then one line per hardware-counter group (core cycles/instructions, floating point,
memory and PCIe bandwidth: supported, or why not), the cgroup layout the jobs collector found
(agent/sources/cgroups.py: v1, v2 or hybrid, Slurm and Kubernetes, and why a job is not seen), and the phase path's protocol versions
and resolution (agent/phases/protocol.py).  On a machine without an NVIDIA GPU it says so plainly: the agent then runs
with the GPU collector absent (teye_collector_absent{collector="gpu"} = 1, no alert).
"""
from __future__ import annotations

import glob
import grp
import os
import pwd
import stat
from typing import Callable, List, Optional

from .errors import SourceUnavailable
from .gpu.nvml import GpuLost, NvmlBackend, load_pynvml
from .sources import _files

PARANOID = {
    -1: "all users may use all perf events",
    0: "unprivileged users may use CPU-wide events, not raw tracepoints",
    1: "unprivileged users may profile their own processes (user and kernel space)",
    2: "unprivileged users may profile only the user space of their own processes",
    3: "unprivileged users may not use perf events at all",
}


def nvml_lines(loader: Callable[[], object] = load_pynvml) -> List[str]:
    """The NVML line, then one line per GPU (and MIG instance)."""
    try:
        b = NvmlBackend(loader())
        b.init()
    except SourceUnavailable as e:
        return [f"nvml: not available: {e}. No NVIDIA GPU/NVML on this machine: the agent runs with the GPU "
                f"collector absent (teye_collector_absent{{collector=\"gpu\"}} = 1, no alert)"]
    lines = []
    try:
        count = b.device_count()
        lines.append(f"nvml: ok: driver {b.driver_version() or '?'}, NVML {b.nvml_version() or '?'}, "
                     f"CUDA {b.cuda_driver_version() or '?'}, {count} GPU(s)")
        if count == 0:
            lines[-1] += "; no GPU found: the GPU source reports itself down"
        for i in range(count):
            lines.extend(_gpu_lines(b, i))
    except SourceUnavailable as e:
        lines.append(f"nvml: failed while probing: {e}")
    finally:
        b.shutdown()
    return lines


# What GPM alone gives, and what NVML offers instead before Hopper (issue 40).
NO_GPM = ("SM, tensor, DRAM and graphics-engine activity, SM occupancy, FP16/FP32/FP64 pipe activity and NVLink bytes "
          "(teye_gpu_sm_active_ratio ... teye_gpu_nvlink_*; dcgm-exporter's DCGM_FI_PROF_*) are absent: NVML has "
          "no other way to them on this GPU (DCGM's profiling module reads the hardware counters itself); NVML "
          "gives teye_gpu_utilization_ratio (DCGM_FI_DEV_GPU_UTIL: time a kernel ran) and "
          "teye_gpu_memory_utilization_ratio (DCGM_FI_DEV_MEM_COPY_UTIL) instead")


def _dcgm_defaults(b: NvmlBackend, h) -> List[str]:
    """dcgm-exporter's default counters that NVML gives: which this GPU reports (the rest are absent, no failure)."""
    have = {"memory temperature": "memory_temperature" in b.field_values(h),
            "PCIe replay counter": b.pcie_replays(h) is not None,
            "encoder utilization": b.codec_utilization(h, "encoder") is not None,
            "decoder utilization": b.codec_utilization(h, "decoder") is not None}
    ok = [k for k, v in have.items() if v]
    missing = [k for k, v in have.items() if not v]
    out = []
    if ok:
        out.append(", ".join(ok) + " ok")
    if missing:
        out.append(", ".join(missing) + " not supported (absent)")
    return out


def _gpu_lines(b: NvmlBackend, i: int) -> List[str]:
    try:
        h = b.handle_by_index(i)
        name, uuid, pci = b.name(h) or "?", b.uuid(h) or "?", b.pci_bus_id(h) or "?"
        parts = [f"gpu {i}: {name} ({uuid}, pci {pci})"]
        gpm = b.gpm_supported(h)
        parts.append("GPM supported" if gpm else ("GPM not supported on this GPU (needs Hopper or newer)"
                     if gpm is False else "GPM not available (driver without GPM)") + ": " + NO_GPM)
        samples = b.samples(h, 0)
        if samples is None:
            parts.append("utilization ring not supported")
        elif len(samples) >= 2:
            span = (samples[-1][0] - samples[0][0]) / 1e6
            parts.append(f"utilization ring ok ({len(samples)} samples over {span:.1f} s)")
        else:
            parts.append(f"utilization ring ok ({len(samples)} sample(s) so far)")
        used, _, _, reserved = b.memory(h)
        parts.append("memory info not available" if used is None else "memory ok" if reserved is not None
                     else "memory ok, reserved memory not reported (memory info v1)")
        parts.extend(_dcgm_defaults(b, h))
        parts.append("power ok" if b.power_watts(h) is not None else "power not supported")
        parts.append("ECC counters ok" if b.ecc_volatile(h) else "ECC off or not supported")
        procs = b.processes(h)
        parts.append("process list ok" if procs is not None else "process list not available (permissions?)")
        supported = b.call("nvmlDeviceGetSupportedEventTypes", h)
        parts.append("XID events ok" if supported is not None and supported & 0x8 else "XID events not supported")
        migs = b.mig_devices(h)
        parts.append(f"MIG on ({len(migs)} instances: " + ", ".join(f"{i}/{gi}" for gi, _ in migs) + ")"
                     if migs else "MIG off")
        return ["; ".join(parts)]
    except GpuLost as e:
        return [f"gpu {i}: not answering: {e.reason}"]


def infiniband_line(sysfs: str) -> str:
    root = os.path.join(sysfs, "class", "infiniband")
    try:
        devices = sorted(os.listdir(root))
    except FileNotFoundError:
        return f"infiniband: none ({root} does not exist)"
    except OSError as e:
        return f"infiniband: cannot list {root}: {e.strerror}"
    if not devices:
        return f"infiniband: none ({root} is empty)"
    parts = []
    for d in devices:
        try:
            ports = sorted(os.listdir(os.path.join(root, d, "ports")))
        except OSError:
            ports = []
        parts.append(f"{d} (port{'s' if len(ports) != 1 else ''} {','.join(ports) or 'none'})")
    return f"infiniband: {len(devices)} device(s): " + ", ".join(parts)


def nfs_line(procfs: str) -> str:
    path = os.path.join(procfs, "self", "mountinfo")
    try:
        text = _files.read_text(path, allow_empty=True)
    except OSError as e:
        return f"nfs: cannot read {path}: {e.strerror}"
    mounts = []
    for line in text.splitlines():
        pre, sep, post = line.partition(" - ")
        fields, tail = pre.split(), post.split()
        if not sep or len(fields) < 5 or len(tail) < 2:
            continue
        if tail[0] in ("nfs", "nfs4"):
            mounts.append(f"{fields[4]} ({tail[0]} {tail[1]})")
    if not mounts:
        return "nfs: no NFS mounts"
    stats = os.path.join(procfs, "self", "mountstats")
    readable = os.access(stats, os.R_OK)
    return (f"nfs: {len(mounts)} NFS mount(s): " + ", ".join(mounts)
            + f"; per-mount statistics ({stats}): {'readable' if readable else 'NOT readable'}")


def perf_line(procfs: str, euid: int) -> str:
    path = os.path.join(procfs, "sys", "kernel", "perf_event_paranoid")
    try:
        raw = _files.read_text(path).strip()
        level = int(raw)
    except FileNotFoundError:
        return f"perf events: not available ({path} does not exist: kernel without perf events, or a container)"
    except (OSError, ValueError) as e:
        return f"perf events: cannot read {path}: {getattr(e, 'strerror', None) or e}"
    meaning = PARANOID.get(max(-1, min(level, 3)), "unknown setting")
    who = "teye runs as root: not restricted" if euid == 0 else \
        "teye does not run as root: this restriction applies (unless it has CAP_PERFMON)"
    return f"perf events: kernel.perf_event_paranoid={level}: {meaning}; {who}"


def pmu_lines(sysfs: str, procfs: str, reader=None) -> List[str]:
    """One line per hardware-counter group (agent/pmu): supported, or why not."""
    from .pmu.source import GROUP_TITLES, probe
    return [f"pmu {GROUP_TITLES[g]}: " + ("supported: " if ok else "not supported: ") + detail
            for g, ok, detail in probe(sysfs, procfs, reader)]


def phase_path_line() -> str:
    from .phases.protocol import RESOLUTION_NS, VERSIONS
    return (f"phase path: Python, protocol versions {', '.join(map(str, VERSIONS))} (clients sum steps shorter "
            f"than {RESOLUTION_NS / 1e6:g} ms)")


def device_line(dev_root: str = "/dev") -> str:
    nodes = sorted(glob.glob(os.path.join(dev_root, "nvidia*")))
    nodes = [n for n in nodes if not os.path.isdir(n)]
    if not nodes:
        return f"permissions: no {os.path.join(dev_root, 'nvidia*')} device nodes (no NVIDIA driver here)"
    parts = []
    for n in nodes:
        try:
            st = os.stat(n)
        except OSError as e:
            parts.append(f"{n} ({e.strerror})")
            continue
        owner = _user(st.st_uid)
        group = _group(st.st_gid)
        ok = os.access(n, os.R_OK | os.W_OK)
        parts.append(f"{os.path.basename(n)} {stat.filemode(st.st_mode)} {owner}:{group}"
                     f"{'' if ok else ' NOT read/writable by teye'}")
    return "permissions: " + ", ".join(parts)


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _gpu_uuids(loader: Callable[[], object]) -> dict:
    """UUID -> GPU label ('0', '2/1') of this node's GPUs and MIG instances; empty without NVML."""
    try:
        b = NvmlBackend(loader())
        b.init()
    except SourceUnavailable:
        return {}
    out = {}
    try:
        for i in range(b.device_count()):
            try:
                h = b.handle_by_index(i)
                out[b.uuid(h) or f"?{i}"] = str(i)
                for gi, mh in b.mig_devices(h):
                    out[b.uuid(mh) or f"?{i}/{gi}"] = f"{i}/{gi}"
            except GpuLost:
                continue
    except SourceUnavailable:
        pass
    finally:
        b.shutdown()
    return out


def collector_lines(cfg, explicit=()) -> List[str]:
    """Each enabled collector read once, as the agent's first read (the phase socket is the agent's: not
    opened here), then counted by state: up, absent (no such hardware: no alert), down, disabled."""
    import copy

    from .daemon import build_sources
    from .sampler import Sampler
    cfg = copy.deepcopy(cfg)
    cfg["collectors"]["phases"]["enabled"] = False
    sampler = Sampler(build_sources(cfg), required=explicit)
    try:
        states = [sampler.read_once(n) for n in sampler.names]
    finally:
        sampler.stop(0.5)
    by: dict = {"up": [], "absent": [], "down": []}
    for st in states:
        by[st.state].append(st.name if st.state == "up" else f"{st.name} ({st.error})")
    off = [n for n, c in cfg["collectors"].items() if not c["enabled"] and n != "phases"]
    return [f"collectors {state} ({len(names)}): {'; '.join(names) or 'none'}" for state, names in by.items()] + \
        [f"collectors disabled ({len(off)}): {', '.join(off) or 'none'}; absent collectors (no such hardware "
         f"on this node) have teye_collector_absent 1 and do not fire TeyeCollectorFailing"]


def rootfs_line(rootfs: str, procfs: str) -> str:
    """Whether --path.rootfs shows the host's root filesystem (filesystem and os collectors)."""
    from .sources.filesystem import ROOTFS_EMPTY, ROOTFS_MISSING, FilesystemSource
    src = FilesystemSource(procfs, rootfs)
    state = src.rootfs_state()
    fix = ("not the host: mount the host's / there read-only (podman -v /:/host/root:ro,rslave; the DaemonSet's "
           "hostPath / at /host/root) or drop --path.rootfs; no filesystem is exported until then")
    if state == ROOTFS_MISSING:
        return f"host root: {rootfs} does not exist: {fix}"
    if state == ROOTFS_EMPTY:
        return f"host root: {rootfs} is an empty directory: {fix}"
    if src._prefix:
        osr = "os-release found" if any(os.path.isfile(p) for p in (os.path.join(rootfs, "etc/os-release"),
                                                                     os.path.join(rootfs, "usr/lib/os-release"))) \
            else "no os-release there"
        return f"host root: {rootfs} (--path.rootfs): mount points statted there, {osr}"
    return "host root: / (the agent's own root: pass --path.rootfs where the host's / is mounted elsewhere)"


def report(cfg, loader: Callable[[], object] = load_pynvml, dev_root: str = "/dev",
           euid: Optional[int] = None, collectors: bool = False, explicit=()) -> List[str]:
    euid = os.geteuid() if euid is None else euid
    lines = nvml_lines(loader)
    lines.append(infiniband_line(cfg["sysfs"]))
    lines.append(nfs_line(cfg["procfs"]))
    lines.append(perf_line(cfg["procfs"], euid))
    lines.append(device_line(dev_root))
    lines.append(rootfs_line(cfg["rootfs"], cfg["procfs"]))
    lines.extend(pmu_lines(cfg["sysfs"], cfg["procfs"]))
    from .sources.cgroups import doctor_lines as job_cgroup_lines
    lines.extend(job_cgroup_lines(cfg["cgroupfs"], cfg["jobs"]["pod_log_dir"], cfg["jobs"]["max_jobs"],
                                  cfg["procfs"]))
    from .sources.allocation import doctor_lines as allocation_lines
    lines.extend(allocation_lines(cfg, _gpu_uuids(loader)))
    if collectors:
        lines.extend(collector_lines(cfg, explicit))
    lines.append(phase_path_line())
    return lines


def main(args, cfg: dict) -> int:
    for line in report(cfg, collectors=True, explicit=getattr(args, "explicit_collectors", ())):
        print(line)
    return 0
