"""decide_run on the faults a training survives (issue 29): each interruption counted under its cause and
against its limit (the code's failures against backoffLimit, the infrastructure's against maxInterruptions)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Optional

import pytest

from scalingrun_operator.decide.snapshot import Node
from tests.unit.decide_world import actions, condition, conditions, stamp, training_status
from tests.unit.test_decide_run import RECORDS, training, training_pods
from tests.unit.test_pods import pod, waiting


def _status(**counts: int) -> dict:
    """A run in Training whose past interruptions are `counts` (by cause)."""
    return training_status(pods=copy.deepcopy(RECORDS), restarts=sum(counts.values()), interruptions=counts)


def _terminating(name: str, uid: str, reason: str = "") -> dict:
    found = pod(name, "worker", uid=uid, conditions=[{"type": "DisruptionTarget", "status": "True",
                                                      "reason": reason}] if reason else None)
    found["metadata"]["deletionTimestamp"] = stamp(0)
    found["spec"]["nodeName"] = "node-1"
    return found


def _worker1(found: dict) -> list[dict]:
    return [*training_pods()[:2], found]


# (what happened, the pods as they are now, the cause it is counted under)
CAUSES: list[tuple[str, Callable[[], list[dict]], str]] = [
    ("a worker deleted", lambda: training_pods()[:2], "podDeleted"),
    ("a worker being deleted", lambda: _worker1(_terminating("demo-train-worker-1", "w1-a")), "podDeleted"),
    ("a worker evicted for node pressure",
     lambda: _worker1(pod("demo-train-worker-1", "worker", uid="w1-a", phase="Failed", reason="Evicted",
                          message="The node was low on resource: memory.")), "evicted"),
    ("a worker preempted by the scheduler",
     lambda: _worker1(_terminating("demo-train-worker-1", "w1-a", "PreemptionByScheduler")), "evicted"),
    ("a worker evicted through the eviction API (a drain)",
     lambda: _worker1(_terminating("demo-train-worker-1", "w1-a", "EvictionByEvictionAPI")), "evicted"),
    ("a worker deleted by the taint manager (its node unreachable)",
     lambda: _worker1(_terminating("demo-train-worker-1", "w1-a", "DeletionByTaintManager")), "nodeLost"),
    ("a worker that failed as its node shut down",
     lambda: _worker1(pod("demo-train-worker-1", "worker", uid="w1-a", phase="Failed", reason="NodeShutdown",
                          message="Pod was terminated in response to imminent node shutdown.")), "evicted"),
    ("a launcher that exited 1 and restarted", lambda: training_pods(launcher_restarts=1), "launcherFailed"),
    ("a worker container that crashed",
     lambda: training_pods(containers=waiting("worker", "CrashLoopBackOff", restarts=1,
                                              last={"exitCode": 2, "reason": "Error"})), "workerFailed"),
]
CODE = {"launcherFailed", "workerFailed"}


@pytest.mark.parametrize("what,pods,cause", CAUSES, ids=[c[0] for c in CAUSES])
def test_each_interruption_is_counted_under_its_cause(what, pods, cause):
    decision = training(pods=pods()).decide()
    assert decision.phase == "Training"
    counted = decision.desired["training"]
    assert counted["interruptions"] == {cause: 1} and counted["restarts"] == 1


@pytest.mark.parametrize("what,pods,cause", CAUSES, ids=[c[0] for c in CAUSES])
def test_each_cause_counts_against_its_own_limit_only(what, pods, cause):
    """backoffLimit and maxInterruptions are 2 in the world's spec: the third of a kind fails the run, and the
    other limit used up to the full does not."""
    other = "podDeleted" if cause in CODE else "launcherFailed"
    decision = training(status=_status(**{other: 2}), pods=pods()).decide()
    assert decision.phase == "Training", conditions(decision).get("Failed")

    decision = training(status=_status(**{cause: 2}), pods=pods()).decide()
    assert decision.phase == "Failed"
    status, reason, message = conditions(decision)["Failed"]
    if cause in CODE:
        assert reason == "BackoffLimitExceeded"
        assert message.startswith("3 failures of the training's code (a container that exited non-zero on a healthy "
                                  "node) exceed spec.training.backoffLimit (2); the last: ")
    else:
        assert reason == "MaxInterruptionsExceeded"
        assert message.startswith(f"3 interruptions by the infrastructure ({cause} 3) exceed "
                                  "spec.training.maxInterruptions (2); the last: ")
    assert decision.desired["training"]["interruptions"][cause] == 3


def test_a_deleted_mpijob_counts_against_max_interruptions_not_the_backoff_limit():
    world = training(status=_status(launcherFailed=2))
    world.children.pop("MPIJob")
    decision = world.decide()
    assert decision.phase == "Training" and decision.again
    assert decision.desired["training"]["interruptions"] == {"launcherFailed": 2, "childDeleted": 1}
    assert "counted as interruption 1 of the 2 allowed (spec.training.maxInterruptions)" in (
        conditions(decision)["ChildDeleted"][2])


def test_a_lost_worker_and_its_launcher_restart_are_one_interruption_of_the_workers_cause():
    """The launcher's non-zero exit that a deleted worker causes is no failure of the code."""
    lost = [training_pods(launcher_restarts=1)[0], training_pods()[1]]
    decision = training(pods=lost).decide()
    assert decision.desired["training"]["interruptions"] == {"podDeleted": 1}


