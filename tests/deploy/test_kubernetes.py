"""deploy/kubernetes/ for kube-prometheus-stack: every object valid against its schema (the Kubernetes API's,
through kubernetes-validate, strict; the prometheus-operator CRDs', compiled in @kubernetes-models/
prometheus-operator from npm), the PrometheusRules equal to the rule files, the dashboards ConfigMaps equal to
dashboards/json, and the objects wired to one another (Service -> pods, ServiceMonitor -> Service)."""
from __future__ import annotations

import copy
import glob
import importlib.util
import json
import os
import shutil
import subprocess

import kubernetes_validate
import pytest
import yaml

from tests.procs import REPO

K8S = os.path.join(REPO, "deploy", "kubernetes")
CRD_DIR = os.path.join(REPO, "tests", "deploy", "crd_schemas")
KUBE_VERSION = "1.30.0"     # the oldest Kubernetes this is checked against (PERFMON needs 1.22+ runtimes)


def objects():
    with open(os.path.join(K8S, "kustomization.yaml"), encoding="utf-8") as fh:
        resources = yaml.safe_load(fh)["resources"]
    assert sorted(resources) == sorted(os.path.basename(p) for p in glob.glob(os.path.join(K8S, "*.yaml"))
                                       if not p.endswith(("kustomization.yaml", "zero-code-pod.yaml")))
    out = []
    for name in resources:
        with open(os.path.join(K8S, name), encoding="utf-8") as fh:
            out += [d for d in yaml.safe_load_all(fh) if d]
    return out


def by_kind(kind):
    return [o for o in objects() if o["kind"] == kind]


def core_errors(obj) -> list:
    try:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{'/'.join(map(str, e.path))}: {e.message}"]
    return []


def crd_errors(objs) -> list:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the CRD schemas are checked with npm's @kubernetes-models "
                    "(./dev.sh test installs nodejs and runs npm ci in tests/deploy/crd_schemas)")
    assert os.path.isdir(os.path.join(CRD_DIR, "node_modules", "@kubernetes-models", "prometheus-operator")), \
        "run: npm ci --prefix tests/deploy/crd_schemas (./dev.sh test does)"
    res = subprocess.run([node, os.path.join(CRD_DIR, "validate.mjs")], input=json.dumps(objs), capture_output=True,
                         text=True, timeout=120, cwd=CRD_DIR)
    assert res.returncode == 0, res.stdout + res.stderr
    return [json.loads(line) for line in res.stdout.splitlines()]


def test_core_objects_are_valid_against_the_kubernetes_schemas():
    core = [o for o in objects() if not o["apiVersion"].startswith("monitoring.coreos.com/")]
    assert {o["kind"] for o in core} == {"Namespace", "ResourceQuota", "ServiceAccount", "ConfigMap", "DaemonSet",
                                         "Service"}
    for o in core:
        assert core_errors(o) == [], (o["kind"], o["metadata"]["name"])


