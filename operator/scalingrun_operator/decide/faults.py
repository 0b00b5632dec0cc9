"""The faults the operator ends itself, pure: training pods lost with their node (force-deleted so that the MPI
operator makes them elsewhere), training pods on a node about to go (deleted gracefully, so that the ranks
checkpoint at their next step first), and a training that stopped beating (stall.py says when). Each is counted in
status.training.interruptions against spec.training.maxInterruptions.
"""

from __future__ import annotations

from typing import Any, Optional

from scalingrun_api.models import ScalingRun
from scalingrun_api.models.common import duration_seconds
from . import interruptions, nodes, podrecords
from .draft import Draft
from .podrecords import same_uid
from .pod_facts import LAUNCHER, TRAINING_ROLES, WORKER, metadata_of, pod_name, pod_role, status_of
from .status import NODE_LOST, NODE_TERMINATING, get_condition

_RESUMES = "the launcher restarts and resumes from the last checkpoint"


def _running_launchers(found: list[dict[str, Any]], mpijob: str) -> list[dict[str, Any]]:
    return [p for p in found if pod_role(p, mpijob) == LAUNCHER and not metadata_of(p).get("deletionTimestamp")
            and status_of(p).get("phase") not in ("Succeeded", "Failed")]


def restart_pods(draft: Draft, training_status: dict[str, Any], doomed: list[dict[str, Any]], mpijob: str,
                 grace_seconds: Any) -> bool:
    """Deletes `doomed` (with `grace_seconds`; None: their own) and, when a worker is among them, the launcher
    (gracefully: its mpirun may wait on the lost worker for ever). Their records are marked lost, so that their
    going is not counted again; returns whether any was not counted yet."""
    recorded = podrecords.records_of(training_status, mpijob)
    records = {r.get("name"): r for r in recorded}
    fresh = False
    names = {pod_name(p) for p in doomed}
    launchers = []
    if any(pod_role(p, mpijob) == WORKER for p in doomed):
        launchers = [p for p in _running_launchers(draft.pods(), mpijob) if pod_name(p) not in names]
    for pod, grace in [*((p, grace_seconds) for p in doomed), *((p, None) for p in launchers)]:
        record = records.get(pod_name(pod))
        if record is not None and same_uid(record.get("uid", ""), metadata_of(pod).get("uid", "")) \
                and not record.get("lost"):
            record["lost"] = True
            fresh = fresh or pod_name(pod) in names
        draft.delete_pod(pod, grace)
    podrecords.keep(training_status, recorded, draft.pods(), mpijob)  # however status holds them (a large run's)
    return fresh


def _restart_node_by_node(draft: Draft, training_status: dict[str, Any], found: list, mpijob: str,
                          grace: Optional[int], cause: str) -> tuple[dict[str, list], int]:
    """Restarts the pods of `found` (LostPod or NoticedPod) a node at a time, counting one interruption of `cause`
    per node whose pods were deleted: (`found` by node, how many nodes counted)."""
    by_node: dict[str, list] = {}
    for item in found:
        by_node.setdefault(item.node, []).append(item)
    counted = 0
    for node, items in sorted(by_node.items()):
        if restart_pods(draft, training_status, [i.pod for i in items], mpijob, grace):
            interruptions.count(training_status, cause)
            counted += 1
    return by_node, counted


def node_trouble(draft: Draft, mpijob: str) -> bool:
    """Whether a training pod's node is down (lost or within nodeLossGracePeriod); from pods and Nodes only."""
    found = draft.pods()
    return nodes.nodes_down(found, draft.nodes(nodes.troubled_nodes(found, mpijob)), mpijob)


def lost_nodes(draft: Draft, run: ScalingRun, training_status: dict[str, Any], mpijob: str) -> bool:
    """NodeLost: the training's pods on a node NotReady/Unknown past spec.training.nodeLossGracePeriod (or stuck
    Terminating) are force-deleted; one interruption per node, counted as nodeLost. True when pods were deleted."""
    update, found = draft.update, draft.pods()
    grace = duration_seconds(run.spec.training.node_loss_grace_period)
    found_nodes = draft.nodes(nodes.troubled_nodes(found, mpijob))
    lost, wait = nodes.lost_pods(found, found_nodes, update.moment, grace, mpijob)
    if wait is not None:
        draft.recheck(wait)
    existing = get_condition(update.desired["conditions"], NODE_LOST) or {}
    if not lost:
        training = [p for p in found if pod_role(p, mpijob) in TRAINING_ROLES]
        if (existing.get("status") == "True" and training
                and all(nodes.pod_ready(p) and not metadata_of(p).get("deletionTimestamp") for p in training)):
            update.condition(NODE_LOST, "False", "PodsRunning",
                             f"the training's pods run again; before: {existing.get('message') or ''}"[:1000])
        return False
    by_node, counted = _restart_node_by_node(draft, training_status, lost, mpijob, 0, interruptions.NODE_LOST)
    message = "; ".join(
        f"{', '.join(pod_name(i.pod) for i in items)} on node {node} lost: {items[0].why}"
        for node, items in sorted(by_node.items()))
    message += (f"; force-deleted (grace 0: the node is not there to confirm) so that the MPI operator makes them on "
                f"another node, and {_RESUMES}")
    reason = "NodeNotReady" if any(nodes.node_down(found_nodes.get(i.node)) for i in lost) else "TerminatingPastGrace"
    update.condition(NODE_LOST, "True", reason, message)
    if counted or existing.get("message") != message:
        update.warn(NODE_LOST, message)
    return True


def terminating_nodes(draft: Draft, training_status: dict[str, Any], mpijob: str) -> bool:
    """NodeTerminating: the training's pods on a node with a cloud's termination taint (the Node watch's, no read)
    are deleted with their own grace period: the kubelet's SIGTERM makes the ranks checkpoint at their next step
    while the node is still there, and the MPI operator makes the pods anew elsewhere. Counted once per node as
    nodeTerminating, with a Warning Event; a pod already Terminating is not noticed again. True when pods were
    deleted."""
    noticed = nodes.noticed_pods(draft.pods(), draft.noticed_nodes(), mpijob)
    if not noticed:
        return False
    by_node, counted = _restart_node_by_node(draft, training_status, noticed, mpijob, None,
                                             interruptions.NODE_TERMINATING)
    if counted:
        draft.update.warn(NODE_TERMINATING, "; ".join(
            f"{', '.join(pod_name(i.pod) for i in items)} on node {node}: {items[0].why}"
            for node, items in sorted(by_node.items()))
            + "; deleted with their grace period, so that the training checkpoints at its next step before the "
              f"node goes, and {_RESUMES}")
    return True
