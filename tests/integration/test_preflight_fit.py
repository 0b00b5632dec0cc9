"""`scalingrun doctor -n NS` for the runs of a namespace, against a real API server of its own (no controllers, no
kubelet): Nodes that advertise a GPU resource in their status as a device plugin's kubelet would, labelled with the
driver as GPU feature discovery labels them, runs asking for GPUs and naming a Kueue queue, then Kueue's CRDs, its
configuration and a LocalQueue, one fact at a time. Each state gets its line and what to do."""

from __future__ import annotations

import pytest

from scalingrun_api.models import GROUP, PLURAL, VERSION
from scalingrun_operator.cluster.preflight_fit import DRIVER_FLOOR, DRIVER_LABELS, KUEUE_CONFIG, KUEUE_CONFIG_KEY
from scalingrun_operator.schema.crd import build_crd, build_sweep_crd
from tests.support.apiserver import install_crd, kueue_crd_document
from tests.support.doctor import api, doctor, kubeconfig  # noqa: F401 (api, kubeconfig: fixtures)
from tests.support.specs import run_document

pytestmark = pytest.mark.k8s

NAMESPACE = "team"


def node(api, name: str, allocatable: dict[str, str], labels: dict[str, str] | None = None) -> None:
    """A Node, and in its status what a device plugin's kubelet reports (capacity and allocatable)."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    core.create_node({"metadata": {"name": name, "labels": labels or {}}})
    core.patch_node_status(name, {"status": {"capacity": allocatable, "allocatable": allocatable}})


def run(api, name: str, phase: str | None = None, **workers) -> None:
    from kubernetes import client

    custom = client.CustomObjectsApi(api)
    queue = workers.pop("queue", None)
    body = run_document(workers=workers, **({"runPolicy": {"kueueQueueName": queue}} if queue else {}))
    body["metadata"]["name"] = name
    custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)
    if phase:
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, NAMESPACE, PLURAL, name,
                                                     {"status": {"phase": phase}})


def kueue_config(api, frameworks: list[str]) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api)
    body = {"metadata": {"name": KUEUE_CONFIG}, "data": {KUEUE_CONFIG_KEY: (
        "apiVersion: config.kueue.x-k8s.io/v1beta1\nkind: Configuration\nintegrations:\n  frameworks:\n"
        + "".join(f"  - {f}\n" for f in frameworks))}}
    try:
        core.create_namespaced_config_map("kueue-system", body)
    except client.ApiException as exc:
        assert exc.status == 409, exc
        core.replace_namespaced_config_map(KUEUE_CONFIG, "kueue-system", body)


def test_doctor_says_whether_the_namespaces_runs_fit_the_nodes_and_queues(kubeconfig, api, capsys):
    from kubernetes import client

    core = client.CoreV1Api(api)
    for namespace in (NAMESPACE, "kueue-system"):
        core.create_namespace({"metadata": {"name": namespace}})
    install_crd(api, build_crd())
    install_crd(api, build_sweep_crd())
    node(api, "cpu-0", {"cpu": "8", "memory": "32Gi", "pods": "110"})
    run(api, "on-cpu", gpusPerWorker=0)
    run(api, "default-gpu")  # gpusPerWorker's default, 1, of nvidia.com/gpu
    run(api, "done-wide", phase="Succeeded", gpusPerWorker=16)  # finished: asks for nothing any more

    _, found, _ = doctor(capsys, kubeconfig, "-n", NAMESPACE)
    level, message = found["gpu-resource"]
    assert level == "error" and "run default-gpu asks for nvidia.com/gpu, which no node advertises" in message
    assert "done-wide" not in message and "(allocatable: none)" in message
    assert found["gpu-driver"][0] == "info"
    assert "kueue-queue" not in found and "kueue-mpijob" not in found

    # A GPU node as the device plugin and GPU feature discovery leave it, with a driver below the floor.
    node(api, "gpu-0", {"cpu": "8", "nvidia.com/gpu": "4"}, {DRIVER_LABELS[1]: str(DRIVER_FLOOR - 5)})
    _, found, _ = doctor(capsys, kubeconfig, "-n", NAMESPACE)
    assert found["gpu-resource"] == ("ok", f"GPU resources allocatable: nvidia.com/gpu: gpu-0 4; the 1 active run(s) "
                                           f"in {NAMESPACE} asking for GPUs fit a node")
    level, message = found["gpu-driver"]
    assert level == "warning" and message.startswith(f"driver below R{DRIVER_FLOOR} on gpu-0 {DRIVER_FLOOR - 5}")
    core.patch_node("gpu-0", {"metadata": {"labels": {DRIVER_LABELS[1]: str(DRIVER_FLOOR)}}})
    run(api, "sliced", gpusPerWorker=1, gpuResource="nvidia.com/mig-1g.10gb")
    _, found, _ = doctor(capsys, kubeconfig, "-n", NAMESPACE)
    assert found["gpu-driver"] == ("ok", f"driver R{DRIVER_FLOOR}+ on every GPU node (gpu-0 {DRIVER_FLOOR})")
    level, message = found["gpu-resource"]
    assert level == "error" and "run sliced asks for nvidia.com/mig-1g.10gb, which no node advertises" in message
    assert "(allocatable: nvidia.com/gpu: gpu-0 4)" in message
    client.CustomObjectsApi(api).delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "sliced")

    # A run naming a Kueue queue before Kueue is installed: its MPIJob would stay suspended.
    run(api, "queued", gpusPerWorker=0, queue="team-queue")
    _, found, _ = doctor(capsys, kubeconfig, "-n", NAMESPACE)
    assert found["kueue"][0] == "info"
    assert found["kueue-queue"][0] == "error" and "Kueue is not installed" in found["kueue-queue"][1]

    # Kueue's CRDs: its configuration is not there yet, nor the LocalQueue.
    install_crd(api, kueue_crd_document("clusterqueues", "ClusterQueue", "Cluster"))
    install_crd(api, kueue_crd_document("localqueues", "LocalQueue", "Namespaced"))
    _, found, _ = doctor(capsys, kubeconfig, "-n", NAMESPACE)
    assert found["kueue"][0] == "ok"
    assert found["kueue-mpijob"][0] == "unknown" and KUEUE_CONFIG in found["kueue-mpijob"][1]
    level, message = found["kueue-queue"]
    assert level == "error" and f"no LocalQueue in {NAMESPACE} for team-queue (run queued)" in message

    # Kueue configured for Jobs only, then for MPIJobs too; the LocalQueue made.
    kueue_config(api, ["batch/job"])
    _, found, _ = doctor(capsys, kubeconfig, "-n", NAMESPACE)
    level, message = found["kueue-mpijob"]
    assert level == "error" and "kueue-system/kueue-manager-config) does not manage kubeflow.org/mpijob" in message
    kueue_config(api, ["batch/job", "kubeflow.org/mpijob"])
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta1", NAMESPACE, "localqueues",
        {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue", "metadata": {"name": "team-queue"},
         "spec": {"clusterQueue": "cluster-queue"}})
    _, found, _ = doctor(capsys, kubeconfig, "-n", NAMESPACE)
    assert found["kueue-mpijob"] == ("ok", "Kueue (kueue-system/kueue-manager-config) manages kubeflow.org/mpijob, "
                                           "batch/job")
    assert found["kueue-queue"] == ("ok", f"the runs' queues are LocalQueues in {NAMESPACE}: team-queue (run queued)")
