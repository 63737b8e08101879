"""GPU allocation (agent/sources/allocation.py): the shipped Slurm prolog/epilog's mapping directory and the
kubelet's pod-resources API, through a fake gRPC server whose answers are encoded by the protobuf library
itself (an independent encoder, from a descriptor of the kubelet's v1 API)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
from concurrent import futures

import pytest

from agent import config as config_mod
from agent.errors import SourceUnavailable
from agent.sources import allocation as A
from agent.sources.allocation import AllocationSource, KubeletPoller, list_pod_resources, read_mapping_dir
from tests.conftest import reading_series

grpc = pytest.importorskip("grpc")     # installed in the dev venv (extra 'kubernetes'); the agent runs without
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROLOG = os.path.join(REPO, "deploy", "slurm", "teye-gpu-prolog.sh")
EPILOG = os.path.join(REPO, "deploy", "slurm", "teye-gpu-epilog.sh")
UUIDS = {f"GPU-0000000{i}-aaaa-bbbb-cccc-00000000000{i}": str(i) for i in range(4)}
UUIDS["MIG-11111111-2222-3333-4444-555555555555"] = "3/1"


def slurm_script(script, mapdir, job, gpus=""):
    env = {"PATH": os.environ["PATH"], "TEYE_GPU_JOB_DIR": mapdir, "SLURM_JOB_ID": job, "SLURM_JOB_GPUS": gpus}
    p = subprocess.run(["sh", script], env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return p


def files(mapdir):
    out = {}
    for n in sorted(os.listdir(mapdir)):
        if not n.startswith("."):
            with open(os.path.join(mapdir, n)) as fh:
                out[n] = fh.read()
    return out


def live_cgroups(tmp_path, *jobs):
    """A cgroup v2 tree with these Slurm jobs running (the stale-file check looks for their cgroups)."""
    root = tmp_path / "cg"
    (root / "system.slice" / "slurmstepd.scope").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory io\n")
    for j in jobs:
        d = root / "system.slice" / "slurmstepd.scope" / f"job_{j}"
        d.mkdir()
        (d / "cgroup.events").write_text("populated 1\n")
    return str(root)


# ----------------------------------------------------------------------------- the prolog and epilog

def test_prolog_writes_the_dcgm_exporter_format_and_epilog_removes_only_its_job(tmp_path):
    mapdir = str(tmp_path / "gpu-jobs")
    slurm_script(PROLOG, mapdir, "5150", "0,1,2,3")
    slurm_script(PROLOG, mapdir, "5151", "3,2.1")       # shares GPU 3 (sharding), and a MIG instance
    assert files(mapdir) == {"0": "5150\n", "1": "5150\n", "2": "5150\n", "2.1": "5151\n", "3": "5150\n5151\n"}
    slurm_script(PROLOG, mapdir, "5151", "3,2.1")       # a prolog run twice lists the job once
    assert files(mapdir)["3"] == "5150\n5151\n"
    m = read_mapping_dir(mapdir)
    assert m.jobs == {"0": ("5150",), "1": ("5150",), "2": ("5150",), "2/1": ("5151",), "3": ("5150", "5151")}
    slurm_script(EPILOG, mapdir, "5150")
    assert files(mapdir) == {"2.1": "5151\n", "3": "5151\n"}
    slurm_script(EPILOG, mapdir, "5151")
    assert files(mapdir) == {}
    # no GPUs, or no job id: nothing written, never a failure
    slurm_script(PROLOG, mapdir, "5152", "")
    slurm_script(PROLOG, mapdir, "", "0")
    assert files(mapdir) == {}


def test_mapping_dir_through_the_source(tmp_path):
    mapdir = str(tmp_path / "gpu-jobs")
    slurm_script(PROLOG, mapdir, "5150", "0,1,2,3")
    src = AllocationSource(mapdir, live_cgroups(tmp_path, "5150"), None, lambda: dict(UUIDS))
    got = reading_series(src.collect())
    assert got == {("teye_gpu_allocation_info", (("container", ""), ("gpu", str(i)), ("namespace", ""), ("pod", ""),
                                                 ("slurm_job", "5150"))): 1.0 for i in range(4)}


def test_bad_mapping_files_are_not_exported_and_said(tmp_path, caplog):
    mapdir = tmp_path / "gpu-jobs"
    mapdir.mkdir()
    (mapdir / "0").write_text("5150\n")
    (mapdir / "1").write_text("")                    # empty: a prolog that failed half-way
    (mapdir / "7").write_text("5150\n")              # this node has GPUs 0-3
    (mapdir / "2").write_text("4999\n")              # job 4999 ended, the epilog did not run
    (mapdir / "3").write_text("abc\n5150\n")         # garbage line, then a good one
    (mapdir / "README").write_text("not a GPU\n")     # not a mapping file: ignored, as dcgm-exporter does
    src = AllocationSource(str(mapdir), live_cgroups(tmp_path, "5150"), None, lambda: dict(UUIDS))
    r = src.collect()
    assert sorted((a.gpu, a.slurm_job) for a in r.allocations) == [("0", "5150"), ("3", "5150")]
    text = "\n".join(r.problems)
    assert "/1: empty" in text
    assert "/7: GPU 7 does not exist on this node (GPUs: 0, 1, 2, 3, 3/1)" in text
    assert "/2: job 4999 has no cgroup on this node: it ended and the epilog did not remove its file (stale)" in text
    assert "/3: 'abc' is not a job id" in text
    cfg = config_mod.load(None, {"cgroupfs": live_cgroups(tmp_path / "x", "5150"),
                                 "allocation": {"slurm_mapping_dir": str(mapdir), "kubelet_socket": None}})
    lines = A.doctor_lines(cfg, dict(UUIDS))
    assert lines[0].startswith(f"gpu allocation (Slurm): {mapdir}: GPU 0 -> job 5150, GPU 3 -> job 5150")
    assert any("stale" in ln for ln in lines) and any("does not exist" in ln for ln in lines)


def test_missing_mapping_dir_and_no_cgroup_tree(tmp_path):
    r = AllocationSource(str(tmp_path / "none"), None, None).collect()
    assert r.allocations == () and r.problems == ()
    cfg = config_mod.load(None, {"allocation": {"slurm_mapping_dir": str(tmp_path / "none"), "kubelet_socket": None}})
    assert "does not exist" in A.doctor_lines(cfg)[0] and "teye-gpu-prolog.sh" in A.doctor_lines(cfg)[0]
    # without a Slurm cgroup layout a stale file cannot be told from a live one: exported as written
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "0").write_text("77\n")
    r = AllocationSource(str(tmp_path / "m"), str(tmp_path / "no-cgroups"), None).collect()
    assert [(a.gpu, a.slurm_job) for a in r.allocations] == [("0", "77")]


# ----------------------------------------------------------------------------- kubelet pod-resources

def _messages():
    """The kubelet's v1 pod-resources messages, built by the protobuf library from a descriptor."""
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="teye_test_podresources.proto", package="v1", syntax="proto3")

    def msg(name, *fields):
        m = fdp.message_type.add(name=name)
        for fname, num, typ, label, tname in fields:
            f = m.field.add(name=fname, number=num, type=typ, label=label)
            if tname:
                f.type_name = tname
    R, O = F.LABEL_REPEATED, F.LABEL_OPTIONAL
    msg("ContainerDevices", ("resource_name", 1, F.TYPE_STRING, O, ""), ("device_ids", 2, F.TYPE_STRING, R, ""))
    msg("ContainerResources", ("name", 1, F.TYPE_STRING, O, ""),
        ("devices", 2, F.TYPE_MESSAGE, R, ".v1.ContainerDevices"), ("cpu_ids", 3, F.TYPE_INT64, R, ""))
    msg("PodResources", ("name", 1, F.TYPE_STRING, O, ""), ("namespace", 2, F.TYPE_STRING, O, ""),
        ("containers", 3, F.TYPE_MESSAGE, R, ".v1.ContainerResources"))
    msg("ListPodResourcesResponse", ("pod_resources", 1, F.TYPE_MESSAGE, R, ".v1.PodResources"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("v1.ListPodResourcesResponse"))


def response(pods):
    """pods: [(namespace, name, [(container, [(resource, [device ids])], [cpu ids])])] -> wire bytes."""
    resp = _messages()()
    for ns, name, containers in pods:
        p = resp.pod_resources.add(name=name, namespace=ns)
        for cname, devices, cpus in containers:
            c = p.containers.add(name=cname)
            c.cpu_ids.extend(cpus)
            for res, ids in devices:
                c.devices.add(resource_name=res, device_ids=ids)
    return resp.SerializeToString()


PODS = [("ml", "trainer-0", [("main", [("nvidia.com/gpu", ["GPU-00000001-aaaa-bbbb-cccc-000000000001",
                                                            "GPU-00000002-aaaa-bbbb-cccc-000000000002::3"]),
                                       ("example.com/nic", ["eth7"])], [4, 5, 6]),
                              ("sidecar", [], [7])]),
        ("ml", "mig-1", [("work", [("nvidia.com/mig-1g.10gb", ["MIG-11111111-2222-3333-4444-555555555555"])], [])]),
        ("web", "no-gpu", [("app", [], [1])]),
        ("ml", "ghost", [("c", [("nvidia.com/gpu", ["GPU-99999999-dead-beef-0000-000000000009"])], [])])]


class FakeKubelet:
    """A pod-resources server on a Unix socket; ``gate`` (an Event) holds List until the test releases it."""

    def __init__(self, answer: bytes, gate: threading.Event = None):
        self.dir = tempfile.mkdtemp(prefix="teye-kl-", dir="/tmp")   # a short path: sun_path holds 108 bytes
        self.path = os.path.join(self.dir, "kubelet.sock")
        self.entered = threading.Event()
        self.calls = 0

        def List(req, ctx):
            self.calls += 1
            self.entered.set()
            if gate is not None:
                gate.wait(30)
            return answer
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(List, request_deserializer=lambda b: b,
                                                        response_serializer=lambda b: b)})
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port(f"unix:{self.path}")
        self.server.start()

    def stop(self):
        self.server.stop(0)
        shutil.rmtree(self.dir, ignore_errors=True)


