"""The training phase, pure: the MPIJob's creation (at an elastic run's size, elastic.py), suspend and resume (its
state: mpijob_state.py), the interruptions it survives (workers lost, launcher restarts, the MPIJob deleted) up to
spec.training.backoffLimit (the code's failures) and spec.training.maxInterruptions (the infrastructure's), and what
its end means for the run.
"""

from __future__ import annotations

from typing import Any, Optional

from scalingrun_api.models import MPIJOB_API_VERSION, Phase, ScalingRun
from scalingrun_api.progress import Progress, ProgressState
from scalingrun_api.status_push import PROGRESS
from ..builders import build_config_map, build_mpijob
from ..builders.common import mpijob_name, trainer_image
from ..builders.mpijob import MPI_OPERATOR, MPI_OPERATOR_INSTALL
from ..builders.locations import progress_uri
from . import elastic, faults, interruptions, podrecords, pods, progress as mirror, stall
from .draft import Draft, store_of
from .mpijob_state import MPIJobState, builder_failed, mpijob_failure_message, mpijob_state, suspend_patch
from .pod_facts import TRAINING_ROLES, WORKER
from .snapshot import Log
from .status import (BUILDER_FAILED, GPUS_UNUSED, INPUT_BOUND, MPIJOB_FAILED, MPIJOB_SERVED, NO_MPIJOB_CONTROLLER,
                     QUEUED, SUSPENDED, TRAINED, Event, get_condition, parse_time)


