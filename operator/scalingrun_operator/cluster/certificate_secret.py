"""The status endpoint's serving certificate, kept by the operator in one Secret of its own namespace.

The chart renders no certificate (a render is the same every time, so Argo CD and `helm template` change nothing
on a sync): the serving replica makes the Secret when there is none, adopts the one there is, and renews it
(serving_certificate.renewed) when a check finds it due. Every write is a create or an update at the version read,
so two replicas never both win: the one refused (409) reads again and adopts what the other wrote. It writes the
pair and the trust bundle into the status server's TLS directory (the server and status_config.py read them from
there); `on_change` then has the server reload and the namespaces' ConfigMaps carry the new bundle.

The grant (charts/scalingrun/templates/rbac.yaml): get and update on this one Secret by name, create on Secrets in
the operator's namespace (create cannot be limited by name).
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import os
import threading
from pathlib import Path
from typing import Callable, Optional

from kubernetes import client
from kubernetes.client.rest import ApiException

from scalingrun_api.models import MANAGED_BY
from ..serving_certificate import CA_FILE, CERT_FILE, KEY_FILE, Lifetimes, ServingCertificate, parse, renewed

log = logging.getLogger(__name__)

CHECK_SECONDS = 120.0  # well inside serving_certificate.TRUST_SETTLE: a staged CA signs soon after it settled
CONFLICT_TRIES = 5


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class CertificateSecret:
    def __init__(self, api_client: client.ApiClient, namespace: str, name: str, hosts: list[str],
                 lifetimes: Lifetimes, directory: str, clock: Callable[[], dt.datetime] = _now):
        self.core = client.CoreV1Api(api_client)
        self.namespace, self.name, self.hosts, self.lifetimes = namespace, name, hosts, lifetimes
        self.directory, self.clock = Path(directory), clock
        self.held: Optional[ServingCertificate] = None  # what the files hold
        self._stop = threading.Event()

    def ensure(self) -> bool:
        """Makes, adopts or renews the Secret and writes its files; returns whether the files changed."""
        for _ in range(CONFLICT_TRIES):
            secret = self._read()
            # A Secret deleted or spoilt under us is made again from what we serve, not from a new CA the pods do
            # not trust yet.
            current = (parse(_decoded(secret)) if secret is not None else None) or self.held
            wanted = renewed(current, self.hosts, self.lifetimes, self.clock())
            if wanted is not None or secret is None:
                wanted = wanted or current
                assert wanted is not None  # renewed() makes one when there is none
                try:
                    self._write(secret, wanted)
                except ApiException as exc:
                    if exc.status == 409:  # another replica wrote first: adopt what it wrote
                        continue
                    raise
                log.info("status certificate: %s Secret %s/%s (serving certificate until %s)",
                         "made" if secret is None else "renewed", self.namespace, self.name,
                         wanted.cert.not_valid_after_utc)
                current = wanted
            assert current is not None
            return self._hold(current)
        raise RuntimeError(f"Secret {self.namespace}/{self.name}: {CONFLICT_TRIES} writes refused as conflicts")

    def keep(self, on_change: Callable[[], None]) -> None:
        """Checks every CHECK_SECONDS until stop(), calling `on_change` after the files changed."""
        while not self._stop.wait(CHECK_SECONDS):
            try:
                if self.ensure():
                    on_change()
            except Exception as exc:  # noqa: BLE001 - the files served stay; the next check tries again
                log.warning("status certificate: Secret %s/%s not checked: %s", self.namespace, self.name, exc)

    def stop(self) -> None:
        self._stop.set()

    def _read(self) -> Optional[client.V1Secret]:
        try:
            return self.core.read_namespaced_secret(self.name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _write(self, secret: Optional[client.V1Secret], wanted: ServingCertificate) -> None:
        data = {key: base64.b64encode(value).decode() for key, value in wanted.data().items()}
        if secret is None:
            self.core.create_namespaced_secret(self.namespace, {
                "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls", "data": data,
                # No Helm or Argo CD label: a sync must neither own nor prune what the operator makes.
                "metadata": {"name": self.name, "namespace": self.namespace, "labels": dict(MANAGED_BY)}})
        else:
            secret.data = data  # an update at the version read: 409 when another replica wrote since
            self.core.replace_namespaced_secret(self.name, self.namespace, secret)

    def _hold(self, current: ServingCertificate) -> bool:
        if self.held is not None and self.held.data() == current.data():
            return False
        data = current.data()
        self.directory.mkdir(parents=True, exist_ok=True)
        for name in (CA_FILE, KEY_FILE, CERT_FILE):  # the pair last: the server reloads when tls.crt changed
            _replace(self.directory / name, data[name], 0o600 if name == KEY_FILE else 0o644)
        self.held = current
        return True


def _decoded(secret: client.V1Secret) -> dict[str, bytes]:
    return {key: base64.b64decode(value) for key, value in (secret.data or {}).items()}


def _replace(path: Path, content: bytes, mode: int) -> None:
    """Writes `content` beside `path` and renames it over: a reader sees the old file or the new, never half."""
    partial = path.with_name(f".{path.name}.new")
    partial.unlink(missing_ok=True)
    with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as file:
        file.write(content)
    os.replace(partial, path)
