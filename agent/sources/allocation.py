"""Which job each GPU is allocated to, whether or not it runs a process on it (the ``allocation`` collector).

A GPU that a job was given and never touched has no process, so the process list
(``teye_gpu_process_info``) cannot show it.  Two schedulers say what they allocated:

- **Slurm**: a prolog writes one file per allocated GPU into a mapping directory and the epilog removes
  them (``deploy/slurm/teye-gpu-prolog.sh`` / ``teye-gpu-epilog.sh``).  The format is the one
  dcgm-exporter's ``--hpc-job-mapping-dir`` reads, so one prolog serves both: the file name is the GPU's
  index (``3``) or ``<GPU index>.<GPU instance id>`` for a MIG instance (``2.1``, teye's GPU ``2/1``),
  the content the job ids holding it, one per line.
- **Kubernetes**: the kubelet's pod-resources API (``/var/lib/kubelet/pod-resources/kubelet.sock``,
  gRPC ``v1.PodResourcesLister/List``): namespace, pod and container of each allocated device of an
  NVIDIA resource (``nvidia.com/gpu``, ``nvidia.com/mig-*``), named by GPU or MIG UUID; the GPU
  source's UUIDs turn them into teye's GPU labels.  gRPC is optional (``pip install teye[kubernetes]``):
  without ``grpcio`` this half is off and ``teye doctor`` says so.  The kubelet is asked from a
  background thread with a timeout; a scrape reads the last answer and never waits for it.

A mapping file that is empty, names a GPU this node does not have, or names a job that no longer has a
cgroup on the node (the epilog did not run) is not exported: ``teye doctor`` lists it and the agent logs
one rate-limited line.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Set, Tuple

from ..errors import ParseError, SourceUnavailable
from ..logutil import RateLimitedLog
from ..metrics import GAUGE, Point, metric, point
from . import cgroups
from ._files import read_bytes

log = logging.getLogger("teye.sources.allocation")

ALLOCATION_INFO = metric(
    "teye_gpu_allocation_info", GAUGE,
    "Always 1 per GPU (NVML index, or 'index/instance' for a MIG instance) and the job it is allocated to, "
    "busy or not: a Slurm job (slurm_job, from the prolog's mapping directory) or a Kubernetes container "
    "(namespace, pod, container, from the kubelet's pod-resources API); the other labels are empty.",
    ["gpu", "slurm_job", "namespace", "pod", "container"])
KUBELET_UP = metric(
    "teye_kubelet_pod_resources_up", GAUGE,
    "1 when the kubelet's pod-resources List answered at the last refresh, 0 when it refused, failed or was "
    "slow; absent where there is no kubelet socket, grpcio is not installed or allocation.kubelet_socket is unset.")

MAPPING_FILE_BYTES = 65536   # a mapping file holds a few job ids (one per line); anything larger is refused
LIST_METHOD = "/v1.PodResourcesLister/List"
_GPU_FILE = re.compile(r"([0-9]+)(?:\.([0-9]+))?")   # fullmatch, ASCII digits only
_GKE_MIG = re.compile(r"^nvidia(\d+)/gi(\d+)(?:/vgpu\d+)?$")
_JOB_ID = re.compile(r"[0-9]{1,18}")                  # fullmatch, ASCII digits only


# ----------------------------------------------------------------------------- Slurm mapping directory

@dataclass(frozen=True)
class Mapping:
    """The mapping directory read once: GPU label -> job ids, and what was wrong with the rest."""

    jobs: Dict[str, Tuple[str, ...]]
    problems: Tuple[str, ...] = ()
    present: bool = True


def read_mapping_dir(path: str) -> Mapping:
    """Parse a dcgm-exporter-format HPC job mapping directory (files named by GPU, job ids one per line)."""
    try:
        with os.scandir(path) as it:
            entries = sorted((e.name for e in it if e.is_file()), key=lambda n: (len(n), n))
    except FileNotFoundError:
        return Mapping({}, (f"{path} does not exist (no Slurm prolog writes it here)",), present=False)
    except OSError as e:
        return Mapping({}, (f"cannot list {path}: {e.strerror}",), present=False)
    jobs: Dict[str, Tuple[str, ...]] = {}
    problems: List[str] = []
    for name in entries:
        m = _GPU_FILE.fullmatch(name)
        if not m:
            continue   # not a mapping file (dcgm-exporter skips these too)
        gpu = m.group(1) if m.group(2) is None else f"{m.group(1)}/{m.group(2)}"
        try:
            text = read_bytes(os.path.join(path, name), MAPPING_FILE_BYTES).decode("utf-8", "replace")
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        except FileNotFoundError:
            continue   # removed by an epilog while we listed
        except OSError as e:   # FileRefused too: a FIFO or device, or larger than MAPPING_FILE_BYTES
            problems.append(f"{name}: cannot read ({e.strerror})")
            continue
        if not lines:
            problems.append(f"{name}: empty (a prolog that failed half-way?): GPU {gpu} not attributed")
            continue
        good = tuple(dict.fromkeys(j for j in lines if _JOB_ID.fullmatch(j)))
        bad = [j for j in lines if not _JOB_ID.fullmatch(j)]
        if bad:
            problems.append(f"{name}: {bad[0][:40]!r} is not a job id")
        if good:
            jobs[gpu] = good
    return Mapping(jobs, tuple(problems))


# ----------------------------------------------------------------------------- kubelet pod-resources

class _Wire:
    """Just enough of the protobuf wire format to read ListPodResourcesResponse (no generated code)."""

    @staticmethod
    def fields(buf: bytes, what: str) -> Iterator[Tuple[int, object]]:
        i, n = 0, len(buf)
        while i < n:
            key, i = _Wire.varint(buf, i, what)
            num, wt = key >> 3, key & 7
            if wt == 0:
                v, i = _Wire.varint(buf, i, what)
                yield num, v
            elif wt == 2:
                ln, i = _Wire.varint(buf, i, what)
                if i + ln > n:
                    raise ParseError(what, "truncated length-delimited field")
                yield num, buf[i:i + ln]
                i += ln
            elif wt == 1:
                i += 8
            elif wt == 5:
                i += 4
            else:
                raise ParseError(what, f"unsupported wire type {wt}")
        if i > n:
            raise ParseError(what, "truncated fixed-width field")

    @staticmethod
    def varint(buf: bytes, i: int, what: str) -> Tuple[int, int]:
        shift = v = 0
        while True:
            if i >= len(buf) or shift > 63:
                raise ParseError(what, "truncated varint")
            b = buf[i]
            i += 1
            v |= (b & 0x7F) << shift
            if not b & 0x80:
                return v, i
            shift += 7


@dataclass(frozen=True)
class PodDevice:
    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str


def _message(buf: bytes, what: str, strings: Dict[int, str], repeated: Dict[int, str]) -> Dict[str, object]:
    """One message's fields: the string fields by name ('' when absent), the repeated ones as lists of bytes."""
    out: Dict[str, object] = {n: "" for n in strings.values()}
    out.update({n: [] for n in repeated.values()})
    for num, val in _Wire.fields(buf, what):
        if not isinstance(val, bytes):
            continue
        if num in strings:
            out[strings[num]] = val.decode("utf-8", "replace")
        elif num in repeated:
            out[repeated[num]].append(val)
    return out


