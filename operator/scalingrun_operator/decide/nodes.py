"""Lost nodes, pure: which of the training's pods are lost with their node, and when to look again.

A pod on a node that is NotReady or Unknown keeps reading Running in the API; once the taint manager evicts it, it
stays Terminating for as long as the node is away, and the MPI operator cannot make a pod of that name meanwhile.
So a launcher or worker pod is lost when its node has been NotReady/Unknown for spec.training.nodeLossGracePeriod,
when it is Terminating past its grace period on such a node, or when it is Terminating longer than its grace
period plus nodeLossGracePeriod wherever it is (a frozen process that ignores SIGTERM, a kubelet that never
confirms). The operator then deletes it with grace 0: its node is not there to confirm.

A Node is read only for a pod that looks troubled (not Ready, or Terminating): a healthy run reads none. When a
node goes away, the node lifecycle controller marks its pods not Ready, and that pod event starts the look.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from .pod_facts import TRAINING_ROLES, metadata_of, pod_name, pod_role, status_of
from .status import parse_time


@dataclass(frozen=True)
class LostPod:
    pod: dict[str, Any]
    role: str
    node: str
    why: str  # 'node node-1 has been Ready=Unknown since ... (92 s, over spec.training.nodeLossGracePeriod 60 s)'


def node_down(node: Optional[dict[str, Any]]) -> Optional[tuple[str, Optional[dt.datetime]]]:
    """(how it is down, since when) for a Node that is NotReady or Unknown or gone; None while it is Ready.
    A node without a Ready condition is taken as Ready (it has not reported yet)."""
    if node is None:
        return "gone (the Node object was deleted)", None
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            if condition.get("status") == "True":
                return None
            return f"Ready={condition.get('status')}", parse_time(condition.get("lastTransitionTime"))
    return None


def pod_ready(pod: dict[str, Any]) -> Optional[bool]:
    for condition in status_of(pod).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return None


def troubled(pod: dict[str, Any]) -> bool:
    """A scheduled pod that is Terminating or whose Ready condition is not True: its node is worth a look."""
    if not (pod.get("spec") or {}).get("nodeName") or status_of(pod).get("phase") in ("Succeeded", "Failed"):
        return False
    return bool(metadata_of(pod).get("deletionTimestamp")) or pod_ready(pod) is False


def troubled_nodes(pods: list[dict[str, Any]], mpijob: str) -> tuple[str, ...]:
    """The nodes of the training's troubled pods: the only Nodes a look reads."""
    return tuple(sorted({p["spec"]["nodeName"] for p in pods if pod_role(p, mpijob) in TRAINING_ROLES and troubled(p)}))


def nodes_down(pods: list[dict[str, Any]], found_nodes: dict[str, Optional[dict[str, Any]]], mpijob: str) -> bool:
    """Whether a troubled training pod is on a node that is NotReady, Unknown or gone (within its grace or past it):
    the lost-node handling owns that fault, and the look reads no storage (the store may be on that node)."""
    return any(pod_role(p, mpijob) in TRAINING_ROLES and troubled(p)
               and node_down(found_nodes.get(p["spec"]["nodeName"])) is not None for p in pods)


def _seconds(delta: dt.timedelta) -> str:
    return f"{delta.total_seconds():.0f} s"


