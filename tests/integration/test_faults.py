"""Faults the operator ends itself, on a real kube-apiserver with the operator running (issue 29).

No kubelet, scheduler or node lifecycle controller runs here: the test creates a Node, binds the run's worker pod
to it (spec.nodeName) and writes what those would write: the Node's Ready condition Unknown (its kubelet stopped
answering) and the pod's Ready condition False (what the node lifecycle controller does to a lost node's pods).
Without a kubelet a pod deleted with a grace period stays Terminating for ever, as on a lost node; one deleted
with grace 0 is gone at once.
"""

from __future__ import annotations

import calendar
import time
import uuid
from dataclasses import dataclass

import pytest
from kubernetes import client

from tests.support.flaky_s3 import FlakyS3
from tests.support.operator import (  # noqa: F401 (bucket: a fixture)
    SCHEDULED, bucket, new_run, progress_uri, reach_training, running, served, started, wait_for,
)
from tests.support.pods import create_training_pod

pytestmark = pytest.mark.k8s

SERVED = "flt"  # namespaces flt-* are served by this module's operator
GRACE_S = 5


operator, cluster = served(SERVED)


@pytest.fixture
def node(api_client):
    """A Node object (no kubelet behind it), Ready; deleted afterwards."""
    core, name = client.CoreV1Api(api_client), f"node-{uuid.uuid4().hex[:6]}"
    core.create_node({"metadata": {"name": name}})
    set_node_ready(core, name, "True")
    yield name
    core.delete_node(name)


