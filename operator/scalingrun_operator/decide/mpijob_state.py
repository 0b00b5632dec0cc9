"""The MPIJob as a run reads it, pure: its state from the mpi-operator's conditions, the patch that makes its suspend
the run's, its worker count, and the words for its failure."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Optional

from scalingrun_api.progress import Progress
from . import progress as mirror
from .snapshot import CLUSTER, Where
from .status import parse_time


@dataclass(frozen=True)
class MPIJobState:
    state: str  # Pending, Created, Running, Restarting, Suspended, Succeeded or Failed
    reason: str = ""
    message: str = ""
    suspended: bool = False  # spec.runPolicy.suspend as the MPIJob has it
    finished_at: Optional[dt.datetime] = None

    @property
    def finished(self) -> bool:
        return self.state in ("Succeeded", "Failed")


_ORDER = ("Failed", "Succeeded", "Suspended", "Restarting", "Running", "Created")


def mpijob_state(mpijob: dict[str, Any]) -> MPIJobState:
    """The MPIJob's state from its conditions (set by the mpi-operator); a finished state wins."""
    status = mpijob.get("status") or {}
    suspended = bool(((mpijob.get("spec") or {}).get("runPolicy") or {}).get("suspend"))
    true = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    for kind in _ORDER:
        if kind in true:
            condition = true[kind]
            finished = None
            if kind in ("Failed", "Succeeded"):
                finished = parse_time(status.get("completionTime")) or parse_time(condition.get("lastTransitionTime"))
            return MPIJobState(kind, condition.get("reason") or "", condition.get("message") or "", suspended,
                               finished)
    return MPIJobState("Pending", suspended=suspended)


def suspend_patch(desired: bool, state: MPIJobState) -> Optional[dict[str, Any]]:
    """The patch that makes the MPIJob's suspend match the run's, if one is needed."""
    if state.finished or state.suspended == desired:
        return None
    return {"spec": {"runPolicy": {"suspend": desired}}}


# Conditions keep 2000 characters (status.set_condition) and status.message adds the reason: the log's end
# must fit in what is left, or the lines that matter most are the ones cut.
_FAILURE_MESSAGE_CHARS = 1900


def _launcher_log_text(log: Any, room: int) -> str:
    """The launcher's log as the Failed message says it, in about `room` characters (whole lines from the
    end); `log` is a pods.LauncherLog."""
    if log.error:
        where = f"launcher pod {log.pod} container {log.container}" if log.pod else "the launcher"
        return f"the log of {where} could not be read ({log.error})"
    if not log.pod:
        return "no launcher pod is left to read its log from"
    if not log.tail:
        return f"launcher pod {log.pod} container {log.container} logged nothing"
    header = f" of launcher pod {log.pod} container {log.container}:\n"
    lines = log.tail.split("\n")
    while len(lines) > 1 and len(header) + 20 + len("\n".join(lines)) > room:
        lines.pop(0)
    tail = "\n".join(lines)[-max(0, room - len(header) - 20):]
    return f"last {len(lines)} line{'s' if len(lines) > 1 else ''}{header}{tail}"


def builder_failed(progress: Optional[Progress]) -> bool:
    """The trainer's contract check of spec.model.builder failed (rank 0 wrote a BuilderError, no epoch ran)."""
    return bool(progress is not None and progress.error and progress.error.startswith("BuilderError:")
                and not progress.epoch)


def mpijob_failure_message(namespace: str, name: str, state: MPIJobState, progress: Optional[Progress],
                           launcher_log: Any = None, pod_cause: str = "", where: Where = CLUSTER) -> str:
    """Why the MPIJob failed: its condition, the epoch reached, the trainer's error, what a pod says (e.g. a
    worker OOMKilled) and, with `launcher_log` (an interruptions.LauncherLog), the end of the launcher's log, cut
    from the front to fit."""
    cause = ": ".join(p for p in (state.reason, state.message) if p)[:500] or "no reason given"
    error = progress.error if progress is not None else None
    if builder_failed(progress):
        # Nothing trained and nothing to resume: the user's package or function is what needs fixing.
        parts = [f"MPIJob {name} failed ({cause}) before any training step: the network of spec.model.builder "
                 f"could not be built", f"trainer reported: {error[:700]}",
                 "fix the package in the image (or the function, spec.model.params) and recreate the run; "
                 f"{where.launcher_logs(namespace, name)}"]
    else:
        parts = [f"MPIJob {name} failed ({cause})", mirror.epochs_text(progress)]
        if state.reason == "DeadlineExceeded":
            parts.append("it ran past spec.runPolicy.activeDeadlineSeconds (the training's deadline); raise it")
        if error:
            parts.append(f"trainer reported: {error[:500]}")
        parts.append(f"{where.launcher_logs(namespace, name)}; recreating the run under the same name "
                     "resumes from its last checkpoint when spec.training.resume is true")
    if pod_cause:
        parts.append(pod_cause[:700])
    if launcher_log is not None:
        head = "; ".join(parts)
        parts.append(_launcher_log_text(launcher_log, _FAILURE_MESSAGE_CHARS - len(head) - 2))
    return "; ".join(parts)


def mpijob_workers(mpijob: dict[str, Any]) -> int:
    """The worker count an MPIJob was made with (spec.mpiReplicaSpecs.Worker.replicas)."""
    worker = (((mpijob.get("spec") or {}).get("mpiReplicaSpecs") or {}).get("Worker") or {})
    return int(worker.get("replicas") or 0)