def lost_pods(pods: list[dict[str, Any]], found_nodes: dict[str, Optional[dict[str, Any]]], now: dt.datetime,
              grace_seconds: float, mpijob: str) -> tuple[list[LostPod], Optional[float]]:
    """The training's pods lost with their node (or stuck Terminating), and the seconds until the next one may be
    (None: no pod is on its way there). `found_nodes`: the Nodes of troubled_nodes(pods) by name."""
    grace = dt.timedelta(seconds=grace_seconds)
    lost: list[LostPod] = []
    waits: list[float] = []
    for pod in sorted(pods, key=pod_name):
        role = pod_role(pod, mpijob)
        if role not in TRAINING_ROLES or not troubled(pod):
            continue
        name, node_name = pod_name(pod), pod["spec"]["nodeName"]
        deleting = parse_time(metadata_of(pod).get("deletionTimestamp"))  # when its grace period ends
        down = node_down(found_nodes.get(node_name))
        if down is not None:
            how, since = down
            age = now - since if since else grace
            if age >= grace:
                lost.append(LostPod(pod, role, node_name, f"node {node_name} has been {how}"
                                    + (f" since {since:%H:%M:%S} UTC ({_seconds(age)}" if since else " (")
                                    + f", over spec.training.nodeLossGracePeriod {grace_seconds:g} s)"))
                continue
            if deleting is not None and now >= deleting:
                lost.append(LostPod(pod, role, node_name, f"pod {name} is Terminating past its grace period "
                                    f"(ended {deleting:%H:%M:%S} UTC) on node {node_name}, which is {how}"))
                continue
            waits.append((grace - age).total_seconds())
            if deleting is not None:
                waits.append((deleting - now).total_seconds())
        elif deleting is not None:
            if now >= deleting + grace:
                lost.append(LostPod(pod, role, node_name, f"pod {name} is still Terminating {_seconds(now - deleting)} "
                                    f"past its grace period (ended {deleting:%H:%M:%S} UTC) on node {node_name}, over "
                                    f"spec.training.nodeLossGracePeriod {grace_seconds:g} s: its process or kubelet "
                                    "does not end it"))
            else:
                waits.append((deleting + grace - now).total_seconds())
    # One second more: condition and deletion times are whole seconds.
    return lost, (max(0.0, min(waits)) + 1.0 if waits else None)


# --- preemption notices -----------------------------------------------------------------------------

# The taints a cloud's node-termination handler puts on a node about to go, by the notice each stands for. A
# launcher or worker on such a node is best deleted at once (gracefully: its ranks, or its mpirun, get SIGTERM and
# the ranks write a checkpoint at their next step, scalingrun_trainer.core.preemption) rather than when the node
# goes. AWS NTH's rebalance-recommendation taint is no notice: the node is at risk, not leaving.
TERMINATION_TAINTS = {
    "cloud.google.com/impending-node-termination": "GKE's notice of the node's termination",
    "aws-node-termination-handler/spot-itn": "an AWS spot interruption notice",
    "aws-node-termination-handler/scheduled-maintenance": "an AWS scheduled maintenance event",
    "aws-node-termination-handler/asg-lifecycle-termination": "an AWS Auto Scaling group's termination",
}


@dataclass(frozen=True)
class NoticedPod:
    pod: dict[str, Any]
    node: str
    why: str  # 'node node-1 has the taint aws-node-termination-handler/spot-itn (an AWS spot interruption notice)'


def termination_notice(node: Optional[dict[str, Any]]) -> Optional[str]:
    """Why a Node is about to go, from its taints; None when it carries no termination taint."""
    for taint in ((node or {}).get("spec") or {}).get("taints") or []:
        what = TERMINATION_TAINTS.get(taint.get("key") or "")
        if what:
            return f"has the taint {taint['key']} ({what})"
    return None


def _may_get_notice(pod: dict[str, Any], mpijob: str) -> bool:
    """A scheduled launcher or worker, not ended and not Terminating (one being deleted already has its SIGTERM)."""
    return (pod_role(pod, mpijob) in TRAINING_ROLES and bool((pod.get("spec") or {}).get("nodeName"))
            and not metadata_of(pod).get("deletionTimestamp")
            and status_of(pod).get("phase") not in ("Succeeded", "Failed"))


def noticed_pods(pods: list[dict[str, Any]], noticed_nodes: Mapping[str, dict[str, Any]],
                 mpijob: str) -> list[NoticedPod]:
    """The training's launcher and workers on a node with a termination taint, not yet Terminating: each to be
    deleted with its own grace period, so that the checkpoint at the next step starts now. `noticed_nodes`: the
    Nodes that carry such a taint, by name (the operator's Node watch keeps them; others may be left out)."""
    noticed = []
    for pod in sorted(pods, key=pod_name):
        if not _may_get_notice(pod, mpijob):
            continue
        node_name = pod["spec"]["nodeName"]
        why = termination_notice(noticed_nodes.get(node_name))
        if why:
            noticed.append(NoticedPod(pod, node_name, f"node {node_name} {why}"))
    return noticed
