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

from tests.e2e.environment import CORRUPT_FILES, IMAGES_PER_CLASS, RELEASE, SYSTEM_NAMESPACE, status_push
from tests.support import push_attack
from tests.support.e2e_runs import (
    OPERATOR_PODS, RESUMED, _name, child_objects, children, condition_texts, finished, launcher_attempt, launcher_log,
    phase, resumed_epochs, run_body, sync_the_chart_twice, wait_for_launcher_line,
)

pytestmark = [pytest.mark.e2e, pytest.mark.k8s]

SOURCE_FILES = 10 * IMAGES_PER_CLASS


def lease_holder(cluster) -> str:
    """The operator pod that holds the chart's Lease (named after the release) and so acts."""
    from kubernetes import client

    lease = client.CoordinationV1Api(cluster.core().api_client).read_namespaced_lease(RELEASE, SYSTEM_NAMESPACE)
    return lease.spec.holder_identity


def live_operator_pods(cluster) -> list[str]:
    pods = cluster.core().list_namespaced_pod(SYSTEM_NAMESPACE, label_selector=OPERATOR_PODS).items
    return [p.metadata.name for p in pods if p.metadata.deletion_timestamp is None]


def hand_over_the_lease(cluster) -> tuple[str, str, float]:
    """Deletes the operator pod that holds the Lease, once its standby is ready; returns (old holder, new holder,
    seconds from the deletion until the new one held it)."""
    def ready_pair() -> bool:
        pods = cluster.core().list_namespaced_pod(SYSTEM_NAMESPACE, label_selector=OPERATOR_PODS).items
        ready = [p for p in pods if p.metadata.deletion_timestamp is None
                 and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]
        return len(ready) == 2

    deadline = time.monotonic() + 120
    while not ready_pair():  # the chart's two replicas: after a deletion, a new standby first
        assert time.monotonic() < deadline, f"no two ready operator pods: {live_operator_pods(cluster)}"
        time.sleep(1)
    leader = lease_holder(cluster)
    assert leader in live_operator_pods(cluster), (leader, live_operator_pods(cluster))
    deleted = time.monotonic()
    cluster.core().delete_namespaced_pod(leader, SYSTEM_NAMESPACE)
    while time.monotonic() < deleted + 120:
        holder = lease_holder(cluster)
        if holder != leader and holder in live_operator_pods(cluster):
            return leader, holder, time.monotonic() - deleted
        time.sleep(0.5)
    pytest.fail(f"no operator pod took the Lease within 120 s of deleting {leader}")


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


