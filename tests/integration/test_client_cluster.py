"""scalingrun.Run against a real kube-apiserver: submit() creates the ScalingRun, status and wait() read what the
operator writes (patched here by the test, as the operator would), delete() removes it."""

from __future__ import annotations

import copy
import threading

import pytest
from kubernetes import client

import scalingrun
from scalingrun.backends import ClusterError
from scalingrun.display import LineDisplay
from scalingrun_api import models
from tests.support.specs import MINIMAL

pytestmark = pytest.mark.k8s


def objects(api_client, namespace: str) -> dict:
    return client.CustomObjectsApi(api_client).list_namespaced_custom_object(
        models.GROUP, models.VERSION, namespace, models.PLURAL)


def patch_status(api_client, namespace: str, name: str, status: dict) -> None:
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object_status(
        models.GROUP, models.VERSION, namespace, models.PLURAL, name, {"status": status})


def test_submit_status_wait_and_delete(api_client, scalingrun_crd, namespace, kubeconfig, capsys):
    run = scalingrun.Run.from_dict(MINIMAL).submit(kubeconfig=kubeconfig, namespace=namespace)
    created = objects(api_client, namespace)["items"]
    assert [o["metadata"]["name"] for o in created] == ["demo"]
    # The document as built (the API server adds the schema's defaults).
    spec = created[0]["spec"]
    assert (spec["dataset"]["source"], spec["dataset"]["output"], spec["storage"]["credentialsSecret"]) == \
        ("s3://bucket/raw", "s3://bucket/parquet", "s3-creds")
    assert run.status == {}
    patch_status(api_client, namespace, "demo", {"phase": "Training", "message": "epoch 1 of 2",
                                                 "training": {"epoch": 1, "maxEpochs": 2, "imagesPerSecond": 90.0}})
    assert run.phase == "Training" and run.status["training"]["epoch"] == 1

    timer = threading.Timer(3, patch_status, (api_client, namespace, "demo", {
        "phase": "Succeeded", "message": "done", "training": {"epoch": 2, "maxEpochs": 2, "imagesPerSecond": 95.0}}))
    timer.start()
    try:
        status = run.wait(timeout=120, poll_seconds=0.5, display=LineDisplay("demo"))
    finally:
        timer.cancel()
    assert status["phase"] == "Succeeded"
    shown = capsys.readouterr().err.splitlines()
    assert shown[0] == "demo Training: epoch 1/2, 90 images/s" and shown[-1] == "demo Succeeded: epoch 2/2, 95 images/s"

    with pytest.raises(ClusterError, match=f"^a ScalingRun demo exists already in namespace {namespace}: delete it"):
        scalingrun.Run.from_dict(MINIMAL).submit(kubeconfig=kubeconfig, namespace=namespace)
    run.delete()
    assert objects(api_client, namespace)["items"] == []
    run.delete()  # gone already: no error
    with pytest.raises(ClusterError, match=f"^ScalingRun demo not found in namespace {namespace} \\(deleted\\?\\)$"):
        run.status


def test_wait_raises_the_failed_runs_status_message(api_client, scalingrun_crd, namespace, kubeconfig):
    body = copy.deepcopy(MINIMAL)
    body["metadata"]["name"] = "doomed"
    run = scalingrun.Run.from_dict(body).submit(kubeconfig=kubeconfig, namespace=namespace)
    patch_status(api_client, namespace, "doomed", {"phase": "Failed", "message": "rank 1 exited with code 1"})
    with pytest.raises(scalingrun.RunFailed, match="^ScalingRun doomed failed: rank 1 exited with code 1$") as raised:
        run.wait(timeout=60, progress=False)
    assert raised.value.status["phase"] == "Failed"
    with pytest.raises(TimeoutError, match="^ScalingRun demo is still not started after 1 s$"):
        scalingrun.Run.from_dict(MINIMAL).submit(kubeconfig=kubeconfig, namespace=namespace).wait(
            timeout=1, poll_seconds=0.5, progress=False)


@pytest.mark.s3
def test_metrics_of_a_cluster_run_come_from_its_progress_document(api_client, scalingrun_crd, namespace, kubeconfig,
                                                                   s3_server, monkeypatch):
    import json

    from scalingrun_operator.builders.locations import progress_uri

    s3_server.create_bucket("client-metrics")
    body = copy.deepcopy(MINIMAL)
    body["metadata"]["name"] = "measured"
    body["spec"]["storage"]["endpoint"] = s3_server.endpoint
    body["spec"]["dataset"].update(source="s3://client-metrics/raw", output="s3://client-metrics/parquet")
    for variable, value in s3_server.env().items():
        monkeypatch.setenv(variable, value)
    run = scalingrun.Run.from_dict(body).submit(kubeconfig=kubeconfig, namespace=namespace)
    assert len(run.metrics()) == 0  # no progress document yet: no rows
    history = [{"epoch": 1, "imagesPerSecond": 80.5, "loss": 1.2, "val_accuracy": 0.41},
               {"epoch": 2, "imagesPerSecond": 92.0, "loss": 0.8, "val_accuracy": 0.57}]
    uri = progress_uri(run.model)
    with s3_server.filesystem().open_output_stream(uri[len("s3://"):]) as stream:
        stream.write(json.dumps({"state": "running", "epoch": 2, "maxEpochs": 3, "history": history}).encode())
    metrics = run.metrics()
    assert metrics.to_dict("records") == [
        {"epoch": 1, "images_per_second": 80.5, "loss": 1.2, "val_accuracy": 0.41},
        {"epoch": 2, "images_per_second": 92.0, "loss": 0.8, "val_accuracy": 0.57}]
    run.delete()
