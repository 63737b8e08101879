"""A real Prometheus, with the shipped scrape job (deploy/prometheus/prometheus-tls.yml), scrapes an agent
running the shipped web config (deploy/teye-web.example.yml) over https with basic auth; the same job
with a wrong password is refused (401)."""
from __future__ import annotations

import copy
import os
import time

import pytest
import yaml

from tests.procs import REPO, Prometheus, prometheus_binary
from tests.web.agentproc import WebAgent
from tests.web.certs import bcrypt_hash, write_pki

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not prometheus_binary(), reason="prometheus not installed (Debian package)")]

DEPLOY = os.path.join(REPO, "deploy")


def shipped_web_config(tmp_path, pki, password: str) -> str:
    with open(os.path.join(DEPLOY, "teye-web.example.yml"), encoding="utf-8") as fh:
        web = yaml.safe_load(fh)
    web["tls_server_config"].update(cert_file=pki["server"], key_file=pki["server-key"])
    web["basic_auth_users"] = {"prometheus": bcrypt_hash(password, cost=10)}
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump(web))
    return str(path)


def shipped_job(tmp_path, name: str, port: int, ca: str, password: str) -> dict:
    with open(os.path.join(DEPLOY, "prometheus", "prometheus-tls.yml"), encoding="utf-8") as fh:
        job = copy.deepcopy(yaml.safe_load(fh)["scrape_configs"][0])
    pw = tmp_path / f"{name}.password"
    pw.write_text(password + "\n")
    job.update(job_name=name, scrape_interval="1s", scrape_timeout="1s",
               static_configs=[{"targets": [f"127.0.0.1:{port}"]}])
    job["tls_config"]["ca_file"] = ca
    job["basic_auth"]["password_file"] = str(pw)
    del job["file_sd_configs"]
    return job


def test_prometheus_scrapes_over_tls_with_basic_auth(tmp_path):
    pki = write_pki(str(tmp_path))
    agent = WebAgent(str(tmp_path), web_config=shipped_web_config(tmp_path, pki, "scrape-me"), ca=pki["ca"])
    jobs = [shipped_job(tmp_path, "teye", agent.port, pki["ca"], "scrape-me"),
            shipped_job(tmp_path, "teye_wrong", agent.port, pki["ca"], "guess")]
    more = "".join("  " + line + "\n" for line in yaml.safe_dump(jobs).splitlines())
    os.makedirs(tmp_path / "prom")
    prom = None
    try:
        prom = Prometheus(str(tmp_path / "prom"), [], scrape_job="unused", more_scrape_configs=more)
        res = prom.wait_for('teye_build_info{job="teye"}')
        assert res[0]["metric"]["instance"] == "127.0.0.1"  # the shipped relabelling drops the port
        assert prom.wait_for('up{job="teye"} == 1')
        assert prom.wait_for('up{job="teye_wrong"} == 0')
        deadline = time.monotonic() + 20
        wrong = None
        while time.monotonic() < deadline:
            targets = prom.api("targets")["activeTargets"]
            wrong = [t for t in targets if t["labels"]["job"] == "teye_wrong"][0]
            if wrong["lastError"]:
                break
            time.sleep(0.5)
        assert "401" in wrong["lastError"]
        assert prom.query('count(teye_build_info{job="teye_wrong"})') == []
        # The agent's own counters, scraped by the good job: every 401 on /metrics is the wrong job's
        # password (one scrape's values, so the two agree exactly), no other auth failure, no TLS failure.
        sel = 'job="teye"'
        got = prom.wait_for(f'teye_web_basic_auth_failures_total{{{sel},reason="wrong_password"}} > 0 and on (job) '
                            f'teye_web_requests_total{{{sel},path="/metrics",code="200"}} > 0')
        scrape_ts = got[0]["value"][0]
        at = {"time": scrape_ts}
        def value(expr):
            (r,) = prom.api("query", query=expr, **at)["result"]
            return float(r["value"][1])
        assert value(f'teye_web_basic_auth_failures_total{{{sel},reason="wrong_password"}}') == \
            value(f'teye_web_requests_total{{{sel},path="/metrics",code="401"}}')
        for reason in ("missing", "malformed", "unknown_user"):
            assert value(f'teye_web_basic_auth_failures_total{{{sel},reason="{reason}"}}') == 0
        assert value(f'sum(teye_web_tls_handshake_failures_total{{{sel}}})') == 0
        assert value(f'teye_web_requests_total{{{sel},path="/metrics",code="200"}}') >= 1
        assert value(f'teye_web_config_last_reload_successful{{{sel}}}') == 1
    finally:
        if prom:
            prom.stop()
        agent.stop()
