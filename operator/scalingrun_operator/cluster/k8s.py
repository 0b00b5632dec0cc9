"""Kubernetes API calls of the operator: raw JSON in and out (objects are plain dicts, as the builders
return them), no client models in between. Which calls to make is decided elsewhere (decide/, act.py).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any, Optional

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from scalingrun_api import models
from scalingrun_api.models import MANAGED_SELECTOR, MPIJOB_GROUP, MPIJOB_PLURAL, MPIJOB_VERSION
from ..builders.common import RUN_LABEL
from .api_answers import absent_is_none, api_message, namespace_terminating, parse_version, raw_json, released

log = logging.getLogger(__name__)

POD_PAGE = 500  # pods per list request
_POD_SPEC_KEPT = ("nodeName", "schedulerName")
_CONTAINER_KEPT = ("name", "image", "resources")


def trimmed_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """The parts of a pod that decide reads (decide/pods.py, interruptions.py): its managedFields, env, volumes
    and probes are most of its size and say nothing about why it does not run. Its volumes' names are kept: whether
    it mounts the status token tells a training that can push from one made before the push path
    (decide/stall.py: made_before_the_push_path)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    kept_spec: dict[str, Any] = {k: spec[k] for k in _POD_SPEC_KEPT if k in spec}
    if "volumes" in spec:
        kept_spec["volumes"] = [{"name": v.get("name")} for v in spec["volumes"] or []]
    for key in ("initContainers", "containers"):
        if key in spec:
            kept_spec[key] = [{k: c[k] for k in _CONTAINER_KEPT if k in c} for c in spec[key] or []]
    return {"metadata": {k: v for k, v in meta.items() if k != "managedFields"}, "spec": kept_spec,
            "status": pod.get("status") or {}}


