"""The serving replica's pod label (cluster/serving.py), as a real kube-apiserver takes it: set when the replica
starts serving the status endpoint, removed when one starts (a standby), so that the status Service, which selects
it, sends pushes to the leader only."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from scalingrun_operator.cluster.serving import SERVING, SERVING_LABEL, mark_serving

pytestmark = pytest.mark.k8s


def test_the_serving_replica_labels_its_pod_and_a_starting_one_removes_the_label(api_client, namespace):
    core = client.CoreV1Api(api_client)
    labels = {"app.kubernetes.io/name": "scalingrun"}
    deadline = time.monotonic() + 60
    while not core.list_namespaced_service_account(namespace, field_selector="metadata.name=default").items:
        assert time.monotonic() < deadline, "the controller manager made no default ServiceAccount"
        time.sleep(0.3)  # a pod needs its namespace's ServiceAccount, which the controller manager makes
    for name in ("operator-a", "operator-b"):
        core.create_namespaced_pod(namespace, {"metadata": {"name": name, "labels": labels}, "spec": {
            "automountServiceAccountToken": False,
            "containers": [{"name": "operator", "image": "ghcr.io/scalingrun/operator:0.1.0"}]}})

    def serving() -> list[str]:
        return sorted(p.metadata.name for p in core.list_namespaced_pod(
            namespace, label_selector=f"{SERVING_LABEL}={SERVING}").items)

    mark_serving(api_client, namespace, "operator-a", serving=True)
    assert serving() == ["operator-a"]
    # operator-a's container restarts (its Lease lost): a standby until it leads again; operator-b leads.
    mark_serving(api_client, namespace, "operator-a", serving=False)
    mark_serving(api_client, namespace, "operator-b", serving=True)
    assert serving() == ["operator-b"]
    assert core.read_namespaced_pod("operator-a", namespace).metadata.labels == labels  # only its own label went
    mark_serving(api_client, namespace, "operator-a", serving=False)  # removing an absent label is no error
    assert serving() == ["operator-b"]
    mark_serving(api_client, namespace, "operator-gone", serving=True)  # no such pod (outside one): passed over
    assert serving() == ["operator-b"]
