"""The ConfigMap scalingrun-status in each namespace the operator runs a run in: the status endpoint's URL and
the CA bundle of its serving certificate, which every run's pod mounts (optional: builders/common.status_volume).

Non-secret: the operator copies it from the ca.crt in its TLS directory (written by cluster/certificate_secret.py,
or mounted by the kubelet from cert-manager's Secret), and writes it again when the CA changed (a renewed bundle:
publish_again at once, else the namespace's next reconcile) or the namespace has none yet.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any, Optional

from kubernetes import client
from kubernetes.client.rest import ApiException

from scalingrun_api.models import MANAGED_BY
from scalingrun_api.status_push import CA_FILE, STATUS_CONFIG_MAP, URL_FILE

log = logging.getLogger(__name__)


class StatusConfigMaps:
    def __init__(self, api_client: client.ApiClient, url: str, tls_dir: str):
        self.core = client.CoreV1Api(api_client)
        self.url, self.ca_file = url, Path(tls_dir) / CA_FILE
        self._written: dict[str, str] = {}  # namespace -> the CA written there
        self._ca: Optional[tuple[Any, str]] = None
        self._guard = threading.Lock()

    def _ca_bundle(self) -> str:
        state = os.stat(self.ca_file)
        key = (state.st_mtime_ns, state.st_size, state.st_ino)
        if self._ca is None or self._ca[0] != key:
            self._ca = (key, self.ca_file.read_text())
        return self._ca[1]

    def publish_again(self) -> None:
        """Writes the CA bundle again into every namespace written before (a renewed certificate): the runs' pods
        follow it without a restart, as the kubelet updates their mounted copy and the trainer reads it per push."""
        with self._guard:
            namespaces = list(self._written)
        for namespace in namespaces:
            try:
                self.ensure(namespace)
            except ApiException as exc:  # a namespace gone or refused: its next reconcile writes it again
                log.warning("%s: the ConfigMap %s keeps the old CA bundle for now: %s", namespace,
                            STATUS_CONFIG_MAP, exc.reason)

    def ensure(self, namespace: str) -> None:
        """Writes the namespace's ConfigMap unless this process wrote the same one there already."""
        with self._guard:
            ca = self._ca_bundle()
            if self._written.get(namespace) == ca:
                return
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": STATUS_CONFIG_MAP, "namespace": namespace, "labels": dict(MANAGED_BY)},
                "data": {URL_FILE: self.url, CA_FILE: ca}}
        try:
            self.core.create_namespaced_config_map(namespace, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            self.core.patch_namespaced_config_map(STATUS_CONFIG_MAP, namespace, {"data": body["data"]})
        with self._guard:
            self._written[namespace] = ca
