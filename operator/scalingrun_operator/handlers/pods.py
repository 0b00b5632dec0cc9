"""What the run's pods say, pure: root causes that hold a run up, and restarts of the training.

Pods are made by others (the Job controller for preprocessing, the MPI operator for the launcher and
workers) but carry our labels from the pod templates. The kubelet and the scheduler write why a pod
does not run only on the pod (container waiting reasons, PodScheduled); this module turns that into
one problem a user can act on, and counts the training's interruptions against a record kept in
status, so that counting survives operator restarts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

PREPROCESS, LAUNCHER, WORKER = "preprocess", "launcher", "worker"
TRAINING_ROLES = (LAUNCHER, WORKER)

# Labels the MPI operator puts on its pods: v0.8 first, then v0.3.
_ROLE_LABELS = ("training.kubeflow.org/job-role", "mpi-job-role")
_COMPONENT_LABEL = "app.kubernetes.io/component"

# Problem reasons (condition reasons a user sees), most blocking first.
IMAGE_PULL_FAILED = "ImagePullFailed"
CONTAINER_CONFIG_ERROR = "ContainerConfigError"
UNSCHEDULABLE = "Unschedulable"
OOM_KILLED = "OOMKilled"
CRASH_LOOP = "CrashLoopBackOff"
EVICTED = "Evicted"
_PRIORITY = (IMAGE_PULL_FAILED, CONTAINER_CONFIG_ERROR, UNSCHEDULABLE, OOM_KILLED, CRASH_LOOP, EVICTED)

_PULL_REASONS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "RegistryUnavailable"}
_CONFIG_REASONS = {"CreateContainerConfigError", "CreateContainerError"}

# The spec fields behind each pod role, for the advice in messages.
_RESOURCE_FIELDS = {
    PREPROCESS: "spec.dataset.preprocessing.resources (or spec.dataset.preprocessing.parallelism)",
    LAUNCHER: "spec.launcher.resources",
    WORKER: "spec.workers.cpu/memory/gpusPerWorker (or spec.workers.replicas, nodeSelector, tolerations)",
}
_MEMORY_FIELDS = {
    PREPROCESS: "spec.dataset.preprocessing.resources.memory",
    LAUNCHER: "spec.launcher.resources.memory",
    WORKER: "spec.workers.memory (or lower spec.training.batchSizePerWorker)",
}
_RECREATE = "the spec is pinned when the run starts, so a changed spec needs a new ScalingRun"


def _meta(pod: dict[str, Any]) -> dict[str, Any]:
    return pod.get("metadata") or {}


def _status(pod: dict[str, Any]) -> dict[str, Any]:
    return pod.get("status") or {}


def pod_name(pod: dict[str, Any]) -> str:
    return _meta(pod).get("name", "")


def pod_role(pod: dict[str, Any], mpijob_name: Optional[str] = None) -> str:
    """preprocess, launcher, worker, or '' for a pod that is none of them."""
    labels = _meta(pod).get("labels") or {}
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


def _terminal(pod: dict[str, Any]) -> bool:
    return _status(pod).get("phase") in ("Succeeded", "Failed")


def _container_statuses(pod: dict[str, Any]) -> list[dict[str, Any]]:
    status = _status(pod)
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def _spec_image(pod: dict[str, Any], container: str) -> str:
    spec = pod.get("spec") or {}
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if c.get("name") == container:
            return c.get("image", "")
    return ""


def _exit(terminated: dict[str, Any]) -> str:
    """'exit code 137 (OOMKilled)' from a container's terminated state."""
    text = f"exit code {terminated.get('exitCode', '?')}"
    if terminated.get("reason"):
        text += f" ({terminated['reason']})"
    if terminated.get("message"):
        text += f": {str(terminated['message']).strip()[:300]}"
    return text


@dataclass(frozen=True)
class PodProblem:
    """One reason a pod does not run, and what to do about it."""

    reason: str  # one of _PRIORITY
    pod: str
    container: str
    role: str
    message: str


