"""What the run's pods say, pure: the root cause that holds a run up, as a PodsHealthy condition.

Pods are made by others (the Job controller for preprocessing, the MPI operator for the launcher and
workers) but carry our labels from the pod templates. The kubelet and the scheduler write why a pod
does not run only on the pod (container waiting reasons, PodScheduled); this module turns that into
one problem a user can act on. The interruptions of the training are counted in interruptions.py.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from scalingrun_api.manifest import DatasetManifest, manifest_from_termination_message
from .children import controlled_by
from .pod_facts import (
    LAUNCHER, PREPROCESS, WORKER, container_statuses, exit_text, metadata_of, pod_name, pods_of, status_of,
)
from .status import PODS_HEALTHY, get_condition, parse_time

if TYPE_CHECKING:
    from .draft import Draft

# Problem reasons (condition reasons a user sees), most blocking first.
IMAGE_PULL_FAILED = "ImagePullFailed"
CONTAINER_CONFIG_ERROR = "ContainerConfigError"
UNSCHEDULABLE = "Unschedulable"
OOM_KILLED = "OOMKilled"
CRASH_LOOP = "CrashLoopBackOff"
EVICTED = "Evicted"
PENDING = "PodPending"  # Pending past PENDING_AFTER_S with no other cause known: the least specific
_PRIORITY = (IMAGE_PULL_FAILED, CONTAINER_CONFIG_ERROR, UNSCHEDULABLE, OOM_KILLED, CRASH_LOOP, EVICTED, PENDING)

# A pod still Pending this long after its creation is reported: early enough that a look at
# PENDING_AFTER_S (plus a reconcile) says so within a minute, late enough for a normal start.
PENDING_AFTER_S = 45.0

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


def _terminal(pod: dict[str, Any]) -> bool:
    return status_of(pod).get("phase") in ("Succeeded", "Failed")


def _spec_image(pod: dict[str, Any], container: str) -> str:
    spec = pod.get("spec") or {}
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if c.get("name") == container:
            return c.get("image", "")
    return ""


def _memory_limit(pod: dict[str, Any], container: str) -> str:
    spec = pod.get("spec") or {}
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if c.get("name") == container:
            return str(((c.get("resources") or {}).get("limits") or {}).get("memory") or "")
    return ""


@dataclass(frozen=True)
class PodProblem:
    """One reason a pod does not run, and what to do about it."""

    reason: str  # one of _PRIORITY
    pod: str
    container: str
    role: str
    message: str


def _problem(namespace: str, pod: dict[str, Any], role: str) -> Optional[PodProblem]:
    name, status = pod_name(pod), status_of(pod)
    where = f"pod {name}"
    if status.get("phase") == "Failed" and status.get("reason") == "Evicted":
        return PodProblem(EVICTED, name, "", role,
                          f"{where} was evicted: {status.get('message') or 'no message'}; the node ran short of a "
                          f"resource: give the pod more room ({_MEMORY_FIELDS.get(role, 'its resources')}) "
                          "or free the node")
    for container in container_statuses(pod):
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
            limit = _memory_limit(pod, cname)
            what = (f"using more memory than its limit of {limit}" if limit
                    else "running out of memory (it has no memory limit: the node ran short)")
            return PodProblem(OOM_KILLED, name, cname, role,
                              f"{at} was killed for {what} ({exit_text(terminated or last)}); raise "
                              f"{_MEMORY_FIELDS.get(role, 'its memory')} ({_RECREATE})")
        if waiting.get("reason") == "CrashLoopBackOff":
            return PodProblem(CRASH_LOOP, name, cname, role,
                              f"{at} keeps crashing (restarted {container.get('restartCount', 0)} times, last "
                              f"{exit_text(last) if last else 'exit unknown'}); see its log: kubectl logs -n "
                              f"{namespace} {name} -c {cname} --previous")
    for condition in status.get("conditions") or []:
        if (condition.get("type") == "PodScheduled" and condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"):
            return PodProblem(UNSCHEDULABLE, name, "", role,
                              f"{where} cannot be scheduled: {str(condition.get('message') or '').strip()[:500]}; "
                              f"lower {_RESOURCE_FIELDS.get(role, 'its requests')} or add nodes ({_RECREATE}); "
                              "it is scheduled as soon as room appears")
    return None


# --- pods stuck Pending --------------------------------------------------------------------------


def _pending_age(pod: dict[str, Any], now: dt.datetime) -> Optional[float]:
    """Seconds since a Pending pod was created; None for a pod that is not Pending (or going away)."""
    if metadata_of(pod).get("deletionTimestamp") or (status_of(pod).get("phase") or "Pending") != "Pending":
        return None
    created = parse_time(metadata_of(pod).get("creationTimestamp"))
    return None if created is None else max(0.0, (now - created).total_seconds())


def pending_too_long(pods: list[dict[str, Any]], now: dt.datetime,
                     threshold_s: float = PENDING_AFTER_S) -> list[dict[str, Any]]:
    """The pods Pending for `threshold_s` or longer since their creation, oldest first."""
    old = [(age, pod_name(p), p) for p in pods
           if (age := _pending_age(p, now)) is not None and age >= threshold_s]
    return [p for _, _, p in sorted(old, key=lambda t: (-t[0], t[1]))]


def next_pending_check(pods: list[dict[str, Any]], now: dt.datetime,
                       threshold_s: float = PENDING_AFTER_S) -> Optional[float]:
    """Seconds until the next Pending pod reaches `threshold_s`, or None when no pod will.

    No watch event need come in that time (a pod waiting for a volume or a slow image pull changes
    nothing the watch reports), so this is when to look again. One second more: creation times are
    whole seconds.
    """
    ages = [age for p in pods if (age := _pending_age(p, now)) is not None and age < threshold_s]
    return threshold_s - max(ages) + 1.0 if ages else None


def _pending_problem(namespace: str, pod: dict[str, Any], role: str, threshold_s: float) -> PodProblem:
    """What a Pending pod waits for, as far as the pod says. The message does not change while the pod
    waits (no running age), so status is not rewritten on every look."""
    name, status, spec = pod_name(pod), status_of(pod), pod.get("spec") or {}
    since = metadata_of(pod).get("creationTimestamp") or "its creation"
    scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
    container = ""
    if not spec.get("nodeName") and not (scheduled and scheduled.get("status") == "True"):
        verdict = str((scheduled or {}).get("message") or "").strip()[:300]
        waits = (f"no node was assigned ({verdict})" if verdict else
                 f"no scheduler has placed it yet (spec.schedulerName {spec.get('schedulerName') or 'default-scheduler'})")
        todo = (f"check that its scheduler runs and that a node matches {_RESOURCE_FIELDS.get(role, 'its requests')}"
                f" ({_RECREATE})")
    else:
        waiting = [(c.get("name", ""), (c.get("state") or {}).get("waiting") or {}) for c in container_statuses(pod)]
        waiting = [(n, w) for n, w in waiting if w]
        on = f"on node {spec['nodeName']}" if spec.get("nodeName") else "scheduled"
        if waiting:
            container = waiting[0][0]
            reasons = ", ".join(f"container {n} {w.get('reason') or 'waiting'}"
                                + (f" ({str(w['message']).strip()[:200]})" if w.get("message") else "")
                                for n, w in waiting)
            waits = f"{on}, {reasons}"
        else:
            waits = f"{on}, its containers have not started"
        todo = ("its Events say what the kubelet waits for (a volume, a Secret or ConfigMap, a large image "
                "still being pulled)")
    return PodProblem(PENDING, name, container, role,
                      f"pod {name} has been Pending since {since} (over {threshold_s:g} s): {waits}; {todo}: "
                      f"kubectl describe pod -n {namespace} {name}")


def _slot(pod: dict[str, Any], role: str) -> str:
    """Pods that replace one another: a worker by name, the launcher's pods together, a Job's pods together."""
    return pod_name(pod) if role == WORKER else role


def diagnose(namespace: str, pods: list[dict[str, Any]], roles: tuple[str, ...],
             mpijob_name: Optional[str] = None, now: Optional[dt.datetime] = None,
             pending_after_s: float = PENDING_AFTER_S) -> tuple[Optional[PodProblem], int]:
    """The most blocking problem among the pods of `roles`, and how many pods have one.

    A finished pod counts only while nothing newer has taken its place (a Job keeps failed pods around).
    With `now`, a pod Pending for `pending_after_s` with no more specific cause is a problem too.
    """
    mine = pods_of(pods, roles, mpijob_name)
    stuck = {pod_name(p) for p in pending_too_long([p for p, _ in mine], now, pending_after_s)} if now else set()
    newest: dict[str, str] = {}
    for pod, role in mine:
        stamp = metadata_of(pod).get("creationTimestamp") or ""
        newest[_slot(pod, role)] = max(newest.get(_slot(pod, role), ""), stamp)
    problems = []
    for pod, role in mine:
        if _terminal(pod) and (metadata_of(pod).get("creationTimestamp") or "") < newest[_slot(pod, role)]:
            continue
        problem = _problem(namespace, pod, role)
        if problem is None and pod_name(pod) in stuck:
            problem = _pending_problem(namespace, pod, role, pending_after_s)
        if problem:
            problems.append(problem)
    if not problems:
        return None, 0
    problems.sort(key=lambda p: (_PRIORITY.index(p.reason), p.pod))
    return problems[0], len(problems)


def problem_message(problem: PodProblem, count: int) -> str:
    more = count - 1
    return problem.message + (f" ({more} more pod{'s' if more > 1 else ''} with problems)" if more > 0 else "")


# --- the PodsHealthy condition ---------------------------------------------------------------------


def check_pods(draft: "Draft", roles: tuple[str, ...], mpijob: Optional[str] = None) -> Optional[tuple[str, str]]:
    """PodsHealthy from the pods of `roles`; returns the problem's (reason, message), if any.

    A Warning Event goes out once per new cause (reason and pod), not on every kubelet retry.
    """
    update, pods = draft.update, draft.pods()
    problem, count = diagnose(draft.namespace, pods, roles, mpijob, now=update.moment)
    delay = next_pending_check([p for p, _ in pods_of(pods, roles, mpijob)], update.moment)
    if delay is not None:  # a pod may stay Pending without a single watch event: look again then
        draft.recheck(delay)
    existing = get_condition(update.desired["conditions"], PODS_HEALTHY)
    if problem is None:
        if existing and existing.get("status") == "False":
            update.condition(PODS_HEALTHY, "True", "PodsRunning", "no pod of the run reports a problem")
        return None
    message = problem_message(problem, count)
    same_cause = (existing is not None and existing.get("status") == "False"
                  and existing.get("reason") == problem.reason
                  and str(existing.get("message") or "").startswith(f"pod {problem.pod} "))
    if not same_cause:
        update.warn(problem.reason, message)
    update.condition(PODS_HEALTHY, "False", problem.reason, message)
    draft.holdup = f"{problem.reason}: {message}"
    return problem.reason, message


def pod_cause(draft: "Draft", roles: tuple[str, ...], mpijob: Optional[str] = None) -> str:
    """What the pods of `roles` say went wrong (an OOMKilled worker, say), for a failure's message; the
    PodsHealthy condition says it too. '' when no pod says anything."""
    problem, count = diagnose(draft.namespace, draft.pods(), roles, mpijob)
    if problem is None:
        return ""
    message = problem_message(problem, count)
    draft.update.condition(PODS_HEALTHY, "False", problem.reason, message)
    return message


def termination_message(pods: list[dict[str, Any]], roles: tuple[str, ...]) -> str:
    """What the last failed container of `roles` said as it ended (its termination message: what the command
    wrote to /dev/termination-log, else the end of its log with FallbackToLogsOnError); '' when none did."""
    said = []
    for pod, _ in pods_of(pods, roles):
        for container in container_statuses(pod):
            for terminated in ((container.get("state") or {}).get("terminated"),
                               (container.get("lastState") or {}).get("terminated")):
                if terminated and terminated.get("exitCode", 0) != 0 and terminated.get("message"):
                    said.append((str(terminated.get("finishedAt") or ""), str(terminated["message"]).strip()))
    return max(said)[1][:1500] if said else ""


def manifest_left(pods: list[dict[str, Any]], job_uid: Optional[str]) -> Optional[DatasetManifest]:
    """The dataset manifest the newest preprocessing or check pod that succeeded left in its termination message
    (scalingrun_api.manifest.manifest_termination_message); None when none did. Only a pod the run's own Job
    (`job_uid`) controls counts: a pod anyone labels as the run's preprocessing leaves nothing (no Job: none)."""
    left = []
    for pod, _ in pods_of([p for p in pods if job_uid and controlled_by(p, job_uid)], (PREPROCESS,)):
        for container in container_statuses(pod):
            terminated = (container.get("state") or {}).get("terminated")
            if terminated and terminated.get("exitCode") == 0:
                manifest = manifest_from_termination_message(terminated.get("message"))
                if manifest is not None:
                    left.append((str(terminated.get("finishedAt") or ""), pod_name(pod), manifest))
    return max(left, key=lambda found: found[:2])[2] if left else None


def pods_done(draft: "Draft") -> None:
    """A run that succeeded has no pod problem left to report."""
    existing = get_condition(draft.update.desired["conditions"], PODS_HEALTHY)
    if existing and existing.get("status") == "False":
        draft.update.condition(PODS_HEALTHY, "True", "Finished", "the run's pods have finished")
