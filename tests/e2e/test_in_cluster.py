"""ScalingRuns in a real cluster: our images as pods on a real kubelet, the operator installed by the chart,
SeaweedFS as a pod, mpirun over ssh between worker pods, run by an MPIJob controller (the test-only stand-in
or a real mpi-operator). scripts/e2e.sh brings the cluster and all of that up, then runs these tests.

Runs go one at a time: a 2-CPU node holds one 2-worker run beside the operator, S3 and the controller.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
import uuid
from typing import Any

import pytest

from tests.e2e.environment import CORRUPT_FILES, DATA_SOURCE, IMAGES_PER_CLASS, RELEASE, SYSTEM_NAMESPACE

pytestmark = [pytest.mark.e2e, pytest.mark.k8s]

SOURCE_FILES = 10 * IMAGES_PER_CLASS
OPERATOR_PODS = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"


def lease_holder(cluster) -> str:
    """The operator pod that holds the chart's Lease (named after the release) and so acts."""
    from kubernetes import client

    lease = client.CoordinationV1Api(cluster.core().api_client).read_namespaced_lease(RELEASE, SYSTEM_NAMESPACE)
    return lease.spec.holder_identity


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:5]}"


def run_body(cluster, name: str, *, output: str, epochs: int = 2, parallelism: int = 1,
             image: str | None = None, worker_cpu: str = "500m", patience: int = 10) -> dict[str, Any]:
    """A run that fits a 2-CPU node: 2 workers at 500m, a small launcher, preprocessing at 500m."""
    return {
        "apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun", "metadata": {"name": name},
        "spec": {
            "storage": {"endpoint": cluster.s3_endpoint, "credentialsSecret": cluster.s3_secret},
            "dataset": {
                "source": DATA_SOURCE, "output": output, "imageSize": 64, "validationFraction": 0.2, "seed": 7,
                "preprocessing": {"parallelism": parallelism, "maxBadFraction": 0.05,
                                  "resources": {"cpu": "500m", "memory": "1Gi"}},
            },
            "model": {"base": "efficientnet_lite0", "weights": "imagenet"},
            "training": {"batchSizePerWorker": 16, "maxEpochs": epochs,
                         "earlyStopping": {"monitor": "val_loss", "patience": patience}},
            "workers": {"replicas": 2, "gpusPerWorker": 0, "cpu": worker_cpu, "memory": "2Gi",
                        "image": image or cluster.trainer_image},
        },
    }


def phase(run: dict[str, Any]) -> str | None:
    return (run.get("status") or {}).get("phase")


def condition_texts(run: dict[str, Any]) -> str:
    status = run.get("status") or {}
    parts = [f"{c.get('type')}={c.get('status')} {c.get('reason')}: {c.get('message')}"
             for c in status.get("conditions") or []]
    return "\n".join(parts + [str(status.get("message") or "")])


def finished(run: dict[str, Any]) -> bool:
    if phase(run) == "Failed":
        pytest.fail(f"{run['metadata']['name']} failed:\n{condition_texts(run)}")
    return phase(run) == "Succeeded"


def children(cluster, name: str) -> dict[str, list[str]]:
    """The run's children by kind, found by its label (duplicates would show as two names)."""
    from kubernetes import client

    selector = f"scalingrun.dev/run={name}"
    batch = client.BatchV1Api(cluster.api)
    mpijobs = cluster.custom().list_namespaced_custom_object("kubeflow.org", "v2beta1", cluster.namespace,
                                                             "mpijobs", label_selector=selector)["items"]
    jobs = [j for j in batch.list_namespaced_job(cluster.namespace, label_selector=selector).items
            if (j.metadata.labels or {}).get("app.kubernetes.io/component") == "preprocess"]
    configmaps = cluster.core().list_namespaced_config_map(cluster.namespace, label_selector=selector).items
    return {"MPIJob": [m["metadata"]["name"] for m in mpijobs], "Job": [j.metadata.name for j in jobs],
            "ConfigMap": [c.metadata.name for c in configmaps]}


def launcher_log(cluster, name: str) -> str:
    result = subprocess.run([*cluster.kubectl, "logs", "-n", cluster.namespace, f"job/{name}-train-launcher",
                             "--tail=-1"], capture_output=True, text=True)
    return result.stdout + result.stderr


