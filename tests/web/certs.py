"""Throwaway PKI for the TLS tests: a CA, a server certificate for 127.0.0.1/localhost, a client certificate."""
from __future__ import annotations

import datetime
import ipaddress
import os
from typing import Dict, Optional, Tuple

import bcrypt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def issue(cn: str, ca: Optional[Tuple] = None, server: bool = True, serial: Optional[int] = None):
    """(cert, key) signed by ca=(cert, key), or self-signed CA when ca is None."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder().subject_name(_name(cn))
         .issuer_name(ca[0].subject if ca else _name(cn))
         .public_key(key.public_key()).serial_number(serial or x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1)))
    if ca is None:
        b = b.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    elif server:
        b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                         x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                            critical=False)
    else:
        b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName("client.teye.test")]), critical=False)
    cert = b.sign(ca[1] if ca else key, hashes.SHA256())
    return cert, key


def write_pki(d: str, serial: Optional[int] = None) -> Dict[str, str]:
    """ca.pem, server.pem/server-key.pem, client.pem/client-key.pem under d; their paths by name."""
    ca = issue("teye test CA")
    files = {"ca": ca[0].public_bytes(serialization.Encoding.PEM)}
    for name, server in (("server", True), ("client", False)):
        cert, key = issue(f"teye test {name}", ca, server, serial)
        files[name] = cert.public_bytes(serialization.Encoding.PEM)
        files[name + "-key"] = _pem_key(key)
    out = {}
    for name, data in files.items():
        path = os.path.join(d, f"{name}.pem")
        with open(path, "wb") as fh:
            fh.write(data)
        out[name] = path
    return out


def bcrypt_hash(password: str, cost: int = 4) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()
