"""The trace webhook's decisions (issue 46), alert by alert, on a hand-made job list and a clock of its own: what
it writes for a job it holds, and each refusal with its reason (agent/trace/webhook.py).  The HTTP path (auth,
sizes, methods) is tests/web/test_trace_webhook_http.py; the whole chain, tests/trace/test_webhook_e2e.py."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from agent.trace.webhook import Webhook
from teye_client import _trace


def _job(name, uid=1000, user="alice", namespace="", ended=False):
    return SimpleNamespace(train_job=name, uid=uid, user=user, namespace=namespace, ended=ended)


def _alert(status="firing", **labels):
    return {"status": status, "labels": {"alertname": "TeyeJobInputBound", **labels}}


def _post(hook, *alerts):
    code, body = hook.handle(json.dumps({"version": "4", "status": "firing", "alerts": list(alerts)}).encode())
    return code, json.loads(body)


@pytest.fixture
def hook(tmp_path):
    now = [1_800_000_000.0]
    jobs = [_job("resnet"), _job("bob/resnet", uid=1001, user="bob"), _job("done", ended=True),
            _job("team-a/pod-1/bert", uid=1002, user="carol", namespace="team-a")]
    h = Webhook(lambda: jobs, str(tmp_path / "trace"), steps=4, job_interval_s=600, node_interval_s=60,
                clock=lambda: now[0])
    h.now = now
    return h


def test_a_firing_alert_about_a_job_here_writes_its_request_where_its_processes_look(hook, tmp_path):
    code, out = _post(hook, _alert(train_job="resnet", instance="n1:9400"))
    (r,) = out["results"]
    assert code == 200 and r["result"] == "requested"
    path = tmp_path / "trace" / "1000" / "resnet.json"
    req = _trace.parse_request(path.read_bytes(), hook.now[0])
    assert req == {"id": r["id"], "steps": 4, "output": None, "ranks": None, "start_after": hook.now[0] + 1.0,
                   "expires": hook.now[0] + 120.0, "max_bytes": _trace.DEFAULT_MAX_BYTES}
    assert os.stat(path).st_mode & 0o777 == 0o644 and os.stat(path.parent).st_mode & 0o777 == 0o711
    # (the job's zero-code hook reads it there: the directory the socket's sits in, as the agent's)
    assert _trace.agent_request_dir(str(tmp_path / "phases.sock"), 1000) == str(path.parent)


def test_another_uids_job_is_asked_by_its_own_name_in_its_uids_directory(hook, tmp_path):
    _, out = _post(hook, _alert(train_job="bob/resnet"))
    assert out["results"][0]["result"] == "requested"
    assert (tmp_path / "trace" / "1001" / "resnet.json").exists()
    hook.now[0] += 3600
    _, out = _post(hook, _alert(train_job="team-a/pod-1/bert", namespace="team-a"))
    assert out["results"][0]["result"] == "requested" and (tmp_path / "trace" / "1002" / "bert.json").exists()


@pytest.mark.parametrize("alert, result, reason", [
    (_alert("resolved", train_job="resnet"), "resolved", "resolved"),
    (_alert(), "no_job", "names no train_job"),
    (_alert(train_job="elsewhere"), "not_here", "no live job elsewhere on this node"),
    (_alert(train_job="done"), "not_here", "no live job done"),
    (_alert(train_job="resnet", user="mallory"), "other_tenant", "the alert's user 'mallory' is not the job's"),
    (_alert(train_job="team-a/pod-1/bert", namespace="team-b"), "other_tenant", "namespace 'team-b'"),
    ({"status": "firing", "labels": {"train_job": 5}}, "malformed", "labels object of strings"),
    ("not an alert", "malformed", "labels object of strings"),
])
def test_each_alert_that_is_not_for_a_job_here_is_refused_with_its_reason(hook, tmp_path, alert, result, reason):
    code, out = _post(hook, alert)
    (r,) = out["results"]
    assert code == 200 and r["result"] == result and reason in r["reason"], r
    assert not (tmp_path / "trace").exists() or not any(os.scandir(tmp_path / "trace"))


def test_the_rate_limits_per_job_and_per_node_and_a_pending_request(hook, tmp_path):
    assert _post(hook, _alert(train_job="resnet"))[1]["results"][0]["result"] == "requested"
    hook.now[0] += 30
    r = _post(hook, _alert(train_job="resnet"), _alert(train_job="bob/resnet"))[1]["results"]
    assert [x["result"] for x in r] == ["rate_limited", "rate_limited"]
    assert "less than 600 s ago (trace.job_interval_seconds)" in r[0]["reason"]
    assert "less than 60 s ago (trace.node_interval_seconds)" in r[1]["reason"]
    hook.now[0] += 31                                 # the node's limit passed, the job's not
    r = _post(hook, _alert(train_job="resnet"), _alert(train_job="bob/resnet"))[1]["results"]
    assert [x["result"] for x in r] == ["rate_limited", "requested"]
    hook.now[0] += 600
    hook._last_job.clear()                            # (as after a restart of the agent)
    r = _post(hook, _alert(train_job="bob/resnet"))[1]["results"]
    assert r[0]["result"] == "requested"              # its earlier request expired (120 s): not pending
    hook._last_job.clear()
    hook._last_node = float("-inf")
    r = _post(hook, _alert(train_job="bob/resnet"))[1]["results"]
    assert r[0]["result"] == "pending" and "already requested" in r[0]["reason"]


@pytest.mark.parametrize("body, why", [
    (b"\xff", "not JSON"), (b"[]", "no 'alerts' list"), (b'{"alerts": {}}', "no 'alerts' list"),
    (json.dumps({"alerts": [{}] * 1001}).encode(), "1001 alerts (at most 1000)"),
])
def test_a_payload_that_is_not_alertmanagers_is_refused_whole(hook, body, why):
    code, out = hook.handle(body)
    assert code == 400 and why in json.loads(out)["error"]
    assert hook.results == {"malformed": 1}


def test_the_agent_refuses_to_start_with_the_webhook_on_and_no_basic_auth(tmp_path):
    """Bad configuration: the webhook takes a trace of any job it is told of; open to anyone who reaches the
    port, it would be a way to make every job trace itself.  The agent stops at start (exit 2) and says why."""
    import subprocess
    import sys
    import tempfile
    from tests.procs import REPO, free_port, http_get
    cfg = tmp_path / "teye.yml"
    cfg.write_text("trace:\n  webhook: true\n")
    import time
    import urllib.error
    sock = os.path.join(tempfile.mkdtemp(prefix="teye-wh"), "phases.sock")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "agent", "agent", "--config", str(cfg), "--listen",
                             f"127.0.0.1:{port}", "--phase-socket", sock], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    # until it exits; an agent that answers a scrape started instead of refusing (said then, not at a timeout)
    deadline = time.monotonic() + 20
    try:
        while proc.poll() is None:
            try:
                served = bool(http_get(f"http://127.0.0.1:{port}/metrics", timeout=1))
            except (OSError, urllib.error.URLError):
                served = False
            assert not served, "the agent started and serves with the webhook on and no basic auth"
            assert time.monotonic() < deadline, "the agent neither refused nor served in 20 s"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
        _out, err = proc.communicate(timeout=10)
    assert proc.returncode == 2, err[-2000:]
    assert "trace.webhook needs basic auth: the web config (web.config_file) has no basic_auth_users" in err
