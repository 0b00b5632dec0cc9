"""The local runner and the operator report the same run the same way: one table of events drives both.

Each row is what happens to a run: the dataset is there already or is made, a shard fails, the training
succeeds or fails, a document is missing. In the cluster (a real kube-apiserver, the operator's Reconciler
in this process), the test plays the Job controller, the MPI operator and the trainer, as the other
operator tests do: it writes the Job's and the MPIJob's status and the trainer's documents. Locally,
`scalingrun run --local`'s runner starts processes that play the trainer: they write the same documents (and push the
progress to the runner with the trainer's own pusher, as the trainer does) and end with the same exit codes. Both runs must end with the same phase, the same conditions (status, reason,
message) and the same Events. Only where to look for logs differs: kubectl in a cluster, the terminal
locally (decide.snapshot.Where); the messages are compared with that part replaced.
"""

from __future__ import annotations

import json
import shutil
import sys
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest
from kubernetes import client

from scalingrun_api import models
from scalingrun_operator.schema.validation import parse_scalingrun
from scalingrun_operator.builders.locations import manifest_uri, progress_uri
from scalingrun_operator.cluster.k8s import Kube
from scalingrun_operator.cluster.reconcile import Reconciler
from scalingrun_operator.config import Config
from scalingrun_operator.decide.preprocessing import dataset_parameters
from scalingrun_operator.decide.snapshot import CLUSTER, LOCAL
from scalingrun_operator.local.processes import Commands
from scalingrun_operator.local.runner import LocalRun

from tests.support.operator import Cluster, PULL_FROM_TEST_STORES

pytestmark = pytest.mark.k8s

NAME = "parity"
ERROR = "ValueError: cannot decode 3 of 4 images"
TRAINER_ERROR = "RuntimeError: weights s3://x/w.h5 not found"


@dataclass(frozen=True)
class Row:
    name: str
    dataset_there: bool = False  # a manifest of this run's dataset exists before the run
    shard_error: Optional[str] = None  # the preprocessing fails with this error
    writes_manifest: bool = True  # the preprocessing writes the dataset manifest
    progress: Optional[dict] = None  # the trainer's last progress document
    exit_code: int = 0  # the training's exit


def _progress(state: str, epoch: int, **extra: Any) -> dict:
    return {"state": state, "epoch": epoch, "maxEpochs": 3, "metrics": {"val_accuracy": 0.5},
            "bestEpoch": epoch, "bestMetrics": {"val_accuracy": 0.625}, "processes": 2, **extra}


ROWS = [
    Row("the dataset is made and the training succeeds", progress=_progress("succeeded", 3, modelUri="/m/model")),
    Row("the dataset is there already", dataset_there=True, progress=_progress("succeeded", 3)),
    Row("a shard fails", shard_error=ERROR),
    Row("the preprocessing ends without a manifest", writes_manifest=False),
    Row("the training fails with the trainer's error", progress=_progress("failed", 1, error=TRAINER_ERROR),
        exit_code=3),
    Row("the training ends before its final progress", progress=_progress("running", 2)),
]


def spec(root: Path) -> dict:
    # One shard: the test's API server (1.20) has no Indexed Jobs, so in a cluster several shards would run in one
    # pod, one after another, and the messages would say so; on this machine they run side by side.
    return {"dataset": {"source": str(root / "raw"), "output": str(root / "data"), "imageSize": 32,
                        "preprocessing": {"parallelism": 1}},
            "training": {"maxEpochs": 3}, "workers": {"replicas": 2, "gpusPerWorker": 0}}


def manifest(run) -> dict:
    return {"fingerprint": "f" * 16, "parameters": dataset_parameters(run), "source": run.spec.dataset.source,
            "classes": ["a", "b"], "shards": 1, "written": {"train": 8, "validation": 2}, "skipped": 0}


def write(path: str, document: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(document))


def outcome(status: dict, events: list[tuple[str, str]], namespace: str, local: bool) -> dict:
    """Phase, conditions and Events, with where-to-look-for-logs replaced (see the module's docstring)."""
    where = LOCAL if local else CLUSTER
    hints = [(where.job_logs(namespace, f"{NAME}-preprocess"), "<logs>"),
             (where.launcher_logs(namespace, f"{NAME}-train"), "<logs>"), (where.events(namespace), "<events>"),
             ("; no launcher pod is left to read its log from", "")]

    def same(text: str) -> str:
        for found, placeholder in hints:
            text = text.replace(found, placeholder)
        return text

    return {"phase": status.get("phase"), "message": same(status.get("message") or ""),
            "conditions": sorted((c["type"], c["status"], c["reason"], same(c["message"]))
                                 for c in status.get("conditions") or []),
            "events": [(reason, same(message)) for reason, message in events]}


