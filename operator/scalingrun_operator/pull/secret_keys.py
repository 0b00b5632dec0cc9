"""A run's storage keys, read from the Secret it names (spec.storage.credentialsSecret): pull mode's only Secret
read (the push path reads none). Errors name the Secret and key, never a value."""

from __future__ import annotations

import base64
import json

from kubernetes import client
from kubernetes.client.rest import ApiException

from ..object_store import secret_key_value
from .storage import Credentials, StorageError


class SecretKeys:
    """Reads the keys through the Kubernetes API (`secrets` get, by name: the chart grants it in pull mode only)."""

    def __init__(self, core: client.CoreV1Api):
        self.core = core

    def read_credentials(self, namespace: str, secret: str, id_key: str, secret_key: str) -> Credentials:
        """The storage keys from the run's Secret; errors name the Secret and key, never a value."""
        try:
            obj = self.core.read_namespaced_secret(secret, namespace, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                raise StorageError(f"Secret {namespace}/{secret} (spec.storage.credentialsSecret) not found") from None
            if exc.status == 403:
                raise StorageError(f"the operator may not read Secret {namespace}/{secret}: check its RBAC") from None
            raise
        data = json.loads(obj.data).get("data") or {}
        values = []
        for key in (id_key, secret_key):
            if key not in data:
                raise StorageError(f"Secret {namespace}/{secret} has no key {key!r}")
            values.append(credential(base64.b64decode(data[key]), f"Secret {namespace}/{secret} key {key!r}"))
        return Credentials(values[0], values[1])


def credential(raw: bytes, where: str) -> str:
    """The key, held to the one rule of object_store.secret_key_value; StorageError (a condition) when it fails."""
    try:
        return secret_key_value(raw, where)
    except ValueError as exc:
        raise StorageError(str(exc)) from None
