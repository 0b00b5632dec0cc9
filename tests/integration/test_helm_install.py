"""The chart installs exactly as the README says, with helm 4 against a real kube-apiserver: with
server-side apply (helm 4's default) and with `--server-side=false`, under the README's release name and
another. Without `--wait`: there may be no kubelet (tests/e2e installs it with `--wait` on a real node).

Where: an API server of their own from KUBEBUILDER_ASSETS (the chart's CRDs must not exist beforehand, and a
test removes them afterwards), or the cluster SCALINGRUN_TEST_KUBECONFIG names. There the releases and their
namespaces get a suffix of their own (the cluster may run the README's release already, as the e2e's does), and
CRDs are removed only when a test installed them: CRDs that this test session created are taken down for the
install and put back after it; anyone else's stay, and the chart is then installed with crds.enabled=false.
"""

from __future__ import annotations

import io
import os
import secrets
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from tests.support.apiserver import CREATED_CRDS, api_server, install_crd
from tests.support.env import NAMED_KUBECONFIG, ROOT, require
from tests.e2e.environment import README_HELM_INSTALL

pytestmark = pytest.mark.k8s
README_INSTALL = " ".join(README_HELM_INSTALL)  # the command tests/e2e runs on a real node
CRDS = ["scalingruns.scalingrun.dev", "scalingsweeps.scalingrun.dev"]
PEERING_CRD = "clusterkopfpeerings.kopf.dev"


@dataclass
class Target:
    kubeconfig: str
    suffix: str  # appended to release and namespace names: "" on a server of our own
    home: Path  # helm's cache, config and data

    @property
    def named(self) -> bool:
        return bool(self.suffix)

    def command(self, release: str, namespace: str, extra: str = "") -> str:
        """The README's install command for this release and namespace."""
        base = README_INSTALL.replace("install scalingrun", f"install {release}").replace(
            "scalingrun-system", namespace)
        return f"{base} {extra}".strip()


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory) -> Target:
    """A fresh API server (no controllers needed), or the named cluster."""
    if NAMED_KUBECONFIG:
        require(Path(NAMED_KUBECONFIG).is_file(), f"SCALINGRUN_TEST_KUBECONFIG={NAMED_KUBECONFIG} is not a file")
        yield Target(NAMED_KUBECONFIG, "-t" + secrets.token_hex(3), tmp_path_factory.mktemp("helm-home"))
        return
    require(bool(os.environ.get("KUBEBUILDER_ASSETS")),
            "needs KUBEBUILDER_ASSETS (an API server of its own) or SCALINGRUN_TEST_KUBECONFIG (a named cluster)")
    with api_server(tmp_path_factory.mktemp("helm-cluster"), controllers=False) as path:
        yield Target(path, "", tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="module")
def tools(own_cluster) -> Path:
    result = subprocess.run(["bash", str(ROOT / "scripts/tools.sh")], capture_output=True, text=True)
    require(result.returncode == 0, f"helm 4 not available: {result.stderr[-500:]}")
    return Path(result.stdout.strip())


def _existing_crds(ext) -> set[str]:
    return {c.metadata.name for c in ext.list_custom_resource_definition().items}


def _delete_crds(ext, names) -> None:
    for name in names:
        try:
            ext.delete_custom_resource_definition(name)
        except ApiException as exc:
            assert exc.status == 404, exc
    deadline = time.monotonic() + 60
    while _existing_crds(ext) & set(names):
        assert time.monotonic() < deadline, "CRDs not deleted within 60 s"
        time.sleep(0.3)


@pytest.fixture
def api(own_cluster):
    """The API client; the chart's CRDs absent before the test (else crds_installed is False) and removed after
    it when the test installed them."""
    api_client = config.new_client_from_config(config_file=own_cluster.kubeconfig)
    ext = client.ApiextensionsV1Api(api_client)
    present = _existing_crds(ext) & set(CRDS)
    ours = {name for name in present if name in CREATED_CRDS}  # this session's: taken down, put back after
    _delete_crds(ext, ours)
    api_client.crds_installed = not (present - ours)  # anyone else's CRDs stay: the chart then leaves them out
    yield api_client
    # crds.keep leaves the CRDs on uninstall, owned by that release: a user reinstalling under another
    # name deletes them first, as here, so each test starts from a cluster without them.
    if api_client.crds_installed:
        _delete_crds(ext, CRDS)
    for name in sorted(ours):
        install_crd(api_client, {**CREATED_CRDS[name], "metadata": {
            k: v for k, v in CREATED_CRDS[name]["metadata"].items() if k != "resourceVersion"}})


