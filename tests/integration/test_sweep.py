"""ScalingSweep: the operator against a real kube-apiserver (+ GC) and a real S3 server (SeaweedFS).

As in test_operator.py, neither kubelet nor mpi-operator runs: the test writes the dataset manifest
and the trainers' progress documents into the bucket and patches the Job's and MPIJobs' status. The
operator creates the points, one after another, once each, fills the table and names the recommendation.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

import pytest
from kubernetes import client

from scalingrun_api import models
from scalingrun_operator.schema.sweep import SWEEP_LABEL
from tests.support.operator import (  # noqa: F401 (bucket: a fixture)
    Bucket, Cluster, Operator, manifest_for, new_run, progress, progress_uri, served, started, wait_for,
)

pytestmark = pytest.mark.k8s

BUCKET = "scalingrun-sweep"
PREFIX = "sws"  # namespaces served by this module's operator


@pytest.fixture(scope="module")
def bucket(s3_server) -> Bucket:
    b = Bucket(s3_server)
    try:
        b.client.create_bucket(Bucket=BUCKET)
    except b.client.exceptions.BucketAlreadyOwnedByYou:
        pass
    return b


operator, cluster = served(PREFIX, sweeps=True)


def new_sweep(namespace: str, name: str, server, workers: list[int], **spec: Any) -> dict:
    template = new_run(namespace, "template", server)["spec"]
    template["dataset"]["source"] = f"s3://{BUCKET}/{namespace}/raw"
    template["dataset"]["output"] = f"s3://{BUCKET}/{namespace}/data"
    return {"apiVersion": models.API_VERSION, "kind": models.SWEEP_KIND, "metadata": {"name": name},
            "spec": {"workers": workers, "template": template, **spec}}


def sweep_of(cluster: Cluster, name: str) -> dict:
    return cluster.custom.get_namespaced_custom_object(models.GROUP, models.VERSION, cluster.ns,
                                                       models.SWEEP_PLURAL, name)


def get_run(cluster: Cluster, name: str):
    try:
        return cluster.run(name)
    except client.rest.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def shared_manifest(run: dict) -> dict:
    """The manifest the first point's preprocessing writes: laid out for the sweep's largest point."""
    from scalingrun_trainer.preprocess.source import Params

    manifest = manifest_for(run)
    d = run["spec"]["dataset"]
    manifest["parameters"] = Params(
        source=d["source"], output=d["output"], image_size=d["imageSize"], validation_fraction=d["validationFraction"],
        sample_fraction=d["sampleFraction"], seed=d["seed"], max_readers=d["preprocessing"]["readers"],
    ).dataset_parameters()
    return manifest


def finish_point(cluster: Cluster, bucket: Bucket, name: str, operator: Operator, epochs: int, seconds: float,
                 accuracy: float) -> None:
    """What a trainer and the mpi-operator would leave behind: the final progress document, MPIJob Succeeded."""
    run = wait_for(lambda: cluster.phase_is(name, "Training")() and cluster.run(name), what=f"{name} Training",
                   operator=operator)
    processes = run["spec"]["workers"]["replicas"]
    history = [{"epoch": e, "imagesPerSecond": 100.0 * processes} for e in range(1, epochs + 1)]
    bucket.put_json(progress_uri(run), progress(
        "succeeded", epochs, maxEpochs=5, elapsedSeconds=seconds, processes=processes, history=history,
        effectiveBatchSize=32 * processes, learningRate=0.001 * processes,
        bestMetrics={"val_loss": 0.4, "val_accuracy": accuracy}))
    cluster.set_mpijob_condition(f"{name}-train", "Succeeded", "MPIJobSucceeded", "done")
    wait_for(cluster.phase_is(name, "Succeeded"), what=f"{name} Succeeded", operator=operator)


def test_points_run_one_after_another_on_one_dataset_with_table_and_recommendation(
        cluster, operator, bucket, s3_server, kubectl, tmp_path):
    body = new_sweep(cluster.ns, "scale", s3_server, [1, 2, 4])
    cluster.custom.create_namespaced_custom_object(models.GROUP, models.VERSION, cluster.ns, models.SWEEP_PLURAL, body)

    # The first point alone, owned by the sweep, visible as a ScalingRun; it preprocesses for the largest point.
    first = wait_for(lambda: get_run(cluster, "scale-w1"), what="the first point", operator=operator)
    owner = first["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("ScalingSweep", "scale", True)
    assert first["metadata"]["labels"][SWEEP_LABEL] == "scale"
    assert first["spec"]["workers"]["replicas"] == 1 and first["spec"]["dataset"]["preprocessing"]["readers"] == 4
    job = wait_for(lambda: cluster.job("scale-w1-preprocess"), what="the preprocessing Job", operator=operator)
    assert get_run(cluster, "scale-w2") is None
    bucket.put_json(f"{first['spec']['dataset']['output']}/_manifest.json", shared_manifest(first))
    cluster.complete_job(job["metadata"]["name"], succeeded=2)

    # Preprocessed, training: still one point at a time (maxParallel 1).
    wait_for(cluster.phase_is("scale-w1", "Training"), what="scale-w1 Training", operator=operator)
    time.sleep(3)
    assert get_run(cluster, "scale-w2") is None, "the second point started while the first was training"
    sweep = sweep_of(cluster, "scale")
    assert sweep["status"]["phase"] == "Running" and sweep["status"]["progress"] == "0/3"
    assert not sweep["metadata"].get("finalizers"), "a sweep needs no finalizer: deletion is left to GC"

    finish_point(cluster, bucket, "scale-w1", operator, epochs=5, seconds=100.0, accuracy=0.90)
    second = wait_for(lambda: get_run(cluster, "scale-w2"), what="the second point", operator=operator)
    assert second["spec"]["workers"]["replicas"] == 2
    # It reuses the first point's dataset: no preprocessing Job of its own.
    wait_for(lambda: cluster.condition("scale-w2", "Preprocessed").get("reason") == "DatasetReused",
             what="scale-w2 DatasetReused", operator=operator)
    assert cluster.job("scale-w2-preprocess") is None
    assert get_run(cluster, "scale-w4") is None
    finish_point(cluster, bucket, "scale-w2", operator, epochs=5, seconds=55.0, accuracy=0.895)
    wait_for(lambda: get_run(cluster, "scale-w4"), what="the third point", operator=operator)
    finish_point(cluster, bucket, "scale-w4", operator, epochs=4, seconds=32.0, accuracy=0.89)

    sweep = wait_for(lambda: (sweep_of(cluster, "scale").get("status") or {}).get("phase") == "Succeeded"
                     and sweep_of(cluster, "scale"), what="the sweep Succeeded", operator=operator)
    status = sweep["status"]
    rows = {r["workers"]: r for r in status["points"]}
    assert [r["run"] for r in status["points"]] == ["scale-w1", "scale-w2", "scale-w4"]
    assert (rows[2]["processes"], rows[2]["effectiveBatchSize"], rows[2]["epochs"], rows[2]["bestValAccuracy"],
            rows[2]["bestValLoss"], rows[2]["wallSeconds"], rows[2]["imagesPerSecond"]) == (
        2, 64, 5, 0.895, 0.4, 55.0, 200.0)
    assert [rows[w]["speedup"] for w in (1, 2, 4)] == [1.0, round(20 / 11, 3), 2.5]  # seconds per epoch 20, 11, 8
    assert [rows[w]["efficiency"] for w in (1, 2, 4)] == [1.0, round(20 / 11 / 2, 3), 0.625]
    assert rows[4]["workerHours"] == round(4 * 32 / 3600, 4)
    assert (status["recommendation"]["run"], status["recommendation"]["workers"]) == ("scale-w2", 2)
    assert "4 workers: efficiency 0.62 < 0.7" in status["recommendation"]["message"]
    assert status["progress"] == "3/3" and status["completionTime"]
    assert not sweep["metadata"].get("finalizers")

    # Printer columns.
    # Discovery of its own: the session's kubectl cache may predate the sweep CRD (an earlier test's kubectl), and
    # kubectl does not look again for a short name it does not know.
    table = subprocess.run([*kubectl, "--cache-dir", str(tmp_path / "kubectl-cache"), "get", "ssweep",
                            "-n", cluster.ns], capture_output=True, text=True, check=True)
    header, line = table.stdout.splitlines()[:2]
    assert header.split()[:4] == ["NAME", "PHASE", "POINTS", "RECOMMENDED-WORKERS"]
    assert line.split()[:4] == ["scale", "Succeeded", "3/3", "2"]

    # Each point was created exactly once.
    created = [e for e in cluster.events("scale") if e[1] == "PointCreated"]
    assert sorted(m.split(":")[0] for _, _, m in created) == [
        "ScalingRun scale-w1", "ScalingRun scale-w2", "ScalingRun scale-w4"], created

    # Deleting the sweep deletes its runs (owner references + the garbage collector).
    cluster.custom.delete_namespaced_custom_object(models.GROUP, models.VERSION, cluster.ns, models.SWEEP_PLURAL,
                                                   "scale")
    wait_for(lambda: all(get_run(cluster, f"scale-w{w}") is None for w in (1, 2, 4)),
             what="garbage collection of the points", operator=operator)


def test_a_failed_point_stops_the_sweep_and_says_which(cluster, operator, bucket, s3_server):
    body = new_sweep(cluster.ns, "fails", s3_server, [1, 2])
    cluster.custom.create_namespaced_custom_object(models.GROUP, models.VERSION, cluster.ns, models.SWEEP_PLURAL, body)
    first = wait_for(lambda: get_run(cluster, "fails-w1"), what="the first point", operator=operator)
    job = wait_for(lambda: cluster.job("fails-w1-preprocess"), what="the preprocessing Job", operator=operator)
    bucket.put_json(f"{first['spec']['dataset']['output']}/_manifest.json", shared_manifest(first))
    cluster.complete_job(job["metadata"]["name"], succeeded=2)
    wait_for(cluster.phase_is("fails-w1", "Training"), what="fails-w1 Training", operator=operator)
    cluster.set_mpijob_condition("fails-w1-train", "Failed", "MPIJobFailed", "launcher exited 137 (OOMKilled)")
    sweep = wait_for(lambda: (sweep_of(cluster, "fails").get("status") or {}).get("phase") == "Failed"
                     and sweep_of(cluster, "fails"), what="the sweep Failed", operator=operator)
    message = sweep["status"]["message"]
    assert "point fails-w1 (1 worker) failed" in message and "OOMKilled" in message, message
    assert next(c for c in sweep["status"]["conditions"] if c["type"] == "Failed")["reason"] == "PointFailed"
    time.sleep(2)
    assert get_run(cluster, "fails-w2") is None


def test_invalid_sweep_is_failed_naming_the_field(cluster, operator, s3_server):
    body = new_sweep(cluster.ns, "bad", s3_server, [1, 2])
    body["spec"]["template"]["dataset"]["output"] = body["spec"]["template"]["dataset"]["source"] + "/out"
    cluster.custom.create_namespaced_custom_object(models.GROUP, models.VERSION, cluster.ns, models.SWEEP_PLURAL, body)
    sweep = wait_for(lambda: (sweep_of(cluster, "bad").get("status") or {}).get("phase") == "Failed"
                     and sweep_of(cluster, "bad"), what="the sweep Failed", operator=operator)
    assert "spec.template.dataset.output: must not be inside" in sweep["status"]["message"]
    assert get_run(cluster, "bad-w1") is None
