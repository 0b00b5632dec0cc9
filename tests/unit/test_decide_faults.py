"""decide_run on the faults a training survives (issue 29): each interruption counted under its cause and
against its limit (the code's failures against backoffLimit, the infrastructure's against maxInterruptions)."""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest

from tests.unit.decide_world import World, conditions, stamp, training_status
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
