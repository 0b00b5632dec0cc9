"""`scalingrun doctor` in the e2e's cluster: the checks that tests/integration/test_preflight.py brings up one fact at
a time on a bare API server, here on a cluster that really has them: the MPIJob controller (the e2e's stand-in, a
Deployment), the operator's pods with a kubelet behind them, so /healthz is answered through the API server's pod
proxy. Then the GPU and Kueue checks: with the GPU e2e's fake GPUs on every node (tests/support/fake_gpus.py), the
resource allocatable per node and the driver unknown (no GPU feature discovery runs here); with Kueue's CRDs, its
configuration and a LocalQueue put in for the test (no Kueue controller runs here), its MPIJob integration and the
namespace's queues. All of it is removed when the test ends, however it ends.
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

import pytest

from scalingrun_operator.cluster.preflight_fit import DRIVER_LABELS, KUEUE_CONFIG, KUEUE_CONFIG_KEY
from tests.e2e.mpijob_controller.deploy import NAME as MPIJOB_CONTROLLER
from tests.e2e.environment import SYSTEM_NAMESPACE
from tests.support.apiserver import install_crd, kueue_crd_document
from tests.support.doctor import doctor as run_doctor
from tests.support.fake_gpus import FAKE_GPUS, GPU_RESOURCE, fake_gpus, wait_advertised

pytestmark = pytest.mark.e2e


def doctor(cluster, capsys, *args: str) -> tuple[int, dict[str, tuple[str, str]], str]:
    code, checks, out = run_doctor(capsys, cluster.kubeconfig, *args)
    print(out)
    return code, checks, out


def test_doctor_reports_the_clusters_mpi_controller_and_a_healthy_operator(cluster, capsys):
    code, checks, out = doctor(cluster, capsys)
    assert code == 0, out
    assert checks["mpijob-api"][0] == "ok"
    level, message = checks["mpijob-controller"]
    assert level == "ok" and f"/{MPIJOB_CONTROLLER}" in message, message
    assert checks["crd-version"][0] == "ok", checks["crd-version"]
    level, message = checks["operator"]
    assert level == "ok" and f"operator {SYSTEM_NAMESPACE}/" in message and "/healthz answered" in message, message


KUEUE_NAMESPACE = "kueue-system"
KUEUE_CRDS = (("clusterqueues", "ClusterQueue", "Cluster"), ("localqueues", "LocalQueue", "Namespaced"))


@contextlib.contextmanager
def kueue_objects(cluster, namespace: str) -> Iterator[None]:
    """Kueue's CRDs, its configuration (MPIJobs and Jobs) and a LocalQueue `e2e-queue` in `namespace`, as an install
    of Kueue leaves them (without its controller), until the block ends."""
    from kubernetes import client

    core, ext = cluster.core(), client.ApiextensionsV1Api(cluster.api)
    made_namespace = KUEUE_NAMESPACE not in {n.metadata.name for n in core.list_namespace().items}
    try:
        for plural, kind, scope in KUEUE_CRDS:
            install_crd(cluster.api, kueue_crd_document(plural, kind, scope))
        if made_namespace:
            core.create_namespace({"metadata": {"name": KUEUE_NAMESPACE}})
        core.create_namespaced_config_map(KUEUE_NAMESPACE, {"metadata": {"name": KUEUE_CONFIG}, "data": {
            KUEUE_CONFIG_KEY: "integrations:\n  frameworks: [batch/job, kubeflow.org/mpijob]\n"}})
        client.CustomObjectsApi(cluster.api).create_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta1", namespace, "localqueues",
            {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue", "metadata": {"name": "e2e-queue"},
             "spec": {"clusterQueue": "e2e"}})
        yield
    finally:
        for plural, _, _ in KUEUE_CRDS:  # the LocalQueue goes with its CRD
            with contextlib.suppress(client.ApiException):
                ext.delete_custom_resource_definition(f"{plural}.kueue.x-k8s.io")
        with contextlib.suppress(client.ApiException):
            if made_namespace:
                core.delete_namespace(KUEUE_NAMESPACE)
            else:
                core.delete_namespaced_config_map(KUEUE_CONFIG, KUEUE_NAMESPACE)
        deadline = time.monotonic() + 300  # a hang's bound (the API server's deletion), not its speed under load
        while {c.metadata.name for c in ext.list_custom_resource_definition().items} & {
                f"{plural}.kueue.x-k8s.io" for plural, _, _ in KUEUE_CRDS}:
            assert time.monotonic() < deadline, "Kueue's CRDs left in the cluster"
            time.sleep(1)


def test_doctor_reports_the_fake_gpus_per_node_and_kueues_mpijob_integration(cluster, capsys):
    code, checks, out = doctor(cluster, capsys, "-n", cluster.namespace)
    assert checks["kueue"][0] == "info" and "kueue-mpijob" not in checks, out
    with fake_gpus(cluster, FAKE_GPUS) as nodes, kueue_objects(cluster, cluster.namespace):
        wait_advertised(cluster, nodes, FAKE_GPUS)
        code, checks, out = doctor(cluster, capsys, "-n", cluster.namespace)
    level, message = checks["gpu-resource"]
    each = ", ".join(f"{node} {FAKE_GPUS}" for node in sorted(nodes))
    assert level == "ok" and message.startswith(f"GPU resources allocatable: {GPU_RESOURCE}: {each}"), message
    level, message = checks["gpu-driver"]
    assert level == "info" and f"{', '.join(sorted(nodes))} carry no driver label ({DRIVER_LABELS[0]}" in message, message
    assert checks["kueue"][0] == "ok", out
    assert checks["kueue-mpijob"] == (
        "ok", f"Kueue ({KUEUE_NAMESPACE}/{KUEUE_CONFIG}) manages kubeflow.org/mpijob, batch/job"), out
    assert checks["kueue-queue"][0] == "info" and "LocalQueues here: e2e-queue" in checks["kueue-queue"][1], out
