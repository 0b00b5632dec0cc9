"""decide_run as a table: for each phase, a world in (the run's last status, its children, pods and documents)
and what decide returns out (the phase, the actions on children, conditions, Events, when to look again).
Every root cause and interruption the operator reports has a row; so do the children it may not touch."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import pytest

from scalingrun_operator.decide import pinning
from scalingrun_operator.decide.snapshot import LogTail, Patch, Server, Settings
from tests.support.decide_world import (
    NOW, OWNER, SPEC, World, condition, config_map, conditions, done, job, manifest, mpijob, preprocessing_status,
    progress, stamp, training_status, actions,
)
from tests.support.decide_pods import pod, unschedulable, waiting
from tests.support.decide_run import RECORDS, preprocess_pod, training, training_pods

OTHER = {**OWNER, "name": "other", "uid": "other-uid"}
OOM = {"exitCode": 137, "reason": "OOMKilled"}


def preprocessing(**changes: Any) -> World:
    base: dict[str, Any] = dict(status=preprocessing_status(), children={"ConfigMap": config_map(), "Job": job()})
    base.update(changes)
    return World(**base)


@dataclass
class Row:
    name: str
    world: Callable[[], World]
    phase: Optional[str]
    actions: list[tuple[str, str]] = field(default_factory=list)
    conditions: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # type -> (status, reason, in message)
    events: list[str] = field(default_factory=list)
    recheck: Optional[float] = None
    again: bool = False
    settings: Settings = Settings()
    check: Optional[Callable[[Any], None]] = None


UNSERVED = Settings(mpijob_unserved_seconds=300)
INSTALL = "kubectl apply --server-side -f https://raw.githubusercontent.com/kubeflow/mpi-operator/v0.8.2/"


def unserved_mpijob(minutes_ago: float) -> dict:
    """An MPIJob no controller has written anything on: no status at all."""
    found = mpijob()
    del found["status"]
    found["metadata"]["creationTimestamp"] = stamp(minutes_ago)
    return found


def unserved(minutes_ago: float, *conditions: dict) -> World:
    return training(status=training_status(*conditions), pods=[], progress=None,
                    children={"ConfigMap": config_map(), "Job": job(done("Complete"), succeeded=2),
                              "MPIJob": unserved_mpijob(minutes_ago)})


def pod_problem(name: str, world: Callable[[], World], reason: str, words: str, phase: str, held: str,
                events: Optional[list[str]] = None) -> Row:
    return Row(name, world, phase, conditions={"PodsHealthy": ("False", reason, words), held: ("Unknown", reason, words)},
               events=events or [reason], check=lambda d: d.desired["message"].startswith(f"{reason}: pod "))


def _pin(decision) -> None:
    assert decision.pin and '"replicas":2' in decision.pin


def _not_indexed(decision) -> None:
    created = [a.obj for a in decision.actions if a.obj.get("kind") == "Job"]
    assert created[0]["spec"]["completions"] == 1 and "--all-shards" in created[0]["spec"]["template"]["spec"][
        "containers"][0]["command"]


def _mpijob_uid_recorded(decision) -> None:
    created = [a for a in decision.actions if a.obj.get("kind") == "MPIJob"]
    assert created[0].uid_at == ("training", "mpiJobUid")


def _suspend(value: bool, event: str) -> Callable[[Any], None]:
    def check(decision) -> None:
        patch = [a for a in decision.actions if isinstance(a, Patch)][0]
        assert patch.patch == {"spec": {"runPolicy": {"suspend": value}}} and patch.event.reason == event
    return check


def _adopted(extra: Optional[dict] = None) -> Callable[[Any], None]:
    def check(decision) -> None:
        patch = [a for a in decision.actions if isinstance(a, Patch)][0]
        assert patch.adopt and patch.patch["metadata"]["ownerReferences"][-1]["uid"] == "run-uid"
        for key, value in (extra or {}).items():
            assert patch.patch[key] == value
    return check


def _follows_progress(decision) -> None:
    document, version = decision.follow
    assert document.uri == "s3://data/parquet/runs/demo/progress.json" and version == "v1"


def _stalled(decision) -> None:
    assert decision.follow is None and decision.recheck_in is None and decision.status["completionTime"]


def _with(world: World, **status: Any) -> World:
    world.status.update(status)
    return world


def _spec(world: World, section: str, **values: Any) -> World:
    world.spec.setdefault(section, {}).update(values)
    return world


def _on_gpus(world: World) -> World:
    """A run that asked for a GPU per worker from its start (its pinned spec says so too)."""
    world.spec["workers"]["gpusPerWorker"] = 1
    world.status[pinning.PINNED_FIELD] = pinning.pin(world.spec)
    return world


def _records(**changes: Any) -> list[dict]:
    records = copy.deepcopy(RECORDS)
    for record in records:
        record.update(changes.get(record["name"], {}))
    return records


CM_DATA = config_map()["data"]
ROWS = [
    # --- Pending --------------------------------------------------------------------------------------
    Row("a new run pins its spec and makes its ConfigMap and preprocessing Job",
        lambda: World(pinned=False), "Preprocessing", [("create", "ConfigMap"), ("create", "Job")],
        {"Preprocessed": ("Unknown", "Running", "Job demo-preprocess: 0 of 2 shards done"),
         "Ready": ("False", "Preprocessing", "Job demo-preprocess")}, ["Pending", "Preprocessing"], check=_pin),
    Row("a dataset made with the same parameters is reused: no Job, straight to training",
        lambda: World(manifest=manifest()), "Training", [("create", "ConfigMap"), ("create", "MPIJob")],
        {"Preprocessed": ("True", "DatasetReused", "already made from the same source with the same parameters"),
         "Trained": ("Unknown", "Running", "MPIJob demo-train: no epoch finished")},
        ["Pending", "Training"], check=_mpijob_uid_recorded),
    Row("a dataset made with other parameters is made again, and the Job says why",
        lambda: World(manifest=manifest(parameters={"imageSize": 64})), "Preprocessing",
        [("create", "ConfigMap"), ("create", "Job")], {"Preprocessed": ("Unknown", "Running", "0 of 2")},
        ["Pending", "Preprocessing"],
        check=lambda d: d.actions[1].event.reason == "PreprocessingAgain" and "other parameters" in d.actions[1].event.message),
    Row("a server without Indexed Jobs gets one pod that runs every shard in turn",
        lambda: World(server=Server(1, 20, "v1.20.2")), "Preprocessing", [("create", "ConfigMap"), ("create", "Job")],
        {"Preprocessed": ("Unknown", "Running", "one pod runs the 2 shards in turn; this server (v1.20.2) has no "
                                                "Indexed Jobs")}, ["Pending", "Preprocessing"], check=_not_indexed),
    Row("an invalid spec fails the run, names the field and touches nothing",
        lambda: _spec(World(pinned=False), "workers", replicas=0), "Failed", [],
        {"Failed": ("True", "InvalidSpec", "spec.workers.replicas"), "Stalled": ("True", "Failed", "InvalidSpec")},
        ["Failed"], check=lambda d: d.pin is None),
    Row("storage that cannot be read is a condition, a Warning and a look again later",
        lambda: World(storage_error="NoSuchBucket: bucket data does not exist"), "Pending", [],
        {"StorageReadable": ("False", "StorageError", "NoSuchBucket")}, ["Pending", "StorageUnreadable"], recheck=30),
    Row("a storage error already reported is not reported again",
        lambda: World(storage_error="NoSuchBucket", status={"phase": "Pending", "conditions": [
            condition("StorageReadable", "False", "StorageError", "NoSuchBucket; retrying every 30 s")]}),
        "Pending", [], {"StorageReadable": ("False", "StorageError", "NoSuchBucket")}, [], recheck=30),
    # --- Preprocessing ----------------------------------------------------------------------------------
    Row("shards done are counted while the Job runs",
        lambda: preprocessing(children={"ConfigMap": config_map(), "Job": job(succeeded=1)}), "Preprocessing", [],
        {"Preprocessed": ("Unknown", "Running", "Job demo-preprocess: 1 of 2 shards done")}),
    pod_problem("a preprocessing pod that cannot pull its image",
                lambda: preprocessing(pods=[preprocess_pod(phase="Pending", containers=waiting(
                    "preprocess", "ImagePullBackOff", "not found"))]),
                "ImagePullFailed", "cannot pull image 'registry.example/trainer:missing'", "Preprocessing",
                "Preprocessed"),
    pod_problem("a preprocessing pod whose Secret key is missing",
                lambda: preprocessing(pods=[preprocess_pod(phase="Pending", containers=waiting(
                    "preprocess", "CreateContainerConfigError", 'couldn\'t find key AWS_KEY in Secret ml/creds'))]),
                "ContainerConfigError", "check the Secrets the run names", "Preprocessing", "Preprocessed"),
    pod_problem("a preprocessing pod that cannot be scheduled",
                lambda: preprocessing(pods=[preprocess_pod(phase="Pending", containers=[], conditions=unschedulable(
                    "0/3 nodes are available: 3 Insufficient memory."))]),
                "Unschedulable", "spec.dataset.preprocessing.resources", "Preprocessing", "Preprocessed"),
    pod_problem("a preprocessing pod killed for memory",
                lambda: preprocessing(pods=[preprocess_pod(containers=waiting(
                    "preprocess", "CrashLoopBackOff", restarts=2, last=OOM))]),
                "OOMKilled", "its limit of 256Mi", "Preprocessing", "Preprocessed"),
    pod_problem("a preprocessing pod that keeps crashing",
                lambda: preprocessing(pods=[preprocess_pod(containers=waiting(
                    "preprocess", "CrashLoopBackOff", restarts=3, last={"exitCode": 2, "reason": "Error"}))]),
                "CrashLoopBackOff", "keeps crashing (restarted 3 times", "Preprocessing", "Preprocessed"),
    pod_problem("an evicted preprocessing pod",
                lambda: preprocessing(pods=[preprocess_pod(phase="Failed", reason="Evicted",
                                                           message="The node was low on resource: memory.")]),
                "Evicted", "was evicted: The node was low on resource", "Preprocessing", "Preprocessed"),
    pod_problem("a preprocessing pod Pending past 45 s with nothing else known",
                lambda: preprocessing(pods=[preprocess_pod(phase="Pending", containers=[], created=stamp(1))]),
                "PodPending", "has been Pending since", "Preprocessing", "Preprocessed"),
    Row("a pod Pending for less than 45 s is looked at again when it reaches them",
        lambda: preprocessing(pods=[preprocess_pod(phase="Pending", containers=[], created=stamp(0.5))]),
        "Preprocessing", [], {"Preprocessed": ("Unknown", "Running", "0 of 2")}, recheck=16),
    Row("a pod problem that went away is said to be gone",
        lambda: _with(preprocessing(), conditions=preprocessing_status(condition(
            "PodsHealthy", "False", "ImagePullFailed", "pod x cannot pull"))["conditions"]),
        "Preprocessing", [], {"PodsHealthy": ("True", "PodsRunning", "no pod of the run reports a problem")}),
    Row("a Job that completed with its manifest written: preprocessed, and the MPIJob is made",
        lambda: preprocessing(children={"ConfigMap": config_map(), "Job": job(done("Complete"), succeeded=2)},
                              manifest=manifest()), "Training", [("create", "MPIJob")],
        {"Preprocessed": ("True", "Preprocessed", "Job demo-preprocess: 45 images (40 train, 5 validation) in 3 "
                                                  "classes, 1 undecodable files skipped")}, ["Training"]),
    Row("a Job that completed waits a while for its manifest",
        lambda: preprocessing(children={"ConfigMap": config_map(), "Job": job(done("Complete", minutes_ago=1),
                                                                              succeeded=2)}),
        "Preprocessing", [], {"Preprocessed": ("Unknown", "WaitingForManifest", "waiting for "
                                                                               "s3://data/parquet/_manifest.json")},
        recheck=30),
    Row("a Job that completed without a manifest after the grace fails the run",
        lambda: preprocessing(children={"ConfigMap": config_map(), "Job": job(done("Complete", minutes_ago=5),
                                                                              succeeded=2)}),
        "Failed", [], {"Preprocessed": ("False", "PreprocessingFailed", "does not describe this run's dataset "
                                                                         "(there is none)")}, ["Failed"]),
    Row("with the status endpoint on, a Job whose pods left no manifest says so after the grace",
        lambda: preprocessing(children={"ConfigMap": config_map(), "Job": job(done("Complete", minutes_ago=5),
                                                                              succeeded=2)}),
        "Failed", [], {"Preprocessed": ("False", "PreprocessingFailed", "none of its pods left this run's dataset "
                                                                         "manifest in its termination message (there "
                                                                         "is none); a trainer image older than the "
                                                                         "operator leaves none")}, ["Failed"],
        settings=Settings(reads_storage=False)),
    Row("a failed Job fails the run with the shards done and what its pod said",
        lambda: preprocessing(children={"ConfigMap": config_map(), "Job": job(done(
            "Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit"), succeeded=1, failed=4)},
            shards=("shard-00000-of-00002.json",),
            pods=[preprocess_pod(phase="Failed", containers=[{"name": "preprocess", "restartCount": 0,
                                                              "state": {"terminated": OOM}}])]),
        "Failed", [], {"Preprocessed": ("False", "PreprocessingFailed", "1 of 2 shards succeeded, 4 pod failures; 1 of "
                                                                        "2 shard manifests written"),
                       "Failed": ("True", "PreprocessingFailed", "its limit of 256Mi"),
                       "PodsHealthy": ("False", "OOMKilled", "killed for using more memory")}, ["Failed"], check=_stalled),
    Row("a failed Job whose shard manifests cannot be listed says why, not how many",
        lambda: preprocessing(children={"ConfigMap": config_map(), "Job": job(done(
            "Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit"), succeeded=1, failed=4)},
            storage_error="cannot list s3://data/parquet/_shards: the store answered 9 listing pages with 0 keys"),
        "Failed", [], {"Preprocessed": ("False", "PreprocessingFailed", "4 pod failures; the shard manifests could "
                                                                        "not be listed (cannot list s3://data/parquet/"
                                                                        "_shards: the store answered 9 listing pages")},
        ["Failed"]),
    Row("a Job whose completion index the server dropped fails the run",
        lambda: preprocessing(children={"ConfigMap": config_map(), "Job": _drop_index(job())}),
        "Failed", [], {"Failed": ("True", "PreprocessingFailed", "has 2 completions but no completion index")},
        ["Failed"]),
    Row("a deleted Job is counted, said, and made anew on the next look",
        lambda: preprocessing(children={"ConfigMap": config_map()}), "Preprocessing", [],
        {"ChildDeleted": ("True", "JobDeleted", "Job demo-preprocess was deleted while the run was Preprocessing; "
                                                "counted as interruption 1 of the 2 allowed")}, ["ChildDeleted"],
        again=True, check=lambda d: d.desired["preprocessing"]["jobName"] is None and d.desired["training"]["restarts"] == 1),
    Row("a Job deleted once too often fails the run",
        lambda: _with(preprocessing(children={"ConfigMap": config_map()}),
                      training={"restarts": 2, "interruptions": {"childDeleted": 2}}), "Failed", [],
        {"Failed": ("True", "MaxInterruptionsExceeded", "3 interruptions by the infrastructure (childDeleted 3) "
                                                        "exceed spec.training.maxInterruptions (2)")},
        ["ChildDeleted", "Failed"]),
    # --- Training --------------------------------------------------------------------------------------
    Row("an MPIJob nothing reconciled past the bound: MPIJobServed False, naming the controller and its install",
        lambda: unserved(10), "Training", [],
        {"MPIJobServed": ("False", "NoMPIJobController", f"Install Kubeflow's mpi-operator v0.8: {INSTALL}")},
        ["NoMPIJobController"], settings=UNSERVED),
    Row("an MPIJob still unserved: the condition stays, the Warning is not posted again",
        lambda: unserved(20, condition("MPIJobServed", "False", "NoMPIJobController", "nothing has reconciled")),
        "Training", [], {"MPIJobServed": ("False", "NoMPIJobController", "Training Operator v1")}, [],
        settings=UNSERVED),
    Row("the MPIJob made now: looked at again when the bound ends (no event need come for it)",
        lambda: preprocessing(children={"ConfigMap": config_map(), "Job": job(done("Complete"), succeeded=2)},
                              manifest=manifest()), "Training", [("create", "MPIJob")], events=["Training"],
        recheck=300.5, settings=UNSERVED),
    Row("an MPIJob without a status within the bound: looked at again when the bound ends, nothing said yet",
        lambda: unserved(2), "Training", [], recheck=180.5, settings=UNSERVED,
        check=lambda d: "MPIJobServed" not in conditions(d)),
    Row("an MPIJob reconciled after all: MPIJobServed True",
        lambda: training(status=training_status(condition("MPIJobServed", "False", "NoMPIJobController", "none"))),
        "Training", [], {"MPIJobServed": ("True", "Served", "reconciled by its controller")}, settings=UNSERVED),
    Row("the check off (the local runner): an MPIJob without a status says nothing",
        lambda: unserved(60), "Training", [], check=lambda d: "MPIJobServed" not in conditions(d)),
    Row("training mirrors the progress document and follows it",
        training, "Training", [], {"Trained": ("Unknown", "Running", "MPIJob demo-train: epoch 2 of 5, val_accuracy "
                                                                     "0.7500")},
        check=lambda d: (_follows_progress(d), d.desired["training"]["epoch"] == 2)),
    pod_problem("a worker that cannot pull its image",
                lambda: training(pods=training_pods(phase="Pending", containers=waiting("worker", "ErrImagePull"))),
                "ImagePullFailed", "pod demo-train-worker-0 container worker cannot pull image", "Training", "Trained"),
    pod_problem("a worker that cannot be scheduled names the workers' fields",
                lambda: training(pods=training_pods(phase="Pending", containers=[], conditions=unschedulable(
                    "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."))),
                "Unschedulable", "spec.workers.cpu/memory/gpusPerWorker", "Training", "Trained"),
    pod_problem("a worker killed for memory: its restart is an interruption too",
                lambda: training(pods=training_pods(containers=waiting("worker", "CrashLoopBackOff", restarts=1,
                                                                       last=OOM))),
                "OOMKilled", "raise spec.workers.memory", "Training", "Trained", ["WorkerPodLost", "OOMKilled"]),
    Row("a deleted worker is an interruption with its last state",
        lambda: training(pods=training_pods()[:2], deleted={"w1-a": "it was Running"}), "Training", [],
        {"Trained": ("Unknown", "Running", "epoch 2")}, ["WorkerPodLost"],
        check=lambda d: d.desired["training"]["restarts"] == 1 and d.desired["training"]["workerPodsLost"] == 1),
    Row("a worker replaced while nobody looked is an interruption",
        lambda: training(pods=training_pods(worker1=pod("demo-train-worker-1", "worker", uid="w1-b"))), "Training", [],
        {}, ["WorkerPodLost"], check=lambda d: d.desired["training"]["pods"][2]["uid"] == "w1-b"),
    Row("an evicted worker is an interruption, counted once",
        lambda: training(pods=training_pods(phase="Failed", reason="Evicted", message="low on memory")), "Training",
        [], {"PodsHealthy": ("False", "Evicted", "was evicted")}, ["WorkerPodLost", "Evicted"]),
    Row("a worker being deleted is an interruption as soon as it is seen",
        lambda: training(pods=[*training_pods()[:2], {**pod("demo-train-worker-1", "worker", uid="w1-a"), "metadata": {
            **pod("demo-train-worker-1", "worker", uid="w1-a")["metadata"], "deletionTimestamp": stamp(0)}}]),
        "Training", [], {}, ["WorkerPodLost"],
        check=lambda d: [r["lost"] for r in d.desired["training"]["pods"]] == [False, False, True]),
    Row("a launcher restart is an interruption with its exit code",
        lambda: training(pods=training_pods(launcher_restarts=1)), "Training", [], {}, ["LauncherRestarted"],
        check=lambda d: d.desired["training"]["launcherRestarts"] == 1),
    Row("a new launcher pod counts the old one lost",
        lambda: training(pods=training_pods(launcher="demo-train-launcher-bbbbb")), "Training", [], {},
        ["LauncherRestarted"]),
    Row("interruptions over the limit fail the run and suspend its MPIJob",
        lambda: training(status=training_status(pods=copy.deepcopy(RECORDS), restarts=2,
                                                interruptions={"podDeleted": 2}),
                         pods=training_pods()[:2]), "Failed", [("patch", "MPIJob")],
        {"Failed": ("True", "MaxInterruptionsExceeded", "3 interruptions by the infrastructure (podDeleted 3) exceed "
                                                        "spec.training.maxInterruptions (2)")},
        ["WorkerPodLost", "Failed"], check=_suspend(True, "Suspending")),
    Row("a deleted MPIJob is counted, said, and made anew on the next look",
        lambda: training(children={"ConfigMap": config_map(), "Job": job(done("Complete"), succeeded=2)}),
        "Training", [], {"ChildDeleted": ("True", "MPIJobDeleted", "a new MPIJob resumes from the last checkpoint")},
        ["ChildDeleted"], again=True, check=lambda d: d.desired["training"]["mpiJobUid"] is None),
    Row("an MPIJob replaced by someone else is counted and kept",
        lambda: training(children={"ConfigMap": config_map(), "MPIJob": mpijob(done("Running"), uid="mpi-2")}),
        "Training", [], {"ChildDeleted": ("True", "MPIJobDeleted", "was deleted and replaced")}, ["ChildDeleted"],
        check=lambda d: d.desired["training"]["mpiJobUid"] == "mpi-2"),
    Row("a succeeded MPIJob with its final progress: the run succeeded",
        lambda: training(children={"ConfigMap": config_map(), "MPIJob": mpijob(done("Succeeded"),
                                                                               completion=stamp(1))},
                         progress=progress("succeeded", 5, modelUri="s3://data/model.keras", bestEpoch=4,
                                           bestMetrics={"val_accuracy": 0.75, "accuracy": 0.875})),
        "Succeeded", [], {"Trained": ("True", "Succeeded", "succeeded after epoch 5 of 5; the model is epoch 4's: "
                                      "val_accuracy 0.7500, training accuracy 0.8750; model at s3://data/model.keras"),
                          "Ready": ("True", "Succeeded", "MPIJob demo-train succeeded")}, ["Succeeded"],
        check=lambda d: d.desired["modelUri"] == "s3://data/model.keras" and d.follow is None),
    Row("a succeeded MPIJob waits a while for the final progress",
        lambda: training(children={"ConfigMap": config_map(), "MPIJob": mpijob(done("Succeeded"),
                                                                               completion=stamp(0.5))}),
        "Training", [], {"Trained": ("Unknown", "WaitingForProgress", "waiting for the final")}, recheck=30),
    Row("an MPIJob removed by its TTL after it succeeded is no interruption",
        lambda: training(status=training_status(condition("Trained", "Unknown", "WaitingForProgress", "")),
                         children={"ConfigMap": config_map()}, progress=progress("succeeded", 5)),
        "Succeeded", [], {"Trained": ("True", "Succeeded", "after epoch 5 of 5")}, ["Succeeded"],
        check=lambda d: "ChildDeleted" not in conditions(d)),
    Row("a failed MPIJob fails the run with the trainer's error, what a pod said and the launcher's log",
        lambda: training(children={"ConfigMap": config_map(), "MPIJob": mpijob(done(
            "Failed", "MPIJobFailed", "launcher exited 1"))}, progress=progress(error="ValueError: bad weights"),
            pods=training_pods(containers=[{"name": "worker", "restartCount": 0,
                                            "state": {"terminated": OOM}}], phase="Failed")),
        "Failed", [], {"Trained": ("False", "MPIJobFailed", "trainer reported: ValueError: bad weights"),
                       "Failed": ("True", "MPIJobFailed", "line 1\nline 2")}, ["Failed"],
        check=lambda d: d.desired["training"]["launcherLogTail"] == "line 1\nline 2"),
    Row("a failed launcher that never ran on a node has no log, and the message says so",
        lambda: training(children={"ConfigMap": config_map(), "MPIJob": mpijob(done("Failed", "MPIJobFailed", "x"))},
                         pods=[pod("demo-train-launcher-aaaaa", "launcher", uid="l-a", phase="Failed")]),
        "Failed", [], {"Failed": ("True", "MPIJobFailed", "the log of launcher pod demo-train-launcher-aaaaa container "
                                                          "launcher could not be read (it never ran on a node, so it "
                                                          "has no log)")}, ["Failed"]),
    Row("a launcher log that cannot be read is said with the API server's words",
        lambda: training(children={"ConfigMap": config_map(), "MPIJob": mpijob(done("Failed", "MPIJobFailed", "x"))},
                         log=LogTail(None, "HTTP 403: forbidden; the operator needs get on pods/log")),
        "Failed", [], {"Failed": ("True", "MPIJobFailed", "could not be read (HTTP 403: forbidden; the operator needs "
                                                          "get on pods/log)")}, ["Failed"]),
    Row("a run that succeeded has no pod problem left",
        lambda: training(status=training_status(condition("PodsHealthy", "False", "ImagePullFailed", "pod x")),
                         children={"ConfigMap": config_map(), "MPIJob": mpijob(done("Succeeded"), completion=stamp(1))},
                         progress=progress("succeeded", 5)),
        "Succeeded", [], {"PodsHealthy": ("True", "Finished", "the run's pods have finished")}, ["Succeeded"]),
    Row("suspending the run suspends its MPIJob, with an Event",
        lambda: _spec(training(), "runPolicy", suspend=True), "Suspended", [("patch", "MPIJob")],
        {"Suspended": ("True", "Suspended", "set it to false to resume")}, ["Suspended"],
        check=_suspend(True, "Suspending")),
    Row("resuming the run resumes its MPIJob",
        lambda: training(status=training_status(condition("Suspended", "True", "Suspended", "")),
                         children={"ConfigMap": config_map(), "MPIJob": mpijob(done("Suspended"), suspend=True)}),
        "Training", [("patch", "MPIJob")], {"Suspended": ("False", "Resumed", "MPIJob demo-train resumed")},
        check=_suspend(False, "Resuming")),
    Row("training that waits for its input is InputBound, said once",
        lambda: training(progress=progress(inputHistory=[{"epoch": 1, "inputWaitFraction": 0.5},
                                                         {"epoch": 2, "inputWaitFraction": 0.6}])),
        "Training", [], {"InputBound": ("True", "InputWaitHigh", "spec.training.input.readerWorkers")},
        ["InputWaitHigh"]),
    Row("a run that asked for GPUs and trains on CPU is GPUsUnused, naming the image, said once",
        lambda: _on_gpus(training(progress=progress(devices={"kind": "cpu", "count": 0}))),
        "Training", [], {"GPUsUnused": ("True", "NoGPUVisible", "sees no GPU in image ghcr.io/scalingrun/trainer")},
        ["NoGPUVisible"], check=lambda d: "NVIDIA device plugin" in next(
            c["message"] for c in d.desired["conditions"] if c["type"] == "GPUsUnused")),
    Row("a run on its GPUs says which, and its GPU-hours",
        lambda: _on_gpus(training(progress=progress(devices={"kind": "gpu", "count": 1, "name": "NVIDIA H100"},
                                                    elapsedSeconds=1800.0))),
        "Training", [], {"GPUsUnused": ("False", "GPUsInUse", "rank 0 trains on 1 GPU(s) (NVIDIA H100)")},
        check=lambda d: (d.desired["training"]["devices"], d.desired["training"]["processHours"],
                         d.desired["training"]["gpuHours"]) == (
                             {"kind": "gpu", "count": 1, "name": "NVIDIA H100"}, 1.0, 1.0)),
    Row("a CPU run on CPU has no GPUsUnused, and process-hours but no GPU-hours",
        lambda: training(progress=progress(devices={"kind": "cpu", "count": 0}, elapsedSeconds=360.0)),
        "Training", [],
        check=lambda d: "GPUsUnused" not in {c["type"] for c in d.desired["conditions"]}
        and d.desired["training"]["processHours"] == 0.2 and "gpuHours" not in d.desired["training"]),
    Row("the feature cache's figures are mirrored into status.training, junk left out",
        lambda: training(progress=progress(featureCache={"used": True, "seconds": 12.5, "bytes": 1228800,
                                                         "rows": 240, "onDisk": False, "junk": 1})),
        "Training", [],
        check=lambda d: d.desired["training"]["featureCache"] == {"used": True, "seconds": 12.5, "bytes": 1228800,
                                                                  "rows": 240, "onDisk": False}),
    Row("a feature cache not used says why in status.training",
        lambda: training(progress=progress(featureCache={"used": False, "reason": "spec.training.featureCache is off",
                                                         "seconds": "never"})),
        "Training", [],
        check=lambda d: d.desired["training"]["featureCache"] == {"used": False,
                                                                  "reason": "spec.training.featureCache is off"}),
    Row("a progress document without the feature cache leaves it out of status.training",
        lambda: training(progress=progress()), "Training", [],
        check=lambda d: "featureCache" not in d.desired["training"] and d.desired["training"]["epoch"] == 2),
    Row("a spec changed after the start is recorded, not applied",
        lambda: _spec(training(), "workers", replicas=4), "Training", [],
        {"SpecChangeIgnored": ("True", "ImmutableFieldChanged", "spec.workers.replicas changed after the run started")},
        ["SpecChangeIgnored"]),
    Row("a finished run is left as it is",
        lambda: training(status={**training_status(), "phase": "Succeeded"}, children={}), "Succeeded", [],
        check=lambda d: d.status is None and d.actions == () and d.events == ()),
    Row("a run that failed for its spec is looked at again once the spec is edited",
        lambda: World(generation=2, pinned=False, status={"phase": "Failed", "observedGeneration": 1, "conditions": [
            condition("Failed", "True", "InvalidSpec", "spec.workers.replicas")]}),
        "Preprocessing", [("create", "ConfigMap"), ("create", "Job")], {}, ["Pending", "Preprocessing"],
        check=lambda d: "Failed" not in conditions(d)),
    # --- children that are not the run's (issue 23, item 2) -----------------------------------------------
    Row("a Job of the run's name that another run controls is left alone, and said",
        lambda: World(children={"Job": job(owner=OTHER)}), "Pending", [],
        {"ChildConflict": ("True", "NameTaken", "Job demo-preprocess already exists in namespace ml and belongs to "
                                                "ScalingRun other (uid other-uid): it is left untouched")},
        ["Pending", "ChildConflict"], recheck=10,
        check=lambda d: d.desired["message"].startswith("ChildConflict: Job demo-preprocess")),
    Row("a Job of the run's name without its labels is left alone, and said",
        lambda: World(children={"Job": _unlabelled(job(owner=None))}), "Pending", [],
        {"ChildConflict": ("True", "NameTaken", "has no controller but lacks this owner's labels "
                                                "(scalingrun.dev/run=demo")}, ["Pending", "ChildConflict"], recheck=10),
    Row("an orphaned Job with the run's labels is adopted",
        lambda: World(children={"Job": job(owner=None)}), "Preprocessing", [("adopt", "Job")],
        {"Preprocessed": ("Unknown", "Running", "0 of 2")}, ["Pending", "Preprocessing"], check=_adopted()),
    Row("the run's ConfigMap is brought to what its spec renders",
        lambda: World(children={"ConfigMap": config_map(data={"config.json": "{}", "stale": "x"})}), "Preprocessing",
        [("patch", "ConfigMap"), ("create", "Job")], {}, ["Pending", "Preprocessing"],
        check=lambda d: d.actions[0].patch == {"data": {"stale": None, **CM_DATA}}),
    Row("an orphaned ConfigMap with the run's labels is adopted and brought to the spec in one patch",
        lambda: World(children={"ConfigMap": _orphan(config_map(data={"config.json": "{}"}))}), "Preprocessing",
        [("adopt", "ConfigMap"), ("create", "Job")], {}, ["Pending", "Preprocessing"],
        check=_adopted({"data": CM_DATA})),
    Row("a ConfigMap of the run's name that another run controls blocks the Job",
        lambda: World(children={"ConfigMap": owned_by_other(config_map())}), "Pending", [],
        {"ChildConflict": ("True", "NameTaken", "ConfigMap demo-runconfig already exists")}, ["Pending", "ChildConflict"],
        recheck=10),
    Row("an MPIJob of the run's name that another run controls holds the run before training",
        lambda: preprocessing(children={"ConfigMap": config_map(), "Job": job(done("Complete"), succeeded=2),
                                        "MPIJob": mpijob(owner=OTHER)}, manifest=manifest()),
        "Preprocessing", [], {"Preprocessed": ("True", "Preprocessed", "45 images"),
                              "ChildConflict": ("True", "NameTaken", "MPIJob demo-train already exists in namespace "
                                                                     "ml and belongs to ScalingRun other")},
        ["ChildConflict"], recheck=10),
    Row("once the name is free the conflict is over",
        lambda: World(status={"phase": "Pending", "conditions": [condition(
            "ChildConflict", "True", "NameTaken", "Job demo-preprocess already exists")]}),
        "Preprocessing", [("create", "ConfigMap"), ("create", "Job")],
        {"ChildConflict": ("False", "NameFree", "the run's children are its own")}, ["Preprocessing"]),
]


def _drop_index(found: dict) -> dict:
    found["spec"].pop("completionMode")
    return found


def _unlabelled(found: dict) -> dict:
    found["metadata"]["labels"] = {"app": "something-else"}
    return found


def _orphan(found: dict) -> dict:
    found["metadata"]["ownerReferences"] = []
    return found


def owned_by_other(found: dict) -> dict:
    found["metadata"]["ownerReferences"] = [OTHER]
    return found


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_decide_run(row: Row):
    world = row.world()
    decision = world.decide(row.settings)
    assert decision.phase == row.phase
    assert actions(decision) == row.actions
    found = conditions(decision)
    for type_, (status, reason, words) in row.conditions.items():
        assert type_ in found, f"no {type_} condition in {sorted(found)}"
        assert found[type_][:2] == (status, reason), found[type_]
        assert words in found[type_][2], found[type_][2]
    assert [e.reason for e in decision.events] == row.events, [(e.reason, e.message) for e in decision.events]
    if row.recheck is None:
        assert decision.recheck_in is None
    else:
        assert decision.recheck_in == pytest.approx(row.recheck, abs=1)
    assert decision.again is row.again
    if row.check:
        assert row.check(decision) is not False


def test_decide_is_the_same_on_the_same_snapshot_and_reads_no_clock():
    """Level-triggered: a look that comes twice decides the same; the time is the snapshot's."""
    first, second = training(pods=training_pods()[:2]).decide(), training(pods=training_pods()[:2]).decide()
    assert first == second
    stamps = {c["lastTransitionTime"] for c in first.desired["conditions"] if c["type"] == "PodsHealthy"} | {
        first.desired["startTime"]}
    assert stamps <= {stamp(10), NOW.strftime("%Y-%m-%dT%H:%M:%SZ")}


