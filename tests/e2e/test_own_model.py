"""Your own model in a real cluster: a model.builder run from an image built FROM the trainer image, a
training.command run of the team's own script, and a function from Python with no image built for it
(HorovodRunner(np=2)), each across 2 worker pods to Succeeded with metrics in status; a Parquet table without its
label column fails before any MPIJob exists, naming the column. The training runs share one small dataset (32 px):
the first preprocesses it, the others reuse it."""

from __future__ import annotations

import base64

import pytest

import scalingrun
from tests.e2e.environment import BUCKET, S3_PORT, S3_SERVICE, UNLABELLED_TABLE, port_forward
from tests.support.shipped_training import TEAM_CODE, train_hvd
from tests.support.e2e_runs import _name, children, condition_texts, finished, launcher_log, phase, run_body

pytestmark = [pytest.mark.e2e, pytest.mark.k8s]
OUTPUT = f"s3://{BUCKET}/own-model/parquet-32"


def small_run(cluster, name: str, image: str) -> dict:
    body = run_body(cluster, name, output=OUTPUT, epochs=2, image=image)
    body["spec"]["dataset"]["imageSize"] = 32
    del body["spec"]["model"]
    return body


def assert_trained_on_two_pods(cluster, run: dict, name: str, image: str) -> dict:
    training = run["status"]["training"]
    assert training["processes"] == 2 and training["epoch"] == 2, training
    assert {"loss", "val_loss", "val_accuracy"} <= set(training["metrics"]), training
    assert training["imagesPerSecond"] > 0, training
    mpijob = cluster.custom().get_namespaced_custom_object("kubeflow.org", "v2beta1", cluster.namespace,
                                                           "mpijobs", f"{name}-train")
    assert mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    images = {c["image"] for spec in mpijob["spec"]["mpiReplicaSpecs"].values()
              for c in spec["template"]["spec"]["containers"]}
    assert images == {image}, images
    return training


def test_a_builder_from_an_image_built_from_ours_trains_across_two_worker_pods(cluster):
    name = _name("builder")
    body = small_run(cluster, name, cluster.custom_model_image)
    body["spec"]["model"] = {"builder": "teamnets.keras_cnn:build", "params": {"width": 16}}
    cluster.create_run(body)
    try:
        run = cluster.wait(name, finished, timeout=900, what="Succeeded")
        assert_trained_on_two_pods(cluster, run, name, cluster.custom_model_image)
        assert run["status"]["modelUri"] == f"{OUTPUT}/runs/{name}/model/model.keras"
    finally:
        cluster.delete_run(name)


def test_a_training_command_runs_the_teams_script_on_every_worker_pod(cluster):
    name = _name("command")
    body = small_run(cluster, name, cluster.custom_training_image)
    body["spec"]["training"]["command"] = ["python", "-m", "teamtrain.keras_horovod"]
    cluster.create_run(body)
    try:
        run = cluster.wait(name, finished, timeout=900, what="Succeeded")
        training = assert_trained_on_two_pods(cluster, run, name, cluster.custom_training_image)
        assert training["effectiveBatchSize"] == 32 and training["bestEpoch"] in (1, 2), training
        assert run["status"]["modelUri"] == f"{OUTPUT}/runs/{name}/model/model.keras"
        log = launcher_log(cluster, name)
        assert "python -m teamtrain.keras_horovod" in log and "epoch 2/2: " in log, log[-2000:]
    finally:
        cluster.delete_run(name)


def test_a_function_from_python_trains_across_two_worker_pods_with_no_image_built(cluster, monkeypatch):
    """HorovodRunner(np=2, run=...).run(train_hvd, ...) from this process: the function (shipped by value) stored
    in the run's SeaweedFS under its digest with this process's keys (the runs' Secret's, through a port-forward),
    run by our trainer image on 2 worker pods, its network imported from the team's module shipped with it
    (code_dir); rank 0's value comes back, and the epochs it reported through the SDK are the run's status."""
    secret = cluster.core().read_namespaced_secret(cluster.s3_secret, cluster.namespace).data
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, base64.b64decode(secret[key]).decode())
    body = small_run(cluster, _name("function"), cluster.trainer_image)
    with port_forward(cluster.kubectl, cluster.namespace, f"svc/{S3_SERVICE}", S3_PORT) as port:
        runner = scalingrun.HorovodRunner(np=2, run=body, store_endpoint=f"http://127.0.0.1:{port}",
                                          kubeconfig=cluster.kubeconfig, namespace=cluster.namespace, timeout=900,
                                          driver_log_verbosity="log_callback_only", code_dir=TEAM_CODE)
        try:
            value = runner.run(train_hvd, learning_rate=0.002)
            run = runner.last_run
            metrics = value.pop("metrics")
            assert value == {"rank": 0, "size": 2, "sum": 3.0, "epochs": 2}
            command = run.model.spec.training.command
            assert command[:3] == ["python", "-m", "scalingrun_trainer.sdk.function"] and command[4] == "--digest"
            assert command[3] == f"{OUTPUT}/runs/{run.name}/function/{command[5].split(':')[1]}", command
            training = assert_trained_on_two_pods(cluster, cluster.get_run(run.name), run.name, cluster.trainer_image)
            assert training["metrics"] == pytest.approx({k: metrics[k] for k in training["metrics"]}, abs=1e-5)
            assert training["function"] == {"digest": command[5], "location": command[3]}, training
        finally:
            if runner.last_run is not None:
                cluster.delete_run(runner.last_run.name)


def test_a_parquet_table_without_its_label_column_fails_before_the_mpijob(cluster):
    name = _name("table")
    body = small_run(cluster, name, cluster.trainer_image)
    dataset = body["spec"]["dataset"]
    del dataset["validationFraction"]
    dataset["preprocessing"] = {"resources": {"cpu": "500m", "memory": "1Gi"}}  # the check Job's pod
    dataset.update(format="parquet", source=UNLABELLED_TABLE, output=f"s3://{BUCKET}/own-model/unlabelled",
                   columns={"image": "pixels"})
    cluster.create_run(body)
    try:
        run = cluster.wait(name, lambda r: phase(r) == "Failed", timeout=300, what="Failed")
        failed = next(c for c in run["status"]["conditions"] if c["type"] == "Failed")
        assert failed["reason"] == "ParquetTableInvalid", condition_texts(run)
        assert (f"spec.dataset.columns.label: column 'label' is not in {UNLABELLED_TABLE}/train/part-00000.parquet "
                "(its columns: pixels, target)") in failed["message"], failed["message"]
        assert children(cluster, name)["MPIJob"] == []
    finally:
        cluster.delete_run(name)