def wait_for_launcher_line(cluster, name: str, text: str, timeout: float) -> None:
    """Waits for a line of rank 0's output: the launcher's log is live, status follows at the next poll."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in launcher_log(cluster, name):
            return
        time.sleep(1)
    pytest.fail(f"{name}: no {text!r} in the launcher's log within {timeout:.0f} s:\n{launcher_log(cluster, name)[-3000:]}")


def test_a_missing_trainer_image_is_named_within_60_seconds(cluster):
    name = _name("noimage")
    image = f"ghcr.io/scalingrun/does-not-exist:{uuid.uuid4().hex[:6]}"
    cluster.create_run(run_body(cluster, name, output=f"s3://scalingrun-e2e/runs/{name}", image=image))
    try:
        started = time.monotonic()
        run = cluster.wait(name, lambda r: image in condition_texts(r) and "pull" in condition_texts(r).lower(),
                           timeout=60, what="naming the image pull failure")
        text = condition_texts(run)
        print(f"image pull failure in status after {time.monotonic() - started:.1f} s:\n{text}")
        assert f"{name}-preprocess" in text, "the condition names the pod"
    finally:
        cluster.delete_run(name)


def test_workers_that_cannot_be_scheduled_say_so(cluster):
    name = _name("toobig")
    cluster.create_run(run_body(cluster, name, output=f"s3://scalingrun-e2e/runs/{name}", worker_cpu="64"))
    try:
        run = cluster.wait(name, lambda r: "Insufficient cpu" in condition_texts(r), timeout=240,
                           what="saying its workers cannot be scheduled")
        assert f"{name}-train-worker-" in condition_texts(run)
    finally:
        cluster.delete_run(name)


def test_a_run_trains_across_pods_and_survives_an_operator_restart(cluster):
    name = _name("train")
    output = f"s3://scalingrun-e2e/runs/{name}/parquet"
    applied = time.monotonic()
    cluster.create_run(run_body(cluster, name, output=output, epochs=2))
    try:
        cluster.wait(name, lambda r: phase(r) == "Training", timeout=300, what="training")
        training_at = time.monotonic() - applied
        # Two replicas: the Lease holder acts. Deleting it hands the Lease to the standby.
        operator_pods = cluster.core().list_namespaced_pod(SYSTEM_NAMESPACE, label_selector=OPERATOR_PODS).items
        assert len(operator_pods) == 2, [p.metadata.name for p in operator_pods]
        leader = lease_holder(cluster)
        assert leader in [p.metadata.name for p in operator_pods]
        cluster.core().delete_namespaced_pod(leader, SYSTEM_NAMESPACE)
        run = cluster.wait(name, finished, timeout=600, what="Succeeded")
        print(f"apply -> Training {training_at:.0f} s, apply -> Succeeded {time.monotonic() - applied:.0f} s")

        live = [p.metadata.name for p in cluster.core().list_namespaced_pod(
            SYSTEM_NAMESPACE, label_selector=OPERATOR_PODS).items if p.metadata.deletion_timestamp is None]
        new_leader = lease_holder(cluster)
        assert leader not in live and new_leader != leader and new_leader in live, (leader, new_leader, live)
        assert children(cluster, name) == {"MPIJob": [f"{name}-train"], "Job": [f"{name}-preprocess"],
                                           "ConfigMap": [f"{name}-config"]}
        status = run["status"]
        assert status["preprocessing"]["imagesSkipped"] == CORRUPT_FILES
        assert status["preprocessing"]["imagesWritten"] == SOURCE_FILES - CORRUPT_FILES
        training = status["training"]
        assert training["processes"] == 2 and training["epoch"] == 2
        assert 0 < training["metrics"]["val_accuracy"] <= 1 and training["metrics"]["val_loss"] > 0
        assert training["imagesPerSecond"] > 0
        assert status["modelUri"].startswith(f"{output}/runs/{name}/") and status["modelUri"].endswith(".keras")
        log = launcher_log(cluster, name)
        assert "2 processes" in log, log[-3000:]
        assert "workers answer ssh after" in log, "the launcher waited for every worker's sshd"
        # None of the run's pods calls the API: none gets a service-account token.
        for pod in cluster.run_pods(name):
            mounts = [m.mount_path for c in pod.spec.containers for m in c.volume_mounts or []]
            assert not any("serviceaccount" in m for m in mounts), (pod.metadata.name, mounts)
        # The chart's RBAC was enough for everything the operator did.
        operator_log = cluster.core().read_namespaced_pod_log(new_leader, SYSTEM_NAMESPACE)
        assert "forbidden" not in operator_log.lower(), operator_log[-3000:]

        table = subprocess.run([*cluster.kubectl, "get", "srun", name, "-n", cluster.namespace],
                               capture_output=True, text=True, check=True).stdout
        print(table)
        assert "Succeeded" in table.splitlines()[1]
    finally:
        cluster.delete_run(name)


def test_a_lost_worker_is_counted_and_the_run_resumes_from_its_checkpoint(cluster):
    name = _name("resume")
    epochs = 8  # several epochs after the first, so that the worker is lost mid-training
    cluster.create_run(run_body(cluster, name, output=f"s3://scalingrun-e2e/runs/{name}/parquet", epochs=epochs,
                                parallelism=2))
    epochs_seen: list[int] = []

    def record(run: dict[str, Any]) -> None:
        epoch = ((run.get("status") or {}).get("training") or {}).get("epoch")
        if epoch is not None:
            epochs_seen.append(epoch)

    try:
        cluster.wait(name, lambda r: phase(r) == "Training", timeout=300, what="training", each=record)
        # Epoch 2's line: epoch 1's checkpoint is surely written, so there is one to resume from.
        wait_for_launcher_line(cluster, name, f"epoch 2/{epochs}:", timeout=300)
        worker = f"{name}-train-worker-1"
        cluster.core().delete_namespaced_pod(worker, cluster.namespace)
        run = cluster.wait(name, finished, timeout=600, what="Succeeded after losing a worker", each=record)
        # Preprocessing with parallelism 2 covered every file, whatever the server's Job features.
        assert run["status"]["preprocessing"]["imagesWritten"] == SOURCE_FILES - CORRUPT_FILES
        assert epochs_seen == sorted(epochs_seen), f"status.training.epoch went backwards: {epochs_seen}"
        assert run["status"]["training"]["epoch"] == epochs
        assert run["status"]["training"].get("restarts", 0) >= 1, run["status"]["training"]
        messages = [e.message for e in cluster.events(name)]
        assert any(worker in m for m in messages), messages
        assert "resuming after epoch" in launcher_log(cluster, name)
    finally:
        cluster.delete_run(name)


def test_a_preprocessing_pod_over_its_memory_limit_is_named_with_the_limit(cluster):
    """A real OOM kill by the kubelet: the Failed message names the pod, the container and the limit."""
    name = _name("oom")
    body = run_body(cluster, name, output=f"s3://scalingrun-e2e/runs/{name}/parquet")
    body["spec"]["dataset"]["preprocessing"]["resources"]["memory"] = "40Mi"  # below Python + pyarrow's needs
    body["spec"]["dataset"]["preprocessing"]["backoffLimit"] = 0
    cluster.create_run(body)
    try:
        run = cluster.wait(name, lambda r: "OOMKilled" in condition_texts(r), timeout=300,
                           what="naming the OOM kill")
        text = condition_texts(run)
        print(text)
        assert f"pod {name}-preprocess-" in text and "limit of 40Mi" in text, text
        assert "raise spec.dataset.preprocessing.resources.memory" in text, text
    finally:
        cluster.delete_run(name)


def test_a_sweep_over_one_and_two_workers_shares_one_dataset_and_recommends_a_point(cluster):
    name = _name("sweep")
    template = run_body(cluster, "template", output=f"s3://scalingrun-e2e/runs/{name}/parquet", epochs=1)["spec"]
    sweep = {"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingSweep", "metadata": {"name": name},
             "spec": {"workers": [1, 2], "template": template}}
    custom = cluster.custom()
    custom.create_namespaced_custom_object("scalingrun.dev", "v1alpha1", cluster.namespace, "scalingsweeps", sweep)
    points = [f"{name}-w1", f"{name}-w2"]
    try:
        deadline = time.monotonic() + 1200
        while True:
            body = custom.get_namespaced_custom_object("scalingrun.dev", "v1alpha1", cluster.namespace,
                                                       "scalingsweeps", name)
            status = body.get("status") or {}
            if status.get("phase") in ("Succeeded", "Failed") or time.monotonic() > deadline:
                break
            time.sleep(5)
        assert status.get("phase") == "Succeeded", status
        rows = status["points"]
        assert [(r["run"], r["workers"], r["processes"]) for r in rows] == [(points[0], 1, 1), (points[1], 2, 2)]
        assert rows[0]["speedup"] == 1.0 and rows[1]["speedup"] > 0 and rows[1]["efficiency"] > 0, rows
        assert all(r["bestValAccuracy"] > 0 and r["workerHours"] > 0 for r in rows), rows
        assert status["recommendation"]["run"] in points, status["recommendation"]
        # One preprocessing for both points: the second reused the first's dataset.
        assert children(cluster, points[0])["Job"] == [f"{points[0]}-preprocess"]
        assert children(cluster, points[1])["Job"] == []
        table = subprocess.run([*cluster.kubectl, "get", "ssweep", name, "-n", cluster.namespace],
                               capture_output=True, text=True, check=True).stdout
        print(table, rows)
        assert "Succeeded" in table.splitlines()[1]
    finally:
        custom.delete_namespaced_custom_object("scalingrun.dev", "v1alpha1", cluster.namespace, "scalingsweeps", name)
        for point in points:
            with contextlib.suppress(Exception):
                cluster.delete_run(point)


def test_a_lightning_run_trains_with_ddp_across_two_worker_pods(cluster):
    """The second framework over the same MPIJob: mpirun starts one Lightning process per worker pod, DDP
    (gloo) connects them through rank 0's pod IP, and the model is saved for PyTorch users."""
    name = _name("lightning")
    output = f"s3://scalingrun-e2e/runs/{name}/parquet"
    body = run_body(cluster, name, output=output, epochs=2, image=cluster.lightning_image)
    body["spec"]["dataset"]["imageSize"] = 32
    body["spec"]["training"]["framework"] = "pytorch-lightning"
    cluster.create_run(body)
    try:
        run = cluster.wait(name, finished, timeout=900, what="Succeeded")
        training = run["status"]["training"]
        assert training["processes"] == 2 and training["epoch"] >= 1, training
        assert 0 < training["metrics"]["val_accuracy"] <= 1, training
        assert run["status"]["modelUri"].startswith(f"{output}/runs/{name}/"), run["status"]["modelUri"]
        assert run["status"]["modelUri"].endswith("/model/model.pt"), run["status"]["modelUri"]
        mpijob = cluster.custom().get_namespaced_custom_object("kubeflow.org", "v2beta1", cluster.namespace,
                                                               "mpijobs", f"{name}-train")
        images = {c["image"] for spec in mpijob["spec"]["mpiReplicaSpecs"].values()
                  for c in spec["template"]["spec"]["containers"]}
        assert images == {cluster.lightning_image}, images
    finally:
        cluster.delete_run(name)