# --- the cluster ----------------------------------------------------------------------------------------


@pytest.fixture
def namespace(api_client, scalingrun_crd, mpijob_crd):
    """A namespace no operator serves: the test runs the Reconciler itself."""
    name = f"srl-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(api_client).create_namespace({"metadata": {"name": name}})
    yield name
    client.CoreV1Api(api_client).delete_namespace(name)


def in_cluster(row: Row, api_client, namespace: str, root: Path) -> dict:
    cluster = Cluster(api_client, namespace)
    reconcile = Reconciler(Kube(api_client), Config(completion_grace_seconds=0, **PULL_FROM_TEST_STORES))
    created = cluster.create_run({"apiVersion": models.API_VERSION, "kind": models.KIND,
                                  "metadata": {"name": NAME}, "spec": spec(root)})
    run = parse_scalingrun({k: created[k] for k in ("apiVersion", "kind", "metadata", "spec")})
    if row.dataset_there:
        write(manifest_uri(run), manifest(run))
    reconcile(namespace, NAME)
    if cluster.job(f"{NAME}-preprocess"):  # the Job controller and the preprocessing, played
        if row.shard_error:
            # What the local runner writes for its one shard process: the shard's error as it is.
            cluster.fail_job(f"{NAME}-preprocess", 0, 1, "ShardsFailed", row.shard_error)
        else:
            if row.writes_manifest:
                write(manifest_uri(run), manifest(run))
            cluster.complete_job(f"{NAME}-preprocess", succeeded=1)
        reconcile(namespace, NAME)
    if cluster.mpijob(f"{NAME}-train"):  # the MPI operator and the trainer, played
        cluster.set_mpijob_condition(f"{NAME}-train", "Running", "MPIJobRunning", "running")
        reconcile(namespace, NAME)
        if row.progress:
            write(progress_uri(run), row.progress)
        if row.exit_code:
            cluster.set_mpijob_condition(f"{NAME}-train", "Failed", "TrainerExited",
                                         f"the training exited with code {row.exit_code}")
        else:
            cluster.set_mpijob_condition(f"{NAME}-train", "Succeeded", "Exited", "the training exited with code 0")
        reconcile(namespace, NAME)
    return outcome(cluster.status(NAME), [(r, m) for _, r, m in cluster.events(NAME)], namespace, local=False)


# --- this machine -----------------------------------------------------------------------------------------

PLAY = ("import json, pathlib, sys\n"
        "path, document, summary, code = sys.argv[1:5]\n"
        "if path:\n"
        "    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)\n"
        "    pathlib.Path(path).write_text(document)\n"
        "if sys.argv[5:]:  # pushed, as the trainer's ProgressWriter pushes beside its write\n"
        "    from scalingrun_trainer.core.status_push import status_pusher\n"
        "    pusher = status_pusher()\n"
        "    assert pusher is not None, 'the runner set no status endpoint'\n"
        "    pusher.push('progress', json.loads(sys.argv[5]))\n"
        "    assert pusher.flush(60), 'the push was not answered'\n"
        "print(summary)\n"
        "sys.exit(int(code))\n")


class Trainer(Commands):
    """Processes that do what the row says the trainer did: write its documents, end with its exit code."""

    def __init__(self, row: Row, run):
        self.row, self.run = row, run

    def preprocess(self, config: Path, shards: int, index: int, workers: int, plan_id: str) -> list[str]:
        failing = self.row.shard_error is not None
        summary = {"error": self.row.shard_error} if failing else {"complete": index == 0}
        path = manifest_uri(self.run) if self.row.writes_manifest and index == 0 and not self.row.shard_error else ""
        return [sys.executable, "-c", PLAY, path, json.dumps(manifest(self.run)), json.dumps(summary),
                "1" if failing else "0"]

    def train(self, run, processes: int, config: Path) -> list[str]:
        path = progress_uri(self.run) if self.row.progress else ""
        pushed = [json.dumps(self.row.progress)] if self.row.progress else []
        return [sys.executable, "-c", PLAY, path, json.dumps(self.row.progress or {}), "", str(self.row.exit_code),
                *pushed]


