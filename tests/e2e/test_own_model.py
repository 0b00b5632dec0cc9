"""Your own model in a real cluster: a model.builder run from an image built FROM the trainer image, a
training.command run of the team's own script, and a notebook's function with no image built for it
(HorovodRunner(np=2) in a Jupyter kernel), each across 2 worker pods to Succeeded with metrics in status; a Parquet
table without its label column fails before any MPIJob exists, naming the column. The training runs share one small
dataset (32 px): the first preprocesses it, the others reuse it."""

from __future__ import annotations

import base64
import inspect
import json
import os
import sys

import pytest

from tests.e2e.environment import BUCKET, S3_PORT, S3_SERVICE, UNLABELLED_TABLE, port_forward
from tests.support.e2e_runs import _name, children, condition_texts, finished, launcher_log, phase, run_body
from tests.support.shipped_training import TEAM_CODE, train_hvd

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


# What a reader's notebook holds once its cells ran, appended to them here.
STATE_CELL = """import json
print(json.dumps({"value": value, "name": runner.last_run.name, "command": runner.last_run.model.spec.training.command}))"""


def test_a_function_from_a_notebook_trains_across_two_worker_pods_with_no_image_built(cluster, monkeypatch, tmp_path):
    """In a real Jupyter kernel (nbclient, ipykernel), a notebook's cells define train_hvd (in __main__, so it
    ships by value) and run HorovodRunner(np=2, run=...).run(train_hvd, ...): the function is stored in the run's
    SeaweedFS under its digest with the kernel's keys (the runs' Secret's, through a port-forward), run by our
    trainer image on 2 worker pods, its network imported from the team's module shipped with it (code_dir); rank
    0's value comes back, the epochs it reported through the SDK are the run's status, and the digest is there."""
    import nbformat
    from nbclient import NotebookClient

    secret = cluster.core().read_namespaced_secret(cluster.s3_secret, cluster.namespace).data
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, base64.b64decode(secret[key]).decode())
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path for path in sys.path if path))  # scalingrun, as installed
    body = small_run(cluster, _name("notebook"), cluster.trainer_image)
    with port_forward(cluster.kubectl, cluster.namespace, f"svc/{S3_SERVICE}", S3_PORT) as port:
        runner_cell = (f"import scalingrun\n"
                       f"runner = scalingrun.HorovodRunner(np=2, run={body!r}, store_endpoint='http://127.0.0.1:{port}',"
                       f" kubeconfig={cluster.kubeconfig!r}, namespace={cluster.namespace!r}, timeout=900,"
                       f" code_dir={str(TEAM_CODE)!r})\n"
                       f"value = runner.run(train_hvd, learning_rate=0.002)")
        notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(inspect.getsource(train_hvd)),
                                                   nbformat.v4.new_code_cell(runner_cell),
                                                   nbformat.v4.new_code_cell(STATE_CELL)])
        try:
            NotebookClient(notebook, kernel_name="python3", timeout=900,
                           resources={"metadata": {"path": str(tmp_path)}}).execute()
            state = json.loads(notebook.cells[-1].outputs[-1].text)
            name, value, command = state["name"], state["value"], state["command"]
            metrics = value.pop("metrics")
            assert value == {"rank": 0, "size": 2, "sum": 3.0, "epochs": 2}
            assert command[:3] == ["python", "-m", "scalingrun_trainer.sdk.function"] and command[4] == "--digest"
            assert command[3] == f"{OUTPUT}/runs/{name}/function/{command[5].split(':')[1]}", command
            run = cluster.get_run(name)
            training = assert_trained_on_two_pods(cluster, run, name, cluster.trainer_image)
            assert training["metrics"] == pytest.approx({k: metrics[k] for k in training["metrics"]}, abs=1e-5)
            assert training["function"] == {"digest": command[5], "location": command[3]}, training
        finally:
            made = [run["metadata"]["name"] for run in cluster.custom().list_namespaced_custom_object(
                "scalingrun.dev", "v1alpha1", cluster.namespace, "scalingruns")["items"]
                if run["metadata"]["name"].startswith(body["metadata"]["name"][:30] + "-fn-")]
            for name in made:
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
