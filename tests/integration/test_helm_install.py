"""The chart installs exactly as the README says, with helm 4 against a real kube-apiserver 1.20: with
server-side apply (helm 4's default) and with `--server-side=false`, under the README's release name and
another. Without `--wait`: there is no kubelet here (tests/e2e installs it with `--wait` on a real node).

These tests get an API server of their own: the chart's CRDs must not exist beforehand (the session's
server has them, created without Helm's ownership), and a test must be able to remove them afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from tests.conftest import NAMED_KUBECONFIG, ROOT, api_server, require
from tests.e2e.environment import README_HELM_INSTALL

pytestmark = pytest.mark.k8s
README_INSTALL = " ".join(README_HELM_INSTALL)  # the command tests/e2e runs on a real node
CRDS = ["scalingruns.scalingrun.dev", "scalingsweeps.scalingrun.dev"]


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory) -> str:
    """A fresh API server (no controllers needed): its kubeconfig path."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if not assets and NAMED_KUBECONFIG:
        pytest.skip("needs a fresh API server (KUBEBUILDER_ASSETS); on a named cluster tests/e2e installs the chart")
    require(bool(assets), "needs KUBEBUILDER_ASSETS")
    with api_server(tmp_path_factory.mktemp("helm-cluster"), controllers=False) as path:
        yield path


@pytest.fixture(scope="module")
def tools(own_cluster) -> Path:
    result = subprocess.run(["bash", str(ROOT / "scripts/tools.sh")], capture_output=True, text=True)
    require(result.returncode == 0, f"helm 4 not available: {result.stderr[-500:]}")
    return Path(result.stdout.strip())


@pytest.fixture
def api(own_cluster):
    api_client = config.new_client_from_config(config_file=own_cluster)
    yield api_client
    # crds.keep leaves the CRDs on uninstall, owned by that release: a user reinstalling under another
    # name deletes them first, as here, so each test starts from a cluster without them.
    ext = client.ApiextensionsV1Api(api_client)
    for name in CRDS:
        try:
            ext.delete_custom_resource_definition(name)
        except ApiException as exc:
            assert exc.status == 404, exc
    deadline = time.monotonic() + 60
    while {c.metadata.name for c in ext.list_custom_resource_definition().items} & set(CRDS):
        assert time.monotonic() < deadline, "CRDs not deleted within 60 s"
        time.sleep(0.3)


def shell(command: str, kubeconfig: str, tools: Path) -> subprocess.CompletedProcess:
    """A command line as a user types it, from the repository root, with helm 4 and kubectl on PATH."""
    env = {**os.environ, "KUBECONFIG": kubeconfig, "PATH": f"{tools}:{os.environ['PATH']}",
           "HELM_CACHE_HOME": str(Path(kubeconfig).parent / "helm-cache"),
           "HELM_CONFIG_HOME": str(Path(kubeconfig).parent / "helm-config"),
           "HELM_DATA_HOME": str(Path(kubeconfig).parent / "helm-data")}
    return subprocess.run(command, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def assert_installed(api_client, release: str, namespace: str, *, server_side: bool) -> None:
    fullname = release if "scalingrun" in release else f"{release}-scalingrun"
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    deployment = apps.read_namespaced_deployment(fullname, namespace)
    pod = deployment.spec.template.spec
    assert pod.service_account_name == fullname and pod.enable_service_links is False
    assert core.read_namespaced_service_account(fullname, namespace)
    service = core.read_namespaced_service(f"{fullname}-metrics", namespace)
    assert [(p.port, p.protocol) for p in service.spec.ports] == [(9090, "TCP")]
    rbac = client.RbacAuthorizationV1Api(api_client)
    binding = rbac.read_cluster_role_binding(f"{fullname}-operator")
    assert [(s.name, s.namespace) for s in binding.subjects] == [(fullname, namespace)]
    assert rbac.read_cluster_role(binding.role_ref.name)
    ext = client.ApiextensionsV1Api(api_client)
    for name in CRDS:
        assert ext.read_custom_resource_definition(name).metadata.annotations["meta.helm.sh/release-name"] == release
    # Two replicas elect a leader with a Lease: no kopf peering CRDs, a Role for the Lease, a budget that
    # this 1.20 server serves as policy/v1beta1 (helm asks the server which versions it has).
    assert not {c.metadata.name for c in ext.list_custom_resource_definition().items} & {
        "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}
    assert deployment.spec.replicas == 2
    assert rbac.read_namespaced_role(f"{fullname}-leader-election", namespace).rules[1].resource_names == [fullname]
    pdb = client.CustomObjectsApi(api_client).get_namespaced_custom_object(  # generic path: no v1beta1 client
        "policy", "v1beta1", namespace, "poddisruptionbudgets", fullname)
    assert pdb["spec"]["maxUnavailable"] == 1
    # Which way helm wrote the objects: server-side apply records an Apply operation.
    operations = {f.operation for f in deployment.metadata.managed_fields if f.manager == "helm"}
    assert operations == ({"Apply"} if server_side else {"Update"}), deployment.metadata.managed_fields


def test_operator_without_peering_crd_exits_saying_why(own_cluster, api):
    """Before the chart: kopf alone would pause silently without its peering CRD."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    result = subprocess.run(
        [sys.executable, "-m", "scalingrun_operator.cli", "operator", "--all-namespaces", "--peering", "scalingrun",
         "--liveness", "", "--metrics-port", "0", "--log-format", "plain"],
        env={**env, "KUBECONFIG": own_cluster}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "needs the CRD clusterkopfpeerings.kopf.dev, which is not installed" in result.stderr
    assert "--standalone" in result.stderr


def test_readme_install_command_with_server_side_apply(own_cluster, tools, api):
    assert README_INSTALL in (ROOT / "README.md").read_text()
    installed = shell(README_INSTALL, own_cluster, tools)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert_installed(api, "scalingrun", "scalingrun-system", server_side=True)
    removed = shell("helm uninstall scalingrun -n scalingrun-system", own_cluster, tools)
    assert removed.returncode == 0, removed.stdout + removed.stderr
    with pytest.raises(ApiException) as gone:
        client.AppsV1Api(api).read_namespaced_deployment("scalingrun", "scalingrun-system")
    assert gone.value.status == 404
    # crds.keep: uninstalling never deletes the CRD, and with it every ScalingRun.
    assert client.ApiextensionsV1Api(api).read_custom_resource_definition("scalingruns.scalingrun.dev")


def test_install_with_client_side_apply_and_another_release_name(own_cluster, tools, api):
    command = README_INSTALL.replace("install scalingrun", "install ml-ops").replace("scalingrun-system", "ml-platform")
    installed = shell(command + " --server-side=false", own_cluster, tools)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert_installed(api, "ml-ops", "ml-platform", server_side=False)
    removed = shell("helm uninstall ml-ops -n ml-platform", own_cluster, tools)
    assert removed.returncode == 0, removed.stdout + removed.stderr
