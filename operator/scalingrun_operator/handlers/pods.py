"""What the run's pods say, pure: root causes that hold a run up, and restarts of the training.

Pods are made by others (the Job controller for preprocessing, the MPI operator for the launcher and
workers) but carry our labels from the pod templates. The kubelet and the scheduler write why a pod
does not run only on the pod (container waiting reasons, PodScheduled); this module turns that into
one problem a user can act on, and counts the training's interruptions against a record kept in
status, so that counting survives operator restarts.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any, Optional

from ..status import parse_time

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


def _memory_limit(pod: dict[str, Any], container: str) -> str:
    spec = pod.get("spec") or {}
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if c.get("name") == container:
            return str(((c.get("resources") or {}).get("limits") or {}).get("memory") or "")
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
            limit = _memory_limit(pod, cname)
            what = (f"using more memory than its limit of {limit}" if limit
                    else "running out of memory (it has no memory limit: the node ran short)")
            return PodProblem(OOM_KILLED, name, cname, role,
                              f"{at} was killed for {what} ({_exit(terminated or last)}); raise "
                              f"{_MEMORY_FIELDS.get(role, 'its memory')} ({_RECREATE})")
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


# --- pods stuck Pending --------------------------------------------------------------------------


def _pending_age(pod: dict[str, Any], now: dt.datetime) -> Optional[float]:
    """Seconds since a Pending pod was created; None for a pod that is not Pending (or going away)."""
    if _meta(pod).get("deletionTimestamp") or (_status(pod).get("phase") or "Pending") != "Pending":
        return None
    created = parse_time(_meta(pod).get("creationTimestamp"))
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
    name, status, spec = pod_name(pod), _status(pod), pod.get("spec") or {}
    since = _meta(pod).get("creationTimestamp") or "its creation"
    scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
    container = ""
    if not spec.get("nodeName") and not (scheduled and scheduled.get("status") == "True"):
        verdict = str((scheduled or {}).get("message") or "").strip()[:300]
        waits = (f"no node was assigned ({verdict})" if verdict else
                 f"no scheduler has placed it yet (spec.schedulerName {spec.get('schedulerName') or 'default-scheduler'})")
        todo = (f"check that its scheduler runs and that a node matches {_RESOURCE_FIELDS.get(role, 'its requests')}"
                f" ({_RECREATE})")
    else:
        waiting = [(c.get("name", ""), (c.get("state") or {}).get("waiting") or {}) for c in _container_statuses(pod)]
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


def pods_of(pods: list[dict[str, Any]], roles: tuple[str, ...],
            mpijob_name: Optional[str] = None) -> list[tuple[dict[str, Any], str]]:
    """(pod, role) for the pods of `roles` that are not going away."""
    mine = [(p, pod_role(p, mpijob_name)) for p in pods if not _meta(p).get("deletionTimestamp")]
    return [(p, role) for p, role in mine if role in roles]


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
        stamp = _meta(pod).get("creationTimestamp") or ""
        newest[_slot(pod, role)] = max(newest.get(_slot(pod, role), ""), stamp)
    problems = []
    for pod, role in mine:
        if _terminal(pod) and (_meta(pod).get("creationTimestamp") or "") < newest[_slot(pod, role)]:
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


# --- the failed launcher's log ---------------------------------------------------------------------

LOG_LINES = 20  # lines of the failed launcher's log that status carries
_LOG_LINE_CHARS = 400
_LOG_CHARS = 4000  # status.training.launcherLogTail at most; the Failed message keeps what fits
# Colour codes and control characters (a tab and newlines apart) say nothing in a status field.
_NOISE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True)
class LauncherLog:
    """The end of a launcher's log, or why there is none."""

    pod: str
    container: str
    tail: str  # bounded, see log_tail
    error: str = ""  # why the log could not be read


def _failed(pod: dict[str, Any]) -> bool:
    if _status(pod).get("phase") == "Failed":
        return True
    for container in _container_statuses(pod):
        for terminated in ((container.get("state") or {}).get("terminated"),
                           (container.get("lastState") or {}).get("terminated")):
            if terminated and terminated.get("exitCode", 0) != 0:
                return True
    return False


def failed_launcher(pods: list[dict[str, Any]], mpijob_name: str) -> Optional[tuple[str, str, str]]:
    """(pod, container, node) whose log tells why the training failed: the newest launcher pod, a failed one
    before one that did not fail (the launcher's Job may have started another after it). The node is ''
    for a pod that never ran: it has no log (the API server answers an empty one)."""
    launchers = [p for p in pods if pod_role(p, mpijob_name) == LAUNCHER]
    if not launchers:
        return None
    pod = max(launchers, key=lambda p: (_failed(p), _meta(p).get("creationTimestamp") or "", pod_name(p)))
    names = [c.get("name", "") for c in (pod.get("spec") or {}).get("containers") or []]
    return (pod_name(pod), LAUNCHER if LAUNCHER in names or not names else names[0],
            str((pod.get("spec") or {}).get("nodeName") or ""))


def log_tail(text: str, lines: int = LOG_LINES, max_chars: int = _LOG_CHARS) -> str:
    """The last `lines` lines of a log as a terminal shows them (a carriage return redraws the line, as
    Keras' progress bars do), without colour codes; each line and the whole bounded, the end kept."""
    rows = []
    for line in text.replace("\r\n", "\n").split("\n"):
        line = _NOISE.sub("", line.rstrip("\r").split("\r")[-1]).rstrip()
        rows.append(line if len(line) <= _LOG_LINE_CHARS else line[:_LOG_LINE_CHARS - 3] + "...")
    while rows and not rows[-1]:
        rows.pop()
    tail = "\n".join(rows[-lines:]) if lines > 0 else ""
    if len(tail) > max_chars:
        tail = tail[-max_chars:]
        tail = tail[tail.find("\n") + 1:] if "\n" in tail else tail
    return tail


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
    One fault, one interruption: a worker lost and the launcher restart it causes count once.
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
    # Workers first: a worker lost ends mpirun, so the launcher restart that follows is the same interruption,
    # counted once, with the worker (taken as one of the launcher's restarts already counted).
    for name in sorted(current, key=lambda n: (pod_role(current[n], mpijob_name) == LAUNCHER, n)):
        pod = current[name]
        role = pod_role(pod, mpijob_name)
        record = kept.get(name) or {"name": name, "uid": _meta(pod).get("uid", ""), "role": role,
                                    "restarts": 0, "lost": False}
        record = dict(record)
        if role == LAUNCHER and not record["lost"] and any(i.role == WORKER for i in interruptions):
            record["restarts"] += 1
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
    return sorted(out, key=lambda r: r["name"]), interruptions


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