def _problem(namespace: str, pod: dict[str, Any], role: str) -> Optional[PodProblem]:
    name, status = pod_name(pod), _status(pod)
    where = f"pod {name}"
    if status.get("phase") == "Failed" and status.get("reason") == "Evicted":
        return PodProblem(EVICTED, name, "", role,
                          f"{where} was evicted: {status.get('message') or 'no message'}; the node ran short of a "
                          f"resource: give the pod more room ({_MEMORY_FIELDS.get(role, 'its resources')}) "
                          "or free the node")
    for container in _container_statuses(pod):
        cname = container.get("name", "")
        at = f"{where} container {cname}"
        state = container.get("state") or {}
        waiting, terminated = state.get("waiting") or {}, state.get("terminated") or {}
        last = (container.get("lastState") or {}).get("terminated") or {}
        detail = str(waiting.get("message") or "").strip()[:500]
        if waiting.get("reason") in _PULL_REASONS:
            image = _spec_image(pod, cname) or container.get("image", "")
            return PodProblem(IMAGE_PULL_FAILED, name, cname, role,
                              f"{at} cannot pull image {image!r} ({waiting['reason']}"
                              + (f": {detail}" if detail else "") + "); check spec.workers.image (the trainer "
                              "image of every pod of the run) and that the nodes can pull it (registry, "
                              f"credentials); the kubelet keeps retrying, {_RECREATE}")
        if waiting.get("reason") in _CONFIG_REASONS:
            return PodProblem(CONTAINER_CONFIG_ERROR, name, cname, role,
                              f"{at} cannot be created ({waiting['reason']}: {detail or 'no message'}); check "
                              "the Secrets the run names (spec.storage.credentialsSecret and its keys "
                              "spec.storage.accessKeyIdKey/secretAccessKeyKey, spec.tracking.credentialsSecret); "
                              "the kubelet retries once they are fixed")
        if terminated.get("reason") == "OOMKilled" or (
                waiting.get("reason") == "CrashLoopBackOff" and last.get("reason") == "OOMKilled"):
            return PodProblem(OOM_KILLED, name, cname, role,
                              f"{at} was killed for using more memory than its limit "
                              f"({_exit(terminated or last)}); raise {_MEMORY_FIELDS.get(role, 'its memory')}"
                              f" ({_RECREATE})")
        if waiting.get("reason") == "CrashLoopBackOff":
            return PodProblem(CRASH_LOOP, name, cname, role,
                              f"{at} keeps crashing (restarted {container.get('restartCount', 0)} times, last "
                              f"{_exit(last) if last else 'exit unknown'}); see its log: kubectl logs -n "
                              f"{namespace} {name} -c {cname} --previous")
    for condition in status.get("conditions") or []:
        if (condition.get("type") == "PodScheduled" and condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"):
            return PodProblem(UNSCHEDULABLE, name, "", role,
                              f"{where} cannot be scheduled: {str(condition.get('message') or '').strip()[:500]}; "
                              f"lower {_RESOURCE_FIELDS.get(role, 'its requests')} or add nodes ({_RECREATE}); "
                              "it is scheduled as soon as room appears")
    return None


def _slot(pod: dict[str, Any], role: str) -> str:
    """Pods that replace one another: a worker by name, the launcher's pods together, a Job's pods together."""
    return pod_name(pod) if role == WORKER else role


def diagnose(namespace: str, pods: list[dict[str, Any]], roles: tuple[str, ...],
             mpijob_name: Optional[str] = None) -> tuple[Optional[PodProblem], int]:
    """The most blocking problem among the pods of `roles`, and how many pods have one.

    A finished pod counts only while nothing newer has taken its place (a Job keeps failed pods around).
    """
    mine = [(p, pod_role(p, mpijob_name)) for p in pods if not _meta(p).get("deletionTimestamp")]
    mine = [(p, role) for p, role in mine if role in roles]
    newest: dict[str, str] = {}
    for pod, role in mine:
        stamp = _meta(pod).get("creationTimestamp") or ""
        newest[_slot(pod, role)] = max(newest.get(_slot(pod, role), ""), stamp)
    problems = []
    for pod, role in mine:
        if _terminal(pod) and (_meta(pod).get("creationTimestamp") or "") < newest[_slot(pod, role)]:
            continue
        problem = _problem(namespace, pod, role)
        if problem:
            problems.append(problem)
    if not problems:
        return None, 0
    problems.sort(key=lambda p: (_PRIORITY.index(p.reason), p.pod))
    return problems[0], len(problems)


def problem_message(problem: PodProblem, count: int) -> str:
    more = count - 1
    return problem.message + (f" ({more} more pod{'s' if more > 1 else ''} with problems)" if more > 0 else "")


# --- restarts of the training ----------------------------------------------------------------------


def last_words(pod: dict[str, Any]) -> str:
    """How a pod was doing when last seen, for the Event that reports it lost: 'it was Running'."""
    status = _status(pod)
    if status.get("reason") == "Evicted":
        return f"it was evicted: {status.get('message') or 'no message'}"
    for container in _container_statuses(pod):
        terminated = (container.get("state") or {}).get("terminated")
        if terminated and terminated.get("exitCode", 0) != 0:
            return f"container {container.get('name')} had ended with {_exit(terminated)}"
    return f"it was {status.get('phase') or 'Pending'}"


def _restart_count(pod: dict[str, Any]) -> int:
    return sum(int(c.get("restartCount") or 0) for c in _container_statuses(pod))


def _last_exit(pod: dict[str, Any]) -> str:
    for container in _container_statuses(pod):
        last = (container.get("lastState") or {}).get("terminated")
        if last:
            return f"container {container.get('name')} {_exit(last)}"
    return "no exit status recorded"


@dataclass(frozen=True)
class Interruption:
    """A worker pod lost or a launcher restart: counted in status, reported in a Warning Event."""

    role: str
    pod: str
    reason: str  # the Event's reason
    message: str


WORKER_LOST = "WorkerPodLost"
LAUNCHER_RESTARTED = "LauncherRestarted"
_RESUMES = "the launcher resumes from the last checkpoint"


def _lost(record: dict[str, Any], how: str) -> Interruption:
    role, name, uid = record["role"], record["name"], record["uid"]
    if role == WORKER:
        return Interruption(WORKER, name, WORKER_LOST,
                            f"worker pod {name} (uid {uid}) {how}; the MPI operator recreates it and {_RESUMES}")
    return Interruption(LAUNCHER, name, LAUNCHER_RESTARTED,
                        f"launcher pod {name} (uid {uid}) {how}; its Job starts a new launcher pod, which "
                        "resumes from the last checkpoint")


def _gone_how(record: dict[str, Any], replacement: Optional[dict[str, Any]], hint: Optional[str]) -> str:
    if replacement is not None:
        return f"was replaced (new uid {_meta(replacement).get('uid')})"
    return "was deleted" + (f"; {hint}" if hint else "")


def _failed_how(pod: dict[str, Any]) -> Optional[str]:
    """Why a pod that still exists is lost to the training, or None while it is not."""
    status = _status(pod)
    if _meta(pod).get("deletionTimestamp"):
        return f"is being deleted; {last_words(pod)}"
    if status.get("phase") == "Failed":
        if status.get("reason") == "Evicted":
            return f"was evicted: {status.get('message') or 'no message'}"
        return f"failed; {last_words(pod)}"
    return None


def track_interruptions(records: list[dict[str, Any]], pods: list[dict[str, Any]], mpijob_name: str,
                        hints: Optional[dict[str, str]] = None) -> tuple[list[dict[str, Any]], list[Interruption]]:
    """New records of the training's pods and the interruptions since `records` were written.

    A record is {"name", "uid", "role", "restarts" (container restarts counted), "lost" (counted as lost)}.
    Level-triggered: whatever happened between two looks (a worker deleted and recreated under the same
    name, a launcher container restarted twice) is counted once, from the difference. `hints` are the
    last states of deleted pods by uid, when a watch event delivered them.
    """
    hints = hints or {}
    current = {pod_name(p): p for p in pods if pod_role(p, mpijob_name) in TRAINING_ROLES}
    launcher_done = any(pod_role(p, mpijob_name) == LAUNCHER and _status(p).get("phase") == "Succeeded"
                        for p in current.values())
    interruptions: list[Interruption] = []
    kept: dict[str, dict[str, Any]] = {}
    for record in records:
        pod = current.get(record.get("name", ""))
        if pod is not None and _meta(pod).get("uid") == record.get("uid"):
            kept[record["name"]] = record
            continue
        # The pod of this record is gone (or another took its name): lost, unless already counted or the
        # training finished (the MPI operator then deletes the workers on purpose).
        if not record.get("lost") and not launcher_done:
            interruptions.append(_lost(record, _gone_how(record, pod, hints.get(record.get("uid", "")))))
    out: list[dict[str, Any]] = []
    for name in sorted(current):
        pod = current[name]
        role = pod_role(pod, mpijob_name)
        record = kept.get(name) or {"name": name, "uid": _meta(pod).get("uid", ""), "role": role,
                                    "restarts": 0, "lost": False}
        record = dict(record)
        restarts = _restart_count(pod)
        if restarts > record["restarts"]:
            times = restarts - record["restarts"]
            what = f"restarted{f' {times} times' if times > 1 else ''}: {_last_exit(pod)}"
            if role == LAUNCHER:
                interruptions.append(Interruption(LAUNCHER, name, LAUNCHER_RESTARTED,
                                                  f"launcher pod {name} {what}; {_RESUMES}"))
            else:
                interruptions.append(Interruption(WORKER, name, WORKER_LOST,
                                                  f"worker pod {name} {what}; {_RESUMES}"))
            record["restarts"] = restarts
        how = _failed_how(pod)
        if how and not record["lost"] and not launcher_done:
            interruptions.append(_lost(record, how))
            record["lost"] = True
        out.append(record)
    return out, interruptions


def baseline(pods: list[dict[str, Any]], mpijob_name: str) -> list[dict[str, Any]]:
    """Records of the pods as they are, counting nothing: while the training is suspended its pods go away
    on purpose, and what they did before is not an interruption either."""
    by_name = {pod_name(p): p for p in pods}
    records, _ = track_interruptions([], pods, mpijob_name)
    for record in records:
        pod = by_name[record["name"]]
        record["restarts"] = _restart_count(pod)
        record["lost"] = _failed_how(pod) is not None
    return records


def signature(pod: dict[str, Any]) -> tuple:
    """What of a pod matters to the run: a watch event that leaves it unchanged needs no reconcile."""
    status = _status(pod)
    containers = tuple(
        (c.get("name"), c.get("restartCount"), tuple(sorted((c.get("state") or {}).keys())),
         ((c.get("state") or {}).get("waiting") or {}).get("reason"),
         ((c.get("state") or {}).get("terminated") or {}).get("reason"))
        for c in _container_statuses(pod))
    scheduled = tuple((c.get("status"), c.get("reason")) for c in status.get("conditions") or []
                      if c.get("type") == "PodScheduled")
    return (_meta(pod).get("uid"), status.get("phase"), status.get("reason"), bool(_meta(pod).get("deletionTimestamp")),
            scheduled, containers)
