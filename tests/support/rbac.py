"""The operator as the chart runs it (its ServiceAccount, its RBAC, through a recording proxy) and what the chart's
roles grant."""

from __future__ import annotations

import base64
import contextlib
import os
import time
import uuid
from pathlib import Path
from typing import Iterable, Iterator

import pytest
import yaml
from kubernetes import client, config, utils

from scalingrun_api import models
from scalingrun_operator.schema.crd import build_crd, build_sweep_crd
from scalingrun_operator.schema.validation import parse_scalingrun
from scalingrun_operator.builders import build_config_map, build_preprocess_job
from scalingrun_api.status_push import PROGRESS, STATUS_CONFIG_MAP, URL_FILE
from scalingrun_operator.builders.capacity_probes import CAPACITY_PROBE_PRIORITY_CLASS
from tests.support.apiserver import api_server, free_port, install_crd, mpijob_crd_document
from tests.support.env import require
from tests.support.recording_proxy import RecordingProxy
from tests.support.operator import (
    Bucket, Cluster, Operator, SCHEDULED, SECRET, leave_manifest_in_a_pod, manifest_for, new_run, progress, progress_uri,
    running, status_pusher, wait_for,
)
from tests.support.pods import create_training_pod
from tests.support.tls import write_serving_certificate


BUCKET = "scalingrun-rbac"


RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


@pytest.fixture(scope="module")
def rbac_kubeconfig(tmp_path_factory) -> str:
    """A fresh API server with GC and the ServiceAccount controllers (cluster-admin kubeconfig)."""
    require(bool(os.environ.get("KUBEBUILDER_ASSETS")),
            "needs KUBEBUILDER_ASSETS: a fresh API server of its own (a cluster-wide operator acts on every run)")
    with api_server(tmp_path_factory.mktemp("rbac-cluster"), controllers=True) as path:
        admin = config.new_client_from_config(config_file=path)
        install_crd(admin, build_crd())
        install_crd(admin, build_sweep_crd())
        install_crd(admin, mpijob_crd_document())
        yield path


@pytest.fixture(scope="module")
def admin(rbac_kubeconfig):
    return config.new_client_from_config(config_file=rbac_kubeconfig)


@pytest.fixture(scope="module")
def bucket(s3_server) -> Bucket:
    return Bucket.created(s3_server, BUCKET)


def create_namespace(admin, name: str, s3_server=None) -> Cluster:
    """A namespace (with the runs' storage Secret when `s3_server` is given)."""
    core = client.CoreV1Api(admin)
    core.create_namespace({"metadata": {"name": name}})
    if s3_server is not None:
        core.create_namespaced_secret(name, {"metadata": {"name": SECRET}, "stringData": {
            "AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}})
    return Cluster(admin, name)


def apply_rbac(admin, objects: list[dict]) -> None:
    for obj in objects:
        if obj["kind"] in RBAC_KINDS:
            utils.create_from_dict(admin, obj)


def bound_rules(objects: list[dict], service_account: str, namespace: str) -> list[dict]:
    """The rules of every (Cluster)Role the chart binds to the operator's ServiceAccount."""
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in objects if o["kind"] in ("ClusterRole", "Role")}
    rules = []
    for binding in (o for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        if not any(s["kind"] == "ServiceAccount" and s["name"] == service_account and s["namespace"] == namespace
                   for s in binding["subjects"]):
            continue
        ref = binding["roleRef"]
        scope = None if ref["kind"] == "ClusterRole" else binding["metadata"]["namespace"]
        rules += roles[(ref["kind"], scope, ref["name"])]["rules"]
    return rules


def grants(rules: Iterable[dict]) -> set[tuple[str, str, str]]:
    """(verb, group, resource[/subresource]) for every combination a rule allows."""
    return {(verb, group, resource) for rule in rules for verb in rule["verbs"] for group in rule["apiGroups"]
            for resource in rule["resources"]}


def service_account_kubeconfig(admin, proxy: RecordingProxy, namespace: str, name: str, folder: Path) -> str:
    """A kubeconfig that reaches the API server through `proxy` with a token of the ServiceAccount (TokenRequest,
    as the kubelet gets one for the operator's pod)."""
    request = client.CoreV1Api(admin).create_namespaced_service_account_token(
        name, namespace, {"spec": {"expirationSeconds": 3600}})
    path = folder / f"{name}.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "operator",
        "clusters": [{"name": "proxy", "cluster": {"server": proxy.url}}],
        "users": [{"name": "operator", "user": {"token": request.status.token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "proxy", "user": "operator"}}]}))
    return str(path)


