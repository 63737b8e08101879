"""Issue 49: an agent that serves no TLS never maps OpenSSL (5 MiB of its resident memory), nor loads a YAML
parser for a configuration it was not given; one that serves TLS (and takes basic auth) is unchanged.

Oracle: the process's own /proc/<pid>/maps (the libraries the kernel mapped), not what teye says of itself;
and a TLS client that completes a handshake against the agent."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.procs import REPO
from tests.web.agentproc import WebAgent
from tests.web.certs import bcrypt_hash, write_pki


def _mapped(pid: int) -> set:
    with open(f"/proc/{pid}/maps") as fh:
        names = {line.split()[-1].rsplit("/", 1)[-1] for line in fh if "/" in line}
    return {n.split(".")[0] for n in names if n.startswith(("libssl", "libcrypto", "_ssl", "_hashlib", "_yaml"))}


@pytest.mark.not_measuring("which libraries a process mapped, from /proc/<pid>/maps")
def test_an_agent_without_a_web_config_maps_no_openssl_and_serves(tmp_path):
    agent = WebAgent(str(tmp_path))
    try:
        body = agent.get("/metrics").decode()
        assert "teye_cpu_seconds_total" in body or "node_cpu_seconds_total" in body
        assert _mapped(agent.proc.pid) == set()
    finally:
        assert agent.stop() == 0


@pytest.mark.not_measuring("which libraries a process mapped, and a TLS handshake")
def test_an_agent_with_tls_and_basic_auth_serves_them(tmp_path):
    pki = write_pki(str(tmp_path))
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {pki['server']}\n  key_file: {pki['server-key']}\n"
                   f"basic_auth_users:\n  alice: '{bcrypt_hash('s3cret')}'\n")
    agent = WebAgent(str(tmp_path), web_config=str(web), ca=pki["ca"])
    try:
        import base64
        auth = {"Authorization": "Basic " + base64.b64encode(b"alice:s3cret").decode()}
        assert b"teye_" in agent.get("/metrics", headers=auth)
        assert {"libssl", "libcrypto", "_ssl", "_hashlib"} <= _mapped(agent.proc.pid)
    finally:
        assert agent.stop() == 0


def test_asyncio_without_ssl_leaves_ssl_importable_afterwards():
    """What exporters.lean does to the process: asyncio's modules without ssl, ssl itself still importable (a
    report's HTTPS client in the same process), and asyncio's plain sockets working."""
    code = """
import sys
from exporters import lean
assert lean.import_asyncio(None) is True
assert "ssl" not in sys.modules and "_ssl" not in sys.modules
import asyncio, asyncio.base_events
assert asyncio.base_events.ssl is None
async def main():
    r, w = await asyncio.open_connection(sock=__import__("socket").socketpair()[0])
    w.close()
asyncio.run(main())
import ssl
print(ssl.SSLContext.__name__, lean.import_asyncio(None), lean.import_asyncio("/etc/web.yml"))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": REPO})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["SSLContext", "False", "False"]
