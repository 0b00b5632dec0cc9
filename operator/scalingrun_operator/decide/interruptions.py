"""What interrupts a run, pure: its training's pods (a worker lost, a launcher restarted), counted against
a record kept in status so that counting survives operator restarts, and its children deleted. Each is counted
by cause in status.training.interruptions: failures of the code (a container that exited non-zero on a node that
was there) against spec.training.backoffLimit, the infrastructure's interruptions (pods deleted, nodes lost,
evictions and preemptions, stalls, children deleted) against spec.training.maxInterruptions; past either the run
fails. Also the end of a failed launcher's log, for the Failed message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from scalingrun_api.heartbeat import PREEMPTED_EXIT_CODE, STALL_EXIT_CODE
from scalingrun_api.logs import RANK_TAG
from scalingrun_api.models import ScalingRun
from .draft import Draft
from .pod_facts import (
    LAUNCHER, TRAINING_ROLES, WORKER, container_statuses, exit_text, metadata_of, pod_name, pod_role, status_of,
)
from .podrecords import same_uid
from .status import BACKOFF_LIMIT_EXCEEDED, CHILD_DELETED, MAX_INTERRUPTIONS_EXCEEDED

# --- causes: the keys of status.training.interruptions -------------------------------------------------

POD_DELETED = "podDeleted"  # a launcher or worker pod deleted (by a person, a controller, a drain)
NODE_LOST = "nodeLost"  # a pod's node NotReady or Unknown past spec.training.nodeLossGracePeriod
NODE_TERMINATING = "nodeTerminating"  # a pod's node got a cloud's termination taint: the operator deleted it
EVICTED = "evicted"  # evicted (node pressure, the eviction API) or preempted by the scheduler
STALLED = "stalled"  # no heartbeat for spec.training.stallTimeout: the operator restarted the training
CHILD_DELETED_CAUSE = "childDeleted"  # the Job or MPIJob deleted mid-run
LAUNCHER_FAILED = "launcherFailed"  # the launcher exited non-zero on a node that was there: the code's failure
WORKER_FAILED = "workerFailed"  # a worker container exited non-zero on a node that was there
CODE_CAUSES = (LAUNCHER_FAILED, WORKER_FAILED)  # spec.training.backoffLimit
# spec.training.maxInterruptions
INFRASTRUCTURE_CAUSES = (POD_DELETED, NODE_LOST, NODE_TERMINATING, EVICTED, STALLED, CHILD_DELETED_CAUSE)
CAUSES = (*INFRASTRUCTURE_CAUSES, *CODE_CAUSES)

# Pod condition DisruptionTarget (Kubernetes 1.26+): why a pod is going away.
_DISRUPTIONS = {"PreemptionByScheduler": EVICTED, "EvictionByEvictionAPI": EVICTED, "TerminationByKubelet": EVICTED,
                "DeletionByTaintManager": NODE_LOST, "DeletionByPodGC": NODE_LOST}
# status.reason of a pod that failed for its node's sake, not its code's.
_FAILED_BY_NODE = {"Evicted": EVICTED, "Preempted": EVICTED, "Preempting": EVICTED, "Shutdown": EVICTED,
                   "NodeShutdown": EVICTED, "Terminated": EVICTED, "NodeLost": NODE_LOST}


# --- the failed launcher's log ---------------------------------------------------------------------

LOG_LINES = 20  # lines of the failed launcher's log that status carries
_LOG_LINE_CHARS = 400
_LOG_CHARS = 4000  # status.training.launcherLogTail at most; the Failed message keeps what fits
# Colour codes and control characters (a tab and newlines apart) say nothing in a status field.
_NOISE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|[\x00-\x08\x0b-\x1f\x7f]")
# Open MPI's --tag-output puts a tag before a rank's newline too (`[1,0]<stdout>:text[1,0]<stdout>:`): only the
# line's first tag says something.
_EMPTY_RANK_TAG = re.compile(rf"(?<=.){RANK_TAG.pattern.decode()}$")


@dataclass(frozen=True)
class LauncherLog:
    """The end of a launcher's log, or why there is none."""

    pod: str
    container: str
    tail: str  # bounded, see log_tail
    error: str = ""  # why the log could not be read


