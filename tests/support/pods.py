"""Pods as the Job controller and the MPI operator make them, created through the API (no kubelet runs)."""

from __future__ import annotations

import time

from kubernetes import client

from tests.support.operator import Cluster, mpijob_pod_labels


IMAGE = "registry.invalid/scalingrun/trainer:1"


def create_training_pod(cluster: Cluster, mpijob: dict, role: str, name: str, node: str = "",
                        with_grace: bool = False, owned: bool = False) -> dict:
    """A launcher or worker pod as the MPI operator makes it: the template's labels, container, image and
    resources (the memory limit an OOM message names); with `node`, as if it had been scheduled there; with
    `with_grace`, the template's terminationGracePeriodSeconds (else Kubernetes' default); with `owned`, controlled
    by the MPIJob, as mpi-operator makes a worker (a pod that pushes needs it: the push path checks the owner)."""
    spec = mpijob["spec"]["mpiReplicaSpecs"]["Launcher" if role == "launcher" else "Worker"]
    template = spec["template"]["spec"]["containers"][0]
    container = {"name": template["name"], "image": IMAGE, "resources": template.get("resources") or {}}
    grace = spec["template"]["spec"].get("terminationGracePeriodSeconds") if with_grace else None
    owner = {"apiVersion": mpijob["apiVersion"], "kind": "MPIJob", "name": mpijob["metadata"]["name"],
             "uid": mpijob["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    return create_pod(cluster, {"metadata": {"name": name, "labels": mpijob_pod_labels(mpijob, role),
                                             "ownerReferences": [owner] if owned else []},
                                "spec": {"automountServiceAccountToken": False, "containers": [container],
                                         **({"nodeName": node} if node else {}),
                                         **({"terminationGracePeriodSeconds": grace} if grace else {})}})


def create_pod(cluster: Cluster, body: dict) -> dict:
    deadline = time.monotonic() + 30
    while True:
        try:
            return cluster.core.api_client.sanitize_for_serialization(cluster.core.create_namespaced_pod(cluster.ns, body))
        except client.ApiException as exc:
            # The controller manager creates the namespace's default ServiceAccount a moment after it.
            if exc.status == 403 and "serviceaccount" in str(exc.body).lower() and time.monotonic() < deadline:
                time.sleep(0.3)
                continue
            raise
