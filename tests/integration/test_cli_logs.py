"""`scalingrun logs` after the pods are gone: a run on a real kube-apiserver whose pods do not exist, its attempts'
logs archived in real SeaweedFS by the trainer's own archiver, read back with the keys of the run's Secret."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from kubernetes import client

from scalingrun_api import models
from scalingrun_trainer.launch.run_logs import AttemptArchive, PodArchive
from tests.support.env import ROOT

pytestmark = [pytest.mark.k8s, pytest.mark.s3]


def cli(kubeconfig: str, *args: str) -> subprocess.CompletedProcess:
    # No AWS keys in the CLI's environment: the archive is read with the run's Secret.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "operator"), str(ROOT / "trainer"), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "scalingrun_operator.cli", "logs", *args, "--kubeconfig", kubeconfig],
                          capture_output=True, timeout=120, env=env)


def create_run(api_client, namespace: str, name: str, s3_server, output: str, secret: str) -> None:
    body = {"apiVersion": models.API_VERSION, "kind": models.KIND, "metadata": {"name": name},
            "spec": {"storage": {"endpoint": s3_server.endpoint, "credentialsSecret": secret},
                     "dataset": {"source": "s3://nowhere/raw", "output": output}}}
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        models.GROUP, models.VERSION, namespace, models.PLURAL, body)


def archive_attempt(logs: str, lines: list[bytes], exit_code: int, pod: str) -> None:
    archive = AttemptArchive(logs, pod=pod)
    for line in lines:
        archive.log.add(line)
    assert archive.finish(exit_code)


@pytest.fixture
def archived_run(api_client, scalingrun_crd, namespace, s3_server, monkeypatch):
    """Run `gone` with two archived attempts and no pods; its Secret holds the store's keys."""
    bucket = f"cli-logs-{uuid.uuid4().hex[:8]}"
    s3_server.create_bucket(bucket)
    client.CoreV1Api(api_client).create_namespaced_secret(namespace, {
        "metadata": {"name": "store-keys"},
        "stringData": {"AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}})
    create_run(api_client, namespace, "gone", s3_server, f"s3://{bucket}/parquet", "store-keys")
    logs = f"s3://{bucket}/parquet/runs/gone/logs"
    for variable, value in s3_server.env().items():  # the launcher's environment, as its pod has it
        monkeypatch.setenv(variable, value)
    archive_attempt(logs, [b"[1,0]<stdout>:first try\n", b"[1,1]<stderr>:Traceback: boom\n"], 1, "gone-launcher-a")
    archive_attempt(logs, [b"scalingrun-trainer launch: all 2 workers answer ssh after 1.0 s\n",
                           b"[1,0]<stdout>:epoch 1/2: val_accuracy 0.61\n", b"[1,1]<stdout>:rank 1 [1,0]<stdout>:"
                           b"epoch 2/2: val_accuracy 0.74\n", b"[1,1]<stdout>:done\n"], 0, "gone-launcher-b")
    for pod in ("gone-preprocess-0-aaaaa", "gone-preprocess-1-bbbbb"):
        archive = PodArchive(f"{logs}/preprocess", pod=pod)
        archive.log.add(f"{pod}: 12 images written\n".encode())
        assert archive.finish(0)
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object_status(
        models.GROUP, models.VERSION, namespace, models.PLURAL, "gone",
        {"status": {"phase": "Succeeded", "logs": logs}})  # as the operator sets it
    return logs


def test_logs_prints_the_last_attempts_archived_launcher_log_once_the_pods_are_gone(archived_run, namespace,
                                                                                    kubeconfig):
    result = cli(kubeconfig, "gone", "-n", namespace)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().splitlines() == [
        "scalingrun-trainer launch: all 2 workers answer ssh after 1.0 s", "[1,0]<stdout>:epoch 1/2: val_accuracy 0.61",
        "[1,1]<stdout>:rank 1 [1,0]<stdout>:epoch 2/2: val_accuracy 0.74", "[1,1]<stdout>:done"]
    note = result.stderr.decode()
    assert note.startswith("scalingrun logs: no live launcher pod; attempt 2 of 2 (pod gone-launcher-b, succeeded, "
                           "exit code 0, ended ")
    assert note.rstrip().endswith(f"archived in {archived_run}/attempt-2/launcher.log")

    first = cli(kubeconfig, "gone", "--attempt", "1", "-n", namespace)
    assert first.returncode == 0 and b"[1,1]<stderr>:Traceback: boom\n" in first.stdout
    assert b"attempt 1 of 2 (pod gone-launcher-a, failed, exit code 1" in first.stderr
    rank = cli(kubeconfig, "gone", "--rank", "1", "-n", namespace)
    assert rank.returncode == 0 and rank.stdout == b"rank 1 done\n"
    assert cli(kubeconfig, "gone", "--rank", "1", "--attempt", "1", "-n", namespace).stdout == b"Traceback: boom\n"
    preprocess = cli(kubeconfig, "gone", "--preprocess", "-n", namespace)
    assert preprocess.returncode == 0, preprocess.stderr
    assert preprocess.stdout.decode().splitlines() == [
        "==> pod gone-preprocess-0-aaaaa <==", "gone-preprocess-0-aaaaa: 12 images written", "",
        "==> pod gone-preprocess-1-bbbbb <==", "gone-preprocess-1-bbbbb: 12 images written"]
    assert preprocess.stderr.decode() == (f"scalingrun logs: no live preprocessing pod; 2 archived in {archived_run}/"
                                          "preprocess/\n")


def test_logs_says_in_one_line_what_is_not_there(archived_run, namespace, kubeconfig, api_client, s3_server):
    def fails(code: int, *args: str) -> str:
        result = cli(kubeconfig, *args, "-n", namespace)
        assert result.returncode == code, (result.stdout, result.stderr)
        assert len(result.stderr.decode().strip().splitlines()) == 1 and b"Traceback" not in result.stderr
        return result.stderr.decode().strip()

    assert fails(1, "gone", "--attempt", "5") == f"scalingrun logs: no attempt 5 in {archived_run}/ (archived: 1, 2)"
    assert fails(1, "gone", "--rank", "7") == (f"scalingrun logs: attempt 2 archived no log of rank 7 in "
                                               f"{archived_run}/attempt-2/ (ranks archived: 0, 1)")
    assert fails(1, "absent") == f"scalingrun logs: ScalingRun absent not found in namespace {namespace}"
    assert fails(2, "gone", "--rank", "-1") == "scalingrun logs: --rank -1: a rank is 0 or more"
    output = archived_run.rsplit("/runs/", 1)[0]
    create_run(api_client, namespace, "fresh", s3_server, output, "store-keys")
    assert fails(1, "fresh").startswith(f"scalingrun logs: ScalingRun fresh has no live launcher pod and no archived "
                                        f"log in {output}/runs/fresh/logs/ (its training has not started")
    assert fails(1, "fresh", "--preprocess") == (
        f"scalingrun logs: ScalingRun fresh has no preprocessing pods left and no archived preprocessing log in "
        f"{output}/runs/fresh/logs/preprocess/ (its dataset was reused, or it has not preprocessed yet)")
    create_run(api_client, namespace, "nobucket", s3_server, "s3://no-such-bucket/parquet", "store-keys")
    assert fails(1, "nobucket").startswith("scalingrun logs: cannot list s3://no-such-bucket/parquet/runs/nobucket/logs")
    create_run(api_client, namespace, "keyless", s3_server, "s3://nowhere/parquet", "absent-secret")
    assert fails(1, "keyless") == (f"scalingrun logs: Secret {namespace}/absent-secret (spec.storage."
                                   "credentialsSecret) does not exist: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                                   "to the store's keys to read the archived logs")


def test_a_launcher_pod_not_started_yet_sends_logs_to_the_last_archived_attempt(archived_run, namespace, kubeconfig,
                                                                         api_client):
    """A launcher pod that exists but has not started its container (the next attempt's, not yet on a node): the
    archive of the last attempt, said so."""
    core = client.CoreV1Api(api_client)
    try:  # the controller manager makes it too, maybe not yet
        core.create_namespaced_service_account(namespace, {"metadata": {"name": "default"}})
    except client.ApiException as exc:
        assert exc.status == 409, exc
    core.create_namespaced_pod(namespace, {
        "metadata": {"name": "gone-train-launcher-zzzzz", "labels": {
            "scalingrun.dev/run": "gone", "training.kubeflow.org/job-role": "launcher"}},
        "spec": {"automountServiceAccountToken": False,
                 "containers": [{"name": "launcher", "image": "scalingrun/trainer:test"}]}})
    result = cli(kubeconfig, "gone", "-n", namespace)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.endswith(b"[1,1]<stdout>:done\n")
    note = result.stderr.decode().splitlines()
    assert note[0] == ("scalingrun logs: pod gone-train-launcher-zzzzz has not started its container yet (Pending); "
                       "looking in the archive")
    assert note[1].startswith("scalingrun logs: no live launcher pod; attempt 2 of 2 (")
