"""Kubernetes DaemonSet, Grafana provisioning and the example config, checked against the agent's own parser."""
from __future__ import annotations

import glob
import os

import yaml

from agent.cli import build_parser
from agent.config import defaults, load
from tests.procs import REPO

DEPLOY = os.path.join(REPO, "deploy")


def k8s():
    with open(os.path.join(DEPLOY, "kubernetes", "daemonset.yaml"), encoding="utf-8") as fh:
        return {d["kind"]: d for d in yaml.safe_load_all(fh)}


def test_daemonset_hands_host_proc_and_sys_to_the_agent():
    docs = k8s()
    assert set(docs) == {"Namespace", "ResourceQuota", "ServiceAccount", "ConfigMap", "DaemonSet"}
    spec = docs["DaemonSet"]["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    args = build_parser().parse_args(c["args"])           # the real CLI accepts them
    assert args.command == "agent"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    by_path = {m["mountPath"]: volumes[name] for name, m in mounts.items()}
    # --procfs / --sysfs point where the host's /proc and /sys are mounted, read-only
    assert by_path[args.procfs]["hostPath"]["path"] == "/proc" and args.procfs == "/host/proc"
    assert by_path[args.sysfs]["hostPath"]["path"] == "/sys" and args.sysfs == "/host/sys"
    assert mounts["proc"]["readOnly"] is True and mounts["sys"]["readOnly"] is True
    # the pods' cgroups under the host's /sys; the kubelet's pod-resources socket and pod log dirs where the
    # agent's defaults look for them
    assert args.cgroupfs == "/host/sys/fs/cgroup" and args.cgroupfs.startswith(args.sysfs + "/")
    cfg = defaults()
    for key, host in (("kubelet_socket", "/var/lib/kubelet/pod-resources"), ("pod_log_dir", "/var/log/pods")):
        default = cfg["allocation"].get(key) or cfg["jobs"].get(key)
        assert by_path[os.path.dirname(default) if key == "kubelet_socket" else default]["hostPath"]["path"] == host
    # the phase socket sits in a hostPath directory training pods can mount too
    assert os.path.dirname(args.phase_socket) == "/run/teye"
    assert by_path["/run/teye"]["hostPath"] == {"path": "/run/teye", "type": "DirectoryOrCreate"}
    # host PID namespace (process -> job mapping) and host network (node counters, instance = node)
    assert spec["hostPID"] is True and spec["hostNetwork"] is True
    # NVML through the NVIDIA runtime without taking a GPU from the device plugin; the runtime is the nodes'
    # default or components/runtimeclass-nvidia's RuntimeClass, never required (tests/deploy/test_kubernetes.py)
    assert "runtimeClassName" not in spec
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env == {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"}
    assert "nvidia.com/gpu" not in str(c.get("resources", {}))
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert c["securityContext"]["capabilities"]["add"] == ["PERFMON"]   # hardware counters, nothing more
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert args.listen.endswith(":9835") and c["ports"][0]["containerPort"] == 9835


def test_daemonset_config_is_valid_agent_config(tmp_path):
    docs = k8s()
    spec = docs["DaemonSet"]["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    args = build_parser().parse_args(c["args"])
    cfg_mount = [m for m in c["volumeMounts"] if m["name"] == "config"][0]["mountPath"]
    assert os.path.dirname(args.config) == cfg_mount
    path = tmp_path / "teye.yml"
    path.write_text(docs["ConfigMap"]["data"][os.path.basename(args.config)])
    cfg = load(str(path))
    assert cfg["collectors"]["nfsd"]["enabled"] is False and cfg["phases"]["max_jobs"] == 64


def test_example_config_loads_and_sets_the_systemd_socket():
    cfg = load(os.path.join(DEPLOY, "teye.example.yml"))
    assert cfg["listen"] == "0.0.0.0:9835"
    assert cfg["phases"]["socket"] == "/run/teye/phases.sock"
    assert cfg["collectors"]["gpu"]["enabled"] is True and cfg["collectors"]["nfsd"]["enabled"] is False


def test_grafana_provisioning_datasource_and_dashboard_provider():
    prov = os.path.join(DEPLOY, "grafana", "provisioning")
    with open(os.path.join(prov, "datasources", "teye-prometheus.yml"), encoding="utf-8") as fh:
        ds = yaml.safe_load(fh)
    assert ds["apiVersion"] == 1
    (d,) = ds["datasources"]
    assert d["type"] == "prometheus" and d["access"] == "proxy" and d["url"].startswith("http")
    # $__rate_interval needs the scrape interval; it matches deploy/prometheus/prometheus.yml
    with open(os.path.join(DEPLOY, "prometheus", "prometheus.yml"), encoding="utf-8") as fh:
        prom = yaml.safe_load(fh)
    teye_job = [j for j in prom["scrape_configs"] if j["job_name"] == "teye"][0]
    assert d["jsonData"]["timeInterval"] == teye_job["scrape_interval"]
    with open(os.path.join(prov, "dashboards", "teye.yml"), encoding="utf-8") as fh:
        dp = yaml.safe_load(fh)
    (p,) = dp["providers"]
    assert p["type"] == "file" and p["options"]["path"] and p["folder"] == "teye"
    # the provisioned folder holds the generated dashboards
    assert sorted(os.path.basename(f) for f in glob.glob(os.path.join(REPO, "dashboards", "json", "*.json"))) == \
        ["teye-cluster.json", "teye-job.json", "teye-node.json"]


def test_agent_uid_is_one_no_ordinary_image_uses_and_pods_are_tenants(tmp_path):
    """Issue 36: the agent trusts its own uid, and 65532 (distroless' nonroot) made every such pod trusted.
    The DaemonSet's uid is one uid everywhere (pod, group, the socket directory's owner), not a common
    image uid nor a user of this machine, below the ranges Kubernetes user namespaces map pods to; the
    config keys jobs by pod (phases.pods)."""
    import pwd
    docs = k8s()
    spec = docs["DaemonSet"]["spec"]["template"]["spec"]
    uid = spec["securityContext"]["runAsUser"]
    assert spec["securityContext"]["runAsGroup"] == uid and spec["hostPID"] is True
    (init,) = spec["initContainers"]
    assert init["command"] == ["chown", f"{uid}:{uid}", "/run/teye"]
    common = {0, 1, 2, 33, 70, 99, 100, 101, 999, 1000, 1001, 10001, 65532, 65534}
    assert uid not in common and 65000 <= uid <= 65533          # Debian's reserved range, below userns ranges
    assert uid not in {p.pw_uid for p in pwd.getpwall()}
    (c,) = spec["containers"]
    assert "runAsUser" not in c["securityContext"]
    path = tmp_path / "teye.yml"
    path.write_text(docs["ConfigMap"]["data"]["teye.yml"])
    assert load(str(path))["phases"]["pods"] is True and defaults()["phases"]["pods"] is False
    readme = open(os.path.join(DEPLOY, "kubernetes", "README.md"), encoding="utf-8").read()
    assert f"runs as uid {uid} " in readme and "65532" in readme   # the choice is documented, and why not 65532
