"""An elastic run (spec.workers.minReplicas), pure: how many workers its MPIJob has, when it shrinks or grows, and
the record of every resize in status.training.elastic (the typed ElasticStatus and Resize of scalingrun_api).

spec.workers.replicas stays the most (the trainer config holds the whole spec: the trainer keeps the global batch
of `replicas` workers by gradient accumulation); the MPIJob is built at `workers_now` workers, the count passed to
the builder. A resize recreates the MPIJob instead of patching its Worker replicas: mpi-operator v2beta1 creates the
launcher Job once, and its pod's command carries `mpirun -np <replicas x slots>` (builders/mpijob.py), so a patched
MPIJob would get a new hostfile and fewer workers under a launcher that still starts the old number of ranks. A new
MPIJob starts a new launcher with the new -np and host list, and the trainer resumes from its last checkpoint.

A resize is two looks, so that a restart of the operator in between loses and duplicates nothing:
1. the intent is written to status (`resizing`: from, to, cause, lostAt; `workers`: the new count) and nothing else;
2. the MPIJob whose Worker replicas differ from `workers` is deleted (uid precondition) and forgotten (mpiJobUid
   cleared, its pods' losses counted as the MPIJob's). An MPIJob found gone while `resizing` is set is that deletion,
   never a `ChildDeleted` interruption. The next look creates the MPIJob at the new size.
The resize ends when that MPIJob's launcher runs (MPIJob Running): its cost is the seconds from the loss to then.
Each look's outcome is a `ResizeStep`: the elastic status it leaves, and what the training phase does with it. The
time at each size is kept by decide/time_at_size.py.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Optional

from scalingrun_api.models import ScalingRun
from scalingrun_api.models.status import MAX_RESIZES, CapacitySeen, ElasticStatus, Resize
from ..builders.capacity_probes import CAPACITY_PROBE, build_capacity_probe, probe_name
from . import pod_facts, podrecords, time_at_size
from .draft import Draft
from .mpijob_state import MPIJobState, mpijob_workers
from .status import Event, get_condition, parse_time, rfc3339

ELASTIC_FIELD = "elastic"  # status.training.elastic
WORKERS_PLACED = "WorkersPlaced"  # an elastic run's condition: are all spec.workers.replicas workers training?
ALL_PLACED = "AllPlaced"
WAITING_TO_SHRINK = "WaitingToShrink"
BELOW_MIN_REPLICAS = "BelowMinReplicas"
RESIZING = "Resizing"
SHRUNK = "Shrunk"
GROWING_AT_EPOCH = "GrowingAtEpoch"
PROBES_OFF = "CapacityProbesOff"  # shrunk, and this operator may make no probes: it cannot grow back
SHRINK_CAUSE = "workersUnplaced"  # a resize's cause: lost workers' replacements the scheduler could not place
GROW_CAUSE = "capacityReturned"  # a resize's cause: capacity probes placed, the run grows at an epoch boundary


@dataclass(frozen=True)
class ResizeStep:
    """What a look makes of an elastic run's size."""

    elastic: Optional[ElasticStatus]  # status.training.elastic after it; None: no elastic run here (fixed, local)
    stops: bool = False  # a step of a resize (the intent written, the MPIJob deleted): the training phase ends here
    deleted: bool = False  # the MPIJob deleted to be made again at the new size: forgotten, its pods' losses its own

    def applied(self, training_status: dict[str, Any], mpijob: str) -> dict[str, Any]:
        """`training_status` (status.training being built, MPIJob `mpijob`) with this step in it, as a new dict."""
        out = dict(training_status)
        written = time_at_size.written(self.elastic) if self.elastic is not None else {}
        if written:  # a run whose clock has not started yet has none to show
            out[ELASTIC_FIELD] = written
        if self.deleted:
            podrecords.mark_all_lost(out, mpijob)
            out["mpiJobUid"] = None
        return out


def workers_now(run: ScalingRun, training_status: Optional[dict[str, Any]]) -> int:
    """The worker count the run's MPIJob is to have: spec.workers.replicas, or an elastic run's current size."""
    return _size(run, time_at_size.read(training_status))


def _size(run: ScalingRun, elastic: ElasticStatus) -> int:
    workers = run.spec.workers
    if not workers.elastic or elastic.workers is None:
        return workers.replicas
    return max(workers.min_replicas, min(workers.replicas, elastic.workers))