def decide_training(draft: Draft, run: ScalingRun) -> None:
    """Trained from the MPIJob, the trainer's progress document and the training's pods."""
    update, name = draft.update, mpijob_name(run)
    size = elastic.workers_now(run, update.desired.get("training"))
    wanted = draft.built(("MPIJob", size), lambda: build_mpijob(run, draft.namespace, draft.settings.gpu_tolerations,
                                                                workers=size))
    mpijob = draft.child("MPIJob", name)
    if mpijob is not None and not draft.own(mpijob, wanted):
        return
    recorded = (update.desired.get("training") or {}).get("mpiJobUid")
    resumes = ("a new MPIJob resumes from the last checkpoint" if run.spec.training.resume
               else "a new MPIJob starts over (spec.training.resume is false)")
    trained = get_condition(update.desired["conditions"], TRAINED) or {}
    if mpijob is None and recorded and elastic.resize_under_way(update.desired.get("training")):
        _forget_mpijob(draft, name, mpijob=None)  # deleted by this run's resize: not an interruption
        draft.again = True
        return
    if mpijob is None and recorded and trained.get("reason") == "WaitingForProgress":
        # It had succeeded, and its ttlSecondsAfterFinished removed it: no interruption, judged on what is there.
        _, progress = draft.read(progress_uri(run), store_of(run), PROGRESS)
        _succeeded(draft, name, progress)
        return
    if mpijob is None and recorded:
        # As for the Job: counted and written (the uid cleared), then the next look creates a new one.
        _forget_mpijob(draft, name, mpijob=None)
        interruptions.child_deleted(draft, run, "MPIJob", name, resumes)
        return
    if mpijob is not None and recorded and recorded != mpijob["metadata"].get("uid"):
        # Deleted and created again by someone else while nobody looked: counted all the same.
        _forget_mpijob(draft, name, mpijob)
        if interruptions.child_deleted(draft, run, "MPIJob", name,
                                       "the MPIJob there now resumes from the last checkpoint", replaced=True):
            _stop(draft, mpijob)
            return
    if mpijob is None:
        draft.ensure(draft.built("ConfigMap", lambda: build_config_map(run, draft.namespace)))
        if draft.blocked:
            return
        draft.ensure(wanted, uid_at=("training", "mpiJobUid"))
    current_mpijob = mpijob or wanted  # one created now is as it will be read: no status yet
    state = mpijob_state(current_mpijob)
    _served(draft, mpijob, name)
    wanted_suspend = run.spec.run_policy.suspend
    current = update.desired.get("training") or {}
    patch = _suspend_change(run, state, current.get("suspendApplied"))
    if patch and mpijob is not None:
        # Posted with the change itself (a conflicting status patch must not lose it).
        draft.patch(mpijob, patch, Event("Normal", "Suspending" if wanted_suspend else "Resuming",
                                         f"MPIJob {name}: spec.runPolicy.suspend={str(wanted_suspend).lower()}"))
    paused = wanted_suspend or state.suspended
    # Pods and Nodes before storage: while a training pod's node is down (its store may be there too, and a read of
    # it then waits out the storage deadline), the lost-node handling acts without reading the progress document.
    node_down = not state.finished and not paused and faults.node_trouble(draft, name)
    progress = None
    if not node_down:
        _, progress = draft.read(progress_uri(run), store_of(run), PROGRESS, versioned=True)
    uid = current_mpijob["metadata"].get("uid")
    same_mpijob = current.get("mpiJobUid") in (None, uid)
    merged = mirror.merge_training_status(current, mirror.base_training_status(run, name, size),
                                          mirror.training_status(progress), same_mpijob)
    merged["mpiJobUid"] = uid
    merged["suspendApplied"] = wanted_suspend
    # The size and the resizes are the run's, kept across MPIJobs; from the look that creates the MPIJob its
    # workers hold their resources.
    resize = elastic.decide_elastic(draft, run, current_mpijob, state, found=mpijob is not None, paused=paused,
                                    before=current, epoch=merged.get("epoch"))
    merged = resize.applied(merged, name)
    if resize.stops:
        update.desired["training"] = merged
        return
    merged["estimatedCompletion"] = (None if state.finished else
                                     mirror.estimated_completion(current, merged, progress, update.moment))
    if not state.finished:
        _track_interruptions(draft, merged, name, paused)
        # A lost node's restart is the restart a stall would make: one fault, counted once. A silence while a
        # node is down (within its grace too) is that node's: the stall check leaves it to the lost-node handling.
        # A node about to go: its pods deleted gracefully now (a checkpoint at the next step), not lost later.
        noticed = not paused and faults.terminating_nodes(draft, merged, name)
        if not paused and not faults.lost_nodes(draft, run, merged, name) and not node_down and not noticed:
            stall.check_stall(draft, run, merged, name)
    update.desired["training"] = merged
    stopped = update.phase == Phase.failed.value  # a stall with onStall fail
    if not state.finished and (stopped or interruptions.over_limits(draft, run, merged)):
        if mpijob is not None:
            _stop(draft, mpijob)
        return
    if node_down:
        return  # Trained and the phase stay as shown; the look after the node's pods are replaced reads progress
    _input_bound(draft, run, merged.get("inputHistory"))
    _gpus_unused(draft, run, merged.get("devices"))
    uri = mirror.model_uri(progress)
    if uri:
        update.desired["modelUri"] = uri
    if state.state == "Succeeded":
        if ((progress is None or progress.state != ProgressState.succeeded.value)
                and not stall.made_before_the_push_path(draft, name) and draft.within_grace(state.finished_at)):
            draft.recheck(draft.grace_left(state.finished_at))
            update.condition(TRAINED, "Unknown", "WaitingForProgress",
                             f"MPIJob {name} succeeded; waiting for the final {progress_uri(run)}")
            update.set_phase(Phase.training.value)
            return
        _succeeded(draft, name, progress)
    elif state.state == "Failed":
        launcher_log = _launcher_log(draft, name)
        if launcher_log is not None and launcher_log.tail:
            merged["launcherLogTail"] = launcher_log.tail
        message = mpijob_failure_message(draft.namespace, name, state, progress, launcher_log,
                                         pods.pod_cause(draft, TRAINING_ROLES, name), draft.settings.where)
        reason = BUILDER_FAILED if builder_failed(progress) else MPIJOB_FAILED
        update.condition(TRAINED, "False", reason, message)
        update.fail(reason, message)
    elif wanted_suspend:
        update.condition(SUSPENDED, "True", "Suspended",
                         f"MPIJob {name} is suspended (spec.runPolicy.suspend); set it to false to resume from the "
                         "last checkpoint")
        update.condition(TRAINED, "Unknown", "Suspended", mirror.running_message(name, progress))
        update.set_phase(Phase.suspended.value, "spec.runPolicy.suspend is true")
    elif state.suspended and run.spec.run_policy.kueue_queue_name:
        if draft.condition_true(SUSPENDED):
            update.condition(SUSPENDED, "False", "ReturnedToQueue",
                             f"spec.runPolicy.suspend is false: MPIJob {name} waits for Kueue to admit it again")
        _queued(draft, run, name, progress)
    else:
        if draft.condition_true(SUSPENDED):
            update.condition(SUSPENDED, "False", "Resumed", f"MPIJob {name} resumed")
        if draft.condition_true(QUEUED):
            update.condition(QUEUED, "False", "Admitted", f"Kueue admitted MPIJob {name}")
        running = mirror.running_message(name, progress)
        holdup = pods.check_pods(draft, TRAINING_ROLES, name)
        update.condition(TRAINED, "Unknown", holdup[0] if holdup else "Running",
                         f"{running}; {holdup[1]}" if holdup else running)
        update.set_phase(Phase.training.value, f"MPIJob {name}")


