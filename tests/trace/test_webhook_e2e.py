"""The trace webhook end to end (issue 46): a real Prometheus with the shipped rules (every file of
deploy/prometheus/rules; only TeyeJobInputBound's `for: 15m` made 0 s), a real Alertmanager with the shipped
configuration (its opt-in trace route uncommented, the URL and password file made this test's), a real agent
(`teye agent`, basic auth, trace.webhook on) and an unmodified PyTorch job under `teye run`.  The job turns
input-bound, Prometheus' rule fires, Alertmanager routes the alert to the agent, which takes a trace of the job by
itself; a second alert about it inside the rate limit takes none; a wrong credential and another tenant's alert
are refused.  The job's output and exit status are its own."""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone

import pytest

from tests.client.helpers import base_env
from tests.procs import REPO, Prometheus, free_port, prometheus_binary, wait_http
from tests.web.agentproc import WebAgent, stop_process
from tests.web.certs import bcrypt_hash

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not __import__("importlib").util.find_spec("torch"),
                                 reason="the torch extra (./dev.sh test installs it)")]
SHIPPED = os.path.join(REPO, "deploy", "alertmanager", "alertmanager.yml")
JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "webhook_job.py")
USER, PASSWORD = "alertmanager", "am-trace-secret"


def _auth(user=USER, password=PASSWORD):
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _alertmanager(d, agent_port):
    """The shipped configuration with its trace route on, pointing at this test's agent."""
    pw = os.path.join(d, "am.password")
    with open(pw, "w") as f:
        f.write(PASSWORD)
    text = re.sub(r"^(\s*)#T ", r"\1", open(SHIPPED).read(), flags=re.M)
    text = text.replace("https://node-1.example:9835/-/trace", f"http://127.0.0.1:{agent_port}/-/trace")
    text = text.replace("/etc/alertmanager/teye-trace.password", pw)
    assert "teye-trace" in text and pw in text
    cfg = os.path.join(d, "alertmanager.yml")
    with open(cfg, "w") as f:
        f.write(text)
    exe = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    assert exe, "alertmanager missing: install Debian's prometheus-alertmanager package (./dev.sh test does)"
    port = free_port()
    proc = subprocess.Popen([exe, f"--config.file={cfg}", f"--storage.path={d}/am",
                             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                            stdout=subprocess.DEVNULL, stderr=open(os.path.join(d, "am.log"), "w"))
    wait_http(f"http://127.0.0.1:{port}/-/ready", proc=proc)
    return proc, f"http://127.0.0.1:{port}"


RULES = os.path.join(REPO, "deploy", "prometheus", "rules")


def _prometheus(d, agent_port, am_url):
    """Prometheus scraping the agent (with the Alertmanager's credential: the agent has basic auth), evaluating the
    shipped rules every second, sending to the Alertmanager.  TeyeJobInputBound fires without its 15 minutes."""
    rules = []
    for name in sorted(os.listdir(RULES)):
        text = open(os.path.join(RULES, name)).read()
        if name == "teye-alerts.yml":
            head, sep, tail = text.partition("- alert: TeyeJobInputBound\n")
            assert sep and "        for: 15m\n" in tail
            text = head + sep + tail.replace("        for: 15m\n", "        for: 0s\n", 1)
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(text)
        rules.append(path)
    config = f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: {json.dumps(rules)}
alerting:
  alertmanagers:
    - static_configs:
        - targets: ["{am_url.split('//', 1)[1]}"]
scrape_configs:
  - job_name: teye
    basic_auth:
      username: {USER}
      password: {PASSWORD}
    static_configs:
      - targets: ["127.0.0.1:{agent_port}"]
"""
    return Prometheus(d, config=config)


def _fire(am, name, **labels):
    alert = [{"labels": {"alertname": name, "severity": "warning", "instance": "node-1:9835", "job": "teye",
                         **labels},
              "annotations": {"summary": "test"},
              "startsAt": datetime.now(timezone.utc).isoformat()}]
    req = urllib.request.Request(am + "/api/v2/alerts", data=json.dumps(alert).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.status == 200


def _post_hook(agent, body, headers):
    req = urllib.request.Request(agent.url + "/-/trace", data=body, method="POST",
                                 headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, None


def _until(what, timeout_s, every_s=0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(every_s)
    return None


@pytest.mark.not_measuring("its clocks bound the waits (60 s for what takes about 2); the delay is printed")
def test_an_alert_about_a_job_takes_its_trace_once_and_refuses_others():
    d = tempfile.mkdtemp(prefix="teye-wh")   # (short: a socket's path is at most 107 bytes)
    if not prometheus_binary():
        pytest.skip("prometheus not installed (./dev.sh test installs it)")
    agent = am = job = prom = None
    try:
        web = os.path.join(d, "web.yml")
        with open(web, "w") as f:
            f.write(f"basic_auth_users:\n  {USER}: '{bcrypt_hash(PASSWORD, cost=4)}'\n")
        cfg = os.path.join(d, "teye.yml")
        with open(cfg, "w") as f:
            f.write("trace:\n  webhook: true\n")
        agent = WebAgent(d, web_config=web, args=["--config", cfg])
        am, am_url = _alertmanager(d, agent.port)
        stop = os.path.join(d, "stop")
        env = base_env(TEYE_TRAIN_JOB="webhook_job", TEYE_TRACE_REQUESTS=os.path.join(d, "req"),
                       OMP_NUM_THREADS="1")
        job = subprocess.Popen([sys.executable, "-m", "agent", "run", "--socket", agent.sock_path, "--",
                                sys.executable, JOB, stop], env=env, cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        metrics = lambda: agent.get(headers=_auth()).decode()   # noqa: E731
        assert _until(lambda: 'teye_job_steps_total{train_job="webhook_job"}' in metrics(), 60), agent.log()
        # the job turns input-bound: Prometheus' rule fires, Alertmanager routes it to the agent, which asks the job
        prom = _prometheus(d, agent.port, am_url)
        firing = _until(lambda: prom.query('ALERTS{alertname="TeyeJobInputBound",alertstate="firing",'
                                           'train_job="webhook_job"}'), 90)
        assert firing, prom.query("ALERTS") or metrics()
        t0 = time.monotonic()
        out = os.path.join(d, "traces")
        traces = _until(lambda: [n for n in os.listdir(out) if n.endswith(".pt.trace.json")]
                        if os.path.isdir(out) else None, 60)
        assert traces, agent.log()[-3000:]
        took = time.monotonic() - t0
        (name,) = traces
        m = re.fullmatch(r"webhook_job\.([A-Za-z0-9_-]+)\.[^.]+\.pid(\d+)\.pt\.trace\.json", name)
        assert m and os.stat(os.path.join(out, name)).st_mode & 0o777 == 0o600
        assert os.stat(out).st_mode & 0o777 == 0o700
        info = _until(lambda: re.search(r'teye_job_trace_info\{id="([^"]+)",train_job="webhook_job"\} 1(\.0)?$', metrics(), re.M), 30)
        assert info and info.group(1) == m.group(1), "\n".join(x for x in metrics().splitlines() if "trace_" in x and not x.startswith("#"))
        print(f"alert firing in Prometheus -> trace on disk: {took:.2f} s ({name})")
        # a second alert about the job, inside its rate limit: refused, nothing more traced
        _fire(am_url, "TeyeJobStraggler", train_job="webhook_job")
        assert _until(lambda: "less than 600 s ago (trace.job_interval_seconds)" in agent.log(), 30), agent.log()
        assert [n for n in os.listdir(out) if n.endswith(".pt.trace.json")] == [name]
        # a wrong credential; another tenant's alert about the job
        body = json.dumps({"alerts": [{"status": "firing", "labels": {"train_job": "webhook_job",
                                                                      "user": "mallory"}}]}).encode()
        assert _post_hook(agent, body, _auth(USER, "wrong"))[0] == 401
        assert _post_hook(agent, body, {})[0] == 401
        code, ans = _post_hook(agent, body, _auth())
        assert code == 200 and ans["results"][0]["result"] == "other_tenant"
        # the job goes on and ends as without teye's trace
        open(stop, "w").close()
        stdout, stderr = job.communicate(timeout=120)
        assert job.returncode == 0, stderr[-3000:]
        assert json.loads(stdout.strip().splitlines()[-1])["steps"] > 0
    finally:
        if prom is not None:
            prom.stop()
        for p in (job, am):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        if agent is not None:
            stop_process(agent.proc)
        shutil.rmtree(d, ignore_errors=True)
