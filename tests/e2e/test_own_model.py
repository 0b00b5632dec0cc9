"""Your own model in a real cluster: a model.builder run from an image built FROM the trainer image, and a
training.command run of the team's own script, each across 2 worker pods to Succeeded with metrics in status; a
Parquet table without its label column fails before any MPIJob exists, naming the column. The two training runs
share one small dataset (32 px): the second reuses it."""

from __future__ import annotations

import pytest

from tests.e2e.environment import BUCKET, UNLABELLED_TABLE
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