def test_a_run_trains_across_pods_and_survives_operator_restarts_in_preprocessing_and_training(cluster):
    """The operator pod that holds the Lease is deleted twice: while the preprocessing Job runs, and while the
    MPIJob trains. Lost: nothing. The standby takes over; no child is created twice or re-created (same uids),
    no pod is started again, and no interruption of the training is counted. Its spec.podOverrides give every pod an
    annotation and an emptyDir volume, mounted (issue #52). Between the two, the chart is rendered and applied twice
    as a GitOps sync would: nothing changes, and the new leader serves the same certificate (issue #52)."""
    from kubernetes import client

    name = _name("train")
    output = f"s3://scalingrun-e2e/runs/{name}/parquet"
    applied = time.monotonic()
    body = run_body(cluster, name, output=output, epochs=2)
    body["spec"]["podOverrides"] = [OVERRIDE]
    cluster.create_run(body)
    try:
        batch = client.BatchV1Api(cluster.api)
        deadline = time.monotonic() + 120
        while not children(cluster, name)["Job"]:
            assert time.monotonic() < deadline, f"{name}: no preprocessing Job within 120 s"
            time.sleep(0.25)
        job = batch.read_namespaced_job(f"{name}-preprocess", cluster.namespace)
        assert not job.status.succeeded and not job.status.failed, "the Job is still running when the leader goes"
        in_preprocessing = child_objects(cluster, name)
        first = hand_over_the_lease(cluster)
        job = batch.read_namespaced_job(f"{name}-preprocess", cluster.namespace)
        print(f"operator {first[0]} deleted while preprocessing (Job active {job.status.active}, succeeded "
              f"{job.status.succeeded}); {first[1]} held the Lease {first[2]:.1f} s later")

        cluster.wait(name, lambda r: phase(r) == "Training", timeout=300, what="training", every=0.5)
        training_at = time.monotonic() - applied
        in_training = child_objects(cluster, name)
        workers_seen = [p for p in cluster.run_pods(name)
                        if (p.metadata.labels or {}).get("training.kubeflow.org/job-role") == "worker"]
        assert len(in_training["MPIJob"]) == 1, in_training
        sync_the_chart_twice(cluster)  # as Argo CD would; on the push path the epochs below come by push after it
        second = hand_over_the_lease(cluster)
        print(f"operator {second[0]} deleted while training; {second[1]} held the Lease {second[2]:.1f} s later")
        run = cluster.wait(name, finished, timeout=600, what="Succeeded")
        print(f"apply -> Training {training_at:.0f} s, apply -> Succeeded {time.monotonic() - applied:.0f} s")

        assert second[0] not in live_operator_pods(cluster) and lease_holder(cluster) in live_operator_pods(cluster)
        # One of each child, and the very objects that were there before each restart.
        after = child_objects(cluster, name)
        assert {kind: [n for n, _ in objs] for kind, objs in after.items()} == {
            "MPIJob": [f"{name}-train"], "Job": [f"{name}-preprocess"], "ConfigMap": [f"{name}-runconfig"]}
        assert after["Job"] == in_preprocessing["Job"] and after["ConfigMap"] == in_preprocessing["ConfigMap"]
        assert after["MPIJob"] == in_training["MPIJob"], (in_training, after)
        roles = [p.metadata.labels.get("training.kubeflow.org/job-role") or p.metadata.labels.get(
            "app.kubernetes.io/component") for p in cluster.run_pods(name)]
        assert roles.count("preprocess") == 1 and roles.count("launcher") == 1, roles  # none started twice
        for pod in [*cluster.run_pods(name), *workers_seen]:  # the workers may be gone (cleanPodPolicy Running)
            assert_overridden(pod)
        worker_template = cluster.custom().get_namespaced_custom_object(
            "kubeflow.org", "v2beta1", cluster.namespace, "mpijobs", f"{name}-train")["spec"]["mpiReplicaSpecs"][
            "Worker"]["template"]
        assert worker_template["metadata"]["annotations"] == OVERRIDE["metadata"]["annotations"]
        assert OVERRIDE["volumes"][0] in worker_template["spec"]["volumes"]
        status = run["status"]
        assert status["preprocessing"]["imagesSkipped"] == CORRUPT_FILES
        assert status["preprocessing"]["imagesWritten"] == SOURCE_FILES - CORRUPT_FILES
        training = status["training"]
        assert training.get("restarts", 0) == 0, training  # an operator restart is no interruption
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
        operator_log = cluster.core().read_namespaced_pod_log(lease_holder(cluster), SYSTEM_NAMESPACE)
        assert "forbidden" not in operator_log.lower(), operator_log[-3000:]

        table = subprocess.run([*cluster.kubectl, "get", "srun", name, "-n", cluster.namespace],
                               capture_output=True, text=True, check=True).stdout
        print(table)
        assert "Succeeded" in table.splitlines()[1]
    finally:
        cluster.delete_run(name)


# Pod overrides on every pod of the run: an annotation, and an emptyDir mounted in the main container.
OVERRIDE = {"targets": ["preprocess", "launcher", "workers"],
            "metadata": {"annotations": {"e2e.scalingrun.dev/override": "carried"}},
            "volumes": [{"name": "e2e-scratch", "emptyDir": {}}],
            "volumeMounts": [{"name": "e2e-scratch", "mountPath": "/scratch"}]}


def assert_overridden(pod) -> None:
    where = pod.metadata.name
    assert (pod.metadata.annotations or {}).get("e2e.scalingrun.dev/override") == "carried", where
    assert any(v.name == "e2e-scratch" and v.empty_dir is not None for v in pod.spec.volumes or []), where
    mounts = {m.name: m.mount_path for m in pod.spec.containers[0].volume_mounts or []}
    assert mounts.get("e2e-scratch") == "/scratch", (where, mounts)