def decode_list_response(data: bytes) -> Tuple[PodDevice, ...]:
    """Every (namespace, pod, container, resource, device id) of a v1 ListPodResourcesResponse
    (pod_resources = 1; PodResources: name 1, namespace 2, containers 3; ContainerResources: name 1,
    devices 2; ContainerDevices: resource_name 1, device_ids 2)."""
    w = "ListPodResourcesResponse"
    out = []
    for pod_b in _message(data, w, {}, {1: "pods"})["pods"]:
        pod = _message(pod_b, w + ".PodResources", {1: "name", 2: "namespace"}, {3: "containers"})
        for c_b in pod["containers"]:
            c = _message(c_b, w + ".ContainerResources", {1: "name"}, {2: "devices"})
            for d_b in c["devices"]:
                d = _message(d_b, w + ".ContainerDevices", {1: "resource"}, {2: "ids"})
                out += [PodDevice(pod["namespace"], pod["name"], c["name"], d["resource"],
                                  i.decode("utf-8", "replace")) for i in d["ids"]]
    return tuple(out)


def is_gpu_resource(name: str) -> bool:
    return name == "nvidia.com/gpu" or name.startswith("nvidia.com/mig-") or name == "nvidia.com/gpu.shared"


def gpu_label(device_id: str, uuids: Dict[str, str]) -> Optional[str]:
    """teye's GPU label for a kubelet device id: a GPU or MIG UUID (time-slicing suffix '::N' dropped),
    or GKE's ``nvidia<N>/gi<M>``; None when it cannot be named."""
    dev = device_id.split("::", 1)[0]
    if dev in uuids:
        return uuids[dev]
    m = _GKE_MIG.match(dev)
    if m:
        return f"{m.group(1)}/{m.group(2)}"
    m = re.match(r"^nvidia(\d+)$", dev)
    return m.group(1) if m else None