class Kube:
    """The calls the operator makes; one instance per process, shared by handler threads."""

    def __init__(self, api_client: client.ApiClient, component: str = "scalingrun-operator"):
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.component = component
        self.instance = socket.gethostname()
        self._version: Optional[tuple[int, int, str]] = None
        self._version_lock = threading.Lock()
        self._pods_forbidden_logged = False
        self._nodes_forbidden_logged = False

    # --- the server ----------------------------------------------------------------------------

    def server_version(self) -> tuple[int, int, str]:
        """(major, minor, gitVersion) of the API server, asked once per process."""
        with self._version_lock:
            if self._version is None:
                info = raw_json(client.VersionApi(self.api_client).get_code(_preload_content=False))
                self._version = parse_version(info)
            return self._version

    # --- pods ----------------------------------------------------------------------------------

    def list_pods(self, namespace: str, run_name: str) -> list[dict[str, Any]]:
        """The pods labelled as the run's (preprocessing, launcher, workers); [] when the operator may not list
        pods (RBAC of an older chart): diagnosis is then missing, not the reconcile."""
        selector = f"{MANAGED_SELECTOR},{RUN_LABEL}={run_name}"
        pods: list[dict[str, Any]] = []
        token, restarted = "", False
        while True:
            try:
                # In pages: a thousand pods are megabytes of JSON, parsed and trimmed a page at a time.
                response = raw_json(self.core.list_namespaced_pod(namespace, label_selector=selector, limit=POD_PAGE,
                                                              _continue=token or None, _preload_content=False))
            except ApiException as exc:
                if exc.status == 410 and token and not restarted:  # the continue token expired: once more, whole
                    pods, token, restarted = [], "", True
                    continue
                if exc.status != 403:
                    raise
                if not self._pods_forbidden_logged:
                    log.warning("the operator may not list pods (%s): no pod diagnosis or restart counts; "
                                "grant get/list/watch on pods", exc.reason)
                    self._pods_forbidden_logged = True
                return []
            pods.extend(trimmed_pod(p) for p in response.get("items") or [])
            token = (response.get("metadata") or {}).get("continue") or ""
            if not token:
                return pods

    def delete_pod(self, namespace: str, name: str, uid: str, grace_seconds: Optional[int]) -> bool:
        """Deletes the pod `name` if it is still the one of `uid` (a replacement of the same name is left alone);
        False when it is gone already, or when the operator may not delete pods (an older chart's RBAC: logged,
        so that the status saying why is still written)."""
        body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid),
                                      grace_period_seconds=grace_seconds)
        try:
            released(self.core.delete_namespaced_pod(name, namespace, body=body, _preload_content=False))
            return True
        except ApiException as exc:
            if exc.status in (404, 409):  # gone, or another pod of that name now
                return False
            if exc.status == 403:
                log.error("the operator may not delete pod %s/%s (%s): grant delete on pods", namespace, name,
                          exc.reason)
                return False
            raise

    def delete_mpijob(self, namespace: str, name: str, uid: str) -> bool:
        """Deletes the MPIJob `name` if it is still the one of `uid`; False when it is gone already or replaced.
        Foreground: the MPIJob stays (deletionTimestamp set) until its pods, launcher Job, Service and ConfigMap are
        gone, so the MPIJob made next at the new size never meets its predecessor's children (the MPI operator
        refuses objects of its names that another MPIJob controls)."""
        body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid),
                                      propagation_policy="Foreground")
        try:
            released(self.custom.delete_namespaced_custom_object(
                MPIJOB_GROUP, MPIJOB_VERSION, namespace, MPIJOB_PLURAL, name, body=body, _preload_content=False))
            return True
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise

    def get_node(self, name: str) -> Optional[dict[str, Any]]:
        """A Node (cluster-scoped: the operator's ClusterRole grants get on nodes), None when there is none. Where
        the operator may not read Nodes (an older chart's RBAC), {}: a node that says nothing counts as Ready, so
        lost nodes go undetected rather than every reconcile failing."""
        try:
            return absent_is_none(lambda: self.core.read_node(name, _preload_content=False))
        except ApiException as exc:
            if exc.status != 403:
                raise
            if not self._nodes_forbidden_logged:
                log.warning("the operator may not get nodes (%s): lost nodes are not detected; grant get on nodes",
                            exc.reason)
                self._nodes_forbidden_logged = True
            return {}

    def read_pod_log_tail(self, namespace: str, pod: str, container: str, lines: int = 20,
                          max_bytes: int = 64 * 1024, timeout: float = 10.0) -> tuple[Optional[str], str]:
        """(the last `lines` lines of a container's log, "") or (None, why it cannot be read).

        Never raises: a log is an extra of a status that must be written anyway. At most `max_bytes`
        are kept, from the end (a line may be megabytes long).
        """
        read = 0
        try:
            response = self.core.read_namespaced_pod_log(
                pod, namespace, container=container, tail_lines=lines, _preload_content=False,
                _request_timeout=timeout)
            try:
                kept = b""
                for chunk in response.stream(16 * 1024):
                    read += len(chunk)
                    kept = (kept + chunk)[-max_bytes:]
                    if read > 64 * max_bytes:  # a runaway stream: what is kept is enough
                        break
            finally:
                response.release_conn()
            return kept.decode("utf-8", errors="replace"), ""
        except ApiException as exc:
            why = f"HTTP {exc.status}: {api_message(exc)}"
            if exc.status == 403:
                why += "; the operator needs get on pods/log"
            return None, why
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return None, f"{type(exc).__name__}: {exc}"

    # --- the ScalingRun ------------------------------------------------------------------------

    def _get_ours(self, plural: str, namespace: str, name: str) -> Optional[dict[str, Any]]:
        return absent_is_none(lambda: self.custom.get_namespaced_custom_object(
            models.GROUP, models.VERSION, namespace, plural, name, _preload_content=False))

    def _patch_our_status(self, plural: str, namespace: str, name: str, status: dict[str, Any],
                          resource_version: Optional[str]) -> dict[str, Any]:
        """Merge-patches status; with `resource_version` it fails with 409 if the object moved on."""
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return raw_json(self.custom.patch_namespaced_custom_object_status(
            models.GROUP, models.VERSION, namespace, plural, name, body, _preload_content=False))

    def get_run(self, namespace: str, name: str) -> Optional[dict[str, Any]]:
        return self._get_ours(models.PLURAL, namespace, name)

    def patch_run_status(self, namespace: str, name: str, status: dict[str, Any],
                         resource_version: Optional[str] = None) -> dict[str, Any]:
        return self._patch_our_status(models.PLURAL, namespace, name, status, resource_version)

    def patch_run_annotations(self, namespace: str, name: str, annotations: dict[str, Optional[str]],
                              resource_version: Optional[str] = None) -> dict[str, Any]:
        metadata: dict[str, Any] = {"annotations": annotations}
        if resource_version:
            metadata["resourceVersion"] = resource_version
        return raw_json(self.custom.patch_namespaced_custom_object(
            models.GROUP, models.VERSION, namespace, models.PLURAL, name, {"metadata": metadata},
            _preload_content=False))

    # --- the ScalingSweep ----------------------------------------------------------------------

    def get_sweep(self, namespace: str, name: str) -> Optional[dict[str, Any]]:
        return self._get_ours(models.SWEEP_PLURAL, namespace, name)

    def patch_sweep_status(self, namespace: str, name: str, status: dict[str, Any],
                           resource_version: Optional[str] = None) -> dict[str, Any]:
        return self._patch_our_status(models.SWEEP_PLURAL, namespace, name, status, resource_version)

    # --- children ------------------------------------------------------------------------------

    def get_child(self, kind: str, namespace: str, name: str) -> Optional[dict[str, Any]]:
        if kind == "ConfigMap":
            return absent_is_none(lambda: self.core.read_namespaced_config_map(name, namespace, _preload_content=False))
        if kind == "Job":
            return absent_is_none(lambda: self.batch.read_namespaced_job(name, namespace, _preload_content=False))
        if kind == "MPIJob":
            return absent_is_none(lambda: self.custom.get_namespaced_custom_object(
                MPIJOB_GROUP, MPIJOB_VERSION, namespace, MPIJOB_PLURAL, name, _preload_content=False))
        if kind == models.KIND:  # a ScalingSweep's point
            return self.get_run(namespace, name)
        raise ValueError(f"unknown child kind {kind}")

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Creates a child; a 409 (it exists after all) is raised: the reconcile then looks again."""
        namespace = obj["metadata"]["namespace"]
        kind = obj["kind"]
        if kind == "ConfigMap":
            return raw_json(self.core.create_namespaced_config_map(namespace, obj, _preload_content=False))
        if kind == "Job":
            return raw_json(self.batch.create_namespaced_job(namespace, obj, _preload_content=False))
        if kind == "Pod":  # an elastic run's capacity probe
            return raw_json(self.core.create_namespaced_pod(namespace, obj, _preload_content=False))
        if kind == "MPIJob":
            return raw_json(self.custom.create_namespaced_custom_object(
                MPIJOB_GROUP, MPIJOB_VERSION, namespace, MPIJOB_PLURAL, obj, _preload_content=False))
        if kind == models.KIND:
            return raw_json(self.custom.create_namespaced_custom_object(
                models.GROUP, models.VERSION, namespace, models.PLURAL, obj, _preload_content=False))
        raise ValueError(f"unknown child kind {kind}")

    def patch(self, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A merge patch of a child. Only act.py calls this, after its check that the run controls the object."""
        if kind == "ConfigMap":
            return raw_json(self.core.patch_namespaced_config_map(name, namespace, patch, _preload_content=False))
        if kind == "Job":
            return raw_json(self.batch.patch_namespaced_job(name, namespace, patch, _preload_content=False))
        if kind == "MPIJob":
            return raw_json(self.custom.patch_namespaced_custom_object(
                MPIJOB_GROUP, MPIJOB_VERSION, namespace, MPIJOB_PLURAL, name, patch, _preload_content=False))
        if kind == models.KIND:
            return raw_json(self.custom.patch_namespaced_custom_object(
                models.GROUP, models.VERSION, namespace, models.PLURAL, name, patch, _preload_content=False))
        raise ValueError(f"unknown child kind {kind}")

    # --- events --------------------------------------------------------------------------------

    def post_event(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> bool:
        """A core/v1 Event on `obj`; False when the API server refused it (a namespace being deleted is no refusal:
        nobody is left to tell). Failures are logged, never raised (an Event is best effort)."""
        meta = obj["metadata"]
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "name": meta["name"],
                "namespace": meta["namespace"], "uid": meta.get("uid"),
            },
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": self.component},
            "reportingComponent": self.component, "reportingInstance": self.instance[:128],
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }
        try:
            released(self.core.create_namespaced_event(meta["namespace"], event, _preload_content=False))
        except ApiException as exc:
            log.warning("cannot post event %s on %s/%s: %s", reason, meta["namespace"], meta["name"], exc.reason)
            return namespace_terminating(exc)
        return True


def new_api_client() -> client.ApiClient:
    """In a pod: the service account; elsewhere: KUBECONFIG / ~/.kube/config."""
    from kubernetes import config as kube_config

    configuration = client.Configuration()
    try:
        kube_config.load_incluster_config(client_configuration=configuration)
    except kube_config.ConfigException:
        kube_config.load_kube_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = 32  # handler threads share it
    return client.ApiClient(configuration)