def test_what_decide_wrote_is_what_it_reads_next_time():
    """Applying a decision's status and looking again changes nothing more: no second Event, no patch."""
    world = training(pods=training_pods()[:2], deleted={"w1-a": "it was Running"})
    first = world.decide()
    world.status = copy.deepcopy(dict(first.desired))
    again = world.decide()
    assert [e.reason for e in first.events] == ["WorkerPodLost"]
    assert again.events == () and again.status is None and again.actions == ()


def test_status_names_where_the_logs_are_archived_from_the_first_look():
    assert World().decide().desired["logs"] == "s3://data/parquet/runs/demo/logs"
    assert training().decide().desired["logs"] == "s3://data/parquet/runs/demo/logs"


# --- the pin ------------------------------------------------------------------------------------------


def _evil_annotation() -> dict[str, str]:
    evil = copy.deepcopy(SPEC)
    evil["workers"]["image"] = "evil/image:6.6.6"
    return {pinning.PINNED_ANNOTATION: json.dumps(evil)}


def test_a_pinned_spec_annotation_chooses_nothing_and_is_removed_with_a_warning():
    spec = copy.deepcopy(SPEC)
    spec["workers"]["image"] = "ok/trainer:1"
    world = World(pinned=False, spec=spec, annotations=_evil_annotation())
    decision = world.decide()
    job = next(a.obj for a in decision.actions if a.obj["kind"] == "Job")
    assert {c["image"] for c in job["spec"]["template"]["spec"]["containers"]} == {"ok/trainer:1"}
    assert json.loads(decision.pin)["workers"]["image"] == "ok/trainer:1"
    assert decision.desired[pinning.PINNED_FIELD] == decision.pin and decision.drop_pin_annotation
    warning = next(e for e in decision.events if e.reason == "PinnedSpecAnnotationIgnored")
    assert warning.type == "Warning" and "evil" not in warning.message
    assert "(it differs from .spec at spec.workers.image)" in warning.message

    # Once the operator's pin is in status, an annotation written later changes nothing either.
    world.status, world.spec = copy.deepcopy(dict(decision.desired)), spec
    again = world.decide()
    assert again.pin is None and again.drop_pin_annotation
    assert all("evil" not in str(a.obj if hasattr(a, "obj") else a.patch) for a in again.actions)


