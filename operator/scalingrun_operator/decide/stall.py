"""A training that stopped beating, pure: spec.training.stallTimeout against <run location>/heartbeat.json.

Rank 0 beats from its training loop (scalingrun_api.heartbeat). While a launcher pod runs, the operator reads the
heartbeat once when the attempt starts and then only when the deadline it computed passes (a recheck is scheduled
for it), so its reads stay one per timeout. The deadline counts from the last beat of this attempt, or from the
launcher pod's start while none came (the timeout's floor covers a first graph build); a training.command's
script is timed only once it beats (through the SDK). The beat's time is the writer's clock (Unix seconds in the
document), taken as now when it is ahead of the operator's. A silence while a training pod's node is down (within
nodeLossGracePeriod too) is not judged here: training.py leaves it to the lost-node handling, one fault, nodeLost.

Past the deadline the run is Stalled: the condition names the last step, epoch and phase, how long ago, and the
suspects (pods Terminating, not Ready, containers not ready). onStall restart deletes the suspects (or every worker
when none stands out) and the launcher, counted as `stalled` against maxInterruptions;
fail fails the run.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Optional

from scalingrun_api.heartbeat import Heartbeat, stall_timeout_seconds
from scalingrun_api.models import ScalingRun
from scalingrun_api.status_push import HEARTBEAT
from ..builders.common import STATUS_VOLUME
from ..builders.locations import heartbeat_uri
from . import faults, interruptions, nodes
from .draft import Draft, store_of
from .pod_facts import LAUNCHER, TRAINING_ROLES, WORKER, container_statuses, metadata_of, pod_name, pod_role, status_of
from .snapshot import Log
from .status import STALLED, get_condition, parse_time, rfc3339

STALL_REASON = "NoHeartbeat"  # the Stalled condition's reason while the training does not beat
_LOG_LINES = 5


def running_launcher(found: list[dict[str, Any]], mpijob: str) -> Optional[tuple[dict[str, Any], dt.datetime]]:
    """The launcher pod of the current attempt, with the attempt's start (its running container's, so that a
    restarted container is a new attempt), while it runs (not Terminating, not waiting to restart)."""
    running = []
    for pod in found:
        status = status_of(pod)
        if (pod_role(pod, mpijob) != LAUNCHER or metadata_of(pod).get("deletionTimestamp")
                or status.get("phase") != "Running"):
            continue
        starts = [parse_time(((c.get("state") or {}).get("running") or {}).get("startedAt"))
                  for c in container_statuses(pod)]
        started = max((s for s in starts if s), default=None)
        if started is None and not container_statuses(pod):
            started = parse_time(status.get("startTime"))
        if started is not None:
            running.append((started, pod_name(pod), pod))
    if not running:
        return None
    started, _, pod = max(running, key=lambda t: (t[0], t[1]))
    return pod, started


def made_before_the_push_path(draft: Draft, mpijob: str) -> bool:
    """With the status endpoint on: whether the MPIJob's launcher pods were made by an operator older than the push
    path (a `helm upgrade` with the run in flight). They mount no status token, so no heartbeat or progress comes
    from them: such a training is never judged stalled, and ends on its MPIJob's condition (docs/install.md,
    "Upgrade")."""
    if draft.settings.reads_storage:
        return False
    launchers = [pod for pod in draft.pods() if pod_role(pod, mpijob) == LAUNCHER]
    volumes = [volume.get("name") for pod in launchers for volume in (pod.get("spec") or {}).get("volumes") or []]
    return bool(launchers) and STATUS_VOLUME not in volumes


def _beat_time(beat: Heartbeat, now: dt.datetime) -> Optional[dt.datetime]:
    if beat.time <= 0:
        return None
    return min(now, dt.datetime.fromtimestamp(beat.time, tz=dt.timezone.utc))


def _where(beat: Optional[Heartbeat]) -> str:
    if beat is None:
        return "none in this attempt"
    parts = [f"phase {beat.phase}"]
    if beat.epoch is not None:
        parts.append(f"epoch {beat.epoch}")
    parts.append(f"step {beat.step}")
    return ", ".join(parts)


def _suspects(found: list[dict[str, Any]], mpijob: str) -> list[tuple[dict[str, Any], str]]:
    """(pod, why) for the training's pods that stand out: Terminating, not Ready, a container not ready. (None is on
    a node that is down: that is the lost-node handling's.)"""
    out = []
    for pod in sorted(found, key=pod_name):
        if pod_role(pod, mpijob) not in TRAINING_ROLES or status_of(pod).get("phase") in ("Succeeded", "Failed"):
            continue
        name = pod_name(pod)
        why = []
        if metadata_of(pod).get("deletionTimestamp"):
            why.append(f"Terminating since {metadata_of(pod)['deletionTimestamp']}")
        not_ready = [c.get("name", "") for c in container_statuses(pod) if c.get("ready") is False]
        if not_ready:
            why.append(f"container{'s' if len(not_ready) > 1 else ''} {', '.join(not_ready)} not ready")
        elif nodes.pod_ready(pod) is False:
            why.append("not Ready")
        if why:
            out.append((pod, f"{name} ({'; '.join(why)})"))
    return out


