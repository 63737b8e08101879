"""Fixtures shared by the web server's tests."""
from __future__ import annotations

import pytest

from tests.web.certs import write_pki


@pytest.fixture
def tls_web(tmp_path):
    pki = write_pki(str(tmp_path))
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {pki['server']}\n  key_file: {pki['server-key']}\n")
    return str(web), pki