def _exit_codes(pod: dict[str, Any]) -> set[int]:
    """The exit codes its containers recorded, now and the time before."""
    codes = set()
    for container in container_statuses(pod):
        for state in ((container.get("state") or {}).get("terminated"), (container.get("lastState") or {}).get(
                "terminated")):
            if state and state.get("exitCode") is not None:
                codes.add(int(state["exitCode"]))
    return codes


def _failed(pod: dict[str, Any]) -> bool:
    return status_of(pod).get("phase") == "Failed" or any(code != 0 for code in _exit_codes(pod))


def failed_launcher(pods: list[dict[str, Any]], mpijob_name: str) -> Optional[tuple[str, str, str]]:
    """(pod, container, node) whose log tells why the training failed: the newest launcher pod, a failed one
    before one that did not fail (the launcher's Job may have started another after it). The node is ''
    for a pod that never ran: it has no log (the API server answers an empty one)."""
    launchers = [p for p in pods if pod_role(p, mpijob_name) == LAUNCHER]
    if not launchers:
        return None
    pod = max(launchers, key=lambda p: (_failed(p), metadata_of(p).get("creationTimestamp") or "", pod_name(p)))
    names = [c.get("name", "") for c in (pod.get("spec") or {}).get("containers") or []]
    return (pod_name(pod), LAUNCHER if LAUNCHER in names or not names else names[0],
            str((pod.get("spec") or {}).get("nodeName") or ""))


def log_tail(text: str, lines: int = LOG_LINES, max_chars: int = _LOG_CHARS) -> str:
    """The last `lines` lines of a log as a terminal shows them (a carriage return redraws the line, as
    Keras' progress bars do), without colour codes; each line and the whole bounded, the end kept."""
    rows = []
    for line in text.replace("\r\n", "\n").split("\n"):
        line = _EMPTY_RANK_TAG.sub("", _NOISE.sub("", line.rstrip("\r").split("\r")[-1]).rstrip())
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
    status = status_of(pod)
    if status.get("reason") == "Evicted":
        return f"it was evicted: {status.get('message') or 'no message'}"
    for container in container_statuses(pod):
        terminated = (container.get("state") or {}).get("terminated")
        if terminated and terminated.get("exitCode", 0) != 0:
            return f"container {container.get('name')} had ended with {exit_text(terminated)}"
    return f"it was {status.get('phase') or 'Pending'}"


def _restart_count(pod: dict[str, Any]) -> int:
    return sum(int(c.get("restartCount") or 0) for c in container_statuses(pod))


def _last_exit(pod: dict[str, Any]) -> str:
    for container in container_statuses(pod):
        last = (container.get("lastState") or {}).get("terminated")
        if last:
            return f"container {container.get('name')} {exit_text(last)}"
    return "no exit status recorded"


@dataclass(frozen=True)
class Interruption:
    """A worker pod lost or a launcher restart: counted in status, reported in a Warning Event."""

    role: str
    pod: str
    reason: str  # the Event's reason
    message: str
    cause: str = POD_DELETED  # the key of status.training.interruptions it is counted under


WORKER_LOST = "WorkerPodLost"
LAUNCHER_RESTARTED = "LauncherRestarted"
_RESUMES = "the launcher resumes from the last checkpoint"


def _lost(record: dict[str, Any], how: str, cause: str) -> Interruption:
    role, name, uid = record["role"], record["name"], record["uid"]
    if role == WORKER:
        return Interruption(WORKER, name, WORKER_LOST,
                            f"worker pod {name} (uid {uid}) {how}; the MPI operator recreates it and {_RESUMES}",
                            cause)
    return Interruption(LAUNCHER, name, LAUNCHER_RESTARTED,
                        f"launcher pod {name} (uid {uid}) {how}; its Job starts a new launcher pod, which "
                        "resumes from the last checkpoint", cause)