def chart_operator(deployment: dict, kubeconfig: str, log_path: Path) -> Operator:
    """`scalingrun operator` with the args and environment of the chart's Deployment (ports aside: the test's
    own; the Downward API's pod name and namespace filled in as the kubelet would)."""
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    chosen_by_the_test = ("--liveness=", "--metrics-port=", "--log-format=")
    args = [a for a in container["args"] if not a.startswith(chosen_by_the_test)]
    downward = {"metadata.namespace": deployment["metadata"]["namespace"],
                "metadata.name": f"{deployment['metadata']['name']}-0",
                "status.podIP": "127.0.0.1"}  # the test's operator is a process here: its pod IP is loopback
    env = {}
    for var in container["env"]:
        env[var["name"]] = var["value"] if "value" in var else downward[var["valueFrom"]["fieldRef"]["fieldPath"]]
    env.pop("SCALINGRUN_POLL_INTERVAL_SECONDS")  # 1 s here (Operator's), as in every operator test
    if "SCALINGRUN_STATUS_PORT_NUMBER" in env:
        # The status endpoint on a free port. Its certificate: the operator's own (made in its Secret, its files
        # written into the folder), or with cert-manager's, in the folder as the kubelet would mount it.
        port, tls = free_port(), log_path.parent / "status-tls"
        tls.mkdir(exist_ok=True)
        if "SCALINGRUN_STATUS_TLS_SECRET" not in env:
            write_serving_certificate(tls)
        env.update(SCALINGRUN_STATUS_PORT_NUMBER=str(port), SCALINGRUN_STATUS_URL=f"https://127.0.0.1:{port}",
                   SCALINGRUN_STATUS_TLS_DIR=str(tls))
    return Operator(kubeconfig, log_path, [], *args, env=env)


def certificate_secret(deployment: dict) -> str:
    """The Secret the chart's operator keeps its serving certificate in; "" when it keeps none."""
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    return next((e["value"] for e in env if e["name"] == "SCALINGRUN_STATUS_TLS_SECRET"), "")


def admitted_run(cluster: Cluster, body: dict):
    """The run as the API server admits it (defaults filled in), parsed as the operator parses it."""
    admitted = cluster.custom.create_namespaced_custom_object(models.GROUP, models.VERSION, cluster.ns,
                                                              models.PLURAL, body, dry_run="All")
    return admitted, parse_scalingrun(admitted)


def owners(obj: dict) -> list[str]:
    return [r["uid"] for r in obj["metadata"].get("ownerReferences") or []]


