"""Runs whose pods push, made through a real API server as the operator and mpi-operator v0.8 make them, with no
operator running: the ScalingRun, its MPIJob and preprocessing Job (controlled by the run), the MPIJob's launcher Job
(controlled by the MPIJob: ../shared/mpi-operator/README.md) and pods controlled by any of them. Their tokens come
from the TokenRequest API bound to the pod, as the kubelet's projected volume gets them. The operator's watch of the
runs is `latest.run_seen`, fed with each run as created (KnownRuns: what PushAuthenticator asks first)."""

from __future__ import annotations

from typing import Any, Optional

import pytest
from kubernetes import client

from scalingrun_api.models import GROUP, MANAGED_BY, PLURAL, VERSION
from scalingrun_api.status_push import STATUS_AUDIENCE
from scalingrun_operator.builders.common import RUN_LABEL
from scalingrun_operator.cluster.latest import LatestObjects
from scalingrun_operator.cluster.push_auth import PushAuthenticator
from tests.support.specs import run_document

SERVICE_ACCOUNT = "runner"
MPIJOB_API = ("kubeflow.org", "v2beta1", "mpijobs")
_CONTAINER = {"name": "trainer", "image": "trainer:test"}


def controller_ref(obj: dict[str, Any]) -> dict[str, Any]:
    """The controller reference a controller puts on what it makes."""
    meta = obj["metadata"]
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}


class PushRuns:
    def __init__(self, api_client: client.ApiClient):
        self.api_client = api_client
        self.core, self.batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.latest = LatestObjects()
        self._accounts: set[str] = set()
        self._mpijobs: dict[tuple[str, str], dict[str, Any]] = {}

    def authenticator(self, **options: Any) -> PushAuthenticator:
        return PushAuthenticator(self.api_client, self.latest.known_runs.uid, **options)

    def run(self, namespace: str, name: str) -> dict[str, Any]:
        """The ScalingRun `name`, as the operator's watch shows it."""
        body = run_document()
        body["metadata"] = {"name": name, "namespace": namespace}
        created = self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
        self.latest.run_seen(None, created)
        return created

    def mpijob(self, run: dict[str, Any]) -> dict[str, Any]:
        """The run's MPIJob `<run>-train`, controlled by the run."""
        meta = run["metadata"]
        replica = {"replicas": 1, "template": {"spec": {"containers": [_CONTAINER]}}}
        return self.custom.create_namespaced_custom_object(*MPIJOB_API[:2], meta["namespace"], MPIJOB_API[2], {
            "apiVersion": "/".join(MPIJOB_API[:2]), "kind": "MPIJob",
            "metadata": {"name": f"{meta['name']}-train", "labels": {**MANAGED_BY, RUN_LABEL: meta["name"]},
                         "ownerReferences": [controller_ref(run)]},
            "spec": {"mpiReplicaSpecs": {"Launcher": replica, "Worker": replica}}})

    def job(self, name: str, owner: dict[str, Any]) -> dict[str, Any]:
        """A Job controlled by `owner` (the run's preprocessing Job, or an MPIJob's launcher Job). No Job controller
        runs here: the tests make its pods."""
        job = self.batch.create_namespaced_job(owner["metadata"]["namespace"], {
            "metadata": {"name": name, "ownerReferences": [controller_ref(owner)]},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [_CONTAINER]}}}})
        return {**self.api_client.sanitize_for_serialization(job), "apiVersion": "batch/v1", "kind": "Job"}

    def pod(self, namespace: str, name: str, run: str, owner: Optional[dict[str, Any]] = None) -> client.V1Pod:
        """A pod labelled as run `run`'s (labels anyone may set), controlled by `owner` (none: by nothing)."""
        if namespace not in self._accounts:
            self.core.create_namespaced_service_account(namespace, {"metadata": {"name": SERVICE_ACCOUNT}})
            self._accounts.add(namespace)
        return self.core.create_namespaced_pod(namespace, {
            "metadata": {"name": name, "labels": {**MANAGED_BY, RUN_LABEL: run},
                         "ownerReferences": [controller_ref(owner)] if owner else []},
            "spec": {"serviceAccountName": SERVICE_ACCOUNT, "automountServiceAccountToken": False,
                     "containers": [_CONTAINER]}})

    def own_pod(self, namespace: str, name: str, run: str) -> client.V1Pod:
        """A pod of run `run` as mpi-operator makes a worker: controlled by the run's MPIJob (the run and its MPIJob
        made on first use)."""
        if (namespace, run) not in self._mpijobs:
            self._mpijobs[(namespace, run)] = self.mpijob(self.run(namespace, run))
        return self.pod(namespace, name, run, self._mpijobs[(namespace, run)])

    def token(self, pod: client.V1Pod, audience: str = STATUS_AUDIENCE, bound: bool = True) -> str:
        """A token as the kubelet's projected volume gets it (`bound`: to the pod; else the ServiceAccount's own)."""
        request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
            audiences=[audience], expiration_seconds=600,
            bound_object_ref=client.V1BoundObjectReference(kind="Pod", api_version="v1", name=pod.metadata.name,
                                                           uid=pod.metadata.uid) if bound else None))
        return self.core.create_namespaced_service_account_token(SERVICE_ACCOUNT, pod.metadata.namespace,
                                                                 request).status.token


@pytest.fixture
def runs(api_client, scalingrun_crd, mpijob_crd) -> PushRuns:
    """PushRuns on the session's API server, which serves ScalingRuns and MPIJobs."""
    return PushRuns(api_client)
