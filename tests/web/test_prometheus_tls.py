"""A real Prometheus scrapes the agent over https with basic auth (and is refused with a wrong password)."""
from __future__ import annotations

import os
import time

import pytest

from tests.procs import Prometheus, prometheus_binary
from tests.web.agentproc import WebAgent
from tests.web.certs import bcrypt_hash, write_pki

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not prometheus_binary(), reason="prometheus not installed (Debian package)")]


def job(name: str, port: int, ca: str, password: str) -> str:
    return f"""  - job_name: {name}
    scheme: https
    tls_config:
      ca_file: {ca}
    basic_auth:
      username: prometheus
      password: {password}
    static_configs:
      - targets: ["127.0.0.1:{port}"]
"""


def test_prometheus_scrapes_over_tls_with_basic_auth(tmp_path):
    pki = write_pki(str(tmp_path))
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {pki['server']}\n  key_file: {pki['server-key']}\n"
                   f"basic_auth_users:\n  prometheus: '{bcrypt_hash('scrape-me', cost=10)}'\n")
    agent = WebAgent(str(tmp_path), web_config=str(web), ca=pki["ca"])
    os.makedirs(tmp_path / "prom")
    prom = None
    try:
        prom = Prometheus(str(tmp_path / "prom"), [], scrape_job="unused",
                          more_scrape_configs=job("teye_tls", agent.port, pki["ca"], "scrape-me")
                          + job("teye_wrong", agent.port, pki["ca"], "guess"))
        res = prom.wait_for('teye_build_info{job="teye_tls"}')
        assert res[0]["metric"]["instance"] == f"127.0.0.1:{agent.port}"
        assert prom.wait_for('up{job="teye_tls"} == 1')
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
    finally:
        if prom:
            prom.stop()
        agent.stop()