def set_node_ready(core: client.CoreV1Api, name: str, status: str) -> float:
    """The Node's Ready condition, as its kubelet (True) or the node lifecycle controller (Unknown) writes it;
    returns the transition time as Unix seconds (whole seconds, as the API keeps it)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    reason = "KubeletReady" if status == "True" else "NodeStatusUnknown"
    core.patch_node_status(name, {"status": {"conditions": [{
        "type": "Ready", "status": status, "reason": reason, "message": f"set by the test: {reason}",
        "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}]}})
    return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))


def pod_exists(cluster, name: str) -> bool:
    try:
        cluster.core.read_namespaced_pod(name, cluster.ns)
        return True
    except client.ApiException as exc:
        if exc.status == 404:
            return False
        raise


def test_a_worker_on_a_node_unknown_past_the_grace_period_is_force_deleted_and_not_before(
        cluster, operator, bucket, s3_server, node, api_client):
    cluster.create_run(new_run(cluster.ns, "lost", s3_server, training={"nodeLossGracePeriod": GRACE_S}))
    reach_training(cluster, bucket, "lost", operator)
    mpijob = cluster.mpijob("lost-train")
    tolerations = mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["tolerations"]
    assert {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
            "tolerationSeconds": GRACE_S} in tolerations
    worker, launcher = "lost-train-worker-0", "lost-train-launcher-k2j4x"
    create_training_pod(cluster, mpijob, "worker", worker, node=node)
    create_training_pod(cluster, mpijob, "launcher", launcher)
    ready = [*SCHEDULED, {"type": "Ready", "status": "True"}]
    cluster.set_pod_status(worker, phase="Running", containers=running("worker"), conditions=ready)
    cluster.set_pod_status(launcher, phase="Running", containers=running("launcher"), conditions=ready)
    wait_for(lambda: len((cluster.status("lost").get("training") or {}).get("pods") or []) == 2,
             what="both pods recorded", operator=operator)

    # The kubelet stops answering: the Node goes Unknown, and its pods not Ready.
    since = set_node_ready(cluster.core, node, "Unknown")
    cluster.set_pod_status(worker, phase="Running", containers=running("worker"),
                           conditions=[*SCHEDULED, {"type": "Ready", "status": "False"}])
    # Within the grace period the worker stays (the look its Ready change starts sees the node down 0 s).
    while time.time() < since + GRACE_S - 1:
        assert pod_exists(cluster, worker), f"deleted {time.time() - since:.1f} s after its node went Unknown"
        assert cluster.condition("lost", "NodeLost").get("status") != "True"
        time.sleep(0.3)
    wait_for(lambda: not pod_exists(cluster, worker), what="the worker force-deleted", timeout=30, operator=operator)
    gone = time.time()
    assert gone >= since + GRACE_S - 1
    print(f"\nworker force-deleted {gone - since:.1f} s after its node went Unknown (nodeLossGracePeriod {GRACE_S} s)")
    lost = wait_for(lambda: cluster.condition("lost", "NodeLost").get("status") == "True"
                    and cluster.condition("lost", "NodeLost"), what="NodeLost", timeout=30, operator=operator)
    assert lost["reason"] == "NodeNotReady"
    assert lost["message"].startswith(f"{worker} on node {node} lost: node {node} has been Ready=Unknown since ")
    assert f"over spec.training.nodeLossGracePeriod {GRACE_S} s); force-deleted (grace 0" in lost["message"]
    # The launcher, whose mpirun may wait on the lost worker for ever, is restarted with it.
    wait_for(lambda: not pod_exists(cluster, launcher), what="the launcher deleted", timeout=30, operator=operator)
    training = cluster.status("lost")["training"]
    counted = {cause: n for cause, n in training["interruptions"].items() if n}
    assert counted == {"nodeLost": 1} and training["restarts"] == 1
    assert cluster.status("lost")["phase"] == "Training"
    cluster.wait_events("lost", lambda events: any(e[1] == "NodeLost" and node in e[2] for e in events), operator)


@dataclass
class _Store:
    endpoint: str


def test_a_lost_node_is_acted_on_in_time_while_the_store_does_not_answer(
        cluster, operator, bucket, s3_server, node, api_client):
    """The store's pod was on the lost node: every read of it waits out the storage deadline (30 s). The node's loss
    is judged from pods and Nodes alone, so NodeLost comes at the grace period's end, not a storage deadline later."""
    proxy = FlakyS3(s3_server.endpoint)
    try:
        cluster.create_run(new_run(cluster.ns, "far", _Store(proxy.endpoint),
                                   training={"nodeLossGracePeriod": GRACE_S}))
        reach_training(cluster, bucket, "far", operator)
        mpijob = cluster.mpijob("far-train")
        worker, launcher = "far-train-worker-0", "far-train-launcher-f4r7x"
        create_training_pod(cluster, mpijob, "worker", worker, node=node)
        create_training_pod(cluster, mpijob, "launcher", launcher)
        ready = [*SCHEDULED, {"type": "Ready", "status": "True"}]
        cluster.set_pod_status(worker, phase="Running", containers=running("worker"), conditions=ready)
        cluster.set_pod_status(launcher, phase="Running", containers=running("launcher"), conditions=ready)
        wait_for(lambda: len((cluster.status("far").get("training") or {}).get("pods") or []) == 2,
                 what="both pods recorded", operator=operator)

        proxy.hold()
        since = set_node_ready(cluster.core, node, "Unknown")
        cluster.set_pod_status(worker, phase="Running", containers=running("worker"),
                               conditions=[*SCHEDULED, {"type": "Ready", "status": "False"}])
        lost = wait_for(lambda: cluster.condition("far", "NodeLost").get("status") == "True"
                        and cluster.condition("far", "NodeLost"), what="NodeLost", timeout=90, operator=operator)
        took = time.time() - since
        print(f"\nNodeLost {took:.1f} s after the node went Unknown, the store not answering "
              f"(nodeLossGracePeriod {GRACE_S} s, storage deadline 30 s)")
        assert took >= GRACE_S - 1
        # Loose: a read of the hanging store alone takes 30 s; a look that waited on one could not come this soon.
        assert took < GRACE_S + 20, f"NodeLost {took:.1f} s after the node went Unknown"
        assert lost["reason"] == "NodeNotReady" and f"{worker} on node {node} lost" in lost["message"]
        wait_for(lambda: not pod_exists(cluster, worker), what="the worker force-deleted", timeout=30,
                 operator=operator)
        training = cluster.status("far")["training"]
        assert {cause: n for cause, n in training["interruptions"].items() if n} == {"nodeLost": 1}
    finally:
        proxy.close()