def lifecycle(cluster: Cluster, bucket: Bucket, s3_server, operator: Operator, push: bool = False) -> None:
    """Every call the operator makes, once at least (what each step reaches is in its comment). `push`: the
    operator's status endpoint is on, so the run's pods report (the manifest in the Job pod's termination message,
    progress pushed) and nothing is written to storage for it."""
    prefix = f"s3://{BUCKET}/{cluster.ns}"
    body = new_run(cluster.ns, "life", s3_server, dataset={"source": f"{prefix}/raw", "output": f"{prefix}/data"})
    admitted, run = admitted_run(cluster, body)
    # An orphaned ConfigMap and Job with the run's labels (a run deleted and created again, its children left
    # by `kubectl delete --cascade=orphan`): adopted, so read and patched (configmaps, jobs: get, patch).
    cluster.core.create_namespaced_config_map(cluster.ns, build_config_map(run, cluster.ns))
    cluster.batch.create_namespaced_job(cluster.ns, build_preprocess_job(run, cluster.ns, indexed=False))
    if push:  # A tenant's own scalingrun-status, immutable: watched, deleted and made again (configmaps: list,
        # watch, delete by name; cluster/status_config.py).
        cluster.core.create_namespaced_config_map(cluster.ns, {
            "metadata": {"name": STATUS_CONFIG_MAP}, "data": {URL_FILE: "https://tenant.example"}, "immutable": True})
    # Read, status written with the pin (scalingruns: get, list, watch, patch; scalingruns/status: patch); its
    # Secret read (secrets: get); an Event per phase (events: create); children listed and watched.
    uid = cluster.create_run(body)["metadata"]["uid"]
    wait_for(cluster.phase_is("life", "Preprocessing"), what="Preprocessing", operator=operator)
    assert owners(cluster.job("life-preprocess")) == [uid]
    assert cluster.job("life-preprocess")["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is True
    # The dataset is written: the MPIJob is created (mpijobs: create), progress mirrored into status.
    preprocessed(cluster, bucket, admitted, f"{prefix}/data", push)
    wait_for(cluster.phase_is("life", "Training"), what="Training", operator=operator)
    assert owners(client.ApiClient().sanitize_for_serialization(
        cluster.core.read_namespaced_config_map("life-runconfig", cluster.ns))) == [uid]
    cluster.set_mpijob_condition("life-train", "Running", "", "")
    if push:  # a worker's push, its token reviewed (tokenreviews: create)
        worker = create_training_pod(cluster, cluster.mpijob("life-train"), "worker", "life-train-worker-1",
                                     owned=True)
        pusher = status_pusher(cluster, worker, "life", Path(operator.log_path).parent)
        pusher.push(PROGRESS, progress("running", 1))
        assert pusher.flush(60) and pusher.sent == 1
    else:
        bucket.put_json(progress_uri(admitted), progress("running", 1))
    wait_for(lambda: (cluster.status("life").get("training") or {}).get("epoch") == 1, what="epoch 1",
             operator=operator)
    # Suspended and resumed (mpijobs: patch).
    cluster.patch_run("life", {"spec": {"runPolicy": {"suspend": True}}})
    wait_for(cluster.phase_is("life", "Suspended"), what="Suspended", operator=operator)
    cluster.patch_run("life", {"spec": {"runPolicy": {"suspend": False}}})
    wait_for(cluster.phase_is("life", "Training"), what="Training again", operator=operator)
    # A worker's node stops answering, long enough ago: its Node read (nodes: get), the worker force-deleted (pods:
    # delete), and the launcher with it.
    lost_worker_on_an_unknown_node(cluster, mpijob=cluster.mpijob("life-train"), operator=operator)
    # The launcher fails on a node (pods: list, watch; pods/log: get; no kubelet answers here).
    mpijob = cluster.mpijob("life-train")
    launcher = "life-train-launcher-x7k2p"
    create_training_pod(cluster, mpijob, "launcher", launcher, node="node-gone")
    cluster.set_pod_status(launcher, phase="Failed", conditions=SCHEDULED, containers=[{
        "name": "launcher", "restartCount": 0, "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}])
    cluster.set_mpijob_condition("life-train", "Failed", "MPIJobFailed", "launcher exited 1")
    wait_for(cluster.phase_is("life", "Failed"), what="Failed", operator=operator)
    failed = cluster.condition("life", "Failed")["message"]
    assert f"the log of launcher pod {launcher} container launcher could not be read" in failed, failed
    # An elastic run shrinks (mpijobs: delete) and probes for capacity to grow back (pods: create).
    elastic_resize(cluster, bucket, s3_server, operator, push)
    # A sweep (scalingsweeps: get, list, watch, patch; scalingsweeps/status: patch) creates its first point
    # (scalingruns: create).
    template = new_run(cluster.ns, "template", s3_server, dataset={"source": f"{prefix}/raw",
                                                                   "output": f"{prefix}/sweep"})["spec"]
    cluster.custom.create_namespaced_custom_object(models.GROUP, models.VERSION, cluster.ns, models.SWEEP_PLURAL, {
        "apiVersion": models.API_VERSION, "kind": models.SWEEP_KIND, "metadata": {"name": "scan"},
        "spec": {"workers": [1, 2], "template": template}})
    wait_for(lambda: cluster.custom.get_namespaced_custom_object(
        models.GROUP, models.VERSION, cluster.ns, models.SWEEP_PLURAL, "scan").get("status"),
        what="the sweep's status", operator=operator)
    wait_for(lambda: cluster.custom.list_namespaced_custom_object(
        models.GROUP, models.VERSION, cluster.ns, models.PLURAL, label_selector="scalingrun.dev/sweep")["items"],
        what="the sweep's first point", operator=operator)


def elastic_resize(cluster: Cluster, bucket: Bucket, s3_server, operator: Operator, push: bool) -> None:
    """A 2-worker run with minReplicas 1 whose second worker cannot be placed: its MPIJob is made again with one
    worker; once that one runs, a capacity probe asks for the missing worker's room."""
    try:  # the chart's PriorityClass (its RBAC alone is applied here): the probes name it
        client.SchedulingV1Api(cluster.core.api_client).create_priority_class(client.V1PriorityClass(
            metadata=client.V1ObjectMeta(name=CAPACITY_PROBE_PRIORITY_CLASS), value=-1000000))
    except client.ApiException as exc:
        if exc.status != 409:  # the other install mode's test made it
            raise
    prefix = f"s3://{BUCKET}/{cluster.ns}"
    body = new_run(cluster.ns, "spot", s3_server, dataset={"source": f"{prefix}/raw", "output": f"{prefix}/spot"},
                   workers={"replicas": 2, "gpusPerWorker": 0, "minReplicas": 1, "resizeAfter": 0})
    admitted, _ = admitted_run(cluster, body)
    cluster.create_run(body)
    wait_for(cluster.phase_is("spot", "Preprocessing"), what="spot Preprocessing", operator=operator)
    preprocessed(cluster, bucket, admitted, f"{prefix}/spot", push)
    wait_for(cluster.phase_is("spot", "Training"), what="spot Training", operator=operator)
    first = cluster.mpijob("spot-train")
    owner = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "name": "spot-train",
             "uid": first["metadata"]["uid"], "controller": True}
    for index, node in ((0, "node-spot"), (1, "")):
        name = f"spot-train-worker-{index}"
        create_training_pod(cluster, first, "worker", name, node=node)
        cluster.core.patch_namespaced_pod(name, cluster.ns, {"metadata": {"ownerReferences": [owner]}})
        cluster.set_pod_status(name, phase="Running" if node else "Pending", containers=running("worker") if node
                               else [], conditions=SCHEDULED if node else [{
                                   "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                   "message": "0/1 nodes are available"}])
    wait_for(lambda: (lambda m: m and m["metadata"]["uid"] != first["metadata"]["uid"] and m)(
        cluster.mpijob("spot-train")), what="spot's MPIJob made again", timeout=120, operator=operator)
    cluster.set_mpijob_condition("spot-train", "Running", "", "")
    wait_for(lambda: cluster.core.list_namespaced_pod(
        cluster.ns, label_selector="app.kubernetes.io/component=capacity-probe").items,
        what="a capacity probe", timeout=60, operator=operator)


def preprocessed(cluster: Cluster, bucket: Bucket, admitted, output: str, push: bool) -> None:
    """The run's preprocessing Job Complete, its manifest where the operator takes it from: the Job's pod's
    termination message with the push path on, else `output` in storage."""
    name = f"{admitted['metadata']['name']}-preprocess"
    if push:
        leave_manifest_in_a_pod(cluster, cluster.job(name), admitted)
    else:
        bucket.put_json(f"{output}/_manifest.json", manifest_for(admitted))
    cluster.complete_job(name, succeeded=1)


def lost_worker_on_an_unknown_node(cluster: Cluster, mpijob: dict, operator: Operator) -> None:
    node = f"rbac-node-{_suffix()}"
    cluster.core.create_node({"metadata": {"name": node}})
    past = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 600))
    cluster.core.patch_node_status(node, {"status": {"conditions": [{
        "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown", "message": "kubelet stopped posting",
        "lastHeartbeatTime": past, "lastTransitionTime": past}]}})
    worker = "life-train-worker-0"
    create_training_pod(cluster, mpijob, "worker", worker, node=node)
    cluster.set_pod_status(worker, phase="Running", containers=running("worker"),
                           conditions=[*SCHEDULED, {"type": "Ready", "status": "False"}])

    def gone() -> bool:
        return not [p for p in cluster.core.list_namespaced_pod(cluster.ns).items if p.metadata.name == worker]

    wait_for(gone, what="the lost worker force-deleted", operator=operator)
    cluster.core.delete_node(node)


def renewed_lease(proxy: RecordingProxy) -> bool:
    return any(r.grant == ("update", "coordination.k8s.io", "leases") and r.status == 200 for r in proxy.requests)


def _suffix() -> str:
    return uuid.uuid4().hex[:5]


@contextlib.contextmanager
def operator_as_the_chart_runs_it(admin, objects: list[dict], tmp_path: Path, earlier_certificate: bool = False
                                  ) -> Iterator[tuple[Operator, RecordingProxy]]:
    """The chart's RBAC applied, its operator started behind a recording proxy; both stopped afterwards.
    `earlier_certificate`: the Secret an earlier chart made (no CA key) is there, and the operator keeping its
    certificate replaces it (get, update: the upgrade's case, a renewal's calls); else it creates it (get, create)."""
    apply_rbac(admin, objects)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    home, account = deployment["metadata"]["namespace"], deployment["spec"]["template"]["spec"]["serviceAccountName"]
    secret = certificate_secret(deployment)
    if secret and earlier_certificate:
        earlier = tmp_path / "earlier-chart-tls"
        earlier.mkdir()
        write_serving_certificate(earlier)
        client.CoreV1Api(admin).create_namespaced_secret(home, {
            "metadata": {"name": secret}, "type": "kubernetes.io/tls",
            "data": {f.name: base64.b64encode(f.read_bytes()).decode() for f in earlier.iterdir()}})
    proxy = RecordingProxy(admin.configuration.host, admin.configuration.ssl_ca_cert).start()
    operator = chart_operator(deployment, service_account_kubeconfig(admin, proxy, home, account, tmp_path),
                              tmp_path / "operator.log")
    try:
        operator.start()
        yield operator, proxy
        wait_for(lambda: renewed_lease(proxy), what="a renewal of the Lease", timeout=30, operator=operator)
    finally:
        operator.stop()
        proxy.stop()
