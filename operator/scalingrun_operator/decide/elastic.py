"""An elastic run (spec.workers.minReplicas), pure: how many workers its MPIJob has, when it shrinks, and the record
of every resize in status.training.elastic.

spec.workers.replicas stays the most (the trainer config holds the whole spec: the trainer keeps the global batch
of `replicas` workers by gradient accumulation). The MPIJob is rendered with `status.training.elastic.workers`
workers. A resize recreates the MPIJob instead of patching its Worker replicas: mpi-operator v2beta1 creates the
launcher Job once, and its pod's command carries `mpirun -np <replicas x slots>` (builders/mpijob.py), so a patched
MPIJob would get a new hostfile and fewer workers under a launcher that still starts the old number of ranks. A new
MPIJob starts a new launcher with the new -np and host list, and the trainer resumes from its last checkpoint.

A resize is two looks, so that a restart of the operator in between loses and duplicates nothing:
1. the intent is written to status (`resizing`: from, to, cause, lostAt; `workers`: the new count) and nothing else;
2. the MPIJob whose Worker replicas differ from `workers` is deleted (uid precondition) and forgotten (mpiJobUid
   cleared, its pods' losses counted as the MPIJob's). An MPIJob found gone while `resizing` is set is that deletion,
   never a `ChildDeleted` interruption. The next look creates the MPIJob at the new size.
The resize ends when that MPIJob's launcher runs (MPIJob Running): its cost is the seconds from the loss to then.

Time at each size (`sizes`): the run's training time is split by the size it trained at, a size's time running from
when the run trained at it (its first MPIJob made, or a resize's trainingAt) to the next resize's trainingAt or the
end; a suspended or queued MPIJob's time counts for no size. `counting` is the size whose time runs now and since
when; its time is added to `sizes` when the size changes, the MPIJob is paused, or it ends. Everything is read from
status, so a look after a restart adds nothing twice; while no resize has left the last 20 and the MPIJob was never
paused, `sizes` agrees with the step plot of the resizes (`worker_steps`).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Optional

from scalingrun_api.models import ScalingRun
from ..builders.capacity_probes import CAPACITY_PROBE, build_capacity_probe, probe_name
from . import podrecords, pods as pod_facts
from .draft import Draft
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
MAX_RESIZES = 20  # status.training.elastic.resizes keeps the last ones: status stays small
SIZES, COUNTING, STARTED_AT = "sizes", "counting", "startedAt"  # status.training.elastic: the time at each size


def elastic_of(training_status: Optional[dict[str, Any]]) -> dict[str, Any]:
    return dict((training_status or {}).get(ELASTIC_FIELD) or {})


def workers_now(run: ScalingRun, training_status: Optional[dict[str, Any]]) -> int:
    """The worker count the run's MPIJob is to have: spec.workers.replicas, or an elastic run's current size."""
    workers = run.spec.workers
    recorded = elastic_of(training_status).get("workers")
    if not workers.elastic or not isinstance(recorded, int):
        return workers.replicas
    return max(workers.min_replicas, min(workers.replicas, recorded))


def sized(run: ScalingRun, workers: int) -> ScalingRun:
    """`run` as its MPIJob is rendered at `workers` workers (a gang's minAvailable lowered to fit)."""
    if workers == run.spec.workers.replicas:
        return run
    copy = run.model_copy(deep=True)
    copy.spec.workers.replicas = workers
    gang = copy.spec.run_policy.scheduling_policy
    if gang is not None and gang.min_available and gang.min_available > workers + 1:
        gang.min_available = workers + 1
    return copy


def mpijob_workers(mpijob: dict[str, Any]) -> int:
    worker = (((mpijob.get("spec") or {}).get("mpiReplicaSpecs") or {}).get("Worker") or {})
    return int(worker.get("replicas") or 0)


def resizing(training_status: Optional[dict[str, Any]]) -> bool:
    return bool(elastic_of(training_status).get("resizing"))


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


def forget_deleted(training_status: dict[str, Any]) -> bool:
    """The MPIJob is gone while a resize is under way: this run deleted it (step 2), so nothing is counted."""
    return resizing(training_status)


def decide_size(draft: Draft, run: ScalingRun, mpijob: dict[str, Any], mpijob_state: str,
                training_status: dict[str, Any]) -> bool:
    """An elastic run's size this look, on `training_status` (status.training being built); `mpijob_state` as
    training.mpijob_state reads it. True: this look is a step of a resize (the intent written, or the MPIJob
    deleted) and the training phase stops here."""
    workers = run.spec.workers
    if not workers.elastic or draft.settings.where.local:
        return False
    if mpijob_state in ("Succeeded", "Failed"):
        drop_probes(draft)
        return False
    elastic = elastic_of(training_status)
    target, current = workers_now(run, training_status), mpijob_workers(mpijob)
    if mpijob["metadata"].get("deletionTimestamp"):
        # Our deletion under way (foreground: until its pods and the rest are gone): the new MPIJob once it is.
        draft.recheck(1.0)
        return True
    pending = elastic.get("resizing")
    if pending and current != target:
        _delete(draft, mpijob, training_status, pending)
        return True
    if pending and mpijob_state == "Running":
        return _resized(draft, run, training_status, elastic, pending)
    unplaced = unplaced_workers(draft.pods(), mpijob)
    lost_at, bound = (unplaced[0][1], workers.resize_after_seconds) if unplaced else (None, 0)
    waited = (draft.update.moment - lost_at).total_seconds() if lost_at else 0.0
    if pending and (not unplaced or waited < bound):
        # The new MPIJob on its way to running. Its own workers unplaced past the bound (capacity went again
        # meanwhile) shrink it further below: its launcher waits for every worker, so the resize would never end.
        if unplaced:
            draft.recheck(bound - waited + 1.0)
        _placed(draft, RESIZING, f"MPIJob {mpijob['metadata']['name']} resumes from the last checkpoint with "
                f"{target} of {workers.replicas} workers (from {pending['from']})")
        return False
    if not unplaced:
        return _grow(draft, run, current, training_status, elastic)
    names = ", ".join(n for n, _, _ in unplaced[:5]) + (" ..." if len(unplaced) > 5 else "")
    words = next((w for _, _, w in unplaced if w), "no node was assigned")
    placeable = min(current - len(unplaced), placed_workers(draft.pods(), mpijob))
    if waited < bound:
        draft.recheck(bound - waited + 1.0)
        _placed(draft, WAITING_TO_SHRINK, f"{len(unplaced)} of {current} workers unplaced since {rfc3339(lost_at)} "
                f"({names}: {words}); unless placed, the run resumes with the {placeable} that are at "
                f"{rfc3339(lost_at + dt.timedelta(seconds=bound))} (spec.workers.resizeAfter {bound} s)")
        return False
    if placeable < workers.min_replicas:
        message = (f"only {placeable} of {current} workers can be placed ({names} unplaced since {rfc3339(lost_at)}: "
                   f"{words}), fewer than spec.workers.minReplicas {workers.min_replicas}: the run waits for capacity")
        _placed(draft, BELOW_MIN_REPLICAS, message, warn=True)
        return False
    cause = f"{SHRINK_CAUSE}: {len(unplaced)} unplaced for {int(waited)} s ({names}: {words})"
    # A resize that never got to train is replaced by this one; the record keeps where and when it began.
    start, since = (pending["from"], pending["lostAt"]) if pending else (current, rfc3339(lost_at))
    elastic.update(workers=placeable, resizing={"from": start, "to": placeable, "cause": cause, "lostAt": since,
                                               "decidedAt": rfc3339(draft.update.moment)})
    training_status[ELASTIC_FIELD] = elastic
    message = (f"shrinking from {current} to {placeable} workers: {cause}; a new MPIJob resumes from the last "
               "checkpoint")
    draft.update.warn("Shrinking", message)
    _placed(draft, RESIZING, message)
    draft.again = True  # step 2 at once, after this intent is written
    return True


def _delete(draft: Draft, mpijob: dict[str, Any], training_status: dict[str, Any],
            pending: dict[str, Any]) -> None:
    name = mpijob["metadata"]["name"]
    draft.delete_child(mpijob, Event("Normal", "Resizing", f"MPIJob {name} deleted to start again with "
                                     f"{pending['to']} workers (from {pending['from']})"))
    podrecords.mark_all_lost(training_status, name)
    training_status["mpiJobUid"] = None
    draft.again = True
    drop_probes(draft)  # the room they held is the new workers'


def capacity_probes(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in found if (pod_facts.metadata_of(p).get("labels") or {}).get("app.kubernetes.io/component")
            == CAPACITY_PROBE and not pod_facts.metadata_of(p).get("deletionTimestamp")]


def drop_probes(draft: Draft) -> None:
    for probe in capacity_probes(draft.pods()):
        draft.delete_pod(probe, 0)


def _grow(draft: Draft, run: ScalingRun, current: int, training_status: dict[str, Any],
          elastic: dict[str, Any]) -> bool:
    """All of the MPIJob's workers placed. Below spec.workers.replicas (and with the operator's probe PriorityClass
    set): a capacity probe per missing worker; probes placed by the scheduler make the run grow at the next epoch
    boundary (an epoch finished after the capacity was seen) to the workers that fit. True: the grow's intent is
    written (step 1 of a resize)."""
    most, priority_class = run.spec.workers.replicas, draft.settings.capacity_probe_priority_class
    probes = capacity_probes(draft.pods())
    if current >= most or not priority_class:
        for probe in probes:
            draft.delete_pod(probe, 0)
        elastic.pop("capacity", None)
        training_status[ELASTIC_FIELD] = elastic
        if current < most and not priority_class:
            _placed(draft, PROBES_OFF, f"training with {current} of {most} workers; it cannot grow back: this "
                    "operator makes no capacity probes (the chart's elastic.capacityProbes is off, which grants "
                    "it no pods create; docs/security.md)", warn=True)
        else:
            _at_size(draft, run, current)
        return False
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
        elastic.pop("capacity", None)
        training_status[ELASTIC_FIELD] = elastic
        _at_size(draft, run, current)
        return False
    fits, epoch = min(most, current + len(placed)), training_status.get("epoch") or 0
    seen = elastic.get("capacity") or {}
    if seen.get("workers") != fits:
        seen = {"workers": fits, "seenAt": seen.get("seenAt") or rfc3339(draft.update.moment),
                "seenAtEpoch": seen.get("seenAtEpoch", epoch)}
        elastic["capacity"] = seen
        training_status[ELASTIC_FIELD] = elastic
    if epoch <= seen["seenAtEpoch"]:
        _placed(draft, GROWING_AT_EPOCH, f"capacity for {fits - current} more workers ({', '.join(placed)} placed); "
                f"the run grows to {fits} of {most} workers when epoch {seen['seenAtEpoch'] + 1} ends, from its "
                "checkpoint")
        return False
    cause = f"{GROW_CAUSE}: {', '.join(placed)} placed since {seen['seenAt']}"
    elastic.pop("capacity", None)
    elastic.update(workers=fits, resizing={"from": current, "to": fits, "cause": cause, "lostAt": seen["seenAt"],
                                           "decidedAt": rfc3339(draft.update.moment)})
    training_status[ELASTIC_FIELD] = elastic
    message = f"growing from {current} to {fits} workers after epoch {epoch}: {cause}; a new MPIJob resumes from " \
              "the last checkpoint"
    draft.update.warn("Growing", message)
    _placed(draft, RESIZING, message)
    draft.again = True
    return True


def _resized(draft: Draft, run: ScalingRun, training_status: dict[str, Any], elastic: dict[str, Any],
             pending: dict[str, Any]) -> bool:
    lost_at = parse_time(pending.get("lostAt"))
    cost = round((draft.update.moment - lost_at).total_seconds()) if lost_at else None
    record = {**{k: pending[k] for k in ("from", "to", "cause", "lostAt") if k in pending},
              "trainingAt": rfc3339(draft.update.moment), "costSeconds": cost}
    elastic["resizes"] = ([*(elastic.get("resizes") or []), record])[-MAX_RESIZES:]
    elastic.pop("resizing", None)
    _switch(elastic, pending["to"], draft.update.moment, run.spec.workers.gpus_per_worker)
    training_status[ELASTIC_FIELD] = elastic
    draft.update.warn("Resized", f"training again with {pending['to']} workers (from {pending['from']}), "
                      f"{cost} s after the loss")
    return _grow(draft, run, pending["to"], training_status, elastic)  # probes at once: no event may come


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


# --- time at each size -----------------------------------------------------------------------------------------


def count_worker_time(draft: Draft, run: ScalingRun, mpijob: dict[str, Any], finished_at: Optional[dt.datetime],
                      finished: bool, paused: bool, training_status: dict[str, Any]) -> None:
    """The clock of an elastic run's time at its size: started by the look that creates its MPIJob or first finds
    it (at that MPIJob's workers), stopped when the MPIJob is paused (suspended, queued) or ends (at its
    completionTime). A look that changes neither writes nothing."""
    if not run.spec.workers.elastic or draft.settings.where.local:
        return
    elastic, gpus = elastic_of(training_status), run.spec.workers.gpus_per_worker
    if finished or paused:
        if not elastic.get(COUNTING):
            return
        _switch(elastic, None, (finished_at if finished and finished_at else draft.update.moment), gpus)
    elif not elastic.get(COUNTING):
        _switch(elastic, mpijob_workers(mpijob) or workers_now(run, training_status), draft.update.moment, gpus)
    else:
        return
    training_status[ELASTIC_FIELD] = elastic


def size_entry(workers: int, seconds: int, gpus_per_worker: int) -> dict[str, Any]:
    """One size's time: seconds, worker-hours (workers x time) and, for workers that ask for GPUs, GPU-hours."""
    entry = {"workers": workers, "seconds": seconds, "workerHours": round(workers * seconds / 3600, 4)}
    if gpus_per_worker:
        entry["gpuHours"] = round(workers * gpus_per_worker * seconds / 3600, 4)
    return entry


def _add_time(sizes: Optional[list[dict[str, Any]]], workers: int, seconds: float,
              gpus_per_worker: int) -> list[dict[str, Any]]:
    """`sizes` (one entry per size, the largest first) with `seconds` more at `workers`."""
    by_size = {int(e["workers"]): int(e.get("seconds") or 0) for e in sizes or []}
    by_size[workers] = by_size.get(workers, 0) + max(0, int(seconds))
    return [size_entry(w, s, gpus_per_worker) for w, s in sorted(by_size.items(), reverse=True)]


def _fold(elastic: dict[str, Any], at: dt.datetime, gpus_per_worker: int) -> None:
    """The counting size's time up to `at` added to `sizes`; the count goes on from `at`. Times are whole seconds,
    as status writes them, so the sums stay exact."""
    counting = elastic.get(COUNTING) or {}
    since = parse_time(counting.get("since"))
    if since is None:
        return
    at = max(at.replace(microsecond=0), since)
    elastic[SIZES] = _add_time(elastic.get(SIZES), int(counting["workers"]), (at - since).total_seconds(),
                               gpus_per_worker)
    elastic[COUNTING] = {"workers": counting["workers"], "since": rfc3339(at)}


def _switch(elastic: dict[str, Any], workers: Optional[int], at: dt.datetime, gpus_per_worker: int) -> None:
    """The time so far added to its size; from `at` the time runs at `workers` (None: at no size)."""
    _fold(elastic, at, gpus_per_worker)
    if workers is None:
        elastic.pop(COUNTING, None)
        return
    elastic[COUNTING] = {"workers": workers, "since": rfc3339(at)}
    elastic.setdefault(STARTED_AT, rfc3339(at))


def time_at_sizes(elastic: dict[str, Any], gpus_per_worker: int,
                  until: Optional[dt.datetime]) -> list[dict[str, Any]]:
    """status.training.elastic.sizes with the counting size's time up to `until` (the reader's now, or the run's
    completionTime) added: what `scalingrun get` and the report show."""
    view = dict(elastic)
    if until is not None:
        _fold(view, until, gpus_per_worker)
    return list(view.get(SIZES) or [])


def worker_steps(elastic: dict[str, Any], until: dt.datetime) -> list[tuple[dt.datetime, int]]:
    """The worker count over time from the resizes: (moment, workers from then on), the first at startedAt, one at
    each resize's trainingAt, the last at `until` (repeating the last count, to end a step plot). With all 20
    resizes kept, earlier ones may have been dropped: the steps then start at the oldest kept resize's loss."""
    resizes = [r for r in elastic.get("resizes") or [] if parse_time(r.get("trainingAt"))]
    counting = elastic.get(COUNTING) or {}
    first = resizes[0]["from"] if resizes else counting.get("workers") or elastic.get("workers")
    start = parse_time(elastic.get(STARTED_AT))
    if resizes and (start is None or len(elastic.get("resizes") or []) >= MAX_RESIZES):
        start = parse_time(resizes[0].get("lostAt")) or parse_time(resizes[0]["trainingAt"])
    if start is None or first is None:
        return []
    steps = [(start, int(first))] + [(parse_time(r["trainingAt"]), int(r["to"])) for r in resizes]
    return steps + [(max(until, steps[-1][0]), steps[-1][1])]