# --- lost nodes ------------------------------------------------------------------------------------------


def _node(ready: str, seconds_ago: float) -> dict:
    return {"metadata": {"name": "node-2"}, "status": {"conditions": [
        {"type": "Ready", "status": ready, "reason": "NodeStatusUnknown", "lastTransitionTime": stamp(seconds_ago / 60)}]}}


def _on_node_2(ready: str = "False", deleting_ago: Optional[float] = None, disruption: str = "") -> list[dict]:
    """The training's pods, worker 1 on node-2 and marked not Ready (as the node lifecycle controller does)."""
    found = training_pods()
    worker = found[2]
    worker["spec"]["nodeName"] = "node-2"
    worker["status"]["conditions"] = [{"type": "Ready", "status": ready}]
    if disruption:
        worker["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True", "reason": disruption})
    if deleting_ago is not None:
        worker["metadata"]["deletionTimestamp"] = stamp(deleting_ago / 60)
    return found


LOST_WORKER = [("delete", "demo-train-worker-1"), ("delete", "demo-train-launcher-aaaaa")]


@dataclass
class NodeRow:
    name: str
    pods: Callable[[], list[dict]]
    node: Optional[dict]
    deleted: list
    counted: dict
    recheck: Optional[float] = None
    condition: str = ""  # words of NodeLost's message; '' for no NodeLost condition