def test_the_core_validator_rejects_a_misspelt_field():
    """The check above can fail: one typo in the DaemonSet is caught (strict: unknown fields are errors)."""
    (ds,) = by_kind("DaemonSet")
    bad = copy.deepcopy(ds)
    bad["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["readOnlly"] = True
    assert core_errors(bad)
    bad = copy.deepcopy(ds)
    bad["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = {"millicores": 50}
    assert core_errors(bad)


def test_prometheus_operator_objects_are_valid_against_the_crd_schemas():
    crs = [o for o in objects() if o["apiVersion"].startswith("monitoring.coreos.com/")]
    assert {o["kind"] for o in crs} == {"ServiceMonitor", "PrometheusRule"}
    results = crd_errors(crs)
    assert [(r["kind"], r["name"]) for r in results] == [(o["kind"], o["metadata"]["name"]) for o in crs]
    assert [r for r in results if r["errors"]] == []
    # and the validator can fail: a duration that is not one, a rule without expr
    (sm,) = by_kind("ServiceMonitor")
    bad_sm = copy.deepcopy(sm)
    bad_sm["spec"]["endpoints"][0]["interval"] = "15 seconds"
    bad_rule = copy.deepcopy(by_kind("PrometheusRule")[0])
    bad_rule["spec"]["groups"][0]["rules"][0]["for"] = 15
    results = crd_errors([bad_sm, bad_rule])
    assert all(r["errors"] for r in results), results
    assert "/spec/endpoints/0/interval" in results[0]["errors"][0]
    assert "/spec/groups/0/rules/0/for" in results[1]["errors"][0]


def test_prometheus_rules_are_the_rule_files():
    rules = {o["metadata"]["name"]: o for o in by_kind("PrometheusRule")}
    files = sorted(glob.glob(os.path.join(REPO, "deploy", "prometheus", "rules", "*.yml")))
    assert sorted(rules) == [os.path.splitext(os.path.basename(f))[0] for f in files]
    for f in files:
        with open(f, encoding="utf-8") as fh:
            want = yaml.safe_load(fh)["groups"]
        obj = rules[os.path.splitext(os.path.basename(f))[0]]
        assert obj["spec"]["groups"] == want, f
        assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_generated_files_are_up_to_date():
    spec = importlib.util.spec_from_file_location("k8s_generate", os.path.join(K8S, "generate.py"))
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.main(["--check"]) == 0, "run: python deploy/kubernetes/generate.py"


def test_dashboard_configmaps_carry_the_committed_json_for_the_sidecar():
    cms = [o for o in by_kind("ConfigMap") if o["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    files = sorted(glob.glob(os.path.join(REPO, "dashboards", "json", "*.json")))
    assert len(cms) == len(files) == 3
    got = {k: v for cm in cms for k, v in cm["data"].items()}
    for f in files:
        with open(f, encoding="utf-8") as fh:
            assert got[os.path.basename(f)] == fh.read()
    for cm in cms:   # each small enough for kubectl apply's last-applied annotation (256 KiB)
        assert len(json.dumps(cm)) < 256 * 1024


def test_alerts_do_not_depend_on_the_scrape_jobs_name():
    for f in glob.glob(os.path.join(REPO, "deploy", "prometheus", "rules", "*.yml")):
        with open(f, encoding="utf-8") as fh:
            for group in yaml.safe_load(fh)["groups"]:
                for rule in group["rules"]:
                    assert "job=" not in rule["expr"].replace(" ", ""), (f, rule.get("alert") or rule["record"])


def test_service_and_servicemonitor_reach_the_daemonsets_pods():
    (ds,) = by_kind("DaemonSet")
    (svc,) = by_kind("Service")
    (sm,) = by_kind("ServiceMonitor")
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["clusterIP"] == "None"                                 # headless
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    (sp,) = svc["spec"]["ports"]
    assert ports[sp["targetPort"]] == sp["port"] == 9835
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [svc["metadata"]["namespace"]]
    assert [e["port"] for e in sm["spec"]["endpoints"]] == [sp["name"]]
    assert "prometheus.io/scrape" not in json.dumps(ds)                      # the operator ignores them


def test_namespace_daemonset_security_and_scheduling():
    (ns,) = by_kind("Namespace")
    labels = ns["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"     # hostPath/hostPID/hostNetwork
    assert labels["pod-security.kubernetes.io/warn"] == labels["pod-security.kubernetes.io/audit"] == "baseline"
    (sa,) = by_kind("ServiceAccount")
    (ds,) = by_kind("DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"] and pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc.get("runAsUser", pod["securityContext"]["runAsUser"]) != 0
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["PERFMON"]}
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    for m in c["volumeMounts"]:
        if "hostPath" in volumes[m["name"]] and m["mountPath"] != "/run/teye":
            assert m.get("readOnly") is True, m                               # host paths read-only
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    assert c["resources"]["limits"]["memory"]
    tol = {(t["key"], t.get("effect")) for t in pod["tolerations"]}
    assert {("nvidia.com/gpu", "NoSchedule"), ("nvidia.com/gpu", "NoExecute")} <= tol
    # the one root step: the init container hands the socket directory to the agent's uid, with CHOWN only
    (init,) = pod["initContainers"]
    assert init["command"] == ["chown", f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}",
                               "/run/teye"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert init["image"] == c["image"]


def test_the_daemonset_and_the_images_command_read_the_hosts_view_alike():
    """The host's view from a container (issue 49): the DaemonSet's arguments and the image's default command
    name the same host paths, each under a host path the pod mounts: udev's database (teye_disk_info's model
    and serial: empty in a container without it) under the host's root, as node_exporter's DaemonSet does."""
    (ds,) = by_kind("DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    flags = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in c["args"] if a.startswith("--") and "=" in a}
    assert flags["--path.udev.data"] == flags["--path.rootfs"] + "/run/udev/data"
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounted = {m["mountPath"]: volumes[m["name"]].get("hostPath", {}).get("path") for m in c["volumeMounts"]}
    for flag in ("--procfs", "--sysfs", "--path.rootfs", "--path.udev.data", "--cgroupfs"):
        under = [m for m in mounted if flags[flag] == m or flags[flag].startswith(m + "/")]
        assert under and all(mounted[m] for m in under), (flag, flags[flag], mounted)
    with open(os.path.join(REPO, "deploy", "image", "build.sh"), encoding="utf-8") as fh:
        cmd = json.loads(next(line for line in fh if "--change 'CMD " in line).split("CMD ", 1)[1].rsplit("'", 1)[0])
    image = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in cmd if a.startswith("--") and "=" in a}
    for flag in ("--procfs", "--sysfs", "--path.rootfs", "--path.udev.data", "--cgroupfs"):
        assert image[flag] == flags[flag], (flag, image, flags)


def test_a_quota_lets_gke_admit_the_daemonsets_priority_class():
    """GKE admits system-node-critical pods only in a namespace whose ResourceQuota covers that class
    (the ResourceQuota admission plugin's limitedResources); the quota limits nothing else."""
    (ds,) = by_kind("DaemonSet")
    prio = ds["spec"]["template"]["spec"]["priorityClassName"]
    assert prio == "system-node-critical"
    quotas = [q for q in by_kind("ResourceQuota") if q["metadata"]["namespace"] == ds["metadata"]["namespace"]]
    covering = [q for q in quotas for e in q["spec"]["scopeSelector"]["matchExpressions"]
                if e["scopeName"] == "PriorityClass" and e["operator"] == "In" and prio in e["values"]]
    assert len(covering) == 1, quotas
    assert covering[0]["spec"]["hard"] == {"pods": "1G"}   # no limit a DaemonSet could reach


def test_gpu_nodes_are_selected_by_any_label_a_cluster_has():
    (ds,) = by_kind("DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {e["key"] for t in terms for e in t["matchExpressions"]}
    # GPU feature discovery's, NFD's NVIDIA PCI vendor label, GKE's accelerator label: any one (terms are ORed)
    assert keys == {"nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present",
                    "cloud.google.com/gke-accelerator"}
    assert all(len(t["matchExpressions"]) == 1 for t in terms)


def _kustomize(path):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (kubectl kustomize builds the kustomization offline)")
    res = subprocess.run([kubectl, "kustomize", path], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def _images(objs):
    return [c["image"] for o in objs if o["kind"] == "DaemonSet"
            for c in o["spec"]["template"]["spec"]["initContainers"] + o["spec"]["template"]["spec"]["containers"]]


def test_the_image_is_one_reference_overridable_through_kustomize(tmp_path):
    from agent import __version__
    base = _images(_kustomize(K8S))
    assert base == [f"localhost/teye:{__version__}"] * 2, base
    # an admin's overlay: the registry and tag set once, for both containers
    (tmp_path / "kustomization.yaml").write_text(
        f"resources:\n  - {os.path.relpath(K8S, tmp_path)}\nimages:\n  - name: localhost/teye\n"
        "    newName: registry.example/ml/teye\n    newTag: 9.9.9\n")
    assert _images(_kustomize(str(tmp_path))) == ["registry.example/ml/teye:9.9.9"] * 2


# Both modes and the documented choices (issue 49): the components under deploy/kubernetes/components/, each
# used from an admin's overlay as README.md here shows, built by kubectl kustomize and validated whole.
COMPONENTS = os.path.join(K8S, "components")
NE_MODE = "node-exporter-mode"


def _overlay(tmp_path, components=(), name="overlay"):
    d = tmp_path / name
    d.mkdir()
    text = f"resources:\n  - {os.path.relpath(K8S, d)}\n"
    if components:
        text += "components:\n" + "".join(f"  - {os.path.relpath(os.path.join(COMPONENTS, c), d)}\n"
                                          for c in components)
    (d / "kustomization.yaml").write_text(text)
    return _kustomize(str(d))


def _pod(objs):
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
    return ds["spec"]["template"]["spec"]


def test_components_are_the_documented_choices():
    assert sorted(os.listdir(COMPONENTS)) == [NE_MODE, "runtimeclass-nvidia", "tolerate-all"]
    with open(os.path.join(K8S, "README.md"), encoding="utf-8") as fh:
        readme = fh.read()
    for c in os.listdir(COMPONENTS):
        with open(os.path.join(COMPONENTS, c, "kustomization.yaml"), encoding="utf-8") as fh:
            assert yaml.safe_load(fh)["kind"] == "Component", c
        assert f"components/{c}" in readme, c


def test_every_mode_and_component_builds_and_is_valid_against_the_schemas(tmp_path):
    combos = [(), ("runtimeclass-nvidia",), ("tolerate-all",), (NE_MODE,),
              (NE_MODE, "runtimeclass-nvidia", "tolerate-all")]
    crs = []
    for i, combo in enumerate(combos):
        objs = _overlay(tmp_path, combo, name=f"o{i}")
        core = [o for o in objs if not o["apiVersion"].startswith("monitoring.coreos.com/")]
        for o in core:
            assert core_errors(o) == [], (combo, o["kind"], o["metadata"]["name"])
        crs += [o for o in objs if o["apiVersion"].startswith("monitoring.coreos.com/")]
    results = crd_errors(crs)
    assert len(results) == len(crs) and [r for r in results if r["errors"]] == []
    assert {(r["kind"], r["name"]) for r in results} >= {("ServiceMonitor", "teye-node-exporter"),
                                                          ("PrometheusRule", "teye-host")}


def test_the_daemonset_needs_no_runtimeclass_and_the_components_set_one_or_tolerate_all(tmp_path):
    base = _pod(_overlay(tmp_path, name="base"))
    assert "runtimeClassName" not in base        # pods start where no RuntimeClass nvidia exists
    assert {(t["key"], t["effect"]) for t in base["tolerations"]} == \
        {("nvidia.com/gpu", "NoSchedule"), ("nvidia.com/gpu", "NoExecute")}
    rc = _pod(_overlay(tmp_path, ("runtimeclass-nvidia",), name="rc"))
    assert rc["runtimeClassName"] == "nvidia"
    assert {k: v for k, v in rc.items() if k != "runtimeClassName"} == base
    tol = _pod(_overlay(tmp_path, ("tolerate-all",), name="tol"))
    assert tol["tolerations"] == [{"operator": "Exists"}]          # every key and effect
    assert {k: v for k, v in tol.items() if k != "tolerations"} == \
        {k: v for k, v in base.items() if k != "tolerations"}


# kube-prometheus-stack's node-exporter Service as its chart renders it (prometheus-node-exporter's
# templates/service.yaml and the stack's values: service.labels.jobLabel, service.portName) for release R
def _stack_node_exporter_service(release="kube-prometheus-stack", namespace="monitoring"):
    return {"metadata": {"namespace": namespace,
                         "labels": {"app.kubernetes.io/name": "prometheus-node-exporter",
                                    "app.kubernetes.io/instance": release, "jobLabel": "node-exporter"}},
            "spec": {"ports": [{"name": "http-metrics", "port": 9100}]}}


def test_node_exporter_mode_rules_config_and_the_scrape_that_joins_instance(tmp_path):
    from agent import config as config_mod
    from agent.hostseries import COVERED
    base = _overlay(tmp_path, name="base")
    mode = _overlay(tmp_path, (NE_MODE,), name="mode")
    rules = {o["metadata"]["name"]: o["spec"]["groups"] for o in mode if o["kind"] == "PrometheusRule"}
    base_rules = {o["metadata"]["name"]: o["spec"]["groups"] for o in base if o["kind"] == "PrometheusRule"}
    assert sorted(rules) == sorted(base_rules)
    for path in glob.glob(os.path.join(REPO, "deploy", "prometheus", "rules", "*.yml")):
        name = os.path.splitext(os.path.basename(path))[0]
        translated = os.path.join(REPO, "deploy", "prometheus", "rules-node-exporter", os.path.basename(path))
        with open(translated if os.path.exists(translated) else path, encoding="utf-8") as fh:
            assert rules[name] == yaml.safe_load(fh)["groups"], name
    assert rules["teye-host"] != base_rules["teye-host"]
    # the agent's configuration: the base's, with host.node_exporter, and the agent's own loader agrees
    (cm,) = [o for o in mode if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "teye-agent-config"]
    (base_cm,) = [o for o in base if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "teye-agent-config"]
    assert yaml.safe_load(cm["data"]["teye.yml"]) == {**yaml.safe_load(base_cm["data"]["teye.yml"]),
                                                      "host": {"node_exporter": True}}
    p = tmp_path / "teye.yml"
    p.write_text(cm["data"]["teye.yml"])
    cfg = config_mod.load(str(p), None, set())
    assert cfg["host"]["node_exporter"] is True and not any(cfg["collectors"][c]["enabled"] for c in COVERED)
    # the rest of the objects are the base's
    key = lambda o: (o["kind"], o["metadata"]["name"])   # noqa: E731
    assert {key(o) for o in mode} == {key(o) for o in base} | {("ServiceMonitor", "teye-node-exporter")}
    same = [o for o in base if o["kind"] not in ("PrometheusRule", "ConfigMap") or key(o) != key(cm)]
    assert [o for o in same if o["kind"] != "PrometheusRule"] == \
        [o for o in mode if key(o) in {key(x) for x in same} and o["kind"] != "PrometheusRule"]
    # the ServiceMonitor selects the stack's node-exporter Service, keeps its job name and relabels instance
    # exactly as teye's own ServiceMonitor does (the node's name): the two exporters' series of a node meet
    sms = {o["metadata"]["name"]: o for o in mode if o["kind"] == "ServiceMonitor"}
    ne, teye = sms["teye-node-exporter"], sms["teye-agent"]
    svc = _stack_node_exporter_service()
    assert ne["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert ne["spec"]["namespaceSelector"] == {"any": True}
    assert svc["metadata"]["labels"][ne["spec"]["jobLabel"]] == "node-exporter"
    assert ne["metadata"]["labels"]["release"] == teye["metadata"]["labels"]["release"] == \
        ne["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"]
    (ep,) = ne["spec"]["endpoints"]
    assert ep["port"] in {p["name"] for p in svc["spec"]["ports"]}
    (tep,) = teye["spec"]["endpoints"]
    assert ep["relabelings"] == tep["relabelings"] == [
        {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "instance", "action": "replace"}]
    assert ep["interval"] == tep["interval"]
    # and the stack's own ServiceMonitor is turned off by the values file shipped beside it
    with open(os.path.join(COMPONENTS, NE_MODE, "kube-prometheus-stack-values.yaml"), encoding="utf-8") as fh:
        values = yaml.safe_load(fh)
    assert values["prometheus-node-exporter"]["prometheus"]["monitor"]["enabled"] is False
    assert values["defaultRules"]["rules"]["nodeExporterAlerting"] is False     # teye-host has them (Teye*)