def test_kubelet_pods_with_gpus_and_mig_through_the_fake_server():
    kl = FakeKubelet(response(PODS))
    try:
        devs = list_pod_resources(kl.path, 5.0)
        assert {(d.namespace, d.pod, d.container, d.resource, d.device_id) for d in devs} == {
            ("ml", "trainer-0", "main", "nvidia.com/gpu", "GPU-00000001-aaaa-bbbb-cccc-000000000001"),
            ("ml", "trainer-0", "main", "nvidia.com/gpu", "GPU-00000002-aaaa-bbbb-cccc-000000000002::3"),
            ("ml", "trainer-0", "main", "example.com/nic", "eth7"),
            ("ml", "mig-1", "work", "nvidia.com/mig-1g.10gb", "MIG-11111111-2222-3333-4444-555555555555"),
            ("ml", "ghost", "c", "nvidia.com/gpu", "GPU-99999999-dead-beef-0000-000000000009")}
        poller = KubeletPoller(kl.path, refresh_s=60, timeout_s=5)
        poller.refresh()
        src = AllocationSource(None, None, poller, lambda: dict(UUIDS))
        r = src.collect()
        got = reading_series(r)
        def info(gpu, ns, pod, c):
            return ("teye_gpu_allocation_info",
                    (("container", c), ("gpu", gpu), ("namespace", ns), ("pod", pod), ("slurm_job", "")))
        assert got == {info("1", "ml", "trainer-0", "main"): 1.0, info("2", "ml", "trainer-0", "main"): 1.0,
                       info("3/1", "ml", "mig-1", "work"): 1.0, ("teye_kubelet_pod_resources_up", ()): 1.0}
        assert any("ghost/c: device GPU-99999999" in p for p in r.problems)   # not a GPU of this node
        src.close()
    finally:
        kl.stop()


