"""Preemption notices from Nodes, pure (decide/nodes.py): a launcher or worker on a node that a cloud's
node-termination handler tainted is one to delete gracefully now, so that its ranks checkpoint at their next step
before the node goes."""

from __future__ import annotations

import pytest

from scalingrun_operator.decide import nodes
from tests.support.decide_pods import pod

MPIJOB = "demo-train"


def node(name: str, *taints: str) -> dict:
    return {"metadata": {"name": name}, "spec": {"taints": [{"key": key, "effect": "NoSchedule"} for key in taints]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def on(found: dict, node_name: str) -> dict:
    found["spec"]["nodeName"] = node_name
    return found


def training() -> list[dict]:
    return [on(pod("demo-train-launcher-aaaaa", "launcher"), "node-a"), on(pod("demo-train-worker-0", "worker"), "node-a"),
            on(pod("demo-train-worker-1", "worker"), "node-b"), pod("demo-train-worker-2", "worker")]


@pytest.mark.parametrize("taint, what", [
    ("cloud.google.com/impending-node-termination", "GKE's notice of the node's termination"),
    ("aws-node-termination-handler/spot-itn", "an AWS spot interruption notice"),
    ("aws-node-termination-handler/scheduled-maintenance", "an AWS scheduled maintenance event"),
    ("aws-node-termination-handler/asg-lifecycle-termination", "an AWS Auto Scaling group's termination"),
])
def test_a_pod_on_a_node_with_a_termination_taint_is_noticed_with_the_cause(taint, what):
    pods = training()
    noticed = nodes.noticed_pods(pods, {"node-a": node("node-a"), "node-b": node("node-b", "other", taint)}, MPIJOB)
    assert [(nodes.pod_name(n.pod), n.node, n.why) for n in noticed] == [
        ("demo-train-worker-1", "node-b", f"node node-b has the taint {taint} ({what})")]
    # The launcher too: its mpirun passes SIGTERM on to the ranks, which checkpoint as a worker's would.
    noticed = nodes.noticed_pods(pods, {"node-a": node("node-a", taint)}, MPIJOB)
    assert [(nodes.pod_name(n.pod), n.node) for n in noticed] == [("demo-train-launcher-aaaaa", "node-a"),
                                                                  ("demo-train-worker-0", "node-a")]


def test_no_notice_without_a_termination_taint_or_for_a_pod_already_terminating_or_ended():
    pods = training()
    healthy = {"node-a": node("node-a", "nvidia.com/gpu", "aws-node-termination-handler/rebalance-recommendation"),
               "node-b": node("node-b")}
    assert nodes.noticed_pods(pods, healthy, MPIJOB) == []  # a rebalance recommendation is a risk, not a notice
    going = {"node-a": node("node-a", "cloud.google.com/impending-node-termination")}
    pods[0]["metadata"]["deletionTimestamp"] = pods[1]["metadata"]["deletionTimestamp"] = "2026-01-01T12:05:00Z"
    assert nodes.noticed_pods(pods, going, MPIJOB) == []  # their SIGTERM is on its way; node-b has no notice
    pods[1]["metadata"].pop("deletionTimestamp")
    pods[1]["status"]["phase"] = "Succeeded"
    assert nodes.noticed_pods(pods, going, MPIJOB) == []
