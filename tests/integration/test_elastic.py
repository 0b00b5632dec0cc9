"""An elastic run shrinks on a real kube-apiserver with the operator and the stand-in MPI operator
(tests/e2e/mpijob_controller, mpi-operator v0.8's behaviour) running: no scheduler or kubelet runs, so the test
places pods itself (a Binding, as the scheduler makes, and the status a kubelet writes) and leaves one worker
unschedulable (PodScheduled=False, as the scheduler writes when no node has room). Past resizeAfter the run resumes
with the placed workers: its MPIJob is made again with fewer workers and the new mpirun -np, nothing is counted as
an interruption, and the resize is recorded with its cause and its cost once the new MPIJob runs. Then a capacity
probe the test places (as the scheduler would, once room returns) makes the run grow back at the next epoch."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from kubernetes import client

from scalingrun_operator.builders.capacity_probes import CAPACITY_PROBE_PRIORITY_CLASS
from scalingrun_operator.decide.status import parse_time
from tests.support.operator import (  # noqa: F401 (fixtures)
    SCHEDULED, bucket, new_run, progress, progress_uri, reach_training, running, served, wait_for,
)
from tests.support.pods import create_pod

pytestmark = pytest.mark.k8s

ROOT = Path(__file__).resolve().parents[2]
RESIZE_AFTER_S = 3
NO_ROOM = "0/2 nodes are available: 2 Insufficient example.com/capacity."

operator, cluster = served("els")


@pytest.fixture
def mpijob_controller(kubeconfig, cluster, tmp_path) -> Iterator[Path]:
    """The stand-in MPIJob controller for the test's namespace; yields its log."""
    log = tmp_path / "mpijob-controller.log"
    with open(log, "ab") as out:
        process = subprocess.Popen([sys.executable, str(ROOT / "tests/e2e/mpijob_controller/controller.py"),
                                    "--kubeconfig", kubeconfig, "--namespace", cluster.ns, "--resync-seconds", "2"],
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    wait_for(lambda: "starting: watching MPIJobs" in log.read_text(), what="the MPIJob controller",
             describe=log.read_text)
    yield log
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture
def nodes(api_client) -> Iterator[list[str]]:
    """Ready Node objects (no kubelet behind them) for the test's bindings: a pod bound to no Node is lost."""
    core, names = client.CoreV1Api(api_client), ["node-a", "node-b", "node-c"]
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for name in names:
        core.create_node({"metadata": {"name": name}})
        core.patch_node_status(name, {"status": {"conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "set by the test",
            "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}]}})
    yield names
    for name in names:
        core.delete_node(name)


@pytest.fixture
def probe_priority_class(api_client) -> str:
    """The chart's PriorityClass of capacity probes (the Priority admission plugin refuses a pod naming none)."""
    scheduling = client.SchedulingV1Api(api_client)
    try:
        scheduling.create_priority_class(client.V1PriorityClass(
            metadata=client.V1ObjectMeta(name=CAPACITY_PROBE_PRIORITY_CLASS), value=-1000000,
            preemption_policy="Never"))
    except client.ApiException as exc:
        if exc.status != 409:  # made by an earlier test of this API server
            raise
    return CAPACITY_PROBE_PRIORITY_CLASS


def worker_pods(cluster, mpijob: dict) -> list[dict]:
    found = cluster.core.list_namespaced_pod(cluster.ns, label_selector=(
        f"training.kubeflow.org/job-name={mpijob['metadata']['name']},training.kubeflow.org/job-role=worker"))
    return [p for p in found.items if any(o.uid == mpijob["metadata"]["uid"] for o in p.metadata.owner_references or [])
            and not p.metadata.deletion_timestamp]


def place(cluster, name: str, node: str) -> None:
    """What the scheduler and the kubelet do: bind the pod, then report it Running and Ready."""
    cluster.core.create_namespaced_pod_binding(name, cluster.ns, client.V1Binding(
        metadata=client.V1ObjectMeta(name=name), target=client.V1ObjectReference(kind="Node", name=node)),
        _preload_content=False)
    cluster.set_pod_status(name, phase="Running", containers=running("worker"),
                           conditions=[*SCHEDULED, {"type": "Ready", "status": "True"}])


def gone_terminating(cluster, uid: str) -> bool:
    """The MPIJob of `uid` gone; meanwhile, as the kubelets would, its pods that are being deleted end (the
    foreground deletion of the MPIJob waits for them)."""
    for pod in cluster.core.list_namespaced_pod(cluster.ns).items:
        if pod.metadata.deletion_timestamp:
            try:
                cluster.core.delete_namespaced_pod(pod.metadata.name, cluster.ns, grace_period_seconds=0)
            except client.ApiException as exc:
                if exc.status != 404:
                    raise
    found = cluster.mpijob("spot-train")
    return found is None or found["metadata"]["uid"] != uid


def start_launcher(cluster, mpijob: dict) -> None:
    """The launcher Job's pod, as the Job controller makes it (the test's KCM runs no Job controller), Running."""
    job = cluster.batch.read_namespaced_job(f"{mpijob['metadata']['name']}-launcher", cluster.ns)
    name = f"{job.metadata.name}-{job.metadata.uid[:5]}"
    create_pod(cluster, {"metadata": {"name": name, "labels": {**job.spec.template.metadata.labels,
                                                               **job.spec.selector.match_labels},
                                      "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                                           "name": job.metadata.name, "uid": job.metadata.uid,
                                                           "controller": True}]},
                         "spec": {"automountServiceAccountToken": False, "nodeName": "node-a",
                                  "containers": [{"name": "launcher", "image": "registry.invalid/trainer:1"}]}})
    cluster.set_pod_status(name, phase="Running", containers=running("launcher"), conditions=SCHEDULED)


def test_an_elastic_run_shrinks_to_the_placed_workers_with_a_new_mpijob_and_records_the_cost(
        cluster, operator, bucket, s3_server, mpijob_controller, probe_priority_class, nodes):
    created = cluster.create_run(new_run(cluster.ns, "spot", s3_server, workers={
        "replicas": 3, "minReplicas": 2, "resizeAfter": RESIZE_AFTER_S}))
    reach_training(cluster, bucket, "spot", operator)
    first = wait_for(lambda: cluster.mpijob("spot-train"), what="the MPIJob", operator=operator)
    assert first["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 3
    workers = wait_for(lambda: len(worker_pods(cluster, first)) == 3 and worker_pods(cluster, first),
                       what="3 workers made by the MPI operator", operator=operator, describe=mpijob_controller.read_text)
    by_name = sorted(p.metadata.name for p in workers)
    place(cluster, by_name[0], "node-a")
    place(cluster, by_name[1], "node-b")
    lost_at = time.time()
    cluster.set_pod_status(by_name[2], phase="Pending", conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": NO_ROOM}])

    wait_for(lambda: gone_terminating(cluster, first["metadata"]["uid"]), what="the first MPIJob gone", timeout=120,
             operator=operator)
    second = wait_for(lambda: (lambda m: m and m["metadata"]["uid"] != first["metadata"]["uid"] and m)(
        cluster.mpijob("spot-train")), what="the MPIJob made again", timeout=120, operator=operator)
    assert time.time() - lost_at >= RESIZE_AFTER_S - 1
    assert second["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    launcher_command = second["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
    assert "mpirun -np 2 " in launcher_command[-1]
    elastic = cluster.status("spot")["training"]["elastic"]
    assert elastic["workers"] == 2 and elastic["resizing"]["from"] == 3 and NO_ROOM in elastic["resizing"]["cause"]

    # The new MPIJob's workers are placed, its launcher runs: training again, the resize recorded with its cost.
    workers = wait_for(lambda: len(worker_pods(cluster, second)) == 2 and worker_pods(cluster, second),
                       what="2 workers of the new MPIJob", timeout=120, operator=operator,
                       describe=mpijob_controller.read_text)
    for pod, node in zip(sorted(p.metadata.name for p in workers), ("node-a", "node-b")):
        place(cluster, pod, node)
    wait_for(lambda: cluster.batch.list_namespaced_job(cluster.ns, field_selector="metadata.name=spot-train-launcher")
             .items, what="the new launcher Job", timeout=60, operator=operator, describe=mpijob_controller.read_text)
    start_launcher(cluster, cluster.mpijob("spot-train"))
    resizes = wait_for(lambda: (cluster.status("spot")["training"].get("elastic") or {}).get("resizes"),
                       what="the resize recorded", timeout=120, operator=operator)
    [resize] = resizes
    assert (resize["from"], resize["to"]) == (3, 2) and resize["costSeconds"] >= RESIZE_AFTER_S
    print(f"\nresize 3 -> 2 workers: {resize['costSeconds']} s from the loss to training again "
          f"(resizeAfter {RESIZE_AFTER_S} s)")
    status = cluster.status("spot")
    # The time at each size, as written with the resize: 3 workers from the first MPIJob made to training again at 2.
    elastic = status["training"]["elastic"]
    started, trained = (parse_time(elastic["startedAt"]), parse_time(resize["trainingAt"]))
    assert started <= parse_time(resize["lostAt"]) and elastic["counting"] == {"workers": 2,
                                                                            "since": resize["trainingAt"]}
    assert [(s["workers"], s["seconds"], s["workerHours"]) for s in elastic["sizes"]] == [
        (3, (trained - started).total_seconds(), round(3 * (trained - started).total_seconds() / 3600, 4))]
    placed = cluster.condition("spot", "WorkersPlaced")
    assert (placed["status"], placed["reason"]) == ("False", "Shrunk") and "2 of 3" in placed["message"]
    assert not cluster.condition("spot", "ChildDeleted") and not status["training"].get("restarts")
    assert status["phase"] == "Training"
    cluster.wait_events("spot", lambda events: {"Shrinking", "Resized"} <= {e[1] for e in events}, operator)

    # Growing back: a probe per missing worker, at the lowest priority; placed, the run grows when an epoch ends.
    probe = wait_for(lambda: next(iter(cluster.core.list_namespaced_pod(
        cluster.ns, label_selector="app.kubernetes.io/component=capacity-probe").items), None),
        what="a capacity probe", timeout=60, operator=operator)
    assert probe.metadata.name == "spot-capacity-0" and probe.spec.priority_class_name == probe_priority_class
    assert probe.spec.priority == -1000000 and probe.metadata.owner_references[0].kind == "ScalingRun"
    cluster.core.create_namespaced_pod_binding(probe.metadata.name, cluster.ns, client.V1Binding(
        metadata=client.V1ObjectMeta(name=probe.metadata.name),
        target=client.V1ObjectReference(kind="Node", name="node-c")), _preload_content=False)
    growing = wait_for(lambda: cluster.condition("spot", "WorkersPlaced").get("reason") == "GrowingAtEpoch"
                       and cluster.condition("spot", "WorkersPlaced"), what="GrowingAtEpoch", timeout=60,
                       operator=operator)
    assert "grows to 3 of 3 workers when epoch 1 ends" in growing["message"]
    assert cluster.mpijob("spot-train")["metadata"]["uid"] == second["metadata"]["uid"]  # not before the epoch ends
    bucket.put_json(progress_uri(created), progress("running", 1, processes=2))
    wait_for(lambda: gone_terminating(cluster, second["metadata"]["uid"]), what="the second MPIJob gone",
             timeout=120, operator=operator)
    third = wait_for(lambda: (lambda m: m and m["metadata"]["uid"] != second["metadata"]["uid"] and m)(
        cluster.mpijob("spot-train")), what="the MPIJob made again at 3 workers", timeout=120, operator=operator)
    assert third["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 3
    resizing = cluster.status("spot")["training"]["elastic"]["resizing"]
    assert (resizing["from"], resizing["to"]) == (2, 3) and resizing["cause"].startswith("capacityReturned")
    wait_for(lambda: not cluster.core.list_namespaced_pod(
        cluster.ns, label_selector="app.kubernetes.io/component=capacity-probe").items,
        what="the probe deleted with the old MPIJob", timeout=60, operator=operator)
