"""Every input the operator reads from object storage is bounded, and only allowed stores are asked.

The operator (its settings as the chart's values set them: a 16 KiB document cap and an allow-list
naming the real SeaweedFS) runs against a real kube-apiserver and SeaweedFS. A manifest or a progress
document over the cap is not read: the run says so and goes on once the document is fixed. A run naming
a store off the list fails with the field named, no child is created, and the store it names (a
counting proxy in front of SeaweedFS) never gets a request; edited to an allowed store, it runs.
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from scalingrun_operator.pull import storage

from tests.support.operator import (
    Bucket, Cluster, manifest_for, new_run, progress, progress_uri, reach_training, served, wait_for,
)
from tests.support.flaky_s3 import FlakyS3

pytestmark = [pytest.mark.k8s, pytest.mark.s3]

BUCKET = "scalingrun-bounds"
PREFIX = "srb"  # namespaces served by this module's operator
CAP = 16 * 1024


@pytest.fixture(scope="module")
def bucket(s3_server) -> Bucket:
    return Bucket.created(s3_server, BUCKET)


operator, cluster = served(PREFIX, env=lambda s3_server: {
    "SCALINGRUN_MAX_DOCUMENT_BYTES": str(CAP), "SCALINGRUN_ALLOWED_STORAGE_ENDPOINTS": s3_server.endpoint,
    # As the chart sets it: the allow-list, not allow-any, lets 127.0.0.1 in.
    "SCALINGRUN_ALLOW_ANY_STORAGE_ENDPOINT": "false"})


def bounded_run(cluster: Cluster, name: str, server, **sections) -> dict:
    prefix = f"s3://{BUCKET}/{cluster.ns}/{name}"
    return new_run(cluster.ns, name, server, dataset={"source": f"{prefix}/raw", "output": f"{prefix}/data"},
                   **sections)


def storage_condition(cluster: Cluster, name: str, status: str):
    return lambda: cluster.condition(name, "StorageReadable").get("status") == status and \
        cluster.condition(name, "StorageReadable")


def test_the_real_store_serves_a_document_up_to_the_cap_and_no_byte_more(bucket, s3_server):
    target = storage.StorageTarget(s3_server.endpoint, "us-east-1",
                                   storage.Credentials(s3_server.access_key, s3_server.secret_key),
                                   max_document_bytes=CAP)
    exact = json.dumps({"pad": "x" * (CAP - 11)}).encode()
    assert len(exact) == CAP
    bucket.put(f"s3://{BUCKET}/direct/exact.json", exact)
    bucket.put(f"s3://{BUCKET}/direct/over.json", exact + b" ")
    assert storage.read_json(f"s3://{BUCKET}/direct/exact.json", target)["pad"].startswith("x")
    with pytest.raises(storage.DocumentTooLarge, match=r"over\.json is 16 KiB\+, over the operator's limit of 16 KiB"):
        storage.read_json(f"s3://{BUCKET}/direct/over.json", target)
    with pytest.raises(storage.DocumentTooLarge):
        storage.read_json_versioned(f"s3://{BUCKET}/direct/over.json", target)
    for index in range(12):
        bucket.put(f"s3://{BUCKET}/direct/listing/shard-{index:05d}.json", b"{}")
    assert storage.list_names(f"s3://{BUCKET}/direct/listing", target, limit=5) == [
        f"shard-{index:05d}.json" for index in range(5)]


def test_a_manifest_over_the_cap_is_a_condition_until_it_is_fixed(cluster, operator, bucket, s3_server):
    body = bounded_run(cluster, "bigmanifest", s3_server)
    admitted = cluster.custom.create_namespaced_custom_object("scalingrun.dev", "v1alpha1", cluster.ns,
                                                              "scalingruns", body, dry_run="All")
    manifest = manifest_for(admitted)
    oversized = {**manifest, "classes": [f"class-{i:05d}" for i in range(2000)]}  # ~30 KiB
    manifest_uri = f"{body['spec']['dataset']['output']}/_manifest.json"
    bucket.put_json(manifest_uri, oversized)
    cluster.create_run(body)
    condition = wait_for(storage_condition(cluster, "bigmanifest", "False"), what="StorageReadable=False",
                         operator=operator)
    assert condition["reason"] == "DocumentTooLarge"
    assert condition["message"].startswith(f"{manifest_uri} is 3") and "over the operator's limit of 16 KiB" in \
        condition["message"] and "operator.maxDocumentBytes" in condition["message"], condition["message"]
    assert cluster.status("bigmanifest")["phase"] == "Pending"
    assert cluster.children("bigmanifest") == {"ConfigMap": [], "Job": [], "MPIJob": []}
    cluster.wait_events("bigmanifest", lambda ev: any(t == "Warning" and r == "StorageUnreadable" and "16 KiB" in m
                                                      for t, r, m in ev), operator)
    # Fixed (the dataset it describes is the run's): reused, the run goes on.
    bucket.put_json(manifest_uri, manifest)
    wait_for(cluster.phase_is("bigmanifest", "Training"), what="Training", operator=operator)
    assert cluster.condition("bigmanifest", "StorageReadable")["status"] == "True"


def test_a_progress_document_over_the_cap_is_not_mirrored(cluster, operator, bucket, s3_server):
    cluster.create_run(bounded_run(cluster, "bigprogress", s3_server))
    run = cluster.run("bigprogress")
    reach_training(cluster, bucket, "bigprogress", operator)
    cluster.set_mpijob_condition("bigprogress-train", "Running", "", "")
    bucket.put_json(progress_uri(run), progress("running", 1))
    wait_for(lambda: (cluster.status("bigprogress").get("training") or {}).get("epoch") == 1, what="epoch 1",
             operator=operator)
    history = [{"epoch": e, "loss": 0.5, "val_accuracy": 0.8} for e in range(1000)]  # ~45 KiB
    bucket.put_json(progress_uri(run), progress("running", 2, history=history))
    condition = wait_for(storage_condition(cluster, "bigprogress", "False"), what="StorageReadable=False",
                         operator=operator)
    assert condition["reason"] == "DocumentTooLarge" and "progress.json is 4" in condition["message"]
    assert cluster.status("bigprogress")["training"]["epoch"] == 1  # what was read before stays
    bucket.put_json(progress_uri(run), progress("running", 3))
    wait_for(lambda: (cluster.status("bigprogress").get("training") or {}).get("epoch") == 3, what="epoch 3",
             operator=operator)
    assert cluster.condition("bigprogress", "StorageReadable")["status"] == "True"


def test_a_store_off_the_allow_list_is_refused_with_the_field_and_never_asked(cluster, operator, s3_server):
    elsewhere = FlakyS3(s3_server.endpoint)  # a real store (SeaweedFS behind a counter) that is not on the list
    try:
        cluster.create_run(bounded_run(cluster, "offlist", s3_server, storage={"endpoint": elsewhere.endpoint}))
        status = wait_for(cluster.phase_is("offlist", "Failed"), what="Failed", operator=operator)
        failed = cluster.condition("offlist", "Failed")
        assert failed["reason"] == "InvalidSpec"
        assert failed["message"].startswith(f"spec.storage.endpoint: {elsewhere.endpoint} is not an endpoint this "
                                            f"operator may use; allowed: {s3_server.endpoint}"), failed["message"]
        assert status["message"].startswith("InvalidSpec: spec.storage.endpoint")
        assert cluster.children("offlist") == {"ConfigMap": [], "Job": [], "MPIJob": []}
        assert elsewhere.requests == []
        # Edited to the allowed store: validated again, and it runs.
        cluster.patch_run("offlist", {"spec": {"storage": {"endpoint": s3_server.endpoint}}})
        wait_for(cluster.phase_is("offlist", "Preprocessing"), what="Preprocessing", operator=operator)
        assert elsewhere.requests == []
    finally:
        elsewhere.close()
