"""Deploying on a real API server: `kubectl apply -k` of manifests/, the chart's RBAC checked with
`kubectl auth can-i` as its ServiceAccount, and the operator running with only that ServiceAccount."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.support.env import require

pytestmark = pytest.mark.k8s
ROOT = Path(__file__).resolve().parents[2]
SYSTEM = "scalingrun-system"
SERVICE_ACCOUNT = f"system:serviceaccount:{SYSTEM}:scalingrun"

# What the operator does (see charts/scalingrun/templates/_helpers.tpl), as manifests/base installs it: the push
# path, the chart's default, so it reads no run's Secret (only its own certificate's, in its namespace: below) ...
ALLOWED = [
    ("get", "scalingruns.scalingrun.dev"), ("watch", "scalingruns.scalingrun.dev"),
    ("patch", "scalingruns.scalingrun.dev"), ("patch", "scalingruns.scalingrun.dev", "status"),
    ("create", "configmaps"), ("create", "jobs.batch"), ("watch", "jobs.batch"), ("create", "mpijobs.kubeflow.org"),
    ("patch", "mpijobs.kubeflow.org"), ("create", "events"),
    # ... reviews a pushing pod's token, and keeps the ConfigMap its runs' pods trust (scalingrun-status, by name)
    ("create", "tokenreviews.authentication.k8s.io"), ("watch", "configmaps/scalingrun-status"),
    ("delete", "configmaps/scalingrun-status"),
    ("list", "customresourcedefinitions.apiextensions.k8s.io"),
    # ... reads its children's pods to report why a run is stuck
    ("list", "pods"), ("watch", "pods"),
    # ... and the failed launcher's last log lines for the Failed condition
    ("get", "pods", "log"),
    # ... force-deletes training pods lost with their node, and restarts a stalled training; reads their nodes
    ("delete", "pods"), ("get", "nodes"),
    # ... watches Nodes for a cloud's termination taint (its pods there are deleted gracefully: a step checkpoint)
    ("list", "nodes"), ("watch", "nodes"),
    # ... resizes an elastic run (a new size is a new MPIJob); its capacity probes (pods create) only with the
    # chart's elastic.capacityProbes, off in the base as in the chart (DENIED)
    ("delete", "mpijobs.kubeflow.org"),
    # ... and runs the points of a ScalingSweep as ScalingRuns it creates
    ("create", "scalingruns.scalingrun.dev"), ("watch", "scalingsweeps.scalingrun.dev"),
    ("patch", "scalingsweeps.scalingrun.dev", "status"),
]
# ... and what it must not be able to do (a subresource as its own item: `pods/log` would mean the pod "log").
DENIED = [
    ("get", "secrets"), ("list", "secrets"), ("watch", "secrets"), ("create", "secrets"), ("delete", "secrets"),
    ("delete", "configmaps/team-settings"),  # a tenant's ConfigMap: only scalingrun-status by name
    ("delete", "jobs.batch"), ("delete", "scalingruns.scalingrun.dev"),
    ("delete", "scalingsweeps.scalingrun.dev"), ("create", "scalingsweeps.scalingrun.dev"), ("update", "configmaps"), ("create", "deployments.apps"),
    ("create", "clusterroles.rbac.authorization.k8s.io"), ("create", "customresourcedefinitions.apiextensions.k8s.io"),
    ("create", "pods", "exec"), ("create", "pods", "portforward"), ("patch", "nodes"), ("patch", "pods"),
    ("create", "pods"),  # an elastic run's capacity probes: elastic.capacityProbes, off by default
    ("delete", "clusterkopfpeerings.kopf.dev"), ("create", "kopfpeerings.kopf.dev"),
    # a Lease, not kopf peering, elects the acting replica
    ("patch", "clusterkopfpeerings.kopf.dev"), ("create", "clusterkopfpeerings.kopf.dev"),
    ("create", "leases.coordination.k8s.io"),  # in a namespace other than its own
    # granted once, never called (tests/integration/test_rbac.py records what it calls)
    ("get", "pods"), ("list", "namespaces"), ("get", "scalingruns.scalingrun.dev", "status"),
    ("create", "events.events.k8s.io"),
]
# ... and, in its own namespace only, its Lease: create any (create cannot be limited by name), get/update its own.
LEASE_ALLOWED = [("create", "leases.coordination.k8s.io"), ("get", "leases.coordination.k8s.io/scalingrun"),
                 ("update", "leases.coordination.k8s.io/scalingrun"),
                 # ... and its certificate's Secret: get/update by name, create (no name can limit it)
                 ("get", "secrets/scalingrun-status-tls"), ("update", "secrets/scalingrun-status-tls"),
                 ("create", "secrets")]
LEASE_DENIED = [("get", "leases.coordination.k8s.io/other"), ("update", "leases.coordination.k8s.io/other"),
                ("delete", "leases.coordination.k8s.io/scalingrun"), ("list", "leases.coordination.k8s.io"),
                ("patch", "leases.coordination.k8s.io/scalingrun"),
                ("get", "secrets/other"), ("update", "secrets/other"), ("list", "secrets")]
# Service links that Services named like the chart's (or a user's) put into every pod of the namespace: the
# chart's pod turns them off, and the operator's own variables are names no Service link can produce.
SERVICE_LINKS = {
    "SCALINGRUN_METRICS_PORT": "tcp://10.0.0.241:9090", "SCALINGRUN_METRICS_PORT_9090_TCP_PORT": "9090",
    "SCALINGRUN_METRICS_SERVICE_PORT": "9090", "SCALINGRUN_METRICS_SERVICE_HOST": "10.0.0.241",
    "SCALINGRUN_OPERATOR_PORT": "tcp://10.0.0.242:8080", "SCALINGRUN_OPERATOR_SERVICE_PORT_HEALTH": "8080",
    "SCALINGRUN_PORT": "tcp://10.0.0.243:80",
}


@pytest.fixture(scope="module")
def tools_kubectl(kubeconfig) -> list[str]:
    result = subprocess.run(["bash", str(ROOT / "scripts/tools.sh")], capture_output=True, text=True)
    require(result.returncode == 0, f"kubectl 1.33 not available: {result.stderr[-500:]}")
    return [str(Path(result.stdout.strip()) / "kubectl"), "--kubeconfig", kubeconfig]


@pytest.fixture(scope="module")
def installed(tools_kubectl, mpijob_crd, scalingrun_crd):
    """manifests/crd, then manifests/base, the way the README says."""
    for folder in ("manifests/crd", "manifests/base"):
        result = subprocess.run([*tools_kubectl, "apply", "-k", str(ROOT / folder)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
    return tools_kubectl


def can_i(kubectl: list[str], verb: str, resource: str, subresource: str | None = None,
          namespace: str = "default") -> bool:
    args = [*kubectl, "auth", "can-i", verb, resource, "--as", SERVICE_ACCOUNT, "-n", namespace]
    if subresource:
        args += ["--subresource", subresource]
    return subprocess.run(args, capture_output=True, text=True).stdout.strip() == "yes"


def test_apply_k_installs_the_operator_and_accepts_example_runs(installed, api_client, namespace):
    apps = client.AppsV1Api(api_client)
    deployment = apps.read_namespaced_deployment("scalingrun", SYSTEM)
    assert deployment.spec.template.spec.service_account_name == "scalingrun"
    assert deployment.spec.template.spec.enable_service_links is False
    # One kubectl for the folder (its *.yaml files, not the subfolders): it names each file it refuses.
    result = subprocess.run([*installed, "create", "-n", namespace, "-f", str(ROOT / "examples")], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    names = subprocess.run([*installed, "get", "srun,ssweep", "-n", namespace, "-o", "name"], capture_output=True,
                           text=True).stdout.split()  # examples/sweep.yaml is a ScalingSweep
    assert len(names) == len(list((ROOT / "examples").glob("*.yaml")))


@pytest.mark.parametrize("check", ALLOWED, ids=lambda c: " ".join(c))
def test_service_account_may_do_what_the_operator_does(installed, check):
    assert can_i(installed, *check)


@pytest.mark.parametrize("check", DENIED, ids=lambda c: " ".join(c))
def test_service_account_may_do_nothing_more(installed, check):
    assert not can_i(installed, *check)


@pytest.mark.parametrize("check", LEASE_ALLOWED, ids=lambda c: " ".join(c))
def test_service_account_may_keep_its_lease_in_its_namespace(installed, check):
    assert can_i(installed, *check, namespace=SYSTEM)


@pytest.mark.parametrize("check", LEASE_DENIED, ids=lambda c: " ".join(c))
def test_service_account_may_touch_no_other_lease(installed, check):
    assert not can_i(installed, *check, namespace=SYSTEM)


def test_users_get_edit_and_view_through_aggregation(installed, api_client):
    rbac = client.RbacAuthorizationV1Api(api_client)
    edit = rbac.read_cluster_role("scalingrun-edit")
    assert edit.metadata.labels["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    view = rbac.read_cluster_role("scalingrun-view")
    assert set(view.rules[0].verbs) == {"get", "list", "watch"}


def _service_account_kubeconfig(api_client, admin_kubeconfig: str, path: Path) -> Path:
    core = client.CoreV1Api(api_client)
    deadline = time.monotonic() + 60
    token = None
    while token is None and time.monotonic() < deadline:
        account = core.read_namespaced_service_account("scalingrun", SYSTEM)
        for ref in account.secrets or []:
            secret = core.read_namespaced_secret(ref.name, SYSTEM)
            if secret.type == "kubernetes.io/service-account-token" and (secret.data or {}).get("token"):
                token = base64.b64decode(secret.data["token"]).decode()
        if token is None:
            time.sleep(0.5)
    assert token, "the token controller did not issue a token for the chart's ServiceAccount"
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    admin["users"] = [{"name": "scalingrun", "user": {"token": token}}]
    admin["contexts"] = [{"name": "sa", "context": {"cluster": admin["clusters"][0]["name"], "user": "scalingrun"}}]
    admin["current-context"] = "sa"
    path.write_text(yaml.safe_dump(admin))
    return path


def test_operator_works_with_only_the_chart_service_account(installed, api_client, kubeconfig, namespace, tmp_path):
    """As the chart runs it: its ServiceAccount, electing itself leader with its Lease in its namespace, and
    service-link variables in the environment (as with enableServiceLinks on)."""
    sa_kubeconfig = _service_account_kubeconfig(api_client, kubeconfig, tmp_path / "sa.kubeconfig")
    custom = client.CustomObjectsApi(api_client)
    coordination = client.CoordinationV1Api(api_client)
    try:
        coordination.delete_namespaced_lease("scalingrun", SYSTEM)
    except ApiException as exc:
        assert exc.status == 404, exc
    log = open(tmp_path / "operator.log", "w")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    operator = subprocess.Popen(
        [sys.executable, "-m", "scalingrun_operator.cli", "operator", "--all-namespaces", "--lease", "scalingrun",
         "--liveness", "", "--metrics-port", "0", "--log-format", "plain"],
        stdout=log, stderr=subprocess.STDOUT, env={**env, **SERVICE_LINKS, "KUBECONFIG": str(sa_kubeconfig),
                                                   "SCALINGRUN_POLL_INTERVAL_SECONDS": "2",
                                                   "SCALINGRUN_LEASE_NAMESPACE": SYSTEM,
                                                   "SCALINGRUN_LEASE_HOLDER": "scalingrun-pod-a",
                                                   "SCALINGRUN_ALLOW_LOCAL_PATHS": "true",
                                                   "SCALINGRUN_PULL_DOCUMENTS": "true"},
        start_new_session=True)
    try:
        run = {"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun", "metadata": {"name": "rbac-check"},
               "spec": {"dataset": {"source": str(tmp_path / "jpeg"), "output": str(tmp_path / "parquet")}}}
        custom.create_namespaced_custom_object("scalingrun.dev", "v1alpha1", namespace, "scalingruns", run)
        batch = client.BatchV1Api(api_client)
        deadline = time.monotonic() + 120
        phase = None
        while time.monotonic() < deadline:
            status = custom.get_namespaced_custom_object("scalingrun.dev", "v1alpha1", namespace, "scalingruns",
                                                         "rbac-check").get("status") or {}
            phase = status.get("phase")
            jobs = batch.list_namespaced_job(namespace).items
            if phase == "Preprocessing" and jobs:
                break
            assert operator.poll() is None, (tmp_path / "operator.log").read_text()[-3000:]
            time.sleep(1)
        assert phase == "Preprocessing", (tmp_path / "operator.log").read_text()[-3000:]
        assert [j.metadata.name for j in jobs] == ["rbac-check-preprocess"]
        assert client.CoreV1Api(api_client).read_namespaced_config_map("rbac-check-runconfig", namespace)
        text = (tmp_path / "operator.log").read_text()
        # An RBAC denial names the user; other 403s (e.g. a namespace being deleted) do not.
        assert f'forbidden: User "{SERVICE_ACCOUNT}"' not in text, text[-3000:]
        assert coordination.read_namespaced_lease("scalingrun", SYSTEM).spec.holder_identity == "scalingrun-pod-a"
        assert "became the leader: holding Lease scalingrun-system/scalingrun" in text
    finally:
        os.killpg(operator.pid, signal.SIGTERM)
        try:
            operator.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(operator.pid, signal.SIGKILL)
            operator.wait()
        log.close()


def test_operator_that_cannot_create_its_peering_object_exits_saying_why(installed, kubeconfig, tmp_path):
    # kopf's peering CRDs are not part of any install (manifests/crd leaves them out); one who asks for --peering
    # applies them, as the remedy says.
    peering_crd = subprocess.run([*installed, "apply", "-f", str(ROOT / "manifests/crd/kopf.dev_peerings.yaml")],
                                 capture_output=True, text=True)
    assert peering_crd.returncode == 0, peering_crd.stderr
    established = subprocess.run([*installed, "wait", "--for=condition=Established", "--timeout=60s", "-f",
                                  str(ROOT / "manifests/crd/kopf.dev_peerings.yaml")], capture_output=True, text=True)
    assert established.returncode == 0, established.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    result = subprocess.run(
        [sys.executable, "-m", "scalingrun_operator.cli", "operator", "--namespace", "no-such-namespace-x1",
         "--peering", "scalingrun", "--liveness", "", "--metrics-port", "0", "--log-format", "plain"],
        env={**env, "KUBECONFIG": kubeconfig, "SCALINGRUN_PULL_DOCUMENTS": "true"}, capture_output=True, text=True,
        timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "KopfPeering scalingrun in namespace no-such-namespace-x1: the namespace does not exist" in result.stderr
