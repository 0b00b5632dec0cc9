"""decide_run on the faults a training survives (issue 29): each interruption counted under its cause and
against its limit (the code's failures against backoffLimit, the infrastructure's against maxInterruptions)."""

from __future__ import annotations

import copy
import datetime as dt
from dataclasses import dataclass, field
from typing import Callable, Optional

import pytest

from scalingrun_api.status_push import HEARTBEAT, PROGRESS
from scalingrun_operator.decide.snapshot import Document, Nodes, Settings
from tests.support.decide_world import (
    NOW, World, actions, condition, conditions, config_map, done, job, mpijob, preprocessing_status, stamp,
    training_status,
)
from tests.support.decide_run import RECORDS, training, training_pods
from tests.support.decide_pods import pod, waiting


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
    ("a launcher whose stall watch ended mpirun (exit 75: a peer stopped answering)",
     lambda: _launcher_exit(75), "stalled"),
    ("a worker container that crashed",
     lambda: training_pods(containers=waiting("worker", "CrashLoopBackOff", restarts=1,
                                              last={"exitCode": 2, "reason": "Error"})), "workerFailed"),
]
CODE = {"launcherFailed", "workerFailed"}


def _launcher_exit(code: int) -> list[dict]:
    found = training_pods(launcher_restarts=1)
    found[0]["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] = code
    return found


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
    assert not [a for a in world.asks if isinstance(a, Nodes) and a.names]


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


# --- stalls ------------------------------------------------------------------------------------------------


def _unix(minutes_ago: float) -> float:
    return (NOW - dt.timedelta(minutes=minutes_ago)).timestamp()


def beat(minutes_ago: float, gap: float = 0.0, **changes) -> dict:
    return {"phase": "training", "epoch": 2, "step": 120, "time": _unix(minutes_ago), "attemptStarted": _unix(30),
            "longestGapSeconds": gap, "rank": 0, **changes}


def stalling(started_ago: float = 30, heartbeat: Optional[dict] = None, pods: Optional[list] = None,
             status: Optional[dict] = None, **training_spec) -> World:
    """A run in Training whose launcher started `started_ago` minutes ago; `training_spec` sets spec.training."""
    found = pods or training_pods()
    found[0]["status"]["startTime"] = stamp(started_ago)
    found[0]["status"]["containerStatuses"][0]["state"] = {"running": {"startedAt": stamp(started_ago)}}
    world = training(pods=found, heartbeat=heartbeat, **({"status": status} if status else {}))
    if training_spec:
        world.pinned = False
        world.spec["training"].update(training_spec)
    return world


ALL_RESTARTED = [("delete", "demo-train-worker-0"), ("delete", "demo-train-worker-1"),
                 ("delete", "demo-train-launcher-aaaaa")]


@dataclass
class StallRow:
    name: str
    world: Callable[[], World]
    stalled: bool
    recheck: Optional[float] = None
    words: str = ""
    deleted: list = field(default_factory=lambda: list(ALL_RESTARTED))


STALL_ROWS = [
    StallRow("auto: a beat 5 min ago is within the 10 min floor", lambda: stalling(heartbeat=beat(5)), False, 301),
    StallRow("auto: no beat for 11 min is a stall", lambda: stalling(heartbeat=beat(11)), True,
             words="no heartbeat for 660 s, over spec.training.stallTimeout (auto: 600 s); the last at "
                   "2026-01-01T11:59:00Z (phase training, epoch 2, step 120); no pod stands out"),
    StallRow("auto: 3x the longest gap seen (5 min) wins over the floor", lambda: stalling(heartbeat=beat(11, gap=300)),
             False, 241),
    StallRow("auto: 3x the longest gap, passed", lambda: stalling(heartbeat=beat(16, gap=300)), True,
             words="over spec.training.stallTimeout (auto: 900 s)"),
    StallRow("5m: a beat late by less", lambda: stalling(heartbeat=beat(4), stallTimeout="5m"), False, 61),
    StallRow("5m: a beat late by more", lambda: stalling(heartbeat=beat(6), stallTimeout="5m"), True,
             words="no heartbeat for 360 s, over spec.training.stallTimeout (5m: 300 s)"),
    StallRow("no beat yet: counted from the launcher's start", lambda: stalling(started_ago=5), False, 301),
    StallRow("no beat since the launcher started 11 min ago", lambda: stalling(started_ago=11), True,
             words="none since launcher pod demo-train-launcher-aaaaa started at 2026-01-01T11:59:00Z"),
    StallRow("a team's command that never beats is not taken as stalled for it",
             lambda: stalling(started_ago=11, command=["python", "-m", "team.train"]), False, 601),
    StallRow("a team's command that beats is held to the timeout",
             lambda: stalling(heartbeat=beat(11), command=["python", "-m", "team.train"]), True,
             words="no heartbeat for 660 s"),
    StallRow("an earlier attempt's beat does not count for this one",
             lambda: stalling(started_ago=5, heartbeat=beat(20)), False, 301),
    StallRow("a writer's clock ahead of the operator's is taken as now",
             lambda: stalling(heartbeat=beat(-3)), False, 601),
    StallRow("a suspect: only it and the launcher are restarted",
             lambda: _with_node(stalling(heartbeat=beat(11), pods=_on_node_2()), _node("True", 600)), True,
             words="suspects: demo-train-worker-1 (not Ready)",
             deleted=[("delete", "demo-train-worker-1"), ("delete", "demo-train-launcher-aaaaa")]),
]


def _with_node(world: World, node: dict) -> World:
    world.nodes["node-2"] = node
    return world


@pytest.mark.parametrize("row", STALL_ROWS, ids=[r.name for r in STALL_ROWS])
def test_a_stall_is_told_from_a_slow_run(row: StallRow):
    world = row.world()
    decision = world.decide()
    assert decision.phase == "Training"
    stalled = conditions(decision).get("Stalled")
    if not row.stalled:
        assert stalled is None and actions(decision) == []
        assert decision.recheck_in == pytest.approx(row.recheck, abs=0.01)
        assert decision.desired["training"]["heartbeat"]["deadline"]
        return
    assert stalled[:2] == ("True", "NoHeartbeat") and row.words in stalled[2], stalled[2]
    assert "launcher log: line 1\nline 2" in stalled[2]
    assert actions(decision) == row.deleted
    assert "(spec.training.onStall restart; interruption 1 of the 2 allowed by spec.training.maxInterruptions)" in (
        stalled[2])
    assert decision.desired["training"]["interruptions"] == {"stalled": 1}
    assert [e.reason for e in decision.events] == ["Stalled"]
    assert decision.desired["training"]["heartbeat"] is None


def test_off_reads_no_heartbeat():
    world = stalling(heartbeat=beat(600), stallTimeout=0)
    decision = world.decide()
    assert "Stalled" not in conditions(decision) and actions(decision) == []
    assert not [a for a in world.asks if isinstance(a, Document) and a.what == HEARTBEAT]


def test_the_heartbeat_is_read_again_only_once_its_deadline_passed():
    first = stalling(heartbeat=beat(5))
    status = copy.deepcopy(first.status)
    status["training"]["heartbeat"] = first.decide().desired["training"]["heartbeat"]
    again = stalling(heartbeat=beat(5), status=status)
    decision = again.decide()
    assert not [a for a in again.asks if isinstance(a, Document) and a.what == HEARTBEAT]
    assert decision.recheck_in == pytest.approx(301, abs=0.01)


def test_on_stall_fail_fails_the_run_and_suspends_its_mpijob():
    decision = stalling(heartbeat=beat(11), onStall="fail").decide()
    assert decision.phase == "Failed"
    status, reason, message = conditions(decision)["Failed"]
    assert reason == "TrainingStalled" and "no heartbeat for 660 s" in message
    assert message.endswith("spec.training.onStall is fail")
    assert actions(decision) == [("patch", "MPIJob")]


def test_a_stall_past_max_interruptions_fails_the_run():
    status = _status(stalled=2)
    decision = stalling(heartbeat=beat(11), status=status).decide()
    assert decision.phase == "Failed"
    assert conditions(decision)["Failed"][:2] == ("True", "MaxInterruptionsExceeded")


def test_stalled_turns_false_once_a_new_attempt_runs():
    """Not at its first beat (a first graph build may take minutes): kstatus (Flux) reads Stalled as failed."""
    status = training_status(condition("Stalled", "True", "NoHeartbeat", "no heartbeat for 660 s"),
                             pods=copy.deepcopy(RECORDS))
    decision = stalling(started_ago=1, status=status).decide()
    assert conditions(decision)["Stalled"] == (
        "False", "Restarted", "launcher pod demo-train-launcher-aaaaa runs a new attempt since 2026-01-01T12:09:00Z; "
        "before: no heartbeat for 660 s")


def test_a_launcher_container_restarted_is_a_new_attempt():
    world = stalling(started_ago=30, heartbeat=beat(12))
    world.pods[0]["status"]["containerStatuses"][0]["state"] = {"running": {"startedAt": stamp(2)}}
    decision = world.decide()
    assert "Stalled" not in conditions(decision)
    assert decision.recheck_in == pytest.approx(481, abs=0.01)


# --- the preprocessing's deadline ------------------------------------------------------------------------------


def test_a_preprocessing_job_past_its_deadline_fails_the_run_naming_the_deadline():
    world = World(status=preprocessing_status(), children={"ConfigMap": config_map(), "Job": job(done(
        "Failed", "DeadlineExceeded", "Job was active longer than specified deadline"), failed=2)})
    world.pinned = False
    world.spec["dataset"]["preprocessing"]["activeDeadlineSeconds"] = 3600
    decision = world.decide()
    assert decision.phase == "Failed"
    status, reason, message = conditions(decision)["Failed"]
    assert reason == "PreprocessingFailed"
    assert message.startswith("Job demo-preprocess failed (DeadlineExceeded: Job was active longer than specified "
                              "deadline); it ran past spec.dataset.preprocessing.activeDeadlineSeconds (3600 s); raise "
                              "it (or spec.dataset.preprocessing.parallelism) and recreate the run")


def test_an_mpijob_past_its_deadline_fails_the_run_naming_the_deadline():
    world = training(children={"ConfigMap": config_map(), "MPIJob": mpijob(done(
        "Failed", "DeadlineExceeded", "MPIJob ml/demo-train has failed because it was active longer than specified "
        "deadline"))})
    decision = world.decide()
    assert decision.phase == "Failed"
    assert "epoch 2 of 5; it ran past spec.runPolicy.activeDeadlineSeconds (the training's deadline); raise it" in (
        conditions(decision)["Failed"][2])


def test_a_lost_node_and_the_stall_it_causes_in_the_same_look_are_one_interruption():
    world = _with_node(stalling(heartbeat=beat(11), pods=_on_node_2()), _node("Unknown", 90))
    decision = world.decide()
    assert decision.desired["training"]["interruptions"] == {"nodeLost": 1}
    assert actions(decision) == LOST_WORKER and "Stalled" not in conditions(decision)


@pytest.mark.parametrize("node", [_node("Unknown", 30), _node("False", 5)], ids=["Unknown", "NotReady"])
def test_a_stall_on_a_node_down_within_its_grace_is_left_to_the_lost_node_handling(node):
    """stallTimeout passed while worker 1's node is down, not yet for nodeLossGracePeriod: no Stalled and no
    deletion now; the look at the grace period's end counts it once, as nodeLost."""
    world = _with_node(stalling(heartbeat=beat(11), pods=_on_node_2()), node)
    decision = world.decide()
    assert "Stalled" not in conditions(decision) and actions(decision) == []
    since = node["status"]["conditions"][0]["lastTransitionTime"]
    ago = (NOW - dt.datetime.strptime(since, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)).total_seconds()
    assert decision.recheck_in == pytest.approx(60 - ago + 1, abs=0.01)  # the grace period's end, not a poll
    later = _with_node(stalling(heartbeat=beat(12), pods=_on_node_2()), _node("Unknown", 61))
    decision = later.decide()
    assert decision.desired["training"]["interruptions"] == {"nodeLost": 1}
    assert actions(decision) == LOST_WORKER and "Stalled" not in conditions(decision)


@pytest.mark.parametrize("node, lost", [(_node("Unknown", 30), False), (_node("Unknown", 90), True), (None, True)],
                         ids=["within", "past", "gone"])
def test_a_node_down_is_judged_from_pods_and_nodes_without_reading_storage(node, lost):
    """The store may be on the lost node (each read then waits out the storage deadline): while a training pod's node
    is down, a look reads neither progress nor heartbeat, and Trained stays as shown."""
    world = stalling(heartbeat=beat(11), pods=_on_node_2())
    if node:
        _with_node(world, node)
    shown = {c["type"]: (c["status"], c["reason"], c["message"]) for c in world.status["conditions"]}
    decision = world.decide()
    assert not [a for a in world.asks if isinstance(a, Document)], world.asks
    assert decision.phase == "Training"
    assert conditions(decision)["Trained"] == shown["Trained"]
    assert (actions(decision) == LOST_WORKER) == lost


def test_a_healthy_run_reads_its_progress():
    world = training()
    world.decide()
    assert [a for a in world.asks if isinstance(a, Document) and a.what == PROGRESS]


def _tainted(*keys: str) -> dict:
    return {"metadata": {"name": "node-2"}, "spec": {"taints": [{"key": k, "effect": "NoSchedule"} for k in keys]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def _healthy_on_node_2() -> list[dict]:
    return _on_node_2(ready="True")


def test_pods_on_a_node_with_a_termination_taint_are_deleted_with_their_grace_once():
    world = training(pods=_healthy_on_node_2(),
                     nodes={"node-2": _tainted("cloud.google.com/impending-node-termination")})
    decision = world.decide()
    # Gracefully (None: the pod's own grace period), the launcher with the worker; counted once, a Warning Event.
    assert actions(decision) == LOST_WORKER and [a.grace_seconds for a in decision.actions] == [None, None]
    assert decision.desired["training"]["interruptions"] == {"nodeTerminating": 1}
    assert decision.desired["training"]["restarts"] == 1 and decision.phase == "Training"
    events = [e for e in decision.events if e.reason == "NodeTerminating"]
    assert len(events) == 1 and events[0].type == "Warning"
    assert events[0].message.startswith("demo-train-worker-1 on node node-2: node node-2 has the taint "
                                        "cloud.google.com/impending-node-termination (GKE's notice")
    # The next look sees them Terminating: nothing deleted or counted again.
    terminating = _on_node_2(ready="True", deleting_ago=-40)
    terminating[0]["metadata"]["deletionTimestamp"] = stamp(-40 / 60)  # the launcher too
    status = training_status(pods=decision.desired["training"]["pods"], restarts=1,
                             interruptions={"nodeTerminating": 1})
    again = training(status=status, pods=terminating,  # the launcher's node-1 is there (no NodeLost)
                     nodes={"node-1": _tainted(), "node-2": _tainted("cloud.google.com/impending-node-termination")}
                     ).decide()
    assert actions(again) == [] and again.desired["training"]["interruptions"] == {"nodeTerminating": 1}
    assert not [e for e in again.events if e.reason == "NodeTerminating"]


def test_a_node_without_a_termination_taint_deletes_nothing():
    world = training(pods=_healthy_on_node_2(),
                     nodes={"node-2": _tainted("aws-node-termination-handler/rebalance-recommendation")})
    decision = world.decide()
    assert actions(decision) == [] and not decision.desired["training"].get("interruptions", {}).get(
        "nodeTerminating")


PUSH = Settings(reads_storage=False)


def _with_status_volume(found: list[dict]) -> list[dict]:
    """The pods as an operator with the push path makes them: the status token's volume mounted."""
    from scalingrun_operator.builders.common import status_volume
    for p in found:
        p["spec"]["volumes"] = [status_volume()[0]]
    return found


def test_with_push_on_a_training_that_pushes_nothing_is_judged_stalled():
    decision = stalling(started_ago=11, pods=_with_status_volume(training_pods())).decide(PUSH)
    assert conditions(decision)["Stalled"][:2] == ("True", "NoHeartbeat")


def test_with_push_on_the_pods_as_the_watch_keeps_them_a_silent_training_is_judged_stalled():
    """The operator's pod watch keeps trimmed pods (cluster/k8s.py): their volumes' names must survive, or every
    training looks made before the push path and is never judged stalled, nor waited for at its end."""
    from scalingrun_operator.cluster.k8s import trimmed_pod

    pods = [trimmed_pod(p) for p in _with_status_volume(training_pods())]
    decision = stalling(started_ago=11, pods=pods).decide(PUSH)
    assert conditions(decision)["Stalled"][:2] == ("True", "NoHeartbeat")


def test_with_push_on_a_training_made_before_the_push_path_is_never_judged_stalled():
    """Upgraded with the run in flight: its pods mount no status token, so no beat can come; a restart would make
    the same pods again (its MPIJob's template). It trains on, untouched."""
    decision = stalling(started_ago=11).decide(PUSH)
    assert "Stalled" not in conditions(decision) and actions(decision) == []
    assert decision.phase == "Training"


def test_with_push_on_a_training_made_before_the_push_path_ends_on_its_mpijob_without_waiting():
    world = training(children={"ConfigMap": config_map(), "Job": job(done("Complete"), succeeded=2),
                               "MPIJob": mpijob(done("Succeeded", minutes_ago=0.1))}, progress=None)
    assert world.decide(PUSH).phase == "Succeeded"
    world = training(children={"ConfigMap": config_map(), "Job": job(done("Complete"), succeeded=2),
                               "MPIJob": mpijob(done("Succeeded", minutes_ago=0.1))}, progress=None,
                     pods=_with_status_volume(training_pods()))
    decision = world.decide(PUSH)  # its final push may still come: waited for, within the grace
    assert decision.phase == "Training" and conditions(decision)["Trained"][1] == "WaitingForProgress"


def test_with_push_on_silence_counts_from_the_operators_start_at_the_earliest():
    """Pushed beats live in the operator's memory: one that started a minute ago (a restart, or a `helm upgrade`
    from pull mode) gives the pods the whole timeout to push, however long ago their launcher started."""
    world = stalling(started_ago=30, pods=_with_status_volume(training_pods()))
    decision = world.decide(Settings(reads_storage=False, pushes_since=NOW - dt.timedelta(minutes=1)))
    assert "Stalled" not in conditions(decision) and actions(decision) == []
    assert decision.recheck_in == pytest.approx(9 * 60 + 1, abs=0.01)
    later = stalling(started_ago=30, pods=_with_status_volume(training_pods()))
    decision = later.decide(Settings(reads_storage=False, pushes_since=NOW - dt.timedelta(minutes=11)))
    assert conditions(decision)["Stalled"][:2] == ("True", "NoHeartbeat")