NODE_ROWS = [
    NodeRow("a node Unknown for less than the grace period: not yet, look again when it ends",
            _on_node_2, _node("Unknown", 30), [], {}, recheck=31),
    NodeRow("a node Unknown past the grace period: its pods force-deleted, the launcher restarted",
            _on_node_2, _node("Unknown", 90), LOST_WORKER, {"nodeLost": 1},
            condition="demo-train-worker-1 on node node-2 lost: node node-2 has been Ready=Unknown since 12:08:30 UTC "
                      "(90 s, over spec.training.nodeLossGracePeriod 60 s); force-deleted (grace 0"),
    NodeRow("a node NotReady past the grace period",
            _on_node_2, _node("False", 61), LOST_WORKER, {"nodeLost": 1}, condition="has been Ready=False"),
    NodeRow("a node whose object is gone", _on_node_2, None, LOST_WORKER, {"nodeLost": 1},
            condition="node node-2 has been gone (the Node object was deleted"),
    NodeRow("a pod evicted by the taint manager, Terminating past its grace on a node Unknown for less",
            lambda: _on_node_2(deleting_ago=5, disruption="DeletionByTaintManager"), _node("Unknown", 20),
            LOST_WORKER, {"nodeLost": 1}, condition="is Terminating past its grace period (ended 12:09:55 UTC) on node "
                                                    "node-2, which is Ready=Unknown"),
    NodeRow("a pod Terminating within its grace on a node Unknown for less: both ends awaited",
            lambda: _on_node_2(deleting_ago=-10, disruption="DeletionByTaintManager"), _node("Unknown", 20),
            [], {"nodeLost": 1}, recheck=11),
    NodeRow("a pod Terminating on a Ready node past its grace plus the node loss grace period",
            lambda: _on_node_2(deleting_ago=61), _node("True", 600), LOST_WORKER, {"podDeleted": 1},
            condition="is still Terminating 61 s past its grace period"),
    NodeRow("a pod Terminating on a Ready node, less than that: look again then",
            lambda: _on_node_2(deleting_ago=30), _node("True", 600), [], {"podDeleted": 1}, recheck=31),
    NodeRow("a pod not Ready on a Ready node is no node's loss", _on_node_2, _node("True", 600), [], {}),
]


@pytest.mark.parametrize("row", NODE_ROWS, ids=[r.name for r in NODE_ROWS])
def test_pods_lost_with_their_node(row: NodeRow):
    world = training(pods=row.pods(), nodes={"node-2": row.node} if row.node else {})
    decision = world.decide()
    assert decision.phase == "Training"
    assert actions(decision) == row.deleted
    assert [a.grace_seconds for a in decision.actions] == [0, None][:len(row.deleted)]
    assert decision.desired["training"].get("interruptions", {}) == row.counted
    assert decision.recheck_in == (pytest.approx(row.recheck, abs=0.01) if row.recheck else None)
    found = conditions(decision).get("NodeLost")
    if row.condition:
        ready = bool(row.node) and row.node["status"]["conditions"][0]["status"] == "True"
        assert found[:2] == ("True", "TerminatingPastGrace" if ready else "NodeNotReady")
        assert row.condition in found[2], found[2]
        assert "NodeLost" in [e.reason for e in decision.events]
        records = {r["name"]: r["lost"] for r in decision.desired["training"]["pods"]}
        assert records["demo-train-worker-1"] and records["demo-train-launcher-aaaaa"]
    else:
        assert found is None


def test_a_healthy_run_reads_no_node():
    world = training()
    world.decide()
    assert not [a for a in world.asks if isinstance(a, Node)]


def test_a_lost_node_already_counted_is_not_counted_again_and_past_the_limit_fails_the_run():
    records = copy.deepcopy(RECORDS)
    records[2]["lost"] = True
    world = training(status=training_status(pods=records, restarts=1, interruptions={"nodeLost": 1}),
                     pods=_on_node_2(), nodes={"node-2": _node("Unknown", 90)})
    decision = world.decide()
    assert ("delete", "demo-train-worker-1") in actions(decision)
    assert decision.desired["training"]["interruptions"] == {"nodeLost": 1}

    world = training(status=_status(nodeLost=2), pods=_on_node_2(), nodes={"node-2": _node("Unknown", 90)})
    decision = world.decide()
    assert decision.phase == "Failed"
    assert conditions(decision)["Failed"][1] == "MaxInterruptionsExceeded"
    assert "(nodeLost 3)" in conditions(decision)["Failed"][2]


def test_node_lost_turns_false_once_the_training_runs_again():
    pods = training_pods()
    for p in pods:
        p["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    world = training(status=training_status(condition("NodeLost", "True", "NodeNotReady", "worker lost"),
                                            pods=copy.deepcopy(RECORDS)), pods=pods)
    assert conditions(world.decide())["NodeLost"][:2] == ("False", "PodsRunning")