def resize_under_way(training_status: Optional[dict[str, Any]]) -> bool:
    """A resize's intent is written: an MPIJob found gone now is the one this run deleted (step 2), no
    interruption."""
    return time_at_size.read(training_status).resizing is not None


def _workers_of(found: list[dict[str, Any]], mpijob: dict[str, Any]) -> list[dict[str, Any]]:
    """The worker pods of `mpijob` (their controller) that are not being deleted."""
    uid, name = mpijob["metadata"].get("uid"), mpijob["metadata"]["name"]
    return [pod for pod, _ in pod_facts.pods_of(found, (pod_facts.WORKER,), name)
            if next((o for o in pod_facts.metadata_of(pod).get("ownerReferences") or [] if o.get("controller")),
                    {}).get("uid") == uid]


def placed_workers(found: list[dict[str, Any]], mpijob: dict[str, Any]) -> int:
    """The workers of `mpijob` that a node runs: what a shrink keeps. A lost worker whose pod is still going away
    (its grace period, a lost node) or whose replacement is not made yet is not one, nor an unplaced replacement:
    counting the MPIJob's workers less the unplaced ones took those for placed (4 -> 3 when 2 were lost)."""
    return sum(1 for pod in _workers_of(found, mpijob) if (pod.get("spec") or {}).get("nodeName")
               and pod_facts.status_of(pod).get("phase") in ("Pending", "Running"))


def unplaced_workers(found: list[dict[str, Any]], mpijob: dict[str, Any]) -> list[tuple[str, dt.datetime, str]]:
    """(pod, since, the scheduler's words) for each worker pod of `mpijob` (its controller) that no node was
    assigned to: a lost worker's replacement waits Pending, unschedulable, for capacity. Oldest first."""
    waiting = []
    for pod in _workers_of(found, mpijob):
        meta, status = pod_facts.metadata_of(pod), pod_facts.status_of(pod)
        if (pod.get("spec") or {}).get("nodeName") or (status.get("phase") or "Pending") != "Pending":
            continue
        scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), {})
        since = parse_time(meta.get("creationTimestamp"))
        if since is not None:
            waiting.append((pod_facts.pod_name(pod), since, str(scheduled.get("message") or "").strip()[:200]))
    return sorted(waiting, key=lambda w: (w[1], w[0]))


def decide_elastic(draft: Draft, run: ScalingRun, mpijob: dict[str, Any], state: MPIJobState, *, found: bool,
                   paused: bool, before: Optional[dict[str, Any]], epoch: Optional[int]) -> ResizeStep:
    """An elastic run's size this look. `mpijob`: the MPIJob found, or the one this look creates (`found` False);
    `before`: status.training as the look found it; `epoch`: the last one finished, as this look shows it. The
    clock of the time at its size runs from the look that creates its first MPIJob or first finds it, and stops
    while the MPIJob is paused (suspended, queued) or once it ended (at its completionTime)."""
    if not run.spec.workers.elastic or draft.settings.where.local:
        return ResizeStep(None)
    elastic, at = time_at_size.read(before), draft.update.moment
    if state.finished and state.finished_at:
        at = state.finished_at
    running = None if state.finished or paused else mpijob_workers(mpijob) or _size(run, elastic)
    elastic = time_at_size.clocked(elastic, running, at, run.spec.workers.gpus_per_worker)
    if not found or paused:
        return ResizeStep(elastic)
    return _sized(draft, run, mpijob, state.state, elastic, epoch or 0)


