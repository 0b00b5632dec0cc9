"""A local run's status endpoint: the operator's (status_server.py) on 127.0.0.1, where the run's own processes
push their progress and heartbeat, so that decide takes the same pushed documents in both modes.

The processes find it as a pod does: SCALINGRUN_STATUS_PATH names the run's push path, and the folder that
SCALINGRUN_STATUS_DIR names (in a pod, the projected volume at STATUS_DIR) holds the URL, the CA bundle and the token.
No ServiceAccount token exists on one machine, so the token is a random secret of this run (a new one at every
start), written 0600 in a 0700 folder of the workdir; the authenticator compares it, in constant time, and takes only
this run's path. The serving certificate is self-signed for 127.0.0.1, made at every start too.
Storage stays the durable record (resume, reports): the runner reads no progress or heartbeat from it.
"""

from __future__ import annotations

import datetime as dt
import hmac
import ipaddress
import os
import secrets
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from scalingrun_api.status_push import (
    CA_FILE, STATUS_DIR_VARIABLE, STATUS_PATH_VARIABLE, TOKEN_FILE, URL_FILE, run_push_path,
)
from ..pushed import PushedDocuments
from ..status_server import INVALID_TOKEN, OTHER_RUN, Refused, StatusServer, bearer_token

LOOPBACK = "127.0.0.1"
CERT_FILE, KEY_FILE = "tls.crt", "tls.key"
CERT_DAYS = 366  # longer than any run; the key never leaves the workdir and a new one is made at every start


class SecretAuthenticator:
    """Who may push on one machine: whoever holds the run's secret, and only for that run."""

    def __init__(self, secret: str, namespace: str, run: str):
        self._secret, self.namespace, self.run = secret.encode(), namespace, run

    def authorize(self, authorization: Optional[str], namespace: str, run: str) -> str:
        if not hmac.compare_digest(bearer_token(authorization).encode(), self._secret):
            raise Refused(401, INVALID_TOKEN, "the token is not this run's")
        if (namespace, run) != (self.namespace, self.run):
            raise Refused(403, OTHER_RUN, f"this endpoint takes only run {self.namespace}/{self.run}'s status")
        return run

    def known(self, authorization: Optional[str]) -> bool:
        return True  # a comparison with the secret: nothing to queue


def _write_private(path: Path, data: bytes) -> None:
    path.unlink(missing_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as file:
        file.write(data)


def write_self_signed(directory: Path) -> None:
    """tls.crt (for IP 127.0.0.1, its own CA: also written as ca.crt) and tls.key, new."""
    now = dt.datetime.now(dt.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"scalingrun local status {LOOPBACK}")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=CERT_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(LOOPBACK))]), False)
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    _write_private(directory / KEY_FILE, private)
    (directory / CERT_FILE).write_bytes(pem)
    (directory / CA_FILE).write_bytes(pem)


class LocalPushes:
    """The endpoint of one local run, from start() to stop(); `received` and `refused` count pushes by document and
    by reason."""

    def __init__(self, directory: Path, namespace: str, run: str):
        self.directory, self.namespace, self.run = directory, namespace, run
        self.pushed = PushedDocuments()
        self.received: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self._server: Optional[StatusServer] = None

    def start(self) -> None:
        self.stop()
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.directory.chmod(0o700)
        secret = secrets.token_urlsafe(32)
        write_self_signed(self.directory)
        _write_private(self.directory / TOKEN_FILE, secret.encode())
        self._server = StatusServer(SecretAuthenticator(secret, self.namespace, self.run), self.pushed,
                                    str(self.directory / CERT_FILE), str(self.directory / KEY_FILE), port=0,
                                    host=LOOPBACK, count_refused=lambda reason: self.refused.update([reason]),
                                    count_accepted=lambda what: self.received.update([what]))
        port = self._server.start()
        (self.directory / URL_FILE).write_text(f"https://{LOOPBACK}:{port}")

    def environment(self) -> dict[str, str]:
        """What the run's processes push with (a pod's variables); nothing before start()."""
        if self._server is None:
            return {}
        return {STATUS_DIR_VARIABLE: str(self.directory),
                STATUS_PATH_VARIABLE: run_push_path(self.namespace, self.run)}

    def get(self, what: str) -> Optional[Any]:
        """The newest document of its kind the run's processes pushed (its model), or None."""
        return self.pushed.get(self.namespace, self.run, what)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
