"""What one tenant may not take from another, against a real kube-apiserver and SeaweedFS: a run cannot choose
the spec it is held to by writing the pin itself.

The operator runs as in test_operator.py (a subprocess, standalone), serving the srt-* namespaces.
"""

from __future__ import annotations

import copy
import json

import pytest
from kubernetes import client

from scalingrun_operator.decide import pinning

from .test_operator import Bucket, Cluster, Operator, _namespace, new_run, reach_training, wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.s3]

BUCKET = "scalingrun-operator"  # new_run's
PREFIX = "srt"


@pytest.fixture(scope="module")
def bucket(s3_server) -> Bucket:
    return Bucket.created(s3_server, BUCKET)


@pytest.fixture(scope="module")
def operator(kubeconfig, scalingrun_crd, mpijob_crd, tmp_path_factory) -> Operator:
    op = Operator(kubeconfig, tmp_path_factory.mktemp("tenancy-operator") / "operator.log", [f"{PREFIX}-*"],
                  "--standalone")
    op.start()
    yield op
    op.stop()


@pytest.fixture
def cluster(api_client, s3_server, request, scalingrun_crd, mpijob_crd) -> Cluster:
    name = _namespace(api_client, s3_server, request, PREFIX)
    yield Cluster(api_client, name)
    client.CoreV1Api(api_client).delete_namespace(name)


def _images(pod_spec: dict) -> set[str]:
    return {c["image"] for c in pod_spec.get("initContainers", []) + pod_spec["containers"]}


def test_a_pin_written_by_a_user_chooses_nothing(cluster, operator, bucket, s3_server):
    body = new_run(cluster.ns, "pinned", s3_server, workers={"image": "ok/trainer:1"})
    evil = copy.deepcopy(body["spec"])
    evil["workers"]["image"] = "evil/image:6.6.6"
    body["metadata"]["annotations"] = {pinning.PINNED_ANNOTATION: json.dumps(evil)}
    body["status"] = {pinning.PINNED_FIELD: json.dumps(evil)}  # the API server drops status on create
    cluster.create_run(body)

    job = wait_for(lambda: cluster.job("pinned-preprocess"), what="the preprocessing Job", operator=operator)
    assert _images(job["spec"]["template"]["spec"]) == {"ok/trainer:1"}
    cluster.wait_events("pinned", lambda ev: any(
        t == "Warning" and r == "PinnedSpecAnnotationIgnored" and "spec.workers.image" in m for t, r, m in ev),
        operator)
    run = cluster.run("pinned")
    assert pinning.PINNED_ANNOTATION not in (run["metadata"].get("annotations") or {})
    assert json.loads(run["status"][pinning.PINNED_FIELD])["workers"]["image"] == "ok/trainer:1"

    # Written again mid-run, the MPIJob is built from .spec all the same, and the annotation removed again.
    cluster.patch_run("pinned", {"metadata": {"annotations": {pinning.PINNED_ANNOTATION: json.dumps(evil)}}})
    reach_training(cluster, bucket, "pinned", operator)
    wait_for(lambda: pinning.PINNED_ANNOTATION not in (cluster.run("pinned")["metadata"].get("annotations") or {}),
             what="the annotation removed again", operator=operator)
    mpijob = cluster.mpijob("pinned-train")
    for role in ("Launcher", "Worker"):
        assert _images(mpijob["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]) == {"ok/trainer:1"}
    assert not any("evil" in m for _, _, m in cluster.events("pinned"))


def test_a_key_with_a_line_break_is_refused_naming_the_key_and_its_value_appears_nowhere(cluster, operator,
                                                                                            s3_server):
    pem = "-----BEGIN PRIVATE KEY-----\nLEAKME0123456789\n-----END PRIVATE KEY-----\n"
    cluster.core.create_namespaced_secret(cluster.ns, {"metadata": {"name": "pem"}, "stringData": {
        "AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": pem}})
    cluster.create_run(new_run(cluster.ns, "pem", s3_server, storage={"credentialsSecret": "pem"}))

    condition = wait_for(lambda: cluster.condition("pem", "StorageReadable").get("status") == "False" and
                         cluster.condition("pem", "StorageReadable"), what="StorageReadable=False", operator=operator)
    assert f"Secret {cluster.ns}/pem key 'AWS_SECRET_ACCESS_KEY' holds control or non-ASCII" in condition["message"]
    cluster.wait_events("pem", lambda ev: any(r == "StorageUnreadable" for _, r, _ in ev), operator)
    assert "LEAKME" not in json.dumps(cluster.run("pem"))
    assert not [m for _, _, m in cluster.events("pem") if "LEAKME" in m or "BEGIN PRIVATE" in m]
    assert "LEAKME" not in operator.log_path.read_text(errors="replace")
    assert cluster.job("pem-preprocess") is None  # nothing made with a store it cannot read