def checkpoint_files(cluster, run_location: str) -> tuple[int, dict[str, int]]:
    """The committed checkpoint: (epoch in state.json, {file: size} of the checkpoint it names), read again if
    a newer one was committed meanwhile (the trainer then removes the older), or while the server starts."""
    import json

    from pyarrow import fs as pafs

    root = run_location[len("s3://"):] + "/checkpoints"
    deadline = time.monotonic() + 60
    with cluster.s3() as s3:
        while True:
            try:
                state = s3.open_input_stream(f"{root}/state.json").read()
                files = s3.get_file_info(pafs.FileSelector(f"{root}/{json.loads(state)['checkpoint']}"))
                if s3.open_input_stream(f"{root}/state.json").read() == state:
                    return json.loads(state)["epoch"], {f.base_name: f.size for f in files}
            except (OSError, ValueError):  # a just-started filer answers 500 for a few seconds; a state.json read
                # as the chief replaces it came back cut to the old one's length (pyarrow asks the size, then the bytes)
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)


def delete_s3_server(cluster) -> float:
    """Deletes the SeaweedFS pod (its data is on the node); returns the seconds until its successor is Ready."""
    selector = "app.kubernetes.io/name=seaweedfs"
    old = {p.metadata.uid for p in cluster.core().list_namespaced_pod(cluster.namespace, label_selector=selector).items}
    assert len(old) == 1, old
    deleted = time.monotonic()
    cluster.core().delete_collection_namespaced_pod(cluster.namespace, label_selector=selector)
    while time.monotonic() < deleted + 180:
        pods = cluster.core().list_namespaced_pod(cluster.namespace, label_selector=selector).items
        if any(p.metadata.uid not in old and any(c.type == "Ready" and c.status == "True"
                                                 for c in p.status.conditions or []) for p in pods):
            return time.monotonic() - deleted
        time.sleep(0.5)
    pytest.fail("no new SeaweedFS pod Ready within 180 s")


