"""The operator against a real kube-apiserver (+ GC) and a real S3 server (SeaweedFS).

The operator runs as a subprocess (`scalingrun operator`), as it would in its pod. Neither the
kubelet nor the mpi-operator runs here, so the tests play their parts: they run the preprocessing
Job's command for each index on this machine (or write the manifest it would write), patch the Job's
and the MPIJob's status, and write the trainer's progress document into the bucket. Storage keys
reach the operator only through the run's Secret: its environment has no AWS_* variables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from scalingrun_api import models
from tests.support.operator import (  # noqa: F401 (fixtures)
    Cluster, Operator, SCHEDULED, SECRET, _now, bucket, cluster, manifest_for, mpijob_pod_labels, namespace_cluster,
    new_run, operator, preprocess_pod_labels, progress, progress_uri, reach_training, running, start_training_pod,
    wait_for, waiting,
)

pytestmark = pytest.mark.k8s

OWN = "srk"  # namespaces srk-* by an operator a test starts and kills itself
PEERED = "srp"  # namespaces srp-* by two peered replicas


# --- helpers ----------------------------------------------------------------------------------------


# --- fixtures --------------------------------------------------------------------------------------


@pytest.fixture
def peered_cluster(api_client, s3_server, request, scalingrun_crd, mpijob_crd) -> Cluster:
    with namespace_cluster(api_client, s3_server, request, PEERED) as made:
        yield made


@pytest.fixture
def own_cluster(api_client, s3_server, request, scalingrun_crd, mpijob_crd) -> Cluster:
    with namespace_cluster(api_client, s3_server, request, OWN) as made:
        yield made


# --- tests -----------------------------------------------------------------------------------------


def _run_kubelets_part(job: dict, config_map: dict, secret: dict[str, str], workdir: Path) -> None:
    """Runs every index of the Indexed Job as the kubelet would: the container's command with its env
    (values and secretKeyRefs resolved) and the ConfigMap mounted, here as a file."""
    container = job["spec"]["template"]["spec"]["containers"][0]
    config_path = workdir / "config.json"
    config_path.write_text(config_map["data"]["config.json"])
    command = [str(config_path) if part == "/etc/scalingrun/config.json" else part for part in container["command"]]
    assert command[0] == "scalingrun-trainer"
    # `scalingrun-trainer logged --logs URI -- scalingrun-trainer preprocess ...`: both run from this checkout.
    command = [part for word in command
               for part in ([sys.executable, "-m", "scalingrun_trainer.cli"] if word == "scalingrun-trainer" else [word])]
    command += ["--workers", "1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "fieldRef" in var["valueFrom"]:
            # The plan id: the Job controller's label on its pods, the Job's uid.
            field = var["valueFrom"]["fieldRef"]["fieldPath"]
            assert field in ("metadata.labels['controller-uid']",
                             "metadata.labels['batch.kubernetes.io/controller-uid']"), var
            # A 1.20 server (envtest) labels pods controller-uid only: the newer label's variable arrives empty.
            legacy = field == "metadata.labels['controller-uid']"
            env[var["name"]] = job["metadata"]["uid"] if legacy else ""
        else:
            env[var["name"]] = secret[var["valueFrom"]["secretKeyRef"]["key"]]
    procs = [subprocess.Popen(command, env={**env, "JOB_COMPLETION_INDEX": str(index)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for index in range(job["spec"]["completions"])]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err


def test_happy_path_status_children_progress_and_events(cluster, operator, bucket, s3_server, kubectl, tmp_path):
    from scalingrun_operator.local.sample_data import fashion_mnist_jpegs

    body = new_run(cluster.ns, "happy", s3_server)
    for relative, data in fashion_mnist_jpegs(3):
        bucket.put(f"{body['spec']['dataset']['source']}/{relative}", data)
    created = cluster.create_run(body)
    uid = created["metadata"]["uid"]

    # Pending -> Preprocessing: ConfigMap and Job, owned by the run.
    wait_for(cluster.phase_is("happy", "Preprocessing"), what="Preprocessing", operator=operator)
    job = cluster.job("happy-preprocess")
    config_map = cluster.core.api_client.sanitize_for_serialization(
        cluster.core.read_namespaced_config_map("happy-runconfig", cluster.ns))
    for obj in (job, config_map):
        refs = obj["metadata"]["ownerReferences"]
        assert [(r["kind"], r["name"], r["uid"], r["controller"]) for r in refs] == [("ScalingRun", "happy", uid, True)]
    assert cluster.mpijob("happy-train") is None, "no training before the dataset exists"

    # Play the kubelet: the real preprocessing runs the Job's command per index, then the Job completes.
    _run_kubelets_part(job, config_map, {"AWS_ACCESS_KEY_ID": s3_server.access_key,
                                         "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}, tmp_path)
    manifest = bucket.get_json(f"{body['spec']['dataset']['output']}/_manifest.json")
    cluster.complete_job("happy-preprocess", succeeded=2)

    status = wait_for(cluster.phase_is("happy", "Training"), what="Training", operator=operator)
    assert status["preprocessing"] == {
        "jobName": "happy-preprocess", "reused": False, "fingerprint": manifest["fingerprint"],
        "imagesWritten": manifest["written"]["train"] + manifest["written"]["validation"],
        "imagesSkipped": 0, "shards": 2, "classes": 10, "shardsReused": 0}
    assert status["preprocessing"]["imagesWritten"] == 30
    assert cluster.condition("happy", "Preprocessed")["reason"] == "Preprocessed"
    mpijob = cluster.mpijob("happy-train")
    assert mpijob["metadata"]["ownerReferences"][0]["uid"] == uid
    assert mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    assert status["training"]["mpiJobName"] == "happy-train" and status["training"]["processes"] == 2

    # The trainer reports epoch 2: status and `kubectl get srun` show it.
    cluster.set_mpijob_condition("happy-train", "Running", "", "")
    bucket.put_json(progress_uri(created), progress("running", 2))
    training = wait_for(lambda: (cluster.status("happy").get("training") or {}).get("epoch") == 2
                        and cluster.status("happy")["training"], what="epoch 2 in status", operator=operator)
    assert training["metrics"]["val_accuracy"] == 0.8125 and training["imagesPerSecond"] == 123.4
    assert training["learningRate"] == 0.002 and training["effectiveBatchSize"] == 64
    assert training["bestEpoch"] == 2 and training["maxEpochs"] == 5
    row = subprocess.run([*kubectl, "get", "srun", "happy", "-n", cluster.ns, "--no-headers"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert row[:6] == ["happy", "Training", "2", "2", "2", "0.8125"]  # the best epoch and its val_accuracy

    # The trainer finishes, the launcher exits 0.
    model = f"{body['spec']['dataset']['output']}/runs/happy/model"
    bucket.put_json(progress_uri(created), progress("succeeded", 4, modelUri=model))
    cluster.set_mpijob_condition("happy-train", "Succeeded", "MPIJobSucceeded", "MPIJob succeeded")
    status = wait_for(cluster.phase_is("happy", "Succeeded"), what="Succeeded", operator=operator)
    assert status["modelUri"] == model and status["completionTime"] and status["startTime"]
    assert status["training"]["epoch"] == 4
    assert status["observedGeneration"] == created["metadata"]["generation"]
    assert cluster.condition("happy", "Trained")["status"] == "True"
    cluster.wait_events("happy", lambda ev: [r for _, r, _ in ev] == [
        "Pending", "Preprocessing", "Training", "Succeeded"], operator)
    assert all(t == "Normal" for t, _, _ in cluster.events("happy"))
    assert {k: len(v) for k, v in cluster.children("happy").items()} == {"ConfigMap": 1, "Job": 1, "MPIJob": 1}


def test_existing_dataset_is_reused_without_a_job(cluster, operator, bucket, s3_server):
    body = new_run(cluster.ns, "reuse", s3_server)
    # Admit with dry-run to get the defaulted spec, then publish its dataset before the run exists.
    admitted = cluster.custom.create_namespaced_custom_object(models.GROUP, models.VERSION, cluster.ns,
                                                              models.PLURAL, body, dry_run="All")
    bucket.put_json(f"{body['spec']['dataset']['output']}/_manifest.json", manifest_for(admitted, "reusedfp"))
    cluster.create_run(body)
    status = wait_for(cluster.phase_is("reuse", "Training"), what="Training", operator=operator)
    condition = cluster.condition("reuse", "Preprocessed")
    assert condition["status"] == "True" and condition["reason"] == "DatasetReused"
    assert "no preprocessing Job" in condition["message"]
    assert status["preprocessing"]["reused"] is True and status["preprocessing"]["fingerprint"] == "reusedfp"
    assert status["preprocessing"]["imagesWritten"] == 45 and status["preprocessing"]["imagesSkipped"] == 1
    assert cluster.children("reuse") == {"ConfigMap": ["reuse-runconfig"], "Job": [], "MPIJob": ["reuse-train"]}
    cluster.wait_events("reuse", lambda ev: [r for _, r, _ in ev] == ["Pending", "Training"], operator)


def test_other_parameters_mean_preprocessing_again(cluster, operator, bucket, s3_server):
    body = new_run(cluster.ns, "stale", s3_server)
    admitted = cluster.custom.create_namespaced_custom_object(models.GROUP, models.VERSION, cluster.ns,
                                                              models.PLURAL, body, dry_run="All")
    old = manifest_for(admitted)
    old["parameters"]["imageSize"] = 64
    bucket.put_json(f"{body['spec']['dataset']['output']}/_manifest.json", old)
    cluster.create_run(body)
    wait_for(cluster.phase_is("stale", "Preprocessing"), what="Preprocessing", operator=operator)
    assert cluster.job("stale-preprocess") is not None
    cluster.wait_events("stale", lambda ev: any(r == "PreprocessingAgain" and "imageSize 64 -> 32" in m
                                                for _, r, m in ev), operator)


def test_preprocessing_failure_says_what_and_where(cluster, operator, bucket, s3_server):
    body = new_run(cluster.ns, "badprep", s3_server)
    cluster.create_run(body)
    wait_for(lambda: cluster.job("badprep-preprocess"), what="the Job", operator=operator)
    # Shard 0 finished (its shard manifest exists), shard 1 kept failing.
    bucket.put_json(f"{body['spec']['dataset']['output']}/_shards/shard-00000-of-00002.json", {"fingerprint": "x"})
    cluster.fail_job("badprep-preprocess", succeeded=1, failed=4, reason="BackoffLimitExceeded",
                     message="Job has reached the specified backoff limit")
    status = wait_for(cluster.phase_is("badprep", "Failed"), what="Failed", operator=operator)
    failed = cluster.condition("badprep", "Failed")
    assert failed["reason"] == "PreprocessingFailed"
    in_turn = cluster.job("badprep-preprocess")["spec"]["completions"] == 1  # a server without Indexed Jobs
    for part in ("BackoffLimitExceeded: Job has reached the specified backoff limit",
                 "its one pod ran the 2 shards in turn" if in_turn else "1 of 2 shards succeeded", "4 pod failures",
                 "1 of 2 shard manifests written", f"kubectl logs -n {cluster.ns} -l job-name=badprep-preprocess"):
        assert part in failed["message"]
    assert cluster.condition("badprep", "Preprocessed")["status"] == "False"
    assert status["completionTime"]
    assert cluster.mpijob("badprep-train") is None
    cluster.wait_events("badprep", lambda ev: ("Warning", "Failed") in [(t, r) for t, r, _ in ev], operator)


def test_mpijob_failure_carries_the_launchers_message(cluster, operator, bucket, s3_server):
    cluster.create_run(new_run(cluster.ns, "badtrain", s3_server))
    run = cluster.run("badtrain")
    reach_training(cluster, bucket, "badtrain", operator)
    bucket.put_json(progress_uri(run), progress("failed", 3, error="ResourceExhausted: OOM when allocating"))
    cluster.set_mpijob_condition("badtrain-train", "Failed", "MPIJobFailed", "launcher exited 1")
    wait_for(cluster.phase_is("badtrain", "Failed"), what="Failed", operator=operator)
    failed = cluster.condition("badtrain", "Failed")
    assert failed["reason"] == "MPIJobFailed"
    assert "MPIJobFailed: launcher exited 1" in failed["message"]
    assert "epoch 3 of 5" in failed["message"] and "OOM when allocating" in failed["message"]
    assert cluster.condition("badtrain", "Trained")["reason"] == "MPIJobFailed"
    cluster.wait_events("badtrain", lambda ev: ev and ev[-1][:2] == ("Warning", "Failed")
                        and "launcher exited 1" in ev[-1][2], operator)


def test_invalid_spec_fails_the_run_not_the_operator(cluster, operator, bucket, s3_server):
    no_secret = new_run(cluster.ns, "nosecret", s3_server)
    del no_secret["spec"]["storage"]["credentialsSecret"]
    # Admission has validate's name limits; cross-field rules only validate and the operator can check.
    with pytest.raises(ApiException) as refused:
        cluster.create_run(new_run(cluster.ns, "a-name-that-is-far-too-long-for-a-scalingrun", s3_server))
    assert refused.value.status == 422 and "metadata.name" in refused.value.body
    inside = new_run(cluster.ns, "inside", s3_server)
    inside["spec"]["dataset"]["output"] = inside["spec"]["dataset"]["source"] + "/parquet"
    for body in (no_secret, inside):
        cluster.create_run(body)  # both pass the CRD schema
    cluster.create_run(new_run(cluster.ns, "fine", s3_server))

    wait_for(cluster.phase_is("nosecret", "Failed"), what="nosecret Failed", operator=operator)
    failed = cluster.condition("nosecret", "Failed")
    assert failed["reason"] == "InvalidSpec" and "spec.storage.credentialsSecret" in failed["message"]
    wait_for(cluster.phase_is("inside", "Failed"), what="inside Failed", operator=operator)
    failed = cluster.condition("inside", "Failed")
    assert failed["reason"] == "InvalidSpec" and "spec.dataset.output" in failed["message"]
    cluster.wait_events("nosecret", lambda ev: ("Warning", "Failed") in [(t, r) for t, r, _ in ev], operator)

    # The operator keeps serving: the valid run beside them proceeds, and no child exists for the bad ones.
    wait_for(cluster.phase_is("fine", "Preprocessing"), what="fine Preprocessing", operator=operator)
    for name in ("nosecret", "inside"):
        assert cluster.children(name) == {"ConfigMap": [], "Job": [], "MPIJob": []}
    assert operator.process.poll() is None

    # Fixing the spec gets the run another look.
    cluster.patch_run("nosecret", {"spec": {"storage": {"credentialsSecret": SECRET}}})
    wait_for(cluster.phase_is("nosecret", "Preprocessing"), what="nosecret Preprocessing after the fix",
             operator=operator)
    assert not cluster.condition("nosecret", "Failed")


def test_deleting_the_run_deletes_its_children(cluster, operator, bucket, s3_server):
    cluster.create_run(new_run(cluster.ns, "gone", s3_server))
    reach_training(cluster, bucket, "gone", operator)
    assert {k: len(v) for k, v in cluster.children("gone").items()} == {"ConfigMap": 1, "Job": 1, "MPIJob": 1}
    cluster.delete_run("gone")
    wait_for(lambda: cluster.children("gone") == {"ConfigMap": [], "Job": [], "MPIJob": []},
             what="garbage collection of the children", operator=operator)


def test_suspend_and_resume(cluster, operator, bucket, s3_server):
    cluster.create_run(new_run(cluster.ns, "pause", s3_server))
    reach_training(cluster, bucket, "pause", operator)
    assert cluster.mpijob("pause-train")["spec"]["runPolicy"]["suspend"] is False

    cluster.patch_run("pause", {"spec": {"runPolicy": {"suspend": True}}})
    wait_for(cluster.phase_is("pause", "Suspended"), what="Suspended", operator=operator)
    assert cluster.mpijob("pause-train")["spec"]["runPolicy"]["suspend"] is True
    assert cluster.condition("pause", "Suspended")["status"] == "True"
    assert not cluster.condition("pause", "SpecChangeIgnored"), "suspend is a live field"

    cluster.patch_run("pause", {"spec": {"runPolicy": {"suspend": False}}})
    wait_for(cluster.phase_is("pause", "Training"), what="Training again", operator=operator)
    assert cluster.mpijob("pause-train")["spec"]["runPolicy"]["suspend"] is False
    assert cluster.condition("pause", "Suspended")["reason"] == "Resumed"
    cluster.wait_events("pause", lambda ev: [r for _, r, _ in ev if r in ("Suspended", "Training")] == [
        "Training", "Suspended", "Training"], operator)


def test_immutable_changes_mid_run_are_recorded_not_applied(cluster, operator, bucket, s3_server):
    cluster.create_run(new_run(cluster.ns, "fixed", s3_server))
    wait_for(cluster.phase_is("fixed", "Preprocessing"), what="Preprocessing", operator=operator)
    original = cluster.run("fixed")
    cluster.patch_run("fixed", {"spec": {"workers": {"replicas": 3}, "dataset": {"imageSize": 48}}})
    condition = wait_for(lambda: cluster.condition("fixed", "SpecChangeIgnored"), what="SpecChangeIgnored",
                         operator=operator)
    assert condition["status"] == "True"
    assert "spec.dataset.imageSize" in condition["message"] and "spec.workers.replicas" in condition["message"]
    cluster.wait_events("fixed", lambda ev: any(t == "Warning" and r == "SpecChangeIgnored" for t, r, _ in ev),
                        operator)

    # The dataset is judged, and the MPIJob built, with the spec the run started with.
    bucket.put_json(f"{original['spec']['dataset']['output']}/_manifest.json", manifest_for(original))
    cluster.complete_job("fixed-preprocess", succeeded=2)
    wait_for(cluster.phase_is("fixed", "Training"), what="Training", operator=operator)
    mpijob = cluster.mpijob("fixed-train")
    assert mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    assert cluster.status("fixed")["training"]["processes"] == 2

    # Changing it back clears the condition.
    cluster.patch_run("fixed", {"spec": {"workers": {"replicas": 2}, "dataset": {"imageSize": 32}}})
    wait_for(lambda: cluster.condition("fixed", "SpecChangeIgnored").get("status") == "False",
             what="SpecChangeIgnored False", operator=operator)


def test_operator_killed_in_every_phase_converges_without_duplicates(own_cluster, kubeconfig, bucket, s3_server,
                                                                       tmp_path):
    from scalingrun_operator.schema.validation import parse_scalingrun
    from scalingrun_operator.builders import build_config_map

    cluster = own_cluster
    op = Operator(kubeconfig, tmp_path / "operator.log", [f"{OWN}-*"], "--standalone")
    try:
        # Pending: a ConfigMap of the run's name is there already, without an owner (say, left by a
        # manual `scalingrun render | kubectl apply`): it is adopted, not duplicated.
        created = cluster.create_run(new_run(cluster.ns, "phoenix", s3_server))
        config_map = build_config_map(parse_scalingrun({k: created[k] for k in ("apiVersion", "kind", "metadata",
                                                                               "spec")}), cluster.ns)
        cluster.core.create_namespaced_config_map(cluster.ns, config_map)
        op.start()
        wait_for(cluster.phase_is("phoenix", "Preprocessing"), what="Preprocessing", operator=op)
        # Events follow the status patch they report; they are best effort: a kill between the two loses
        # that one Event (never duplicates it). Wait for it, so that the list below is exact.
        cluster.wait_events("phoenix", lambda ev: "Preprocessing" in [r for _, r, _ in ev], op)

        # Preprocessing: killed; the Job finishes meanwhile.
        op.kill()
        bucket.put_json(f"{created['spec']['dataset']['output']}/_manifest.json", manifest_for(created))
        cluster.complete_job("phoenix-preprocess", succeeded=2)
        op.start()
        wait_for(cluster.phase_is("phoenix", "Training"), what="Training after restart", operator=op)
        bucket.put_json(progress_uri(created), progress("running", 1))
        wait_for(lambda: (cluster.status("phoenix").get("training") or {}).get("epoch") == 1,
                 what="epoch 1", operator=op)

        # Training: killed; the trainer finishes meanwhile.
        op.kill()
        bucket.put_json(progress_uri(created), progress("succeeded", 3, modelUri="s3://x/model"))
        cluster.set_mpijob_condition("phoenix-train", "Succeeded", "MPIJobSucceeded", "done")
        op.start()
        status = wait_for(cluster.phase_is("phoenix", "Succeeded"), what="Succeeded after restart", operator=op)
        assert status["training"]["epoch"] == 3 and status["modelUri"] == "s3://x/model"
        assert cluster.children("phoenix") == {"ConfigMap": ["phoenix-runconfig"], "Job": ["phoenix-preprocess"],
                                               "MPIJob": ["phoenix-train"]}
        uid = created["metadata"]["uid"]
        cm = cluster.core.read_namespaced_config_map("phoenix-runconfig", cluster.ns)
        assert [r.uid for r in cm.metadata.owner_references] == [uid]
        cluster.wait_events("phoenix", lambda ev: [r for _, r, _ in ev] == [
            "Pending", "Preprocessing", "Training", "Succeeded"], op)
    finally:
        op.stop()


def test_liveness_and_metrics(cluster, operator, bucket, s3_server):
    cluster.create_run(new_run(cluster.ns, "counted", s3_server))
    wait_for(lambda: cluster.job("counted-preprocess"), what="the Job", operator=operator)
    assert operator.healthy()

    def preprocessing_runs() -> float:
        lines = [line for line in operator.metrics().splitlines()
                 if line.startswith('scalingrun_runs{phase="Preprocessing"}')]
        return float(lines[0].split()[-1]) if lines else 0.0

    wait_for(lambda: preprocessing_runs() >= 1, what="the runs gauge to count the Preprocessing run",
             operator=operator)
    text = operator.metrics()
    assert 'scalingrun_child_create_seconds_count{kind="Job"}' in text
    assert "scalingrun_reconcile_errors_total" in text


def test_two_peered_replicas_only_one_acts_and_the_other_takes_over(peered_cluster, kubeconfig, kopf_peering_crds,
                                                                     bucket, s3_server, tmp_path):
    cluster = peered_cluster
    cluster.custom.create_namespaced_custom_object("kopf.dev", "v1", cluster.ns, "kopfpeerings", {
        "apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "scalingrun"}})
    env = {"SCALINGRUN_PEERING_LIFETIME_SECONDS": "8"}
    # Named, not a pattern: a peering needs its KopfPeering in every namespace served.
    active = Operator(kubeconfig, tmp_path / "active.log", [cluster.ns], "--peering", "scalingrun",
                      "--priority", "100", env=env)
    standby = Operator(kubeconfig, tmp_path / "standby.log", [cluster.ns], "--peering", "scalingrun",
                       "--priority", "50", env=env)
    try:
        active.start()
        standby.start()
        # Both replicas announce themselves in the peering object; the lower priority stays paused.
        wait_for(lambda: len(cluster.custom.get_namespaced_custom_object(
            "kopf.dev", "v1", cluster.ns, "kopfpeerings", "scalingrun").get("status") or {}) == 2,
            what="two peers in the KopfPeering", operator=standby)
        cluster.create_run(new_run(cluster.ns, "duo", s3_server))
        wait_for(cluster.phase_is("duo", "Preprocessing"), what="Preprocessing", operator=active)
        assert "created Job" in active.log_tail(400) and "created" not in standby.log_tail(400)
        assert cluster.children("duo")["Job"] == ["duo-preprocess"]

        # The active replica dies; once its keep-alive expires the standby carries the run on.
        active.kill()
        run = cluster.run("duo")
        bucket.put_json(f"{run['spec']['dataset']['output']}/_manifest.json", manifest_for(run))
        cluster.complete_job("duo-preprocess", succeeded=2)
        wait_for(cluster.phase_is("duo", "Training"), what="Training by the standby", operator=standby)
        assert "created MPIJob" in standby.log_tail(400)
        assert cluster.children("duo") == {"ConfigMap": ["duo-runconfig"], "Job": ["duo-preprocess"],
                                           "MPIJob": ["duo-train"]}
    finally:
        active.stop()
        standby.stop()


def test_unreadable_storage_is_a_condition_until_fixed_and_keys_never_leak(cluster, operator, bucket, s3_server,
                                                                          api_client):
    body = new_run(cluster.ns, "nokeys", s3_server)
    body["spec"]["storage"]["credentialsSecret"] = "missing-creds"
    cluster.create_run(body)
    condition = wait_for(lambda: cluster.condition("nokeys", "StorageReadable"), what="StorageReadable",
                         operator=operator)
    assert condition["status"] == "False"
    assert f"Secret {cluster.ns}/missing-creds (spec.storage.credentialsSecret) not found" in condition["message"]
    assert cluster.status("nokeys")["phase"] == "Pending"
    assert cluster.children("nokeys")["Job"] == []
    cluster.wait_events("nokeys", lambda ev: ("Warning", "StorageUnreadable") in [(t, r) for t, r, _ in ev],
                        operator)

    # Creating the Secret is enough: the next poll reads the store and starts preprocessing.
    cluster.core.create_namespaced_secret(cluster.ns, {"metadata": {"name": "missing-creds"}, "stringData": {
        "AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}})
    wait_for(cluster.phase_is("nokeys", "Preprocessing"), what="Preprocessing once the Secret exists",
             operator=operator)
    assert cluster.condition("nokeys", "StorageReadable")["status"] == "True"

    # The keys appear nowhere the operator writes: status, events, its log.
    written = json.dumps(cluster.run("nokeys")) + json.dumps(cluster.events("nokeys")) + operator.log_tail(100000)
    assert s3_server.secret_key not in written and s3_server.access_key not in written


# --- pods: root causes, restarts, preprocessing without Indexed Jobs -----------------------------------


def test_pod_problems_reach_status_within_seconds_through_the_pod_watch(own_cluster, kubeconfig, bucket, s3_server,
                                                                         tmp_path):
    cluster = own_cluster
    image = "registry.invalid/scalingrun/trainer:missing"
    # One poll every 5 minutes: what shows up within seconds came through the pod watch.
    op = Operator(kubeconfig, tmp_path / "operator.log", [f"{OWN}-*"], "--standalone",
                  env={"SCALINGRUN_POLL_INTERVAL_SECONDS": "300"})
    try:
        op.start()
        created = cluster.create_run(new_run(cluster.ns, "stuck", s3_server, workers={"image": image}))
        job = wait_for(lambda: cluster.job("stuck-preprocess"), what="the preprocessing Job", operator=op)
        wait_for(cluster.phase_is("stuck", "Preprocessing"), what="Preprocessing", operator=op)

        # The kubelet cannot pull the image.
        pod = "stuck-preprocess-x7k2p"
        cluster.create_pod(pod, preprocess_pod_labels(job), "preprocess", image)
        cluster.set_pod_status(pod, containers=waiting(
            "preprocess", "ErrImagePull", "rpc error: code = Unknown desc = Error response from daemon: pull access "
            "denied for registry.invalid/scalingrun/trainer, repository does not exist"), conditions=SCHEDULED)
        health = wait_for(lambda: cluster.condition("stuck", "PodsHealthy").get("status") == "False"
                          and cluster.condition("stuck", "PodsHealthy"), what="PodsHealthy False", timeout=15,
                          operator=op)
        assert health["reason"] == "ImagePullFailed"
        for part in (f"pod {pod} container preprocess", f"cannot pull image '{image}'", "ErrImagePull: rpc error",
                     "check spec.workers.image"):
            assert part in health["message"]
        status = cluster.status("stuck")
        assert status["phase"] == "Preprocessing", "the kubelet keeps retrying: not a terminal failure"
        assert status["message"].startswith(f"ImagePullFailed: pod {pod} container preprocess cannot pull image")
        preprocessed = cluster.condition("stuck", "Preprocessed")
        assert preprocessed["reason"] == "ImagePullFailed" and image in preprocessed["message"]

        # It backs off and retries: the status follows, the Warning is not repeated.
        cluster.set_pod_status(pod, containers=waiting("preprocess", "ImagePullBackOff",
                                                       f'Back-off pulling image "{image}"'), conditions=SCHEDULED)
        wait_for(lambda: "ImagePullBackOff" in cluster.condition("stuck", "PodsHealthy").get("message", ""),
                 what="ImagePullBackOff in PodsHealthy", timeout=15, operator=op)
        cluster.wait_events("stuck", lambda ev: ("Warning", "ImagePullFailed") in [(t, r) for t, r, _ in ev], op)

        # The image can be pulled after all (pushed, registry back): the pod runs, the condition clears.
        cluster.set_pod_status(pod, phase="Running", containers=running("preprocess"), conditions=SCHEDULED)
        wait_for(lambda: cluster.condition("stuck", "PodsHealthy").get("status") == "True", what="PodsHealthy True",
                 timeout=15, operator=op)
        assert cluster.condition("stuck", "Preprocessed")["reason"] == "Running"
        assert "ImagePull" not in cluster.status("stuck")["message"]
        pulls = [(t, m) for t, r, m in cluster.events("stuck") if r == "ImagePullFailed"]
        assert len(pulls) == 1 and pulls[0][0] == "Warning" and pod in pulls[0][1] and image in pulls[0][1]

        # Training: the launcher does not fit on any node.
        bucket.put_json(f"{created['spec']['dataset']['output']}/_manifest.json", manifest_for(created))
        cluster.complete_job("stuck-preprocess", succeeded=1)
        wait_for(cluster.phase_is("stuck", "Training"), what="Training", operator=op)
        launcher = "stuck-train-launcher-q8w7e"
        cluster.create_pod(launcher, mpijob_pod_labels(cluster.mpijob("stuck-train"), "launcher"), "launcher", image)
        cluster.set_pod_status(launcher, conditions=[{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/1 nodes are available: 1 Insufficient cpu."}])
        health = wait_for(lambda: cluster.condition("stuck", "PodsHealthy").get("reason") == "Unschedulable"
                          and cluster.condition("stuck", "PodsHealthy"), what="PodsHealthy Unschedulable",
                          timeout=15, operator=op)
        assert health["status"] == "False"
        assert f"pod {launcher} cannot be scheduled: 0/1 nodes are available: 1 Insufficient cpu." in health["message"]
        assert "spec.launcher.resources" in health["message"] and "add nodes" in health["message"]
        trained = cluster.condition("stuck", "Trained")
        assert trained["reason"] == "Unschedulable" and trained["message"].startswith("MPIJob stuck-train: no epoch")
        assert cluster.status("stuck")["message"].startswith(f"Unschedulable: pod {launcher} cannot be scheduled")
        cluster.wait_events("stuck", lambda ev: ("Warning", "Unschedulable") in [(t, r) for t, r, _ in ev], op)
    finally:
        op.stop()


def test_restarts_are_counted_once_across_operator_restarts_and_the_epoch_never_goes_back(
        own_cluster, kubeconfig, bucket, s3_server, tmp_path):
    cluster = own_cluster
    op = Operator(kubeconfig, tmp_path / "operator.log", [f"{OWN}-*"], "--standalone")

    def training() -> dict:
        return cluster.status("again").get("training") or {}

    def counted(name: str) -> list[str]:
        return [m for _, r, m in cluster.events("again") if r == name]

    try:
        op.start()
        created = cluster.create_run(new_run(cluster.ns, "again", s3_server))
        reach_training(cluster, bucket, "again", op)
        mpijob = cluster.mpijob("again-train")
        launcher, workers = "again-train-launcher-abcde", ["again-train-worker-0", "again-train-worker-1"]

        def start_pod(name: str, role: str) -> None:
            start_training_pod(cluster, mpijob, role, name)

        for name in workers:
            start_pod(name, "worker")
        start_pod(launcher, "launcher")
        cluster.set_mpijob_condition("again-train", "Running", "", "")
        bucket.put_json(progress_uri(created), progress("running", 2))
        status = wait_for(lambda: training().get("epoch") == 2 and len(training().get("pods") or []) == 3
                          and training(), what="epoch 2 and three pods", operator=op)
        assert (status["restarts"], status["workerPodsLost"], status["launcherRestarts"]) == (0, 0, 0)
        assert status["mpiJobUid"] == mpijob["metadata"]["uid"]

        # A worker pod is deleted.
        cluster.delete_pod(workers[1])
        status = wait_for(lambda: training().get("restarts") == 1 and training(), what="1 restart", operator=op)
        assert (status["workerPodsLost"], status["launcherRestarts"]) == (1, 0)
        cluster.wait_events("again", lambda ev: any(
            r == "WorkerPodLost" and m.startswith(f"worker pod {workers[1]} (uid ") and "was deleted" in m
            for _, r, m in ev), op)

        # The MPI operator recreates it; the launcher's mpirun lost its ssh connection and restarts: the same
        # interruption, not a second one.
        start_pod(workers[1], "worker")
        cluster.set_pod_status(launcher, phase="Running", containers=running("launcher", restarts=1, last_exit=1),
                               conditions=SCHEDULED)
        status = wait_for(lambda: len(training().get("pods") or []) == 3 and training(), what="the new worker",
                          operator=op)
        assert (status["restarts"], status["workerPodsLost"], status["launcherRestarts"]) == (1, 1, 0)
        # A restart of the launcher's own (its container failed again) is one.
        cluster.set_pod_status(launcher, phase="Running", containers=running("launcher", restarts=2, last_exit=1),
                               conditions=SCHEDULED)
        status = wait_for(lambda: training().get("restarts") == 2 and training(), what="2 restarts", operator=op)
        assert (status["workerPodsLost"], status["launcherRestarts"]) == (1, 1)
        cluster.wait_events("again", lambda ev: any(
            r == "LauncherRestarted" and f"launcher pod {launcher} restarted: container launcher exit code 1 (Error)"
            in m for _, r, m in ev), op)

        # The resumed attempt's first document, as an older trainer wrote it (epoch 0, no metrics): status
        # keeps the epoch it showed; then the trainer says where it resumed.
        bucket.put_json(progress_uri(created), {**progress("running", 0), "metrics": {}, "bestMetrics": {},
                                                "bestEpoch": None, "learningRate": 0.004})
        status = wait_for(lambda: training().get("learningRate") == 0.004 and training(),
                          what="the resumed attempt's document read", operator=op)
        assert status["epoch"] == 2 and status["metrics"]["val_accuracy"] == 0.8125 and status["bestEpoch"] == 2
        bucket.put_json(progress_uri(created), progress("running", 2, resumedFromEpoch=2))
        wait_for(lambda: training().get("resumedFromEpoch") == 2, what="resumedFromEpoch 2", operator=op)

        # The operator is down while worker 0 is replaced: counted on its return, once.
        op.kill()
        old_uid = next(p["uid"] for p in training()["pods"] if p["name"] == workers[0])
        cluster.delete_pod(workers[0])
        start_pod(workers[0], "worker")
        op.start()
        status = wait_for(lambda: training().get("restarts") == 3 and training(), what="3 restarts", operator=op)
        replaced = f"worker pod {workers[0]} (uid {old_uid}) was replaced"
        cluster.wait_events("again", lambda ev: any(r == "WorkerPodLost" and replaced in m for _, r, m in ev), op)
        bucket.put_json(progress_uri(created), progress("running", 3, resumedFromEpoch=2))
        status = wait_for(lambda: training().get("epoch") == 3 and training(), what="epoch 3", operator=op)
        assert (status["restarts"], status["workerPodsLost"], status["launcherRestarts"]) == (3, 2, 1)
        assert (len(counted("WorkerPodLost")), len(counted("LauncherRestarted"))) == (2, 1)

        # The training succeeds and the MPI operator removes the workers: that is no interruption.
        done = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": _now(), "finishedAt": _now()}}
        cluster.set_pod_status(launcher, phase="Succeeded", conditions=SCHEDULED,
                               containers=[{"name": "launcher", "restartCount": 1, "state": done}])
        for name in workers:
            cluster.delete_pod(name)
        bucket.put_json(progress_uri(created), progress("succeeded", 4, modelUri="s3://x/model", resumedFromEpoch=2))
        cluster.set_mpijob_condition("again-train", "Succeeded", "MPIJobSucceeded", "done")
        status = wait_for(cluster.phase_is("again", "Succeeded"), what="Succeeded", operator=op)
        assert status["training"]["restarts"] == 3 and status["training"]["epoch"] == 4
        assert len(counted("WorkerPodLost")) == 2
    finally:
        op.stop()


def test_parallel_preprocessing_without_indexed_jobs_runs_every_shard_in_one_pod(cluster, operator, bucket,
                                                                                 s3_server, api_client):
    from scalingrun_operator.schema.validation import parse_scalingrun
    from scalingrun_operator.builders import build_preprocess_job
    from scalingrun_operator.cluster.api_answers import parse_version
    from scalingrun_operator.decide.snapshot import INDEXED_JOBS_SINCE

    info = client.VersionApi(api_client).get_code()
    version = parse_version({"major": info.major, "minor": info.minor, "gitVersion": info.git_version})
    cluster.create_run(new_run(cluster.ns, "split", s3_server))  # parallelism 2
    wait_for(cluster.phase_is("split", "Preprocessing"), what="Preprocessing", operator=operator)
    job = cluster.job("split-preprocess")
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    condition = cluster.condition("split", "Preprocessed")
    if version[:2] < INDEXED_JOBS_SINCE:
        assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (1, 1)
        assert "completionMode" not in job["spec"] and command[-1] == "--all-shards"
        note = f"this server ({version[2]}) has no Indexed Jobs"
        assert note in condition["message"] and "the 2 shards" in condition["message"]
        assert "one pod runs the 2 shards in turn" in condition["message"]
        cluster.wait_events("split", lambda ev: any(r == "Preprocessing" and note in m for _, r, m in ev), operator)
    else:
        assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 2
        assert "--all-shards" not in command and "Indexed" not in condition["message"]

    # A Job with several completions and no completion index (left by an older operator, or a server that
    # dropped the mode) fails the run at once and says why, not minutes later with a misleading message.
    body = new_run(cluster.ns, "legacy", s3_server)
    admitted = cluster.custom.create_namespaced_custom_object(models.GROUP, models.VERSION, cluster.ns,
                                                              models.PLURAL, body, dry_run="All")
    legacy = build_preprocess_job(parse_scalingrun(admitted), cluster.ns)
    del legacy["spec"]["completionMode"]
    cluster.batch.create_namespaced_job(cluster.ns, legacy)
    cluster.create_run(body)
    wait_for(cluster.phase_is("legacy", "Failed"), what="legacy Failed", operator=operator)
    failed = cluster.condition("legacy", "Failed")
    assert failed["reason"] == "PreprocessingFailed"
    assert "has 2 completions but no completion index" in failed["message"]
    assert "every pod would process shard 0" in failed["message"] and "recreate the run" in failed["message"]
