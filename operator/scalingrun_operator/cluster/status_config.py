"""The ConfigMap scalingrun-status in each namespace the operator runs a run in: the status endpoint's URL and
the CA bundle of its serving certificate, which every run's pod mounts (optional: builders/common.status_volume).

Non-secret: the operator copies it from the ca.crt in its TLS directory (written by cluster/certificate_secret.py,
or mounted by the kubelet from cert-manager's Secret), and writes it again when the CA changed (a renewed bundle:
publish_again at once, else the namespace's next reconcile).
It lives in the tenant's namespace, where the tenant may write ConfigMaps: a URL or CA of theirs would send the
pods' pushes and tokens elsewhere. So the operator watches these ConfigMaps (by name, server-side: one watch for the
cluster, or one per namespace it runs a run in) and writes its own again whenever what is there differs, at once
from the watch and at every reconcile of a run in the namespace, which compares with the watch's copy and sends
no request while they agree (docs/security.md, "The status ConfigMap").
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from scalingrun_api.models import MANAGED_BY
from scalingrun_api.status_push import CA_FILE, STATUS_CONFIG_MAP, URL_FILE

log = logging.getLogger(__name__)

ALL_NAMESPACES = ""  # the scope of the one cluster-wide watch
WATCH_SECONDS = 300  # a watch's life before it is opened again (and the stop flag looked at)
RETRY_SECONDS = 5.0  # after a watch failed; meanwhile each namespace is written once per CA, as without a watch
_SELECTOR = f"metadata.name={STATUS_CONFIG_MAP}"

Published = tuple[Optional[str], Optional[str], bool, bool]  # url, ca, labelled ours, immutable


def published(config_map: Any) -> Published:
    """What a ConfigMap scalingrun-status tells the pods, and whether it can be patched."""
    data, labels = config_map.data or {}, config_map.metadata.labels or {}
    return (data.get(URL_FILE), data.get(CA_FILE), all(labels.get(k) == v for k, v in MANAGED_BY.items()),
            bool(config_map.immutable))


class StatusConfigMaps:
    def __init__(self, api_client: client.ApiClient, url: str, tls_dir: str, namespaces: Sequence[str] = (),
                 counted: Callable[[], None] = lambda: None):
        """`namespaces`: the operator's (kopf globs; empty: the cluster): one watch for all, or one per namespace.
        `counted()`: a ConfigMap found changed by someone else, to be written again (a metric)."""
        self.core = client.CoreV1Api(api_client)
        self.url, self.ca_file = url, Path(tls_dir) / CA_FILE
        self._cluster_wide, self._counted = not namespaces, counted
        self._served: set[str] = set()  # the namespaces with runs: kept as ours
        self._written: dict[str, str] = {}  # namespace -> the CA written there (what counts while no watch is live)
        self._seen: dict[str, Optional[Published]] = {}  # namespace -> the watch's copy; None: there is none
        self._live: set[str] = set()  # the watches' scopes that are listed and following
        self._watches: dict[str, threading.Thread] = {}
        self._ca: Optional[tuple[Any, str]] = None
        self._guard = threading.Lock()
        self._writing = threading.Lock()  # one write at a time: a reconcile and the watch may both find a change
        self._stopped = threading.Event()

    def _ca_bundle(self) -> str:
        state = os.stat(self.ca_file)
        key = (state.st_mtime_ns, state.st_size, state.st_ino)
        if self._ca is None or self._ca[0] != key:
            self._ca = (key, self.ca_file.read_text())
        return self._ca[1]

    def wanted(self) -> Published:
        """The one place that says what the pods are to trust: this operator's URL and CA bundle."""
        return self.url, self._ca_bundle(), True, False

    def publish_again(self) -> None:
        """Writes the CA bundle again into every namespace with runs (a renewed certificate): the runs' pods
        follow it without a restart, as the kubelet updates their mounted copy and the trainer reads it per push."""
        with self._guard:
            namespaces = list(self._served)
        for namespace in namespaces:
            try:
                self.write(namespace)
            except ApiException as exc:  # a namespace gone or refused: its next reconcile writes it again
                log.warning("%s: the ConfigMap %s keeps the old CA bundle for now: %s", namespace,
                            STATUS_CONFIG_MAP, exc.reason)

    def ensure(self, namespace: str) -> None:
        """Makes the namespace's ConfigMap ours (a reconcile calls it): no request while the watch's copy (or,
        without a live watch, this process's last write) agrees."""
        with self._guard:
            self._served.add(namespace)
            self._follow(namespace)
            if not self._differs(namespace):
                return
        self.write(namespace)

    def _differs(self, namespace: str) -> bool:
        wanted = self.wanted()
        if ALL_NAMESPACES in self._live or namespace in self._live:
            seen = self._seen.get(namespace)
            return seen is None or seen[:3] != wanted[:3]
        return self._written.get(namespace) != wanted[1]

    def write(self, namespace: str) -> None:
        """Creates the ConfigMap, or sets its data and label; one made immutable (which no patch may change) is
        deleted, its finalizers removed first, and made again. Nothing when, its turn come, it is ours already."""
        with self._writing:
            with self._guard:
                if not self._differs(namespace):
                    return
            self._write(namespace)

    def _write(self, namespace: str) -> None:
        wanted = self.wanted()
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": STATUS_CONFIG_MAP, "namespace": namespace, "labels": dict(MANAGED_BY)},
                "data": {URL_FILE: wanted[0], CA_FILE: wanted[1]}}
        try:
            self.core.create_namespaced_config_map(namespace, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            try:
                self.core.patch_namespaced_config_map(STATUS_CONFIG_MAP, namespace,
                                                      {"metadata": {"labels": dict(MANAGED_BY)}, "data": body["data"]})
            except ApiException as refused:
                if refused.status != 422:  # Invalid: immutable
                    raise
                self._recreate(namespace, body)
        with self._guard:
            self._written[namespace] = wanted[1]
            self._seen[namespace] = wanted

    def _recreate(self, namespace: str, body: dict[str, Any]) -> None:
        log.warning("%s: the ConfigMap %s was made immutable; deleted and written again", namespace, STATUS_CONFIG_MAP)
        self.core.patch_namespaced_config_map(STATUS_CONFIG_MAP, namespace, {"metadata": {"finalizers": None}})
        self.core.delete_namespaced_config_map(STATUS_CONFIG_MAP, namespace)
        self.core.create_namespaced_config_map(namespace, body)

    # --- the watch -------------------------------------------------------------------------------------------

    def _follow(self, namespace: str) -> None:
        scope = ALL_NAMESPACES if self._cluster_wide else namespace
        if scope not in self._watches and not self._stopped.is_set():
            thread = threading.Thread(target=self._watch, args=(scope,), daemon=True,
                                      name=f"status-configmaps{'-' + scope if scope else ''}")
            self._watches[scope] = thread
            thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self, scope: str) -> None:
        while not self._stopped.is_set():
            with self._guard:
                if scope and scope not in self._served:  # a namespace forgotten: its watch ends
                    self._watches.pop(scope, None)
                    self._live.discard(scope)
                    return
            try:
                self._list_and_follow(scope)
            except ApiException as exc:
                if exc.status != 410:  # Gone: listed again at once
                    self._failed(scope, exc)
            except Exception as exc:  # noqa: BLE001 - a broken watch: written per CA meanwhile, listed again
                self._failed(scope, exc)

    def _failed(self, scope: str, exc: Exception) -> None:
        with self._guard:
            self._live.discard(scope)
        log.warning("the watch of the ConfigMaps %s%s failed (%s); again in %g s", STATUS_CONFIG_MAP,
                    f" in {scope}" if scope else "", exc, RETRY_SECONDS)
        self._stopped.wait(RETRY_SECONDS)

    def _list_and_follow(self, scope: str) -> None:
        if scope == ALL_NAMESPACES:
            lister: Callable[..., Any] = self.core.list_config_map_for_all_namespaces
            kwargs: dict[str, Any] = {}
        else:
            lister, kwargs = self.core.list_namespaced_config_map, {"namespace": scope}
        listing = lister(field_selector=_SELECTOR, **kwargs)
        found = {item.metadata.namespace: published(item) for item in listing.items}
        with self._guard:
            for namespace in ({scope} if scope else set(self._served) | set(self._seen)):
                self._seen[namespace] = found.get(namespace)
            self._seen.update(found)
            self._live.add(scope)
            drifted = [ns for ns in self._served if (not scope or ns == scope) and self._differs(ns)]
        for namespace in drifted:
            self._reassert(namespace)
        stream = watch.Watch().stream(lister, field_selector=_SELECTOR, timeout_seconds=WATCH_SECONDS,
                                      resource_version=listing.metadata.resource_version, **kwargs)
        for event in stream:
            if self._stopped.is_set():
                return
            item = event["object"]  # an ERROR event is raised by the stream (ApiException; 410: listed again)
            namespace = item.metadata.namespace
            if scope and scope not in self._served:
                return
            with self._guard:
                self._seen[namespace] = None if event["type"] == "DELETED" else published(item)
                drifted = [namespace] if namespace in self._served and self._differs(namespace) else []
            for namespace in drifted:
                self._reassert(namespace)

    def _reassert(self, namespace: str) -> None:
        if namespace in self._written:  # else this process's first write is under way
            log.warning("%s: the ConfigMap %s differs from the operator's (changed or deleted by someone else); "
                        "written again", namespace, STATUS_CONFIG_MAP)
            self._counted()
        try:
            self.write(namespace)
        except ApiException as exc:
            body = exc.body or ""
            if (exc.status == 404 and '"kind":"namespaces"' in body) or (
                    exc.status == 403 and "NamespaceTerminating" in body):
                self.forget(namespace)  # the namespace goes, its ConfigMap with it; a new run there: ensure again
            else:
                log.warning("%s: cannot write the ConfigMap %s again: %s", namespace, STATUS_CONFIG_MAP, exc)
        except Exception as exc:  # noqa: BLE001 - the next reconcile of a run there tries again
            log.warning("%s: cannot write the ConfigMap %s again: %s", namespace, STATUS_CONFIG_MAP, exc)

    def forget(self, namespace: str) -> None:
        """Stops keeping the namespace's ConfigMap (being deleted); its own watch ends at its next event or
        re-list."""
        with self._guard:
            self._served.discard(namespace)
            self._written.pop(namespace, None)
            self._seen.pop(namespace, None)