def test_faults_in_training_the_s3_server_and_a_worker_twice(cluster):
    """Three faults in one run, each with what it loses:
    - the S3 server's pod deleted (data on the node): the training waits for it and goes on; no checkpoint
      lost, no interruption counted;
    - a worker pod deleted, twice: each counted once in status.training.restarts (2), an Event names the pod,
      the run resumes from its last checkpoint (losing at most the epoch in progress) and Succeeds."""
    name = _name("faults")
    epochs = 10  # room for three faults, each after a checkpoint of its own
    output = f"s3://scalingrun-e2e/runs/{name}/parquet"
    run_location = f"{output}/runs/{name}"
    cluster.create_run(run_body(cluster, name, output=output, epochs=epochs, parallelism=2))
    epochs_seen: list[int] = []
    restarts_seen: list[int] = []

    def record(run: dict[str, Any]) -> None:
        training = (run.get("status") or {}).get("training") or {}
        if training.get("epoch") is not None:
            epochs_seen.append(training["epoch"])
        restarts_seen.append(training.get("restarts", 0))

    try:
        cluster.wait(name, lambda r: phase(r) == "Training", timeout=300, what="training", each=record)
        # The S3 server, after epoch 1's checkpoint (epoch 2's line is printed once it is committed).
        wait_for_launcher_line(cluster, name, f"epoch 2/{epochs}:", timeout=300)
        before = checkpoint_files(cluster, run_location)
        started = time.monotonic()
        s3_back = delete_s3_server(cluster)
        after = checkpoint_files(cluster, run_location)
        assert after[0] >= before[0] and after[1], (before, after)  # the committed checkpoint is all there
        if after[0] == before[0]:
            assert after[1] == before[1], (before, after)
        wait_for_launcher_line(cluster, name, f"epoch {after[0] + 2}/{epochs}:", timeout=300)
        print(f"S3 server: a new pod Ready {s3_back:.1f} s after the deletion; training on "
              f"{time.monotonic() - started:.1f} s after it; checkpoint epoch {before[0]} before, {after[0]} after")
        run = cluster.get_run(name)
        assert run["status"]["training"].get("restarts", 0) == 0, run["status"]["training"]
        assert phase(run) == "Training", condition_texts(run)

        worker = f"{name}-train-worker-1"
        for fault in (1, 2):
            attempt = launcher_attempt(cluster, name)
            at = time.monotonic()
            cluster.core().delete_namespaced_pod(worker, cluster.namespace)
            deadline = time.monotonic() + 300
            while launcher_attempt(cluster, name) in (attempt, ("", -1)):  # the next attempt's log, running
                assert time.monotonic() < deadline, f"the launcher did not start again: {attempt}"
                time.sleep(1)
            wait_for_launcher_line(cluster, name, f"/{epochs}:", timeout=300, after=RESUMED)
            resumed = resumed_epochs(launcher_log(cluster, name))
            print(f"worker deleted ({fault}): resumed after epoch {resumed}, training again "
                  f"{time.monotonic() - at:.1f} s after the deletion")
            if fault == 1:  # the second fault after the resumed training has checkpointed once more
                wait_for_launcher_line(cluster, name, f"epoch {resumed + 2}/{epochs}:", timeout=300,
                                       after=RESUMED)
        run = cluster.wait(name, finished, timeout=600, what="Succeeded after its faults", each=record)
        # Preprocessing with parallelism 2 covered every file, whatever the server's Job features.
        assert run["status"]["preprocessing"]["imagesWritten"] == SOURCE_FILES - CORRUPT_FILES
        assert epochs_seen == sorted(epochs_seen), f"status.training.epoch went backwards: {epochs_seen}"
        assert restarts_seen == sorted(restarts_seen), restarts_seen
        training = run["status"]["training"]
        assert training["epoch"] == epochs, training
        assert training["restarts"] == 2 and training["workerPodsLost"] == 2, training
        messages = [e.message for e in cluster.events(name) if e.type == "Warning"]
        assert sum(worker in m for m in messages) == 2, messages
        assert checkpoint_files(cluster, run_location)[0] == epochs
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
    # One epoch over 400 images: the points' val_accuracies differ by chance by more than the default tolerance
    # (0.01), so that no point might qualify; with it wide, efficiency decides (tests/unit covers the tolerance).
    threshold = 0.7
    sweep = {"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingSweep", "metadata": {"name": name},
             "spec": {"workers": [1, 2], "template": template, "accuracyTolerance": 1.0,
                      "efficiencyThreshold": threshold}}
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
        expected = points[1] if rows[1]["efficiency"] >= threshold else points[0]
        assert status.get("recommendation", {}).get("run") == expected, (status.get("message"), rows)
        # One dataset for both points. In pull mode the second reuses the first's with no Job; on the push path the
        # operator reads no store, so the second's Job runs, finds that dataset's manifest and ends without decoding.
        assert children(cluster, points[0])["Job"] == [f"{points[0]}-preprocess"]
        assert children(cluster, points[1])["Job"] == ([f"{points[1]}-preprocess"] if status_push() else [])
        datasets = [cluster.get_run(point)["status"]["preprocessing"] for point in points]
        assert datasets[0]["fingerprint"] == datasets[1]["fingerprint"], datasets
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
    slot each), each builds TF_CONFIG from the MPI world, and TensorFlow's ring all-reduce connects the pods.
    With the push path on, the run is also the victim of two attacker pods in its namespace the whole time (issue
    51 item 8, tests/support/push_attack.py): garbage tokens, and a valid token pushing for made-up names and for
    this run's name; the run never goes Stalled, its status shows only its own pods' reports."""
    name = _name("mirrored")
    output = f"s3://scalingrun-e2e/runs/{name}/parquet"
    body = run_body(cluster, name, output=output, epochs=2)
    body["spec"]["dataset"]["imageSize"] = 32
    body["spec"]["training"]["strategy"] = "multi-worker-mirrored"
    cluster.create_run(body)
    attackers: list[str] = []
    seen = push_attack.Seen()
    try:
        attackers = push_attack.start(cluster, name) if status_push() else []
        run = cluster.wait(name, finished, timeout=900, what="Succeeded", each=seen.record)
        if attackers:
            push_attack.assert_held(cluster, seen, run, attackers, SYSTEM_NAMESPACE, OPERATOR_PODS)
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
        push_attack.stop(cluster)
        cluster.delete_run(name)
