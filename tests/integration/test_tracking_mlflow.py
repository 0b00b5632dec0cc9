"""The trainer's MLflow client and run tracker against a real MLflow tracking server with basic auth."""

from __future__ import annotations

import socket
import uuid

import pytest

from scalingrun_trainer.core.tracking import RUN_LOCATION_TAG, MlflowClient, RunTracker, TrackingError

pytestmark = pytest.mark.mlflow


def client_for(server, **kwargs) -> MlflowClient:
    return MlflowClient(server.uri, username=server.username, password=server.password, **kwargs)


def metric_history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    history = client.call("GET", "metrics/get-history", {"run_id": run_id, "metric_key": key}).get("metrics", [])
    return sorted((m["step"], m["value"]) for m in history)


def test_experiment_is_created_once_then_found(mlflow_server):
    client = client_for(mlflow_server)
    name = f"exp-{uuid.uuid4().hex[:8]}"
    first = client.experiment_id(name)
    assert client.experiment_id(name) == first
    assert client.call("GET", "experiments/get", {"experiment_id": first})["experiment"]["name"] == name


def test_a_run_gets_params_metrics_per_epoch_best_values_and_its_status(mlflow_server):
    client = client_for(mlflow_server)
    warnings: list[str] = []
    tracker = RunTracker(client, warn=warnings.append)
    run_id = tracker.start(experiment="lifecycle", run_name="flowers", run_location="s3://b/runs/flowers",
                           params={"processes": 2, "learningRate": 0.002})
    run = client.get_run(run_id)
    assert run["info"]["status"] == "RUNNING" and run["info"]["run_name"] == "flowers"
    tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    assert tags[RUN_LOCATION_TAG] == "s3://b/runs/flowers"
    for epoch, loss in ((1, 0.9), (2, 0.5), (3, 0.7)):
        tracker.epoch(epoch, {"val_loss": loss, "accuracy": 1 - loss}, images_per_second=100.0 * epoch)
    tracker.finish("FINISHED", best_epoch=2, best_metrics={"val_loss": 0.5}, model_uri="s3://b/runs/flowers/model.keras")

    run = client.get_run(run_id)
    assert run["info"]["status"] == "FINISHED" and run["info"]["end_time"] >= run["info"]["start_time"]
    assert {p["key"]: p["value"] for p in run["data"]["params"]} == {"processes": "2", "learningRate": "0.002"}
    assert metric_history(client, run_id, "val_loss") == [(1, 0.9), (2, 0.5), (3, 0.7)]
    assert metric_history(client, run_id, "images_per_second") == [(1, 100.0), (2, 200.0), (3, 300.0)]
    latest = {m["key"]: m["value"] for m in run["data"]["metrics"]}
    assert latest["best_val_loss"] == 0.5 and latest["best_epoch"] == 2
    assert {t["key"]: t["value"] for t in run["data"]["tags"]}["scalingrun.dev/model-uri"] == "s3://b/runs/flowers/model.keras"
    assert warnings == []


def test_a_resumed_training_reopens_its_run_and_an_unknown_run_gets_a_new_one(mlflow_server):
    client = client_for(mlflow_server)
    first = RunTracker(client)
    run_id = first.start(experiment="resume", run_name="r", run_location="/tmp/r", params={"processes": 2})
    first.epoch(1, {"loss": 1.0}, 10.0)
    client.set_status(run_id, "KILLED")  # as a killed job leaves it, or another attempt marked it

    # Params are write-once in MLflow: a resume with other values must not try to log them again.
    again = RunTracker(client)
    assert again.start(experiment="resume", run_name="r", run_location="/tmp/r", params={"processes": 4},
                       resume_run_id=run_id) == run_id
    assert client.get_run(run_id)["info"]["status"] == "RUNNING"
    again.epoch(2, {"loss": 0.5}, 10.0)
    assert metric_history(client, run_id, "loss") == [(1, 1.0), (2, 0.5)]

    fresh = RunTracker(client).start(experiment="resume", run_name="r", run_location="/tmp/r", params={},
                                     resume_run_id="0" * 32)
    assert fresh != run_id and client.get_run(fresh) is not None


def test_wrong_credentials_are_a_clear_error(mlflow_server):
    client = MlflowClient(mlflow_server.uri, username=mlflow_server.username, password="wrong", retries=0)
    with pytest.raises(TrackingError, match=rf"MLflow at {mlflow_server.uri} answered 401 to experiments/get-by-name"):
        client.experiment_id("denied")
    with pytest.raises(TrackingError, match="answered 401"):
        MlflowClient(mlflow_server.uri, retries=0).experiment_id("anonymous")


def test_an_unreachable_server_is_a_clear_error_after_retries():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the test calls it: connection refused
    client = MlflowClient(f"http://127.0.0.1:{port}", retries=2, backoff=0.01)
    with pytest.raises(TrackingError, match=rf"cannot reach MLflow at http://127.0.0.1:{port} \(.*refused"):
        client.experiment_id("nowhere")


def test_failures_during_training_are_warnings_not_errors(mlflow_server):
    warnings: list[str] = []
    tracker = RunTracker(client_for(mlflow_server, retries=0), warn=warnings.append)
    tracker.run_id = uuid.uuid4().hex  # a run the server does not have, as if deleted mid-training
    tracker.epoch(1, {"loss": 1.0}, 10.0)
    tracker.finish("FINISHED", best_epoch=1, best_metrics={"loss": 1.0})
    assert len(warnings) == 3 and all("warning: MLflow: MLflow at" in w for w in warnings)