def _sized(draft: Draft, run: ScalingRun, mpijob: dict[str, Any], state: str, elastic: ElasticStatus,
           epoch: int) -> ResizeStep:
    """The size of a run whose MPIJob is found and not paused; `state` as mpijob_state reads it."""
    workers = run.spec.workers
    if state in ("Succeeded", "Failed"):
        drop_probes(draft)
        return ResizeStep(elastic)
    target, current = _size(run, elastic), mpijob_workers(mpijob)
    if mpijob["metadata"].get("deletionTimestamp"):
        # Our deletion under way (foreground: until its pods and the rest are gone): the new MPIJob once it is.
        draft.recheck(1.0)
        return ResizeStep(elastic, stops=True)
    pending = elastic.resizing
    if pending and current != target:
        _delete(draft, mpijob, pending)
        return ResizeStep(elastic, stops=True, deleted=True)
    if pending and state == "Running":
        return _resized(draft, run, elastic, pending, epoch)
    unplaced = unplaced_workers(draft.pods(), mpijob)
    lost_at, bound = (unplaced[0][1], workers.resize_after_seconds) if unplaced else (None, 0)
    waited = (draft.update.moment - lost_at).total_seconds() if lost_at else 0.0
    if pending and (not unplaced or waited < bound):
        # The new MPIJob on its way to running. Its own workers unplaced past the bound (capacity went again
        # meanwhile) shrink it further below: its launcher waits for every worker, so the resize would never end.
        if unplaced:
            draft.recheck(bound - waited + 1.0)
        _placed(draft, RESIZING, f"MPIJob {mpijob['metadata']['name']} resumes from the last checkpoint with "
                f"{target} of {workers.replicas} workers (from {pending.from_})")
        return ResizeStep(elastic)
    if not unplaced:
        return _grow(draft, run, current, elastic, epoch)
    names = ", ".join(n for n, _, _ in unplaced[:5]) + (" ..." if len(unplaced) > 5 else "")
    words = next((w for _, _, w in unplaced if w), "no node was assigned")
    placeable = min(current - len(unplaced), placed_workers(draft.pods(), mpijob))
    if waited < bound:
        draft.recheck(bound - waited + 1.0)
        _placed(draft, WAITING_TO_SHRINK, f"{len(unplaced)} of {current} workers unplaced since {rfc3339(lost_at)} "
                f"({names}: {words}); unless placed, the run resumes with the {placeable} that are at "
                f"{rfc3339(lost_at + dt.timedelta(seconds=bound))} (spec.workers.resizeAfter {bound} s)")
        return ResizeStep(elastic)
    if placeable < workers.min_replicas:
        message = (f"only {placeable} of {current} workers can be placed ({names} unplaced since {rfc3339(lost_at)}: "
                   f"{words}), fewer than spec.workers.minReplicas {workers.min_replicas}: the run waits for capacity")
        _placed(draft, BELOW_MIN_REPLICAS, message, warn=True)
        return ResizeStep(elastic)
    cause = f"{SHRINK_CAUSE}: {len(unplaced)} unplaced for {int(waited)} s ({names}: {words})"
    # A resize that never got to train is replaced by this one; the record keeps where and when it began.
    start, since = (pending.from_, pending.lost_at) if pending else (current, rfc3339(lost_at))
    message = (f"shrinking from {current} to {placeable} workers: {cause}; a new MPIJob resumes from the last "
               "checkpoint")
    draft.update.warn("Shrinking", message)
    return _resize(draft, elastic, Resize(from_=start, to=placeable, cause=cause, lost_at=since), message)


def _resize(draft: Draft, elastic: ElasticStatus, resize: Resize, message: str) -> ResizeStep:
    """Step 1 of a resize: its intent written (the new count, the resize under way) and nothing else."""
    _placed(draft, RESIZING, message)
    draft.again = True  # step 2 at once, after this intent is written
    intent = resize.model_copy(update={"decided_at": rfc3339(draft.update.moment)})
    return ResizeStep(elastic.model_copy(update={"workers": resize.to, "resizing": intent}), stops=True)


def _delete(draft: Draft, mpijob: dict[str, Any], pending: Resize) -> None:
    name = mpijob["metadata"]["name"]
    draft.delete_child(mpijob, Event("Normal", "Resizing", f"MPIJob {name} deleted to start again with "
                                     f"{pending.to} workers (from {pending.from_})"))
    draft.again = True
    drop_probes(draft)  # the room they held is the new workers'


def capacity_probes(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in found if (pod_facts.metadata_of(p).get("labels") or {}).get("app.kubernetes.io/component")
            == CAPACITY_PROBE and not pod_facts.metadata_of(p).get("deletionTimestamp")]


def drop_probes(draft: Draft) -> None:
    for probe in capacity_probes(draft.pods()):
        draft.delete_pod(probe, 0)


