"""The ConfigMap scalingrun-status that the runs' pods trust (the status endpoint's URL and CA bundle) lives in the
tenant's namespace, where the tenant may write ConfigMaps: the operator makes it its own again, whatever the tenant
does to it (issue 51, item 4; docs/security.md, "The status ConfigMap").

A real API server and the operator as a subprocess with its status endpoint on; the test writes as a tenant would:
other data, a deletion, an immutable ConfigMap with a finalizer made before the operator's. While nobody touches it,
the reconciles of more runs there leave it as it is.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families

from scalingrun_api.status_push import CA_FILE, STATUS_CONFIG_MAP, URL_FILE
from tests.support.apiserver import free_port
from tests.support.operator import new_run, served, wait_for  # noqa: F401 (fixtures)
from tests.support.tls import write_serving_certificate

pytestmark = pytest.mark.k8s

STATUS_PORT = free_port()
URL = f"https://127.0.0.1:{STATUS_PORT}"
FORGED = {URL_FILE: "https://collector.tenant.example:443", CA_FILE: "-----BEGIN CERTIFICATE-----\nforged\n"}


def _status_env(_s3_server) -> dict[str, str]:
    tls = Path(tempfile.mkdtemp(prefix="scalingrun-status-tls-"))
    write_serving_certificate(tls)
    return {"SCALINGRUN_STATUS_PORT_NUMBER": str(STATUS_PORT), "SCALINGRUN_STATUS_TLS_DIR": str(tls),
            "SCALINGRUN_STATUS_URL": URL}


operator, cluster = served("srcm", env=_status_env)


def _counter(operator, name: str) -> float:
    return sum(sample.value for family in text_string_to_metric_families(operator.metrics())
               for sample in family.samples if sample.name == name)


def _config_map(core: client.CoreV1Api, namespace: str):
    try:
        return core.read_namespaced_config_map(STATUS_CONFIG_MAP, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _ours(core: client.CoreV1Api, namespace: str):
    """The ConfigMap when it says the operator's URL and a certificate (not the forged one); else None."""
    found = _config_map(core, namespace)
    data = (found.data or {}) if found else {}
    ok = data.get(URL_FILE) == URL and "BEGIN CERTIFICATE" in data.get(CA_FILE, "") and "forged" not in data[CA_FILE]
    return found if ok else None


def test_a_tenants_edit_or_deletion_of_the_status_configmap_is_undone(cluster, operator, s3_server):
    core = client.CoreV1Api(cluster.core.api_client)
    cluster.create_run(new_run(cluster.ns, "trusted", s3_server))
    ours = wait_for(lambda: _ours(core, cluster.ns), what="the operator's ConfigMap", operator=operator)
    before = _counter(operator, "scalingrun_status_configmap_rewrites_total")

    # Left alone, it stays as it is while more runs there are reconciled.
    for other in ("second", "third"):
        cluster.create_run(new_run(cluster.ns, other, s3_server))
        wait_for(lambda: cluster.status(other).get("phase"), what=f"run {other} reconciled", operator=operator)
    assert _config_map(core, cluster.ns).metadata.resource_version == ours.metadata.resource_version

    # The tenant's URL and CA, its own label: undone.
    core.patch_namespaced_config_map(STATUS_CONFIG_MAP, cluster.ns, {
        "metadata": {"labels": {"app.kubernetes.io/managed-by": "tenant"}}, "data": FORGED})
    restored = wait_for(lambda: _ours(core, cluster.ns), what="the forged ConfigMap written again", operator=operator)
    assert restored.metadata.labels["app.kubernetes.io/managed-by"] == "scalingrun-operator"

    # Deleted: made again.
    core.delete_namespaced_config_map(STATUS_CONFIG_MAP, cluster.ns)
    wait_for(lambda: _ours(core, cluster.ns), what="the deleted ConfigMap made again", operator=operator)
    assert _counter(operator, "scalingrun_status_configmap_rewrites_total") >= before + 2


def test_an_immutable_configmap_a_tenant_made_first_is_replaced(cluster, operator, s3_server):
    """Made before any run, immutable (no patch may change its data) and with a finalizer (its deletion would wait):
    the operator's first write finds it and replaces it."""
    core = client.CoreV1Api(cluster.core.api_client)
    core.create_namespaced_config_map(cluster.ns, {
        "metadata": {"name": STATUS_CONFIG_MAP, "finalizers": ["tenant.example/keep"]},
        "data": FORGED, "immutable": True})
    cluster.create_run(new_run(cluster.ns, "first", s3_server))
    replaced = wait_for(lambda: _ours(core, cluster.ns), what="the tenant's immutable ConfigMap replaced",
                        operator=operator)
    assert not replaced.immutable and not replaced.metadata.finalizers