def test_a_slow_kubelet_never_holds_a_scrape():
    gate = threading.Event()
    kl = FakeKubelet(response(PODS), gate)
    poller = KubeletPoller(kl.path, refresh_s=60, timeout_s=30)
    src = AllocationSource(None, None, poller, lambda: dict(UUIDS))
    try:
        r = src.collect()                   # starts the background thread, which now waits on the kubelet
        assert kl.entered.wait(10)
        r = src.collect()                   # answered while List is still in flight: nothing known yet
        assert r.allocations == () and r.kubelet_up is None and not gate.is_set()
        gate.set()
        for _ in range(100):
            if poller.state.up:
                break
            threading.Event().wait(0.05)
        assert len(src.collect().allocations) == 3
    finally:
        gate.set()
        src.close()
        kl.stop()


def test_a_kubelet_slower_than_the_timeout_is_down():
    gate = threading.Event()
    kl = FakeKubelet(response(PODS), gate)
    try:
        poller = KubeletPoller(kl.path, refresh_s=60, timeout_s=0.3)
        st = poller.refresh()
        assert st.up is False and "did not answer List within 0.3 s" in st.error
        assert reading_series(AllocationSource(None, None, poller).collect()) == \
            {("teye_kubelet_pod_resources_up", ()): 0.0}
    finally:
        gate.set()
        kl.stop()