def code_cause(role: str, pod: Optional[dict[str, Any]] = None) -> str:
    """A non-zero exit on a healthy node: the code's failure, unless the stall watch said a peer stopped answering or
    the ranks stopped on a preemption notice."""
    if role == LAUNCHER and pod is not None and STALL_EXIT_CODE in _exit_codes(pod):
        return STALLED
    if role == LAUNCHER and pod is not None and stopped_on_notice(pod):
        return EVICTED
    return LAUNCHER_FAILED if role == LAUNCHER else WORKER_FAILED


def stopped_on_notice(pod: dict[str, Any]) -> bool:
    """A launcher whose ranks stopped on a preemption notice (exit PREEMPTED_EXIT_CODE: a checkpoint at their last
    step, scalingrun_trainer.core.preemption): its restart is not counted, since its cause is counted where it is
    seen (a worker deleted, evicted or on a node about to go, the launcher pod itself deleted)."""
    return PREEMPTED_EXIT_CODE in _exit_codes(pod)


def _gone_how(record: dict[str, Any], replacement: Optional[dict[str, Any]], hint: Optional[str]) -> tuple[str, str]:
    if replacement is not None:
        return f"was replaced (new uid {metadata_of(replacement).get('uid')})", POD_DELETED
    cause = EVICTED if (hint or "").startswith("it was evicted") else POD_DELETED
    return "was deleted" + (f"; {hint}" if hint else ""), cause


def disruption_cause(pod: dict[str, Any]) -> Optional[str]:
    """The cause a pod's DisruptionTarget condition names (preempted, evicted, its node tainted away), if any."""
    for condition in status_of(pod).get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            return _DISRUPTIONS.get(condition.get("reason") or "")
    return None


def _failed_how(pod: dict[str, Any], role: str) -> Optional[tuple[str, str]]:
    """Why a pod that still exists is lost to the training, and the cause, or None while it is not."""
    status = status_of(pod)
    if metadata_of(pod).get("deletionTimestamp"):
        return f"is being deleted; {last_words(pod)}", disruption_cause(pod) or POD_DELETED
    if status.get("phase") == "Failed":
        by_node = _FAILED_BY_NODE.get(status.get("reason") or "")
        if status.get("reason") == "Evicted":
            return f"was evicted: {status.get('message') or 'no message'}", EVICTED
        if by_node:
            return f"failed ({status.get('reason')}: {status.get('message') or 'no message'})", by_node
        return f"failed; {last_words(pod)}", disruption_cause(pod) or code_cause(role, pod)
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
    launcher_done = any(pod_role(p, mpijob_name) == LAUNCHER and status_of(p).get("phase") == "Succeeded"
                        for p in current.values())
    interruptions: list[Interruption] = []
    kept: dict[str, dict[str, Any]] = {}
    for record in records:
        pod = current.get(record.get("name", ""))
        if pod is not None and same_uid(record.get("uid", ""), metadata_of(pod).get("uid", "")):
            kept[record["name"]] = record
            continue
        # The pod of this record is gone (or another took its name): lost, unless already counted or the
        # training finished (the MPI operator then deletes the workers on purpose).
        if not record.get("lost") and not launcher_done:
            interruptions.append(_lost(record, *_gone_how(record, pod, hints.get(record.get("uid", "")))))
    out: list[dict[str, Any]] = []
    # Workers first: a worker lost ends mpirun, so the launcher restart that follows is the same interruption,
    # counted once, with the worker (taken as one of the launcher's restarts already counted).
    for name in sorted(current, key=lambda n: (pod_role(current[n], mpijob_name) == LAUNCHER, n)):
        pod = current[name]
        role = pod_role(pod, mpijob_name)
        record = kept.get(name) or {"name": name, "uid": metadata_of(pod).get("uid", ""), "role": role,
                                    "restarts": 0, "lost": False}
        record = dict(record)
        if role == LAUNCHER and not record["lost"] and any(i.role == WORKER for i in interruptions):
            record["restarts"] += 1
        restarts = _restart_count(pod)
        if restarts > record["restarts"]:
            times = restarts - record["restarts"]
            what = f"restarted{f' {times} times' if times > 1 else ''}: {_last_exit(pod)}"
            if role == LAUNCHER and stopped_on_notice(pod):
                pass  # one fault, one interruption: the notice's cause is counted
            elif role == LAUNCHER:
                interruptions.append(Interruption(LAUNCHER, name, LAUNCHER_RESTARTED,
                                                  f"launcher pod {name} {what}; {_RESUMES}", code_cause(role, pod)))
            else:
                interruptions.append(Interruption(WORKER, name, WORKER_LOST,
                                                  f"worker pod {name} {what}; {_RESUMES}", WORKER_FAILED))
            record["restarts"] = restarts
        how = _failed_how(pod, role)
        if how and not record["lost"] and not launcher_done:
            interruptions.append(_lost(record, *how))
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
        record["lost"] = _failed_how(pod, record["role"]) is not None
    return records


