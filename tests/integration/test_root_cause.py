"""Root causes in status, on a real kube-apiserver with the operator running.

No kubelet or scheduler runs here: the tests create the run's pods as the MPI operator would and write
their status as the kubelet and the scheduler would (OOMKilled, Evicted, ImagePullBackOff, Unschedulable,
CrashLoopBackOff, Pending), then read what the run's status says. Without a kubelet the pod log API
cannot serve a log: here it answers with an error, which is the path where a failed run must still
say why it failed (the real log is checked in the e2e on a real node).
"""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from scalingrun_operator.config import Config
from scalingrun_operator.cluster import reconcile
from scalingrun_operator.cluster.k8s import Kube
from scalingrun_operator.decide import pods as pod_diagnosis
from scalingrun_operator.decide.status import parse_time

from tests.support.operator import (  # noqa: F401 (bucket: a fixture)
    Cluster, Operator, SCHEDULED, PULL_FROM_TEST_STORES, bucket, manifest_for, namespace_cluster, new_run,
    preprocess_pod_labels, progress, progress_uri, reach_training, running, served, started, wait_for, waiting,
)
from tests.support.pods import IMAGE, create_pod, create_training_pod

pytestmark = pytest.mark.k8s

SERVED = "src"  # namespaces src-* are served by this module's operator
UNSERVED = "srq"  # namespaces no operator serves: a test reconciles there itself


operator, cluster = served(SERVED)


@pytest.fixture
def unserved(api_client, s3_server, request, scalingrun_crd, mpijob_crd):
    with namespace_cluster(api_client, s3_server, request, UNSERVED) as made:
        yield made


def pods_healthy(cluster: Cluster, run: str, reason: str, operator: Operator) -> dict:
    """The condition once it says `reason`: the operator's next look, which a loaded machine delays (CI: 38 s after
    the pod's status was written); the bound is a hang's, not a speed."""
    return wait_for(lambda: cluster.condition(run, "PodsHealthy").get("reason") == reason
                    and cluster.condition(run, "PodsHealthy"), what=f"PodsHealthy {reason}", timeout=120,
                    operator=operator, describe=lambda: cluster.condition(run, "PodsHealthy"))