def _served(draft: Draft, mpijob: Optional[dict[str, Any]], name: str) -> None:
    """An MPIJob nobody has written a status on past Settings.mpijob_unserved_seconds: no controller serves MPIJobs
    here (none installed, one that is down, or the Training Operator v1's, which serves another version). Every
    controller writes a condition within seconds, suspended or not; the run would otherwise wait in silence."""
    bound = draft.settings.mpijob_unserved_seconds
    if bound is None:
        return
    if mpijob is None:  # created by this look: no event need come for it (its controller's would), look then
        draft.recheck(bound + 0.5)
        return
    before = get_condition(draft.update.desired["conditions"], MPIJOB_SERVED) or {}
    if (mpijob.get("status") or {}).get("conditions"):
        if before.get("status") == "False":
            draft.update.condition(MPIJOB_SERVED, "True", "Served", f"MPIJob {name} is reconciled by its controller")
        return
    born = parse_time(mpijob["metadata"].get("creationTimestamp"))
    waited = (draft.update.moment - born).total_seconds() if born else 0.0
    if waited < bound:
        draft.recheck(bound - waited + 0.5)
        return
    message = (f"nothing has reconciled MPIJob {name} in {bound:g} s (no status, no condition): no controller serves "
               f"{MPIJOB_API_VERSION} MPIJobs in this cluster, or it is down. Install {MPI_OPERATOR}: "
               f"{MPI_OPERATOR_INSTALL} (beside Kubeflow's Training Operator v1, read docs/run-in-a-cluster.md, "
               "\"MPIJobs: mpi-operator and the Training Operator\", first); `scalingrun doctor` checks the cluster")
    if before.get("status") != "False":
        draft.update.warn(NO_MPIJOB_CONTROLLER, message)
    draft.update.condition(MPIJOB_SERVED, "False", NO_MPIJOB_CONTROLLER, message)


def _suspend_change(run: ScalingRun, state: MPIJobState, applied: Optional[bool]) -> Optional[dict[str, Any]]:
    """The patch of the MPIJob's suspend this look makes, if any. Without Kueue the MPIJob follows
    spec.runPolicy.suspend at every look. With a Kueue queue, Kueue suspends (for quota, or to preempt) and resumes
    the MPIJob: the operator suspends it when the user sets spec.runPolicy.suspend, and never resumes it (a
    `suspend: false` written by anyone but Kueue starts pods no quota was granted for)."""
    wanted = run.spec.run_policy.suspend
    if run.spec.run_policy.kueue_queue_name and (applied is None or applied == wanted or not wanted):
        return None
    return suspend_patch(wanted, state)


def _queued(draft: Draft, run: ScalingRun, name: str, progress: Optional[Progress]) -> None:
    """Kueue holds the MPIJob: waiting for quota, or preempted (its pods are gone; admitted again, the training
    resumes from the last checkpoint). Neither is an interruption."""
    queue = run.spec.run_policy.kueue_queue_name
    before = get_condition(draft.update.desired["conditions"], QUEUED) or {}
    if before.get("status") == "True":
        preempted = before.get("reason") == "Preempted"
    else:  # held again after it trained: preempted
        preempted = draft.update.phase == Phase.training.value
    reason = "Preempted" if preempted else "WaitingForAdmission"
    what = ("was preempted; it resumes from the last checkpoint when admitted again" if preempted
            else "waits for admission (quota)")
    message = f"MPIJob {name} is suspended by Kueue: LocalQueue {queue} {what}"
    draft.update.condition(QUEUED, "True", reason, message)
    draft.update.condition(TRAINED, "Unknown", "Queued", mirror.running_message(name, progress))
    draft.update.set_phase(Phase.queued.value, message)


