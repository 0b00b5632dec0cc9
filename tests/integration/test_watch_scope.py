"""The operator's watches are selective on the API server: the pods, Jobs and MPIJobs of everyone else in the
cluster never reach it (kopf's `labels=` filters would drop them only after they arrived and were parsed).

The operator runs as the chart runs it (cluster-wide, its ServiceAccount) behind the recording proxy, which
keeps each request's query string, on an API server of its own (test_rbac's fixtures).
"""

from __future__ import annotations

from urllib.parse import parse_qs

from kubernetes import client

from scalingrun_operator.builders.common import RUN_LABEL
from scalingrun_operator.cluster import k8s
from scalingrun_operator.cluster.k8s import Kube
from tests.support.chart import helm, render  # noqa: F401 (helm is a fixture)

from tests.support.recording_proxy import Request
from tests.support.operator import Cluster, wait_for
from tests.support.rbac import (  # noqa: F401 (fixtures)
    _suffix, admin, bucket, create_namespace, lifecycle, operator_as_the_chart_runs_it, rbac_kubeconfig,
)
from tests.support.pods import create_pod

SELECTIVE = {("", "pods"), ("batch", "jobs"), ("kubeflow.org", "mpijobs")}
MANAGED = "app.kubernetes.io/managed-by=scalingrun-operator"


def reads_of(requests: list[Request], verbs: tuple[str, ...]) -> list[Request]:
    return [r for r in requests if r.verb in verbs and (r.group, r.resource) in SELECTIVE and not r.name]


def test_pods_jobs_and_mpijobs_are_watched_by_label_on_the_api_server(helm, admin, bucket, s3_server, tmp_path):
    home = f"ws-system-{_suffix()}"
    # The lifecycle's elastic run probes for capacity: the grant for that is on.
    objects = render(helm, None, "--set", "crds.enabled=false", "--set", "elastic.capacityProbes=true",
                     release="watch-scope", namespace=home)
    create_namespace(admin, home)
    bystanders = create_namespace(admin, f"ws-others-{_suffix()}")
    unrelated = [create_pod(bystanders, {"metadata": {"name": f"unrelated-{i}", "labels": {"app": "other"}},
                                         "spec": {"automountServiceAccountToken": False,
                                                  "containers": [{"name": "c", "image": "busybox"}]}})
                 for i in range(3)]
    with operator_as_the_chart_runs_it(admin, objects, tmp_path) as (operator, proxy):
        wait_for(lambda: {(r.group, r.resource) for r in reads_of(proxy.requests, ("watch",))} >= SELECTIVE,
                 what="watches of pods, Jobs and MPIJobs", operator=operator)
        # A run goes through its life with its Job, MPIJob and pods seen: the selector lets the operator's own in.
        lifecycle(create_namespace(admin, f"ws-team-{_suffix()}", s3_server), bucket, s3_server, operator,
                  push=True)  # the chart's default: the status endpoint on
    reads = reads_of(proxy.requests, ("watch", "list"))
    assert reads, "the operator neither listed nor watched pods, Jobs or MPIJobs"
    for request in reads:
        selector = ",".join(parse_qs(request.query).get("labelSelector") or []).split(",")
        assert MANAGED in selector, f"{request.verb} {request.resource} {request.query} without the managed-by selector"
    names = {pod["metadata"]["name"] for pod in unrelated}
    assert not [r for r in proxy.requests if r.namespace == bystanders.ns and r.name in names]


def test_a_runs_pods_are_listed_in_pages_trimmed_to_what_decide_reads(api_client, monkeypatch):
    """Seven pods of a run, three a page; another run's pod and an unlabelled pod in the namespace are not listed."""
    core = client.CoreV1Api(api_client)
    namespace = f"ws-pages-{_suffix()}"
    core.create_namespace({"metadata": {"name": namespace}})
    cluster = Cluster(api_client, namespace)
    try:
        def labelled(name: str, run: str, managed: bool = True) -> dict:
            labels = {RUN_LABEL: run, **({"app.kubernetes.io/managed-by": "scalingrun-operator"} if managed else {})}
            return create_pod(cluster, {"metadata": {"name": name, "labels": labels}, "spec": {
                "automountServiceAccountToken": False, "nodeName": "node-1",
                "containers": [{"name": "worker", "image": "busybox", "env": [{"name": "X", "value": "y" * 1000}],
                                "resources": {"limits": {"memory": "1Gi"}}}]}})

        mine = {labelled(f"big-train-worker-{i}", "big")["metadata"]["uid"] for i in range(7)}
        labelled("other-train-worker-0", "other")
        labelled("big-train-worker-stray", "big", managed=False)
        monkeypatch.setattr(k8s, "POD_PAGE", 3)
        kube, pages = Kube(api_client), []
        list_page = kube.core.list_namespaced_pod

        def counted(*args, **kwargs):
            pages.append(kwargs.get("_continue"))
            return list_page(*args, **kwargs)

        kube.core.list_namespaced_pod = counted
        pods = kube.list_pods(namespace, "big")
        assert {p["metadata"]["uid"] for p in pods} == mine
        assert len(pages) == 3 and pages[0] is None and all(pages[1:]), "three pages of three, the last with one"
        first = pods[0]
        assert "managedFields" not in first["metadata"] and first["spec"]["nodeName"] == "node-1"
        assert [{**c, "resources": c["resources"]["limits"]} for c in first["spec"]["containers"]] == [
            {"name": "worker", "image": "busybox", "resources": {"memory": "1Gi"}}], "no env, probes or volumes"
        assert first["status"]["phase"] == "Pending"
    finally:
        core.delete_namespace(namespace)