GRPC_MISSING = ("grpcio is not installed (pip install 'teye[kubernetes]'): GPU allocation to "
                "Kubernetes pods is off")


def grpc_installed() -> bool:
    """Whether grpcio can be imported, without importing it (about 10 MiB of RSS an agent on a node
    without a kubelet socket never needs: it is imported at the first List call)."""
    try:
        return importlib.util.find_spec("grpc") is not None
    except (ImportError, ValueError):
        return False


def load_grpc():
    """The grpc module, or SourceUnavailable saying how to get it."""
    try:
        import grpc   # optional dependency (extra 'kubernetes')
    except ImportError:
        raise SourceUnavailable(GRPC_MISSING) from None
    return grpc


class SocketMissing(SourceUnavailable):
    """No kubelet socket: not a Kubernetes node (or the directory is not mounted)."""


def list_pod_resources(socket_path: str, timeout_s: float, grpc_mod=None) -> Tuple[PodDevice, ...]:
    """One List call; SourceUnavailable (missing, refused, slow, garbled) with the reason."""
    if not os.path.exists(socket_path):
        raise SocketMissing(f"{socket_path} does not exist (not a Kubernetes node, or the kubelet's "
                                f"pod-resources directory is not mounted into teye's container)")
    grpc = grpc_mod or load_grpc()
    channel = grpc.insecure_channel(f"unix://{socket_path}")
    try:
        call = channel.unary_unary(LIST_METHOD, request_serializer=lambda _: b"",
                                   response_deserializer=lambda b: b)
        data = call(None, timeout=timeout_s)
    except grpc.RpcError as e:
        code = e.code() if hasattr(e, "code") else None
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise SourceUnavailable(f"{socket_path}: the kubelet did not answer List within {timeout_s:g} s") \
                from None
        raise SourceUnavailable(f"{socket_path}: List failed: {getattr(code, 'name', code)}: "
                                f"{(e.details() if hasattr(e, 'details') else str(e)) or ''}".rstrip(": ")) from None
    finally:
        channel.close()
    try:
        return decode_list_response(data)
    except ParseError as e:
        raise SourceUnavailable(f"{socket_path}: garbled List answer: {e}") from None


@dataclass(frozen=True)
class KubeletState:
    up: Optional[bool] = None           # None: never asked yet
    devices: Tuple[PodDevice, ...] = ()
    error: Optional[str] = None
    at: float = 0.0