def _succeeded(draft: Draft, name: str, progress: Optional[Progress]) -> None:
    message = mirror.succeeded_message(name, progress)
    draft.update.condition(TRAINED, "True", "Succeeded", message)
    pods.pods_done(draft)
    draft.update.set_phase(Phase.succeeded.value, message)


def _launcher_log(draft: Draft, mpijob: str) -> Optional[interruptions.LauncherLog]:
    """The end of the failed launcher's log, or why it cannot be read; None where the log is the user's terminal."""
    if draft.settings.where.local:
        return None
    found = interruptions.failed_launcher(draft.pods(), mpijob)
    if found is None:
        return interruptions.LauncherLog("", "", "")
    pod, container, node = found
    if not node:
        return interruptions.LauncherLog(pod, container, "", "it never ran on a node, so it has no log")
    tail = draft.need(Log(pod, container, interruptions.LOG_LINES))
    return interruptions.LauncherLog(pod, container, interruptions.log_tail(tail.text or ""), tail.error)


def _input_bound(draft: Draft, run: ScalingRun, history: Any) -> None:
    decision = mirror.input_bound(run, history)
    if decision is None:
        return
    before = get_condition(draft.update.desired["conditions"], INPUT_BOUND)
    draft.update.condition(INPUT_BOUND, *decision)
    if decision[0] == "True" and (before or {}).get("status") != "True":
        draft.update.warn(decision[1], decision[2])


def _gpus_unused(draft: Draft, run: ScalingRun, devices: Any) -> None:
    decision = mirror.gpus_unused(run, draft.settings.where.trainer_place(trainer_image(run)), devices)
    if decision is None:
        return
    before = get_condition(draft.update.desired["conditions"], GPUS_UNUSED)
    draft.update.condition(GPUS_UNUSED, *decision)
    if decision[0] == "True" and (before or {}).get("status") != "True":
        draft.update.warn(decision[1], decision[2])


def _track_interruptions(draft: Draft, training_status: dict[str, Any], mpijob: str, paused: bool) -> None:
    """Counts worker pods lost and launcher restarts against the pods recorded in status (one Event each)."""
    found = draft.pods()
    if paused:  # suspending deletes the pods on purpose
        podrecords.keep(training_status, interruptions.baseline(found, mpijob), found, mpijob)
        return
    records, lost = interruptions.track_interruptions(podrecords.records_of(training_status, mpijob), found, mpijob,
                                                      draft.deleted_pods())
    podrecords.keep(training_status, records, found, mpijob)
    for key in ("restarts", "workerPodsLost", "launcherRestarts"):
        training_status.setdefault(key, 0)
    for interruption in lost:
        key = "workerPodsLost" if interruption.role == WORKER else "launcherRestarts"
        training_status[key] += 1
        interruptions.count(training_status, interruption.cause)
        draft.update.warn(interruption.reason, interruption.message)


def _forget_mpijob(draft: Draft, name: str, mpijob: Optional[dict[str, Any]]) -> None:
    """The recorded MPIJob is gone: its pods' losses are part of that, not interruptions of their own."""
    training_status = dict(draft.update.desired.get("training") or {})
    podrecords.mark_all_lost(training_status, name)
    training_status["mpiJobUid"] = mpijob["metadata"].get("uid") if mpijob else None
    draft.update.desired["training"] = training_status


def _stop(draft: Draft, mpijob: dict[str, Any]) -> None:
    """A run that failed while its MPIJob still runs: suspend it, so its pods stop holding nodes (and GPUs)."""
    patch = suspend_patch(True, mpijob_state(mpijob))
    if patch:
        name = mpijob["metadata"]["name"]
        why = f"MPIJob {name}: suspended because the run failed; delete the run to remove it"
        draft.patch(mpijob, patch, Event("Normal", "Suspending", why))
