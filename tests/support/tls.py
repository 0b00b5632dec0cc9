"""A CA and a serving certificate signed by it, as files (what the chart's genCA/genSignedCert Secret holds), and an
HTTPS POST that trusts such a CA (a push to the status endpoint)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def write_serving_certificate(directory: Path, host: str = "127.0.0.1") -> None:
    """Writes ca.crt, tls.crt (for IP address `host`) and tls.key into `directory`, from a new CA."""
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("scalingrun-test-ca")
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(host)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ca.crt").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    (directory / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "tls.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                           serialization.PrivateFormat.PKCS8,
                                                           serialization.NoEncryption()))


def post(port: int, ca: Path, path: str, body: bytes, token: Optional[str]) -> tuple[int, dict]:
    """POSTs `body` to https://127.0.0.1:`port``path` with `token` as bearer (none: no header), trusting only `ca`;
    (the status code, the JSON answer)."""
    code, answer, _ = post_with_headers(port, ca, path, body, token)
    return code, answer


def post_with_headers(port: int, ca: Path, path: str, body: bytes, token: Optional[str]) -> tuple[int, dict, dict]:
    """As post, with the answer's headers too."""
    context = ssl.create_default_context(cafile=str(ca))
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(f"https://127.0.0.1:{port}{path}", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}"), dict(exc.headers)
