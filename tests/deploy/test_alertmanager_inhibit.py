"""The shipped Alertmanager configuration, run: while the critical rule of a node-mixin pair fires (issue 49: a
filesystem filling up, file handles), its warning about the same node, device and mount point is inhibited, and
nothing else is.  A real Alertmanager (Debian's prometheus-alertmanager) reads deploy/alertmanager/alertmanager.yml
as shipped; the alerts are posted to its API as Prometheus would, and its own API says which are suppressed."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request

import pytest

from tests.procs import REPO, free_port, wait_http

pytestmark = pytest.mark.e2e

CONFIG = os.path.join(REPO, "deploy", "alertmanager", "alertmanager.yml")


@pytest.fixture
def alertmanager(tmp_path):
    exe = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    assert exe, "alertmanager missing: install Debian's prometheus-alertmanager package (./dev.sh test does)"
    port = free_port()
    proc = subprocess.Popen([exe, f"--config.file={CONFIG}", f"--storage.path={tmp_path}",
                             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "am.log", "w"))
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", proc=proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _post(url, alerts):
    req = urllib.request.Request(url + "/api/v2/alerts", data=json.dumps(alerts).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.status == 200


def _states(url):
    with urllib.request.urlopen(url + "/api/v2/alerts", timeout=5) as r:
        got = json.loads(r.read())
    return {(a["labels"]["alertname"], a["labels"]["severity"], a["labels"].get("mountpoint", ""),
             a["labels"]["instance"]): a["status"]["state"] for a in got}


def _alert(name, severity, instance, **labels):
    return {"labels": {"alertname": name, "severity": severity, "instance": instance, "job": "teye", **labels},
            "annotations": {"summary": "x"}}


def test_a_critical_mutes_its_own_warning_only(alertmanager):
    fs = {"device": "/dev/sdb", "fstype": "xfs"}
    alerts = [
        # n1 /scratch: both rules of the pair fire -> the warning is muted
        _alert("TeyeFilesystemSpaceFillingUp", "critical", "n1", mountpoint="/scratch", **fs),
        _alert("TeyeFilesystemSpaceFillingUp", "warning", "n1", mountpoint="/scratch", **fs),
        # the same alert's warning on another mount point, on another node: not muted
        _alert("TeyeFilesystemSpaceFillingUp", "warning", "n1", mountpoint="/data", device="/dev/sdc",
               fstype="xfs"),
        _alert("TeyeFilesystemSpaceFillingUp", "warning", "n2", mountpoint="/scratch", **fs),
        # another alert's warning on the same mount point: not muted (it says something else)
        _alert("TeyeFilesystemAlmostOutOfFiles", "warning", "n1", mountpoint="/scratch", **fs),
        # file handles: the pair has no device or mount point
        _alert("TeyeFileDescriptorLimit", "critical", "n3"),
        _alert("TeyeFileDescriptorLimit", "warning", "n3"),
    ]
    _post(alertmanager, alerts)
    want = {
        ("TeyeFilesystemSpaceFillingUp", "critical", "/scratch", "n1"): "active",
        ("TeyeFilesystemSpaceFillingUp", "warning", "/scratch", "n1"): "suppressed",
        ("TeyeFilesystemSpaceFillingUp", "warning", "/data", "n1"): "active",
        ("TeyeFilesystemSpaceFillingUp", "warning", "/scratch", "n2"): "active",
        ("TeyeFilesystemAlmostOutOfFiles", "warning", "/scratch", "n1"): "active",
        ("TeyeFileDescriptorLimit", "critical", "", "n3"): "active",
        ("TeyeFileDescriptorLimit", "warning", "", "n3"): "suppressed",
    }
    deadline = time.monotonic() + 20
    while len(_states(alertmanager)) < len(want):    # ingested (the API marks inhibitions as it answers)
        assert time.monotonic() < deadline, _states(alertmanager)
        time.sleep(0.2)
    assert _states(alertmanager) == want