def _record(training_status: dict[str, Any], launcher: dict[str, Any], last: dt.datetime, beat: Optional[Heartbeat],
            timeout: float, deadline: dt.datetime) -> None:
    record: dict[str, Any] = {"launcherUid": metadata_of(launcher).get("uid"), "time": rfc3339(last),
                              "timeoutSeconds": timeout, "deadline": rfc3339(deadline)}
    if beat is not None:
        record.update(step=beat.step, phase=beat.phase, **({"epoch": beat.epoch} if beat.epoch is not None else {}))
    training_status["heartbeat"] = record


def check_stall(draft: Draft, run: ScalingRun, training_status: dict[str, Any], mpijob: str) -> None:
    """Stalled from the heartbeat while a launcher runs; onStall restart or fail past the timeout."""
    update, training = draft.update, run.spec.training
    if stall_timeout_seconds(training.stall_timeout, 0.0) is None:
        return  # stallTimeout 0: off
    found = draft.pods()
    current = running_launcher(found, mpijob)
    if current is None:
        return  # no attempt runs: nothing should beat (a Pending pod is PodsHealthy's)
    if made_before_the_push_path(draft, mpijob):
        return  # it cannot beat here; a restart would make the same pods (their MPIJob's template), no wiser
    launcher, started = current
    now = update.moment
    record = training_status.get("heartbeat") or {}
    existing = get_condition(update.desired["conditions"], STALLED) or {}
    if existing.get("status") == "True" and existing.get("reason") == STALL_REASON and not record:
        # Restarted (the record is cleared then): a new attempt runs. Not waiting for its first beat keeps kstatus'
        # Stalled (Flux: failed) as short as the restart.
        update.condition(STALLED, "False", "Restarted", f"launcher pod {pod_name(launcher)} runs a new attempt since "
                         f"{rfc3339(started)}; before: {existing.get('message') or ''}"[:1500])
    deadline = parse_time(record.get("deadline"))
    if record.get("launcherUid") == metadata_of(launcher).get("uid") and deadline and now < deadline:
        draft.recheck((deadline - now).total_seconds() + 1.0)
        return
    readable, beat = draft.read(heartbeat_uri(run), store_of(run), HEARTBEAT)
    if not readable:
        return  # StorageReadable says why; the read is retried
    when = _beat_time(beat, now) if beat else None
    if when is None or when < started:
        beat, when = None, None  # none yet, or an earlier attempt's
    last = when or started
    if draft.settings.pushes_since is not None:
        last = max(last, draft.settings.pushes_since)  # beats pushed before this operator started are not known
    timeout = stall_timeout_seconds(training.stall_timeout, beat.longest_gap_seconds if beat else 0.0) or 0.0
    if beat is None and training.command:
        # A team's own script beats through the SDK (sdk.context() beats first): one that never does is not judged
        # by a silence it cannot help. Looked at again a timeout later, in case it starts.
        _record(training_status, launcher, now, None, timeout, now + dt.timedelta(seconds=timeout))
        draft.recheck(timeout + 1.0)
        return
    deadline = last + dt.timedelta(seconds=timeout)
    _record(training_status, launcher, last, beat, timeout, deadline)
    if now < deadline:
        draft.recheck((deadline - now).total_seconds() + 1.0)
        return
    _stalled(draft, run, training_status, mpijob, launcher, beat, last, timeout, found)


def _stalled(draft: Draft, run: ScalingRun, training_status: dict[str, Any], mpijob: str, launcher: dict[str, Any],
             beat: Optional[Heartbeat], last: dt.datetime, timeout: float, found: list[dict[str, Any]]) -> None:
    update, training = draft.update, run.spec.training
    silent = (update.moment - last).total_seconds()
    since = (f"the last at {rfc3339(last)} ({_where(beat)})" if beat is not None
             else f"none since launcher pod {pod_name(launcher)} started at {rfc3339(last)}")
    setting = "auto" if training.stall_timeout == "auto" else str(training.stall_timeout)
    suspects = _suspects(found, mpijob)
    named = ("suspects: " + ", ".join(why for _, why in suspects) if suspects
             else "no pod stands out (all Running and Ready)")
    message = (f"no heartbeat for {silent:.0f} s, over spec.training.stallTimeout ({setting}: {timeout:g} s); {since}; "
               f"{named}")
    if not draft.settings.where.local:
        container = (launcher.get("spec") or {}).get("containers") or [{}]
        tail = draft.need(Log(pod_name(launcher), container[0].get("name") or LAUNCHER, _LOG_LINES))
        if tail.text:
            message += f"; launcher log: {interruptions.log_tail(tail.text, _LOG_LINES, 600)}"
    if training.on_stall == "fail":
        update.condition(STALLED, "True", STALL_REASON, message)
        update.fail("TrainingStalled", f"{message}; spec.training.onStall is fail")
        return
    doomed = [p for p, _ in suspects] or [p for p in found if pod_role(p, mpijob) == WORKER
                                          and not metadata_of(p).get("deletionTimestamp")]
    doomed = [*doomed, *([launcher] if launcher not in doomed else [])]
    faults.restart_pods(draft, training_status, doomed, mpijob, None)
    counted = interruptions.count(training_status, interruptions.STALLED)
    training_status["heartbeat"] = None  # the next attempt is timed from its own start
    message += (f"; deleted {', '.join(pod_name(p) for p in doomed)} so that the MPI operator starts them again and "
                f"the launcher resumes from the last checkpoint (spec.training.onStall restart; interruption "
                f"{counted} of the {training.max_interruptions} allowed by spec.training.maxInterruptions)")
    update.condition(STALLED, "True", STALL_REASON, message)
    update.warn("Stalled", message)