class KubeletPoller:
    """Asks the kubelet every ``refresh_s`` from its own thread; ``state`` is the last answer (lock-free)."""

    def __init__(self, socket_path: str, refresh_s: float = 10.0, timeout_s: float = 2.0,
                 lister: Optional[Callable[[], Tuple[PodDevice, ...]]] = None):
        self.socket_path = socket_path
        self.refresh_s = refresh_s
        self.timeout_s = timeout_s
        self._lister = lister or (lambda: list_pod_resources(socket_path, timeout_s))
        self.state = KubeletState()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._rlog = RateLimitedLog(log, interval_s=300.0)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="teye-kubelet-pod-resources", daemon=True)
            self._thread.start()

    def refresh(self) -> KubeletState:
        try:
            devs = self._lister()
            self.state = KubeletState(True, devs, None, time.monotonic())
        except SocketMissing as e:   # not a Kubernetes node: nothing to say on every scrape
            self.state = KubeletState(None, (), str(e), time.monotonic())
        except SourceUnavailable as e:
            if self.state.up is not False or self.state.error != str(e):
                self._rlog.warning("kubelet", "allocation: %s", e)
            self.state = KubeletState(False, (), str(e), time.monotonic())
        except Exception as e:   # a bug must not end the thread: logged loudly, state down
            self._rlog.error("kubelet:bug", "allocation: pod-resources refresh failed", exc_info=True)
            self.state = KubeletState(False, (), f"internal error: {type(e).__name__}: {e}", time.monotonic())
        return self.state

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.refresh_s)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 1)


# ----------------------------------------------------------------------------- the source

@dataclass(frozen=True)
class Allocation:
    gpu: str
    slurm_job: str = ""
    namespace: str = ""
    pod: str = ""
    container: str = ""


@dataclass(frozen=True)
class AllocationReading:
    allocations: Tuple[Allocation, ...]
    kubelet_up: Optional[bool] = None
    problems: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = field(default=())

    def points(self) -> Iterator[Point]:
        for a in self.allocations:
            yield point(ALLOCATION_INFO, 1.0, a.gpu, a.slurm_job, a.namespace, a.pod, a.container)
        if self.kubelet_up is not None:
            yield point(KUBELET_UP, 1.0 if self.kubelet_up else 0.0)


def slurm_jobs_with_cgroups(cgroupfs: str) -> Optional[Set[str]]:
    """Slurm job ids that have a cgroup on this node; None when the tree shows no Slurm layout at all
    (then a stale mapping file cannot be told from a live one)."""
    try:
        layout = cgroups.detect_layout(cgroupfs)
    except SourceUnavailable:
        return None
    hier = layout.root("cpuacct") or layout.root("memory") or layout.root("cpu")
    if not hier:
        return None
    slurm_roots = [os.path.join(hier, "system.slice", "slurmstepd.scope"), os.path.join(hier, "slurm")]
    if not any(os.path.isdir(d) for d in slurm_roots):
        return None
    jobs, _, _ = cgroups.discover(hier)
    return {j.id for j in jobs if j.kind == cgroups.SLURM}