def test_a_multi_worker_mirrored_run_trains_across_two_worker_pods(cluster):
    """The third engine over the same MPIJob, from the Keras image: mpirun starts one process per worker pod (one
    slot each), each builds TF_CONFIG from the MPI world, and TensorFlow's ring all-reduce connects the pods."""
    name = _name("mirrored")
    output = f"s3://scalingrun-e2e/runs/{name}/parquet"
    body = run_body(cluster, name, output=output, epochs=2)
    body["spec"]["dataset"]["imageSize"] = 32
    body["spec"]["training"]["strategy"] = "multi-worker-mirrored"
    cluster.create_run(body)
    try:
        run = cluster.wait(name, finished, timeout=900, what="Succeeded")
        training = run["status"]["training"]
        assert training["processes"] == 2 and training["epoch"] == 2, training
        assert training["effectiveBatchSize"] == 32 and 0 < training["metrics"]["val_accuracy"] <= 1, training
        assert run["status"]["modelUri"] == f"{output}/runs/{name}/model/model.keras", run["status"]["modelUri"]
        mpijob = cluster.custom().get_namespaced_custom_object("kubeflow.org", "v2beta1", cluster.namespace,
                                                               "mpijobs", f"{name}-train")
        assert mpijob["spec"]["slotsPerWorker"] == 1 and mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
        log = launcher_log(cluster, name)
        assert "2 replicas x batch 16 = effective batch 32" in log, log[-3000:]
    finally:
        cluster.delete_run(name)