def crds_flag(api_client) -> str:
    return "" if api_client.crds_installed else "--set crds.enabled=false"


def shell(command: str, target: Target, tools: Path) -> subprocess.CompletedProcess:
    """A command line as a user types it, from the repository root, with helm 4 and kubectl on PATH."""
    env = {**os.environ, "KUBECONFIG": target.kubeconfig, "PATH": f"{tools}:{os.environ['PATH']}",
           "HELM_CACHE_HOME": str(target.home / "cache"), "HELM_CONFIG_HOME": str(target.home / "config"),
           "HELM_DATA_HOME": str(target.home / "data")}
    return subprocess.run(command, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _read_budget(api_client, namespace: str, name: str) -> dict:
    """The PodDisruptionBudget in whichever version the server serves (1.20: policy/v1beta1 only)."""
    custom = client.CustomObjectsApi(api_client)  # the generic path: no v1beta1 client
    for version in ("v1", "v1beta1"):
        try:
            return custom.get_namespaced_custom_object("policy", version, namespace, "poddisruptionbudgets", name)
        except ApiException as exc:
            if exc.status != 404:
                raise
    raise AssertionError(f"no PodDisruptionBudget {namespace}/{name}")


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
    if api_client.crds_installed:
        for name in CRDS:
            annotations = ext.read_custom_resource_definition(name).metadata.annotations
            assert annotations["meta.helm.sh/release-name"] == release
    # Two replicas elect a leader with a Lease: no kopf peering CRDs from the chart, a Role for the Lease, a
    # budget (helm asks the server which policy versions it has).
    assert not any(r.metadata.annotations and r.metadata.annotations.get("meta.helm.sh/release-name") == release
                   for r in ext.list_custom_resource_definition().items if r.spec.group == "kopf.dev")
    assert deployment.spec.replicas == 2
    assert rbac.read_namespaced_role(f"{fullname}-leader-election", namespace).rules[1].resource_names == [fullname]
    assert _read_budget(api_client, namespace, fullname)["spec"]["maxUnavailable"] == 1
    # Which way helm wrote the objects: server-side apply records an Apply operation.
    operations = {f.operation for f in deployment.metadata.managed_fields if f.manager == "helm"}
    assert operations == ({"Apply"} if server_side else {"Update"}), deployment.metadata.managed_fields


def test_operator_without_peering_crd_exits_saying_why(own_cluster, api):
    """Before the chart: kopf alone would pause silently without its peering CRD."""
    if own_cluster.named:  # a precondition a named cluster may not meet, and no test may change there
        present = PEERING_CRD in _existing_crds(client.ApiextensionsV1Api(api))
        require(not present, f"the named cluster has {PEERING_CRD}: this test needs a cluster without it")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    result = subprocess.run(
        [sys.executable, "-m", "scalingrun_operator.cli", "operator", "--all-namespaces", "--peering", "scalingrun",
         "--liveness", "", "--metrics-port", "0", "--log-format", "plain"],
        env={**env, "KUBECONFIG": own_cluster.kubeconfig, "SCALINGRUN_PULL_DOCUMENTS": "true"}, capture_output=True,
        text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"needs the CRD {PEERING_CRD}, which is not installed" in result.stderr
    assert "--standalone" in result.stderr


def test_readme_install_command_with_server_side_apply(own_cluster, tools, api):
    assert README_INSTALL in (ROOT / "README.md").read_text()
    release, namespace = f"scalingrun{own_cluster.suffix}", f"scalingrun-system{own_cluster.suffix}"
    command = own_cluster.command(release, namespace, crds_flag(api))
    assert command == README_INSTALL or own_cluster.named or not api.crds_installed
    installed = shell(command, own_cluster, tools)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert_installed(api, release, namespace, server_side=True)
    removed = shell(f"helm uninstall {release} -n {namespace}", own_cluster, tools)
    assert removed.returncode == 0, removed.stdout + removed.stderr
    with pytest.raises(ApiException) as gone:
        client.AppsV1Api(api).read_namespaced_deployment(release, namespace)
    assert gone.value.status == 404
    # crds.keep: uninstalling never deletes the CRD, and with it every ScalingRun.
    assert client.ApiextensionsV1Api(api).read_custom_resource_definition("scalingruns.scalingrun.dev")
    if own_cluster.named:
        client.CoreV1Api(api).delete_namespace(namespace)


def test_install_with_client_side_apply_and_another_release_name(own_cluster, tools, api):
    release, namespace = f"ml-ops{own_cluster.suffix}", f"ml-platform{own_cluster.suffix}"
    installed = shell(own_cluster.command(release, namespace, f"{crds_flag(api)} --server-side=false"),
                      own_cluster, tools)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert_installed(api, release, namespace, server_side=False)
    removed = shell(f"helm uninstall {release} -n {namespace}", own_cluster, tools)
    assert removed.returncode == 0, removed.stdout + removed.stderr
    if own_cluster.named:
        client.CoreV1Api(api).delete_namespace(namespace)


def _previous_chart(folder: Path) -> Path:
    """charts/scalingrun of the previous release (tests/e2e/previous-release: before the push path), from git."""
    commit = next(line.split("=", 1)[1] for line in (ROOT / "tests/e2e/previous-release").read_text().splitlines()
                  if line.startswith("commit="))
    archive = subprocess.run(["git", "archive", "--format=tar", commit, "charts/scalingrun"], cwd=ROOT,
                             capture_output=True)
    require(archive.returncode == 0, f"needs commit {commit} (tests/e2e/previous-release) in this clone: "
            "git fetch --unshallow")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(folder)
    return folder / "charts/scalingrun"


def _roles_naming_secrets(api_client, release: str) -> list[str]:
    rbac = client.RbacAuthorizationV1Api(api_client)
    roles = [*rbac.list_cluster_role().items, *rbac.list_role_for_all_namespaces().items]
    return [role.metadata.name for role in roles if role.metadata.name.startswith(release)
            for rule in role.rules or [] if {"secrets", "*"} & set(rule.resources or [])]


def test_the_documented_upgrade_from_the_previous_release_takes_the_push_path_with_a_stable_render(
        own_cluster, tools, api, tmp_path):
    """docs/install.md's `helm upgrade --reset-then-reuse-values` over the previous release (pull mode, before the
    push path): the new defaults take over, so the only role of the release that names Secrets is the operator's
    for its own certificate, by name. The chart renders no certificate (the operator makes it at its start), so a
    second upgrade renders the same manifest, as every Argo CD sync would."""
    release, namespace = f"upgraded{own_cluster.suffix}", f"upgraded-system{own_cluster.suffix}"
    installed = shell(f"helm install {release} {_previous_chart(tmp_path)} -n {namespace} --create-namespace "
                      f"{crds_flag(api)}", own_cluster, tools)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert _roles_naming_secrets(api, release) == [f"{release}-scalingrun-operator"]  # pull mode: get, by name
    upgrade = f"helm upgrade {release} charts/scalingrun -n {namespace} --reset-then-reuse-values"
    manifests = []
    for _ in range(2):
        upgraded = shell(upgrade, own_cluster, tools)
        assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
        # Its two rules: create (no name can limit it); get, update of its own Secret.
        assert _roles_naming_secrets(api, release) == [f"{release}-scalingrun-status-certificate"] * 2
        manifest = shell(f"helm get manifest {release} -n {namespace}", own_cluster, tools)
        assert manifest.returncode == 0, manifest.stderr
        manifests.append(manifest.stdout)
    assert manifests[1] == manifests[0] and "kind: Secret\n" not in manifests[0]
    secrets = client.CoreV1Api(api).list_namespaced_secret(namespace).items
    assert f"{release}-scalingrun-status-tls" not in {s.metadata.name for s in secrets}  # the operator's to make
    removed = shell(f"helm uninstall {release} -n {namespace}", own_cluster, tools)
    assert removed.returncode == 0, removed.stdout + removed.stderr
    if own_cluster.named:
        client.CoreV1Api(api).delete_namespace(namespace)