def _grow(draft: Draft, run: ScalingRun, current: int, elastic: ElasticStatus, epoch: int) -> ResizeStep:
    """All of the MPIJob's workers placed. Below spec.workers.replicas (and with the operator's probe PriorityClass
    set): a capacity probe per missing worker; probes placed by the scheduler make the run grow at the next epoch
    boundary (an epoch finished after the capacity was seen) to the workers that fit."""
    most, priority_class = run.spec.workers.replicas, draft.settings.capacity_probe_priority_class
    probes = capacity_probes(draft.pods())
    if current >= most or not priority_class:
        for probe in probes:
            draft.delete_pod(probe, 0)
        if current < most and not priority_class:
            _placed(draft, PROBES_OFF, f"training with {current} of {most} workers; it cannot grow back: this "
                    "operator makes no capacity probes (the chart's elastic.capacityProbes is off, which grants "
                    "it no pods create; docs/security.md)", warn=True)
        else:
            _at_size(draft, run, current)
        return ResizeStep(elastic.model_copy(update={"capacity": None}))
    # At most max_capacity_probes at a time: a run far below its size grows in steps, each a resize.
    wanted = {probe_name(run, index) for index in range(min(most - current, draft.settings.max_capacity_probes))}
    names = {pod_facts.pod_name(p) for p in probes}
    for probe in probes:
        if pod_facts.pod_name(probe) not in wanted:
            draft.delete_pod(probe, 0)
    probes = [p for p in probes if pod_facts.pod_name(p) in wanted]
    for index in range(len(wanted)):
        if probe_name(run, index) not in names:
            draft.create(build_capacity_probe(run, draft.namespace, index, priority_class,
                                              draft.settings.gpu_tolerations))
    placed = sorted(pod_facts.pod_name(p) for p in probes if (p.get("spec") or {}).get("nodeName"))
    if not placed:
        _at_size(draft, run, current)
        return ResizeStep(elastic.model_copy(update={"capacity": None}))
    fits, seen = min(most, current + len(placed)), elastic.capacity
    if seen is None or seen.workers != fits:
        seen = CapacitySeen(workers=fits, seen_at=(seen and seen.seen_at) or rfc3339(draft.update.moment),
                            seen_at_epoch=epoch if seen is None or seen.seen_at_epoch is None else seen.seen_at_epoch)
        elastic = elastic.model_copy(update={"capacity": seen})
    if epoch <= (seen.seen_at_epoch or 0):
        _placed(draft, GROWING_AT_EPOCH, f"capacity for {fits - current} more workers ({', '.join(placed)} placed); "
                f"the run grows to {fits} of {most} workers when epoch {(seen.seen_at_epoch or 0) + 1} ends, from "
                "its checkpoint")
        return ResizeStep(elastic)
    cause = f"{GROW_CAUSE}: {', '.join(placed)} placed since {seen.seen_at}"
    message = f"growing from {current} to {fits} workers after epoch {epoch}: {cause}; a new MPIJob resumes from " \
              "the last checkpoint"
    draft.update.warn("Growing", message)
    return _resize(draft, elastic.model_copy(update={"capacity": None}), Resize(from_=current, to=fits, cause=cause, lost_at=seen.seen_at), message)


def _resized(draft: Draft, run: ScalingRun, elastic: ElasticStatus, pending: Resize, epoch: int) -> ResizeStep:
    """The MPIJob at the new size runs: the resize ends, recorded with its cost; the time runs at the new size."""
    lost_at, moment = parse_time(pending.lost_at), draft.update.moment
    cost = round((moment - lost_at).total_seconds()) if lost_at else None
    record = pending.model_copy(update={"decided_at": None, "training_at": rfc3339(moment), "cost_seconds": cost})
    elastic = elastic.model_copy(update={"resizes": [*elastic.resizes, record][-MAX_RESIZES:], "resizing": None})
    elastic = time_at_size.switched(elastic, pending.to, moment, run.spec.workers.gpus_per_worker)
    draft.update.warn("Resized", f"training again with {pending.to} workers (from {pending.from_}), "
                      f"{cost} s after the loss")
    return _grow(draft, run, pending.to, elastic, epoch)  # probes at once: no event may come


def _at_size(draft: Draft, run: ScalingRun, workers: int) -> None:
    most = run.spec.workers.replicas
    if workers >= most:
        _placed(draft, ALL_PLACED, f"all {most} workers are placed")
    else:
        _placed(draft, SHRUNK, f"training with {workers} of {most} workers (spec.workers.minReplicas "
                f"{run.spec.workers.min_replicas}); it grows back when capacity returns")


def _placed(draft: Draft, reason: str, message: str, warn: bool = False) -> None:
    before = get_condition(draft.update.desired["conditions"], WORKERS_PLACED) or {}
    if warn and before.get("reason") != reason:
        draft.update.warn(reason, message)
    draft.update.condition(WORKERS_PLACED, "True" if reason == ALL_PLACED else "False", reason, message)