STALL_S = 8  # beats come every second: room for a slow write under load


def test_a_run_whose_heartbeat_stops_is_stalled_and_restarted(cluster, operator, bucket, s3_server):
    """Beats every second keep it Training past a timeout; once they stop, Stalled names the last beat, and
    onStall restart deletes the workers and the launcher (none stands out), counted as stalled."""
    cluster.create_run(new_run(cluster.ns, "quiet", s3_server, training={"stallTimeout": STALL_S}))
    reach_training(cluster, bucket, "quiet", operator)
    heartbeat = progress_uri(cluster.run("quiet")).replace("progress.json", "heartbeat.json")
    cluster.set_mpijob_condition("quiet-train", "Running", "", "")
    mpijob = cluster.mpijob("quiet-train")
    names = ["quiet-train-worker-0", "quiet-train-worker-1", "quiet-train-launcher-q8s7d"]
    for name in names:
        role = "launcher" if "launcher" in name else "worker"
        create_training_pod(cluster, mpijob, role, name)
        cluster.set_pod_status(name, phase="Running", containers=running(role), startTime=_stamp(time.time()),
                               conditions=[*SCHEDULED, {"type": "Ready", "status": "True"}])
    started = time.time()
    step = 0
    while time.time() < started + STALL_S + 4:  # beating: past a timeout (and the look at its end) without a stall
        step += 10
        last_beat = time.time()
        bucket.put_json(heartbeat, {"phase": "training", "epoch": 1, "step": step, "time": last_beat,
                                    "attemptStarted": started, "longestGapSeconds": 1.0, "rank": 0})
        assert cluster.condition("quiet", "Stalled").get("status") != "True", cluster.condition("quiet", "Stalled")
        time.sleep(1)
    assert (cluster.status("quiet")["training"].get("heartbeat") or {}).get("step"), "the heartbeat was never read"

    stalled = wait_for(lambda: cluster.condition("quiet", "Stalled").get("reason") == "NoHeartbeat"
                       and cluster.condition("quiet", "Stalled"), what="Stalled", timeout=30, operator=operator)
    print(f"\nStalled {time.time() - last_beat:.1f} s after the last beat (stallTimeout {STALL_S} s)")
    assert time.time() >= last_beat + STALL_S
    message = stalled["message"]
    assert f"over spec.training.stallTimeout ({STALL_S}: {STALL_S} s); the last at " in message
    assert f"(phase training, epoch 1, step {step}); no pod stands out" in message
    assert "deleted quiet-train-worker-0, quiet-train-worker-1, quiet-train-launcher-q8s7d" in message
    for name in names:
        wait_for(lambda: not pod_exists(cluster, name), what=f"{name} deleted", timeout=30, operator=operator)
    training = cluster.status("quiet")["training"]
    assert {c: n for c, n in training["interruptions"].items() if n} == {"stalled": 1}
    assert cluster.status("quiet")["phase"] == "Training"
    cluster.wait_events("quiet", lambda events: any(e[1] == "Stalled" for e in events), operator)


def _stamp(unix: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix))