def on_this_machine(row: Row, namespace: str, root: Path) -> dict:
    run = parse_scalingrun({"apiVersion": models.API_VERSION, "kind": models.KIND,
                            "metadata": {"name": NAME, "namespace": namespace}, "spec": spec(root)})
    if row.dataset_there:
        write(manifest_uri(run), manifest(run))
    local = LocalRun(run, root / "work", commands=Trainer(row, run), poll_seconds=0.2, log=lambda line: None)
    local.start()
    return outcome(local.body["status"], [(e.reason, e.message) for e in local.events], namespace, local=True)


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_the_local_runner_and_the_operator_say_the_same(row: Row, api_client, namespace, tmp_path):
    root = tmp_path / "storage"  # the same paths on both sides: messages name them
    cluster = in_cluster(row, api_client, namespace, root)
    shutil.rmtree(root, ignore_errors=True)
    local = on_this_machine(row, namespace, root)
    assert local == cluster
    assert cluster["phase"] in ("Succeeded", "Failed")


def test_the_table_covers_every_end_a_local_run_can_have(api_client, namespace, tmp_path):
    """The rows reach both ends, through both phases, and every reason a local run's status can carry."""
    seen = set()
    for row in ROWS:
        root = tmp_path / row.name.replace(" ", "-").replace("'", "")
        found = on_this_machine(row, namespace, root)
        seen |= {(found["phase"], reason) for _, status, reason, _ in found["conditions"] if status != "Unknown"}
    assert {("Succeeded", "Succeeded"), ("Succeeded", "DatasetReused"), ("Failed", "PreprocessingFailed"),
            ("Failed", "MPIJobFailed")} <= seen


def test_a_queued_run_is_admitted_at_once_on_this_machine(tmp_path):
    """spec.runPolicy.kueueQueueName: there is no Kueue on one machine to resume the suspended Job and MPIJob, so
    the local runner admits them at once: the run is never Queued and trains to the end."""
    root = tmp_path / "storage"
    run = parse_scalingrun({"apiVersion": models.API_VERSION, "kind": models.KIND,
                            "metadata": {"name": NAME, "namespace": "default"},
                            "spec": {**spec(root), "runPolicy": {"kueueQueueName": "team-a"}}})
    local = LocalRun(run, root / "work", commands=Trainer(ROWS[0], run), poll_seconds=0.2, log=lambda line: None)
    local.start()
    status = local.body["status"]
    assert status["phase"] == "Succeeded", status.get("message")
    assert "Queued" not in {c["type"] for c in status.get("conditions") or []}
    assert "Queued" not in {e.reason for e in local.events} | {e.message.split()[0] for e in local.events if e.message}


def test_the_local_runner_takes_the_pushed_progress_and_reads_none_from_storage(tmp_path):
    """decide is fed what the training process pushed to the runner (as the operator's, with its status endpoint on):
    storage holds an older progress document, and the run ends on the pushed one."""
    root = tmp_path / "storage"
    pushed = _progress("succeeded", 3, modelUri="/m/model")
    run = parse_scalingrun({"apiVersion": models.API_VERSION, "kind": models.KIND,
                            "metadata": {"name": NAME, "namespace": "default"}, "spec": spec(root)})
    write(manifest_uri(run), manifest(run))

    class OlderInStorage(Trainer):
        def train(self, run, processes: int, config: Path) -> list[str]:
            return [sys.executable, "-c", PLAY, progress_uri(self.run), json.dumps(_progress("running", 1)), "", "0",
                    json.dumps(pushed)]

    local = LocalRun(run, root / "work", commands=OlderInStorage(ROWS[0], run), poll_seconds=0.2,
                     log=lambda line: None)
    assert local.start() == 0, local.body["status"].get("message")
    status = local.body["status"]
    assert status["phase"] == "Succeeded"
    assert (status["training"]["epoch"], status["modelUri"]) == (3, "/m/model")
    assert local.pushes.received == Counter({"progress": 1}) and not local.pushes.refused
    assert json.loads(Path(progress_uri(run)).read_text())["epoch"] == 1  # what storage had: never taken
