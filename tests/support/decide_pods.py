"""Pods as decide reads them: a pod with container states, a waiting container, an unschedulable pod."""

from __future__ import annotations




IMAGE = "registry.example/trainer:missing"


def pod(name: str, role: str, uid: str = "", phase: str = "Running", containers=None, conditions=None,
        created: str = "2026-01-01T12:00:00Z", **status) -> dict:
    labels = {"scalingrun.dev/run": "demo", "app.kubernetes.io/managed-by": "scalingrun-operator",
              "app.kubernetes.io/component": "preprocess" if role == "preprocess" else "training"}
    if role in ("launcher", "worker"):
        labels["training.kubeflow.org/job-role"] = role
    container = {"preprocess": "preprocess", "launcher": "launcher", "worker": "worker"}[role]
    return {
        "metadata": {"name": name, "uid": uid or f"uid-{name}", "labels": labels, "creationTimestamp": created},
        "spec": {"containers": [{"name": container, "image": IMAGE}]},
        "status": {"phase": phase, "conditions": conditions or [],
                   "containerStatuses": containers if containers is not None else [
                       {"name": container, "restartCount": 0, "state": {"running": {}}}],
                   **status},
    }


def waiting(name: str, reason: str, message: str = "", restarts: int = 0, last=None) -> list[dict]:
    status = {"name": name, "restartCount": restarts, "image": IMAGE,
              "state": {"waiting": {"reason": reason, **({"message": message} if message else {})}}}
    if last:
        status["lastState"] = {"terminated": last}
    return [status]


def unschedulable(message: str) -> list[dict]:
    return [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]