def test_a_node_that_gets_a_termination_taint_has_its_training_pods_deleted_with_their_grace_period_once(
        cluster, operator, bucket, s3_server, node, api_client):
    """A cloud's node-termination handler taints a node about to go: the operator sees it on its Node watch and
    deletes the training pods there with their own grace period (the kubelet's SIGTERM: the ranks checkpoint at
    their next step), with the launcher, once; counted as nodeTerminating, with a Warning Event. A pod on a node
    without the taint stays."""
    other = f"node-{uuid.uuid4().hex[:6]}"
    cluster.core.create_node({"metadata": {"name": other}})
    try:
        cluster.create_run(new_run(cluster.ns, "spot", s3_server, workers={"replicas": 2, "gpusPerWorker": 0,
                                                                           "terminationGracePeriod": "45s"}))
        reach_training(cluster, bucket, "spot", operator)
        mpijob = cluster.mpijob("spot-train")
        pods = {"spot-train-worker-0": ("worker", node), "spot-train-worker-1": ("worker", other),
                "spot-train-launcher-q8m2v": ("launcher", other)}
        ready = [*SCHEDULED, {"type": "Ready", "status": "True"}]
        for name, (role, on) in pods.items():
            body = create_training_pod(cluster, mpijob, role, name, node=on, with_grace=True)
            assert body["spec"]["terminationGracePeriodSeconds"] == 45, body["spec"]
            cluster.set_pod_status(name, phase="Running", containers=running(role), conditions=ready)
        wait_for(lambda: len((cluster.status("spot").get("training") or {}).get("pods") or []) == 3,
                 what="the three pods recorded", operator=operator)

        # A rebalance recommendation is a risk, not a notice: then the spot interruption notice.
        cluster.core.patch_node(node, {"spec": {"taints": [
            {"key": "aws-node-termination-handler/rebalance-recommendation", "effect": "PreferNoSchedule"},
            {"key": "aws-node-termination-handler/spot-itn", "effect": "NoSchedule"}]}})

        def deleting(name: str) -> dict:
            return cluster.core.read_namespaced_pod(name, cluster.ns).metadata

        worker = wait_for(lambda: deleting("spot-train-worker-0").deletion_timestamp
                          and deleting("spot-train-worker-0"), what="the worker on the tainted node deleted",
                          timeout=60, operator=operator)
        assert worker.deletion_grace_period_seconds == 45  # its own grace period, not a force-delete
        # The launcher with it (its mpirun passes SIGTERM on too), gracefully; the worker on the other node stays.
        launcher = wait_for(lambda: deleting("spot-train-launcher-q8m2v").deletion_timestamp
                            and deleting("spot-train-launcher-q8m2v"), what="the launcher deleted", timeout=30,
                            operator=operator)
        assert launcher.deletion_grace_period_seconds == 45
        assert deleting("spot-train-worker-1").deletion_timestamp is None
        training = wait_for(lambda: (cluster.status("spot").get("training") or {}).get("restarts") == 1
                            and cluster.status("spot")["training"], what="the interruption counted",
                            operator=operator)
        assert {cause: n for cause, n in training["interruptions"].items() if n} == {"nodeTerminating": 1}
        cluster.wait_events("spot", lambda events: any(
            e[:2] == ("Warning", "NodeTerminating") and "spot-train-worker-0 on node " + node in e[2]
            and "aws-node-termination-handler/spot-itn" in e[2] for e in events), operator)

        # Once: the taint seen again (removed and put back: a new notice on the watch) and a later look (a spec
        # change, reported as ignored) find the pods Terminating: nothing deleted or counted again.
        cluster.core.patch_node(node, {"spec": {"taints": None}})
        cluster.core.patch_node(node, {"spec": {"taints": [
            {"key": "aws-node-termination-handler/spot-itn", "effect": "NoSchedule"}]}})
        cluster.patch_run("spot", {"spec": {"training": {"maxEpochs": 7}}})
        wait_for(lambda: cluster.condition("spot", "SpecChangeIgnored").get("status") == "True",
                 what="a look after the taint came again", operator=operator)
        assert len([e for e in cluster.events("spot") if e[1] == "NodeTerminating"]) == 1
        assert cluster.status("spot")["training"]["interruptions"]["nodeTerminating"] == 1
        assert deleting("spot-train-worker-1").deletion_timestamp is None
    finally:
        cluster.core.delete_node(other)