def test_the_pin_is_read_from_status_only():
    body = {"metadata": {"annotations": _evil_annotation()}, "status": {}}
    assert pinning.pinned_of(body) is None
    body["status"][pinning.PINNED_FIELD] = pinning.pin(SPEC)
    assert pinning.pinned_of(body) == pinning.pin(SPEC)
    body["status"][pinning.PINNED_FIELD] = "zlib+base64:not a pin"  # unreadable: pinned again from .spec
    assert pinning.pinned_of(body) is None


def test_a_large_spec_is_pinned_compressed_and_read_back():
    spec = copy.deepcopy(SPEC)
    spec["model"] = {"builderArgs": {f"k{i}": "v" * 64 for i in range(1000)}}
    pinned = pinning.pin(spec)
    assert len(pinned) < pinning.PLAIN_LIMIT < len(json.dumps(spec)) and pinned.startswith("zlib+base64:")
    assert pinning.effective_spec(SPEC, pinned)["model"] == spec["model"]


# --- bounded status -----------------------------------------------------------------------------------


def test_an_oversized_progress_document_leaves_a_small_status():
    """Whatever the run's own code writes into progress.json, the status stays far under etcd's limit."""
    huge = "x" * 1_000_000
    document = progress(
        metrics={f"metric_{i:05d}": 0.5 for i in range(2_000)} | {"val_accuracy": 0.75, "m" * 500: 1.0},
        bestMetrics={f"metric_{i:05d}": 0.5 for i in range(2_000)} | {"val_accuracy": 0.75},
        mlflowRunId=huge, modelUri="s3://data/" + huge, error=huge,
        inputHistory=[{"epoch": i, "inputWaitFraction": 0.1} for i in range(3_000)],
        batchSizeProbe={"chosen": 64, "stoppedBy": huge,
                        "table": [{"batchSize": i, "imagesPerSecond": 1.0} for i in range(3_000)]},
        featureCache={"used": False, "reason": huge})
    for state in ("running", "succeeded", "failed"):
        decision = training(progress={**document, "state": state}).decide()
        training_status = decision.desired["training"]
        assert len(json.dumps(decision.desired)) < 64 * 1024, state
        assert len(training_status["metrics"]) == len(training_status["bestMetrics"]) == 32
        assert list(training_status["metrics"])[0] == "val_accuracy"  # the usual names are kept first
        assert len(training_status["inputHistory"]) == 10 and training_status["inputHistory"][-1]["epoch"] == 2_999
        assert len(training_status["batchSizeProbe"]["table"]) == 32
        assert len(training_status["batchSizeProbe"]["stoppedBy"]) <= 256
        assert len(training_status["featureCache"]["reason"]) <= 256
        assert "mlflowRunId" not in training_status and "modelUri" not in decision.desired
        assert all(len(e.message) <= 2000 for e in decision.events)


def test_a_run_pinned_by_an_earlier_operator_goes_on_pinned_to_its_spec():
    """Pinned in the annotation by an earlier version, mid-training: pinned again in status from .spec, nothing
    made anew, the annotation removed."""
    world = training(pinned=False, annotations={pinning.PINNED_ANNOTATION: pinning.pin(SPEC)})
    decision = world.decide()
    assert decision.phase == "Training" and actions(decision) == []
    assert decision.pin == pinning.pin(SPEC) and decision.drop_pin_annotation
    assert [e.message for e in decision.events if e.reason == "PinnedSpecAnnotationIgnored"] == [
        pinning.annotation_ignored_message(SPEC, pinning.pin(SPEC))]
    assert "(it matches .spec)" in decision.events[-1].message
