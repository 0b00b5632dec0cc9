"""What one tenant may not take from another, against a real kube-apiserver and SeaweedFS: a run cannot choose
the spec it is held to by writing the pin itself, cannot have a Secret's value echoed, and cannot make the
operator send requests where only its pod can reach or read its disk.

The operator runs as in test_operator.py (a subprocess, standalone), serving the srt-* namespaces; a second one
with the chart's defaults (no allow-list, no paths) serves the srd-* namespaces.
"""

from __future__ import annotations

import copy
import json

import pytest
from kubernetes import client

from scalingrun_operator.decide import pinning

from tests.support.operator import (  # noqa: F401 (bucket: a fixture)
    Bucket, new_run, reach_training, served, wait_for,
)

pytestmark = [pytest.mark.k8s, pytest.mark.s3]

BUCKET = "scalingrun-operator"  # new_run's
PREFIX = "srt"


@pytest.fixture(scope="module")
def bucket(s3_server) -> Bucket:
    return Bucket.created(s3_server, BUCKET)


operator, cluster = served(PREFIX)


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


# --- an operator with the chart's defaults: no allow-list, nothing allowed beyond it -----------------------

SAFE = "srd"


safe_operator, safe_cluster = served(SAFE, env=lambda s3_server: {
    "SCALINGRUN_ALLOW_ANY_STORAGE_ENDPOINT": "false", "SCALINGRUN_ALLOW_LOCAL_PATHS": "false",
    "SCALINGRUN_STORAGE_DEADLINE_SECONDS": "2"})


def test_by_default_the_operator_sends_nothing_where_only_it_can_reach(safe_cluster, safe_operator, s3_server):
    cluster, port = safe_cluster, s3_server.endpoint.rsplit(":", 1)[1]
    metadata = new_run(cluster.ns, "metadata", s3_server)
    metadata["spec"]["storage"]["endpoint"] = "http://169.254.169.254"
    cluster.create_run(metadata)
    disk = new_run(cluster.ns, "disk", s3_server, dataset={"output": "/var/run/secrets/kubernetes.io"})
    disk["spec"]["storage"]["endpoint"] = "http://minio.storage.invalid:9000"  # a name: passes the spec's check
    cluster.create_run(disk)
    spelt = new_run(cluster.ns, "spelt", s3_server)
    spelt["spec"]["storage"]["endpoint"] = f"http://2130706433:{port}"  # 127.0.0.1, read by the resolver
    cluster.create_run(spelt)

    for name, words in (("metadata", "spec.storage.endpoint: http://169.254.169.254 is link-local"),
                        ("disk", "spec.dataset.output: /var/run/secrets/kubernetes.io is a path on the operator's")):
        wait_for(cluster.phase_is(name, "Failed"), what=f"{name} Failed", operator=safe_operator)
        failed = cluster.condition(name, "Failed")
        assert failed["reason"] == "InvalidSpec" and failed["message"].startswith(words), failed
    condition = wait_for(lambda: cluster.condition("spelt", "StorageReadable").get("status") == "False" and
                         cluster.condition("spelt", "StorageReadable"), what="StorageReadable=False",
                         operator=safe_operator)
    assert "the storage endpoint is not reachable or not allowed; check spec.storage.endpoint" in condition["message"]
    assert "loopback" not in condition["message"] and "127.0.0.1" not in condition["message"]
    assert "2130706433" in safe_operator.log_path.read_text() and "loopback" in safe_operator.log_path.read_text()
    assert cluster.children("metadata") == cluster.children("disk") == cluster.children("spelt") == {
        "ConfigMap": [], "Job": [], "MPIJob": []}
