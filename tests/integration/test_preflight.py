"""`scalingrun doctor` against a real API server of its own (no controllers), brought from empty to ready one fact at
a time: no MPIJob API, then the Training Operator v1's (kubeflow.org/v1) with its controller, then mpi-operator's
v2beta1 beside a Training Operator that still serves MPIJobs, then one told not to (--enable-scheme), Kueue, our CRDs
at this version and at another, the operator's Deployment. Each state gets the line a platform team needs."""

from __future__ import annotations

import copy

import pytest

from scalingrun_operator.builders.mpijob import MPI_OPERATOR_INSTALL
from scalingrun_operator.schema.crd import VERSION_LABEL, build_crd, build_sweep_crd, project_version
from tests.support.apiserver import install_crd, kueue_crd_document, mpijob_crd_document
from tests.support.doctor import api, doctor, kubeconfig  # noqa: F401 (api, kubeconfig: fixtures)

pytestmark = pytest.mark.k8s


def deployment(api, namespace: str, name: str, image: str, args: list[str] | None = None,
               labels: dict[str, str] | None = None) -> None:
    """A Deployment as its installer makes it, with the status a ready one has (no controllers run here)."""
    from kubernetes import client

    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    if namespace not in {n.metadata.name for n in core.list_namespace().items}:
        core.create_namespace({"metadata": {"name": namespace}})
    selector = {"app": name}
    body = {"metadata": {"name": name, "labels": {**selector, **(labels or {})}},
            "spec": {"replicas": 1, "selector": {"matchLabels": selector},
                     "template": {"metadata": {"labels": selector},
                                  "spec": {"containers": [{"name": name, "image": image, "args": args or []}]}}}}
    try:
        apps.create_namespaced_deployment(namespace, body)
    except client.ApiException as exc:
        if exc.status != 409:
            raise
        apps.replace_namespaced_deployment(name, namespace, {**body, "metadata": {
            **body["metadata"], "resourceVersion": apps.read_namespaced_deployment(name, namespace).metadata.resource_version}})
    apps.patch_namespaced_deployment_status(name, namespace, {"status": {"replicas": 1, "readyReplicas": 1}})


def training_operator_crd() -> dict:
    """The Training Operator v1's MPIJob CRD: the same name, kubeflow.org/v1 only."""
    crd = copy.deepcopy(mpijob_crd_document())
    crd["spec"]["versions"] = [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
        "type": "object", "x-kubernetes-preserve-unknown-fields": True}}, "subresources": {"status": {}}}]
    return crd


def delete_crd(api, name: str) -> None:
    import time

    from kubernetes import client

    ext = client.ApiextensionsV1Api(api)
    ext.delete_custom_resource_definition(name)
    deadline = time.monotonic() + 30
    while name in {c.metadata.name for c in ext.list_custom_resource_definition().items}:
        assert time.monotonic() < deadline, f"CRD {name} not gone"
        time.sleep(0.2)


def test_doctor_says_what_is_missing_and_what_to_do_until_the_cluster_is_ready(kubeconfig, api, capsys):
    code, found, _ = doctor(capsys, kubeconfig)
    assert code == 1
    assert found["mpijob-api"][0] == "error" and MPI_OPERATOR_INSTALL in found["mpijob-api"][1]
    assert found["mpijob-controller"][0] == "error" and "no Deployment serves MPIJobs" in found["mpijob-controller"][1]
    assert found["kueue"][0] == "info" and "Kueue not installed" in found["kueue"][1]
    assert found["crd-version"][0] == "error" and "scalingruns.scalingrun.dev" in found["crd-version"][1]
    assert found["operator"][0] == "error" and "no scalingrun operator Deployment" in found["operator"][1]

    # The Training Operator v1: its MPIJob CRD (v1 only) and its controller. Installing mpi-operator over it would
    # break it: the coexistence page is named, not the install command alone.
    install_crd(api, training_operator_crd())
    deployment(api, "kubeflow", "training-operator", "kubeflow/training-operator:v1-855e096")
    code, found, _ = doctor(capsys, kubeconfig)
    assert code == 1
    assert found["mpijob-api"][0] == "error" and "serves v1, not v2beta1" in found["mpijob-api"][1]
    assert "Training Operator v1" in found["mpijob-api"][1] and "run-in-a-cluster.md" in found["mpijob-api"][1]
    assert found["mpijob-controller"][0] == "error"
    assert "only the Training Operator v1 (kubeflow/training-operator)" in found["mpijob-controller"][1]

    # The coexistence page's steps: the v1 CRD replaced by mpi-operator's, mpi-operator running. The Training
    # Operator still has its MPIJob controller on: both would act on every MPIJob.
    delete_crd(api, "mpijobs.kubeflow.org")
    install_crd(api, mpijob_crd_document())
    deployment(api, "mpi-operator", "mpi-operator", "mpioperator/mpi-operator:0.8.2")
    code, found, _ = doctor(capsys, kubeconfig)
    assert found["mpijob-api"][0] == "ok"
    assert found["mpijob-controller"][0] == "warning" and "--enable-scheme" in found["mpijob-controller"][1]
    deployment(api, "kubeflow", "training-operator", "kubeflow/training-operator:v1-855e096",
               args=["--enable-scheme=tfjob", "--enable-scheme=pytorchjob"])
    code, found, _ = doctor(capsys, kubeconfig)
    assert found["mpijob-controller"] == ("ok", "MPIJobs served by mpi-operator/mpi-operator")

    # Kueue: its API group is what says it is there.
    install_crd(api, kueue_crd_document("clusterqueues", "ClusterQueue", "Cluster"))
    code, found, _ = doctor(capsys, kubeconfig)
    assert found["kueue"][0] == "ok" and "kueue.x-k8s.io/v1beta1" in found["kueue"][1]

    # Our CRDs of another version: said, with how to apply this one's; then this version's.
    older = build_crd()
    older["metadata"]["labels"][VERSION_LABEL] = "0.0.9"
    install_crd(api, older)
    install_crd(api, build_sweep_crd())
    code, found, _ = doctor(capsys, kubeconfig)
    assert found["crd-version"][0] == "warning"
    assert f"scalingruns.scalingrun.dev 0.0.9) than this one ({project_version()})" in found["crd-version"][1]
    assert "kubectl apply --server-side" in found["crd-version"][1]
    install_crd(api, build_crd(), replace=True)
    code, found, _ = doctor(capsys, kubeconfig)
    assert found["crd-version"] == ("ok", f"CRDs at {project_version()}, as this scalingrun")

    # The operator's Deployment, ready: named with its chart's version; its /healthz cannot be asked here (no
    # kubelet runs its pod), which is a warning, not a failure.
    deployment(api, "scalingrun-system", "scalingrun", "ghcr.io/scalingrun/operator:0.1.0",
               labels={"app.kubernetes.io/name": "scalingrun", "app.kubernetes.io/component": "operator",
                       VERSION_LABEL: project_version()})
    code, found, _ = doctor(capsys, kubeconfig)
    assert found["operator"][0] == "warning"
    assert f"operator scalingrun-system/scalingrun ready (chart {project_version()}); /healthz not asked" in (
        found["operator"][1])
    assert code == 0, found  # nothing left that stops a run