# --- children deleted, and the limit -----------------------------------------------------------------


def count(training_status: dict[str, Any], cause: str) -> int:
    """Counts one interruption of `cause` in status.training (restarts counts them all); returns the new count
    of the limit it falls under."""
    counts = dict(training_status.get("interruptions") or {})
    counts[cause] = int(counts.get(cause) or 0) + 1
    training_status["interruptions"] = counts
    training_status["restarts"] = int(training_status.get("restarts") or 0) + 1
    return sum(int(counts.get(c) or 0) for c in (CODE_CAUSES if cause in CODE_CAUSES else INFRASTRUCTURE_CAUSES))


def child_deleted(draft: Draft, run: ScalingRun, kind: str, name: str, next_step: str, replaced: bool = False) -> bool:
    """Reports and counts a deleted child; True when that was one too many (the run failed)."""
    update = draft.update
    training_status = dict(update.desired.get("training") or {})
    counted = count(training_status, CHILD_DELETED_CAUSE)
    update.desired["training"] = training_status
    limit = run.spec.training.max_interruptions
    how = "was deleted and replaced" if replaced else "was deleted"
    message = (f"{kind} {name} {how} while the run was {update.phase}; counted as interruption "
               f"{counted} of the {limit} allowed (spec.training.maxInterruptions); {next_step}")
    update.condition(CHILD_DELETED, "True", f"{kind}Deleted", message)
    update.warn("ChildDeleted", message)
    if over_limits(draft, run, training_status, message):
        return True
    draft.again = draft.again or not replaced
    return False


def over_limits(draft: Draft, run: ScalingRun, training_status: dict[str, Any], last: str = "") -> bool:
    """Fails the run once the failures of its code exceed spec.training.backoffLimit, or the infrastructure's
    interruptions (pods deleted, nodes lost, evictions, stalls, children deleted) spec.training.maxInterruptions."""
    counts = training_status.get("interruptions") or {}
    last = last or "see the run's Warning Events for each one"
    failures = sum(int(counts.get(c) or 0) for c in CODE_CAUSES)
    others = sum(int(counts.get(c) or 0) for c in INFRASTRUCTURE_CAUSES)
    training = run.spec.training
    where = draft.settings.where.events(draft.namespace)
    if failures > training.backoff_limit:
        counted = "1 failure" if failures == 1 else f"{failures} failures"
        message = (f"{counted} of the training's code (a container that exited non-zero on a healthy node) "
                   f"exceed{'s' if failures == 1 else ''} spec.training.backoffLimit ({training.backoff_limit}); "
                   f"the last: {last}. Fix what fails ({where}, and the launcher's log), then recreate the run, "
                   "which resumes from its last checkpoint when spec.training.resume is true")
        draft.update.fail(BACKOFF_LIMIT_EXCEEDED, message)
        return True
    if others > training.max_interruptions:
        counted = "1 interruption" if others == 1 else f"{others} interruptions"
        by_cause = ", ".join(f"{c} {counts[c]}" for c in INFRASTRUCTURE_CAUSES if counts.get(c))
        message = (f"{counted} by the infrastructure ({by_cause}) exceed{'s' if others == 1 else ''} "
                   f"spec.training.maxInterruptions ({training.max_interruptions}); the last: {last}. "
                   f"Find what deletes, evicts or stops the run's pods and children ({where}), then recreate the "
                   "run, which resumes from its last checkpoint when spec.training.resume is true, or allow more "
                   "with spec.training.maxInterruptions")
        draft.update.fail(MAX_INTERRUPTIONS_EXCEEDED, message)
        return True
    return False
