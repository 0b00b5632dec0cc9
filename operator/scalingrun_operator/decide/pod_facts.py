"""A pod as the API serves it, read, pure: its metadata, status and name, its role in the run (preprocessing,
launcher, worker) by the labels its controller gives it, its containers' states and exits, and what of it a run
acts on (`signature`). What the pods' states mean for the run is in pods.py (PodsHealthy), interruptions.py,
stall.py and nodes.py."""

from __future__ import annotations

import re
from typing import Any, Optional

PREPROCESS, LAUNCHER, WORKER = "preprocess", "launcher", "worker"
TRAINING_ROLES = (LAUNCHER, WORKER)

# Labels the MPI operator puts on its pods: v0.8 first, then v0.3.
_ROLE_LABELS = ("training.kubeflow.org/job-role", "mpi-job-role")
_COMPONENT_LABEL = "app.kubernetes.io/component"


def metadata_of(pod: dict[str, Any]) -> dict[str, Any]:
    return pod.get("metadata") or {}


def status_of(pod: dict[str, Any]) -> dict[str, Any]:
    return pod.get("status") or {}


def pod_name(pod: dict[str, Any]) -> str:
    return metadata_of(pod).get("name", "")


def pod_role(pod: dict[str, Any], mpijob_name: Optional[str] = None) -> str:
    """preprocess, launcher, worker, or '' for a pod that is none of them."""
    labels = metadata_of(pod).get("labels") or {}
    for key in _ROLE_LABELS:
        if labels.get(key) in TRAINING_ROLES:
            return labels[key]
    component = labels.get(_COMPONENT_LABEL)
    if component == PREPROCESS:
        return PREPROCESS
    if component == "training" and mpijob_name:
        # A controller that copies only the template's labels: tell the roles apart by the names it gives.
        name = pod_name(pod)
        if name.startswith(f"{mpijob_name}-launcher"):
            return LAUNCHER
        if re.fullmatch(rf"{re.escape(mpijob_name)}-worker-\d+", name):
            return WORKER
    return ""


def container_statuses(pod: dict[str, Any]) -> list[dict[str, Any]]:
    status = status_of(pod)
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def exit_text(terminated: dict[str, Any]) -> str:
    """'exit code 137 (OOMKilled)' from a container's terminated state."""
    text = f"exit code {terminated.get('exitCode', '?')}"
    if terminated.get("reason"):
        text += f" ({terminated['reason']})"
    if terminated.get("message"):
        text += f": {str(terminated['message']).strip()[:300]}"
    return text


def pods_of(pods: list[dict[str, Any]], roles: tuple[str, ...],
            mpijob_name: Optional[str] = None) -> list[tuple[dict[str, Any], str]]:
    """(pod, role) for the pods of `roles` that are not going away."""
    mine = [(p, pod_role(p, mpijob_name)) for p in pods if not metadata_of(p).get("deletionTimestamp")]
    return [(p, role) for p, role in mine if role in roles]


def signature(pod: dict[str, Any]) -> tuple:
    """What of a pod matters to the run: a watch event that leaves it unchanged needs no reconcile."""
    status = status_of(pod)
    containers = tuple(
        (c.get("name"), c.get("restartCount"), tuple(sorted((c.get("state") or {}).keys())),
         ((c.get("state") or {}).get("waiting") or {}).get("reason"),
         ((c.get("state") or {}).get("terminated") or {}).get("reason"))
        for c in container_statuses(pod))
    # Ready: the node lifecycle controller turns it False on the pods of a node that stops answering (decide.nodes).
    scheduled = tuple((c.get("type"), c.get("status"), c.get("reason")) for c in status.get("conditions") or []
                      if c.get("type") in ("PodScheduled", "Ready"))
    meta = metadata_of(pod)
    return (meta.get("uid"), status.get("phase"), status.get("reason"), bool(meta.get("deletionTimestamp")),
            scheduled, containers)