def test_missing_and_refusing_kubelet_sockets(tmp_path):
    poller = KubeletPoller(str(tmp_path / "kubelet.sock"), timeout_s=1)
    st = poller.refresh()
    assert st.up is None and "does not exist" in st.error        # not a Kubernetes node: no series
    assert reading_series(AllocationSource(None, None, poller).collect()) == {}
    d = tempfile.mkdtemp(prefix="teye-kl-", dir="/tmp")
    try:
        path = os.path.join(d, "kubelet.sock")
        s = socket.socket(socket.AF_UNIX)
        s.bind(path)                       # a socket nobody listens on: connection refused
        poller = KubeletPoller(path, timeout_s=2)
        st = poller.refresh()
        assert st.up is False and "UNAVAILABLE" in st.error
        s.close()
        cfg = config_mod.load(None, {"allocation": {"slurm_mapping_dir": None, "kubelet_socket": path}})
        assert A.doctor_lines(cfg) == [f"gpu allocation (Kubernetes): off: {st.error}"]
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_without_grpcio_the_agent_runs_and_doctor_says_why(monkeypatch, tmp_path):
    import sys
    monkeypatch.setitem(sys.modules, "grpc", None)      # as if not installed: import grpc raises ImportError
    with pytest.raises(SourceUnavailable, match="grpcio is not installed"):
        A.load_grpc()
    kl_path = str(tmp_path / "kubelet.sock")
    open(kl_path, "w").close()
    cfg = config_mod.load(None, {"allocation": {"slurm_mapping_dir": None, "kubelet_socket": kl_path}})
    src = A.from_config(cfg)
    assert src.kubelet is None and reading_series(src.collect()) == {}
    assert "grpcio is not installed" in A.doctor_lines(cfg)[0]


def test_garbled_answer_is_a_clear_error():
    kl = FakeKubelet(b"\x0a\xff\xff\xff\xff\x0f")       # a length far beyond the message
    try:
        with pytest.raises(SourceUnavailable, match="garbled List answer"):
            list_pod_resources(kl.path, 5.0)
    finally:
        kl.stop()


def test_grpc_is_imported_only_when_a_kubelet_socket_exists(tmp_path):
    """grpcio costs the agent about 10 MiB of RSS (issue 38's budget): a node without the kubelet's socket never
    imports it, though it is installed and the kubelet half is configured."""
    import subprocess
    import sys
    code = ("import sys; from agent import config; from agent.sources import allocation as A\n"
            f"cfg = config.load(None, {{'allocation': {{'kubelet_socket': {str(tmp_path / 'kubelet.sock')!r}}}}})\n"
            "src = A.from_config(cfg); st = src.kubelet.refresh()\n"
            "print(src.kubelet is not None, st.up, 'grpc' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.stdout.split() == ["True", "None", "False"]   # polled, no socket (not an error), grpc not loaded