def test_each_pod_cause_reaches_status_with_pod_container_and_what_to_do(cluster, operator, bucket, s3_server):
    cluster.create_run(new_run(cluster.ns, "causes", s3_server, workers={"memory": "3Gi"}))
    reach_training(cluster, bucket, "causes", operator)
    mpijob = cluster.mpijob("causes-train")
    worker, other, launcher = "causes-train-worker-0", "causes-train-worker-1", "causes-train-launcher-k2j4x"
    create_training_pod(cluster, mpijob, "worker", worker)
    create_training_pod(cluster, mpijob, "worker", other)
    create_training_pod(cluster, mpijob, "launcher", launcher)
    cluster.set_pod_status(other, phase="Running", containers=running("worker"), conditions=SCHEDULED)
    cluster.set_pod_status(launcher, phase="Running", containers=running("launcher"), conditions=SCHEDULED)

    # The image cannot be pulled: the image is named.
    cluster.set_pod_status(worker, containers=waiting("worker", "ImagePullBackOff", f'Back-off pulling image "{IMAGE}"'),
                           conditions=SCHEDULED)
    health = pods_healthy(cluster, "causes", "ImagePullFailed", operator)
    assert health["message"].startswith(f"pod {worker} container worker cannot pull image '{IMAGE}' (ImagePullBackOff")
    assert "check spec.workers.image" in health["message"]
    assert cluster.status("causes")["message"].startswith(f"ImagePullFailed: pod {worker} container worker")

    # It runs, then is killed for memory: the limit it had is named, and the field that sets it.
    cluster.set_pod_status(worker, phase="Running", containers=[{
        "name": "worker", "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}], conditions=SCHEDULED)
    health = pods_healthy(cluster, "causes", "OOMKilled", operator)
    assert health["message"].startswith(
        f"pod {worker} container worker was killed for using more memory than its limit of 3Gi (exit code 137 "
        "(OOMKilled)); raise spec.workers.memory"), health["message"]

    # A crash loop: the last exit code, and the command that shows the crash.
    cluster.set_pod_status(worker, phase="Running", containers=[{
        "name": "worker", "restartCount": 4, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 2, "reason": "Error"}}}], conditions=SCHEDULED)
    health = pods_healthy(cluster, "causes", "CrashLoopBackOff", operator)
    assert f"pod {worker} container worker keeps crashing (restarted 4 times, last exit code 2 (Error))" in (
        health["message"])
    assert f"kubectl logs -n {cluster.ns} {worker} -c worker --previous" in health["message"]

    # The launcher's replacement cannot be scheduled: the scheduler's words are quoted.
    cluster.set_pod_status(worker, phase="Running", containers=running("worker", restarts=4), conditions=SCHEDULED)
    cluster.set_pod_status(launcher, conditions=[{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/1 nodes are available: 1 Insufficient memory."}])
    health = pods_healthy(cluster, "causes", "Unschedulable", operator)
    assert health["message"].startswith(
        f"pod {launcher} cannot be scheduled: 0/1 nodes are available: 1 Insufficient memory.; lower "
        "spec.launcher.resources")

    # A worker is evicted: the kubelet's reason is quoted.
    cluster.set_pod_status(launcher, phase="Running", containers=running("launcher"), conditions=SCHEDULED)
    why = "The node was low on resource: memory. Container worker was using 3500Mi, which exceeds its request of 3Gi."
    cluster.set_pod_status(other, phase="Failed", reason="Evicted", message=why)
    health = pods_healthy(cluster, "causes", "Evicted", operator)
    assert health["message"].startswith(f"pod {other} was evicted: {why}; ")
    assert "spec.workers.memory" in health["message"]
    status = cluster.status("causes")
    assert status["phase"] == "Training" and status["message"].startswith(f"Evicted: pod {other} was evicted")

    # One Warning per cause, each naming the pod.
    wanted = ["ImagePullFailed", "OOMKilled", "CrashLoopBackOff", "Unschedulable", "Evicted"]
    cluster.wait_events("causes", lambda ev: all(r in [r for t, r, _ in ev if t == "Warning"] for r in wanted),
                        operator)
    warnings = [(r, m) for t, r, m in cluster.events("causes") if t == "Warning" and r in wanted]
    assert [r for r, _ in warnings] == wanted
    assert all(m.startswith("pod causes-train-") for _, m in warnings)


def test_a_failed_training_still_says_why_when_the_launchers_log_cannot_be_read(cluster, operator, bucket,
                                                                                  s3_server):
    cluster.create_run(new_run(cluster.ns, "nolog", s3_server, workers={"memory": "2Gi"}))
    run = cluster.run("nolog")
    reach_training(cluster, bucket, "nolog", operator)
    mpijob = cluster.mpijob("nolog-train")
    launcher, worker = "nolog-train-launcher-p9x8z", "nolog-train-worker-1"
    # It ran on a node that is gone now (no kubelet here either way); a worker was killed for memory.
    create_training_pod(cluster, mpijob, "launcher", launcher, node="node-gone")
    create_training_pod(cluster, mpijob, "worker", worker, node="node-gone")
    cluster.set_pod_status(worker, phase="Failed", containers=[{
        "name": "worker", "restartCount": 0, "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}],
        conditions=SCHEDULED)
    cluster.set_pod_status(launcher, phase="Failed", containers=[{
        "name": "launcher", "restartCount": 0,
        "state": {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": "2026-01-01T12:00:00Z",
                                 "finishedAt": "2026-01-01T12:01:00Z"}}}], conditions=SCHEDULED)
    bucket.put_json(progress_uri(run), progress("failed", 2, error="ValueError: bad batch"))
    cluster.set_mpijob_condition("nolog-train", "Failed", "MPIJobFailed", "launcher exited 1")
    wait_for(cluster.phase_is("nolog", "Failed"), what="Failed", operator=operator)
    failed = cluster.condition("nolog", "Failed")
    assert failed["reason"] == "MPIJobFailed"
    assert "MPIJobFailed: launcher exited 1" in failed["message"] and "ValueError: bad batch" in failed["message"]
    # The root cause a pod left behind, with the limit and the field that sets it.
    assert (f"; pod {worker} container worker was killed for using more memory than its limit of 2Gi (exit code "
            "137 (OOMKilled)); raise spec.workers.memory") in failed["message"], failed["message"]
    assert cluster.condition("nolog", "PodsHealthy")["reason"] == "OOMKilled"
    # This API server has no kubelet to ask: it answers with an error, which status reports.
    marker = f"; the log of launcher pod {launcher} container launcher could not be read (HTTP 4"
    assert marker in failed["message"], failed["message"]
    status = cluster.status("nolog")
    assert marker in status["message"] and "launcherLogTail" not in status["training"]
    assert "Traceback" not in operator.log_tail(200)


def test_a_failed_preprocessing_names_the_pod_killed_for_memory(cluster, operator, s3_server):
    cluster.create_run(new_run(cluster.ns, "smallprep", s3_server, dataset={"preprocessing": {
        "parallelism": 1, "resources": {"cpu": "500m", "memory": "256Mi"}}}))
    job = wait_for(lambda: cluster.job("smallprep-preprocess"), what="the preprocessing Job", operator=operator)
    template = job["spec"]["template"]["spec"]["containers"][0]
    pod = "smallprep-preprocess-h5g6f"
    body = {"metadata": {"name": pod, "labels": preprocess_pod_labels(job)},
            "spec": {"automountServiceAccountToken": False, "nodeName": "node-1", "containers": [
                {"name": template["name"], "image": IMAGE, "resources": template["resources"]}]}}
    create_pod(cluster, body)
    cluster.set_pod_status(pod, phase="Failed", containers=[{
        "name": template["name"], "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}],
        conditions=SCHEDULED)
    cluster.fail_job("smallprep-preprocess", succeeded=0, failed=1, reason="BackoffLimitExceeded",
                     message="Job has reached the specified backoff limit")
    wait_for(cluster.phase_is("smallprep", "Failed"), what="Failed", operator=operator)
    message = cluster.condition("smallprep", "Failed")["message"]
    assert message.startswith("Job smallprep-preprocess failed (BackoffLimitExceeded")
    assert (f"; pod {pod} container {template['name']} was killed for using more memory than its limit of 256Mi "
            "(exit code 137 (OOMKilled)); raise spec.dataset.preprocessing.resources.memory") in message, message


def test_a_pod_stuck_pending_is_surfaced_within_60_s_without_any_pod_event(unserved, api_client, bucket,
                                                                             s3_server):
    """The operator-wide watcher looks again when a reconcile asks; here the test plays it and
    reconciles in this process, so nothing else (no poll, no pod event) can look in between."""
    cluster = unserved
    watcher = RecordingWatcher()
    # No MPIJobServed look at 300 s (mpijob_unserved_seconds 0): the only look asked here is the pending pod's.
    reconcile_run = reconcile.Reconciler(Kube(api_client), Config(poll_interval_seconds=300, mpijob_unserved_seconds=0,
                                                                  **PULL_FROM_TEST_STORES), watcher)
    asked = watcher.rechecks
    cluster.create_run(new_run(cluster.ns, "slow", s3_server))
    assert reconcile_run(cluster.ns, "slow") == "Preprocessing"
    run = cluster.run("slow")
    bucket.put_json(f"{run['spec']['dataset']['output']}/_manifest.json", manifest_for(run))
    cluster.complete_job("slow-preprocess", succeeded=2)
    assert reconcile_run(cluster.ns, "slow") == "Training"
    assert asked == []  # no pod, nothing to look at again

    launcher = "slow-train-launcher-w3e4r"
    pod = create_training_pod(cluster, cluster.mpijob("slow-train"), "launcher", launcher)
    created = parse_time(pod["metadata"]["creationTimestamp"])
    assert reconcile_run(cluster.ns, "slow") == "Training"  # what the pod's ADDED event would start
    looked = time.time()
    assert cluster.condition("slow", "PodsHealthy") == {}
    assert len(asked) == 1 and asked[0][:2] == (cluster.ns, "slow")
    delay = asked[0][2]
    # The timer is what is left of 45 s since the pod's creation: no less than what was left once the reconcile had
    # returned (a loaded machine only lengthens the time before it); 1 s for the timestamp's whole seconds.
    left = pod_diagnosis.PENDING_AFTER_S - (looked - created.timestamp())
    assert left - 1 <= delay <= pod_diagnosis.PENDING_AFTER_S + 1, (left, delay)

    time.sleep(delay)  # the watcher's timer
    reconcile_run(cluster.ns, "slow")
    reconciled = time.time()
    health = cluster.condition("slow", "PodsHealthy")
    assert health["status"] == "False" and health["reason"] == "PodPending"
    since = created.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert health["message"].startswith(f"pod {launcher} has been Pending since {since} (over 45 s): no "
                                        "scheduler has placed it yet"), health["message"]
    assert f"kubectl describe pod -n {cluster.ns} {launcher}" in health["message"]
    surfaced = parse_time(health["lastTransitionTime"])
    # Surfaced by that reconcile, once 45 s had passed: between the two, whatever the load.
    assert created.timestamp() + pod_diagnosis.PENDING_AFTER_S - 1 <= surfaced.timestamp() <= reconciled + 1, (
        created, surfaced, reconciled)
    status = cluster.status("slow")
    assert status["phase"] == "Training" and status["message"].startswith(f"PodPending: pod {launcher}")
    assert cluster.condition("slow", "Trained")["reason"] == "PodPending"
    assert len(asked) == 1, "nothing left to look at again: the pod is reported"

    # Looking again changes nothing (the message has no running age): no status write, no second Warning.
    version = cluster.run("slow")["metadata"]["resourceVersion"]
    reconcile_run(cluster.ns, "slow")
    assert cluster.run("slow")["metadata"]["resourceVersion"] == version
    assert [r for t, r, _ in cluster.events("slow") if t == "Warning"] == ["PodPending"]

    # Scheduled and started: the problem clears.
    cluster.set_pod_status(launcher, phase="Running", containers=running("launcher"), conditions=SCHEDULED)
    reconcile_run(cluster.ns, "slow")
    assert cluster.condition("slow", "PodsHealthy")["status"] == "True"


class RecordingWatcher:
    """Stands in for the operator-wide progress watcher: records what the reconcile asks of it."""

    def __init__(self) -> None:
        self.rechecks: list[tuple[str, str, float]] = []

    def schedule_recheck(self, namespace: str, name: str, delay_s: float) -> None:
        self.rechecks.append((namespace, name, delay_s))

    def watch(self, *_: object) -> None:
        pass

    def unwatch(self, *_: object) -> None:
        pass

    def forget(self, *_: object) -> None:
        pass


def test_the_pod_log_api_error_is_the_api_servers_own_words(unserved, api_client):
    """What the Failed message quotes when a log cannot be read: a missing pod, a pod on a missing node."""
    kube = Kube(api_client)
    text, why = kube.read_pod_log_tail(unserved.ns, "nowhere", "launcher")
    assert text is None and why == 'HTTP 404: pods "nowhere" not found', why
    unserved.create_pod("placed", {"app": "x"}, "launcher", IMAGE)
    unserved.core.create_namespaced_pod_binding("placed", unserved.ns, {
        "metadata": {"name": "placed"}, "target": {"kind": "Node", "name": "node-gone"}}, _preload_content=False)
    text, why = kube.read_pod_log_tail(unserved.ns, "placed", "launcher")
    assert text is None and why.startswith("HTTP "), why
    assert "node-gone" in why, why