class AllocationSource:
    name = "allocation"

    def __init__(self, mapping_dir: Optional[str], cgroupfs: Optional[str], kubelet: Optional[KubeletPoller],
                 gpu_labels: Callable[[], Dict[str, str]] = dict):
        self.mapping_dir = mapping_dir
        self.cgroupfs = cgroupfs
        self.kubelet = kubelet
        self._gpu_labels = gpu_labels
        self._rlog = RateLimitedLog(log)

    def collect(self) -> AllocationReading:
        if self.kubelet is not None:
            self.kubelet.start()
        uuids = self._gpu_labels()
        known = set(uuids.values())
        out: List[Allocation] = []
        problems: List[str] = []
        if self.mapping_dir:
            mp = read_mapping_dir(self.mapping_dir)
            if mp.present:
                problems += [f"{self.mapping_dir}/{p}" for p in mp.problems]
            live = slurm_jobs_with_cgroups(self.cgroupfs) if self.cgroupfs and mp.jobs else None
            for gpu, jobs in sorted(mp.jobs.items()):
                if known and gpu not in known:
                    problems.append(f"{self.mapping_dir}/{gpu.replace('/', '.')}: GPU {gpu} does not exist on this "
                                    f"node (GPUs: {', '.join(sorted(known, key=_gpu_order))})")
                    continue
                for j in jobs:
                    if live is not None and j not in live:
                        problems.append(f"{self.mapping_dir}/{gpu.replace('/', '.')}: job {j} has no cgroup on "
                                        f"this node: it ended and the epilog did not remove its file (stale)")
                        continue
                    out.append(Allocation(gpu, slurm_job=j))
        kube_up = None
        if self.kubelet is not None:
            st = self.kubelet.state
            kube_up = st.up
            seen = set()
            for d in st.devices:
                if not is_gpu_resource(d.resource):
                    continue
                gpu = gpu_label(d.device_id, uuids)
                if gpu is None or (known and gpu not in known):
                    problems.append(f"kubelet: {d.namespace}/{d.pod}/{d.container}: device {d.device_id[:64]} "
                                    f"is not a GPU of this node" + ("" if known else " (the GPU source has not "
                                                                                     "named the GPUs yet)"))
                    continue
                key = (gpu, d.namespace, d.pod, d.container)
                if key not in seen:
                    seen.add(key)
                    out.append(Allocation(gpu, namespace=d.namespace, pod=d.pod, container=d.container))
        for p in problems:
            self._rlog.warning(f"problem:{p[:80]}", "allocation: %s", p)
        return AllocationReading(tuple(out), kube_up, tuple(problems))

    def close(self) -> None:
        if self.kubelet is not None:
            self.kubelet.close()


def _gpu_order(label: str):
    return tuple(int(x) if x.isdigit() else 0 for x in label.split("/"))


def from_config(cfg, ctx=None) -> AllocationSource:
    a = cfg["allocation"]
    kubelet = None
    if a["kubelet_socket"]:
        if grpc_installed():
            kubelet = KubeletPoller(a["kubelet_socket"], a["kubelet_refresh_seconds"], a["kubelet_timeout_seconds"])
        else:
            log.info("allocation: %s", GRPC_MISSING)
    labels = (lambda: ctx.gpu_labels) if ctx is not None else dict
    return AllocationSource(a["slurm_mapping_dir"], cfg["cgroupfs"], kubelet, labels)


def doctor_lines(cfg, gpu_labels: Optional[Dict[str, str]] = None, grpc_mod=None) -> List[str]:
    """Where GPU allocations come from on this node, and what is wrong with them."""
    a = cfg["allocation"]
    lines = []
    if a["slurm_mapping_dir"]:
        mp = read_mapping_dir(a["slurm_mapping_dir"])
        if not mp.present:
            lines.append(f"gpu allocation (Slurm): {mp.problems[0]}; install deploy/slurm/teye-gpu-prolog.sh and "
                         f"teye-gpu-epilog.sh to see GPUs allocated but never used")
        else:
            src = AllocationSource(a["slurm_mapping_dir"], cfg["cgroupfs"], None, lambda: gpu_labels or {})
            r = src.collect()
            held = ", ".join(f"GPU {x.gpu} -> job {x.slurm_job}" for x in r.allocations)
            lines.append(f"gpu allocation (Slurm): {a['slurm_mapping_dir']}: " + (held or "no GPU allocated"))
            lines += [f"gpu allocation (Slurm): not exported: {p}" for p in r.problems]
    if a["kubelet_socket"]:
        try:
            devs = list_pod_resources(a["kubelet_socket"], a["kubelet_timeout_seconds"], grpc_mod or load_grpc())
            gpus = [d for d in devs if is_gpu_resource(d.resource)]
            lines.append(f"gpu allocation (Kubernetes): {a['kubelet_socket']}: List ok, {len(gpus)} GPU device(s) "
                         f"allocated to {len({(d.namespace, d.pod) for d in gpus})} pod(s)")
        except SourceUnavailable as e:
            lines.append(f"gpu allocation (Kubernetes): off: {e}")
    return lines
