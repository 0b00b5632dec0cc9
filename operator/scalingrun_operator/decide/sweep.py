"""A ScalingSweep's state machine, pure: its points as child ScalingRuns, one after another, and the
scaling table.

It serves the operator and `scalingrun sweep --local` alike: from the sweep, its last status and a
snapshot of its points (the child ScalingRuns, and the progress document of each finished one) it
decides which points to create (owned by the sweep, so that deleting the sweep deletes them), one row
per point, speedup, efficiency, the phase and the recommendation. Level-triggered like the run's:
the events of the child ScalingRuns start the next look.

Speedup compares time per epoch (training wall time / epochs run), not the whole run: early
stopping may end points after different numbers of epochs.
"""

from __future__ import annotations

import statistics
from typing import Any, Optional

from scalingrun_api.models import API_VERSION, KIND, SWEEP_KIND, Phase, ScalingSweep, SweepPhase
from scalingrun_api.progress import Progress, ProgressState
from scalingrun_api.status_push import PROGRESS
from ..schema.sweep import Point, build_point_run, sweep_points
from ..schema.validation import InvalidScalingRun, parse_scalingrun, parse_scalingsweep
from ..builders.locations import progress_uri
from .children import FOREIGN, Claims
from .draft import store_of
from .progress import training_status
from .snapshot import Child, Create, Decision, Document, Read, Settings, Snapshot
from .status import (
    FAILED, INVALID_SPEC, PREPROCESSED, SWEEP_PHASES, Event, StatusUpdate, get_condition, may_revalidate,
)

TERMINAL_RUN = (Phase.succeeded.value, Phase.failed.value)
POINT_FAILED = "PointFailed"


# --- which points start --------------------------------------------------------------------------


def _phase(child: Optional[dict[str, Any]]) -> Optional[str]:
    return ((child or {}).get("status") or {}).get("phase")


def _preprocessed(child: Optional[dict[str, Any]]) -> bool:
    condition = get_condition(((child or {}).get("status") or {}).get("conditions") or [], PREPROCESSED)
    return bool(condition and condition.get("status") == "True")


def points_to_start(points: list[Point], children: dict[str, Optional[dict[str, Any]]],
                    max_parallel: int) -> list[Point]:
    """The points to create now, in order.

    The first point alone preprocesses; the others wait until its dataset is there (Preprocessed), then
    reuse it. At most `max_parallel` points are unfinished at once. A failed point stops the sweep.
    """
    if not points:
        return []
    if children.get(points[0].name) is None:
        return [points[0]]
    if any(_phase(c) == Phase.failed.value for c in children.values() if c is not None):
        return []
    if not _preprocessed(children[points[0].name]):
        return []
    active = sum(1 for c in children.values() if c is not None and _phase(c) not in TERMINAL_RUN)
    start = []
    for point in points[1:]:
        if children.get(point.name) is None:
            if active >= max_parallel:
                break
            start.append(point)
            active += 1
    return start


# --- the table -----------------------------------------------------------------------------------


def _number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def point_row(point: Point, phase: Optional[str], training: Optional[dict[str, Any]],
              progress: Optional[Progress]) -> dict[str, Any]:
    """One row of status.points from the child's status.training and, once it finished, its progress document."""
    row: dict[str, Any] = {"run": point.name, "workers": point.workers, "gpusPerWorker": point.gpus_per_worker,
                           "processes": point.processes}
    if phase:
        row["phase"] = phase
    training = training or {}
    for source, target in (("effectiveBatchSize", "effectiveBatchSize"), ("learningRate", "learningRate"),
                           ("epoch", "epochs"), ("imagesPerSecond", "imagesPerSecond")):
        if training.get(source) is not None:
            row[target] = training[source]
    cache = training.get("featureCache") or {}
    if isinstance(cache.get("used"), bool):
        row["featureCache"] = cache["used"]
        if cache["used"] and _number(cache.get("seconds")) is not None:
            row["featureCacheSeconds"] = round(float(cache["seconds"]), 1)
    best = training.get("bestMetrics") or {}
    for source, target in (("val_accuracy", "bestValAccuracy"), ("val_loss", "bestValLoss")):
        if _number(best.get(source)) is not None:
            row[target] = round(float(best[source]), 4)
    elastic = training.get("elastic") or {}
    if elastic.get("resizes") or elastic.get("resizing"):
        # A point measures one size: a resized run's time and throughput would mix sizes in the table.
        row["resized"] = True
        row.pop("imagesPerSecond", None)
        return row
    if progress is not None:
        speeds = [entry.images_per_second for entry in progress.history if entry.images_per_second]
        if speeds:
            row["imagesPerSecond"] = round(statistics.median(speeds), 1)
        wall, epochs = progress.elapsed_seconds, progress.epoch
        if wall and epochs:
            row["epochs"] = int(epochs)
            row["wallSeconds"] = round(wall, 1)
            row["secondsPerEpoch"] = round(wall / epochs, 2)
            row["workerHours"] = progress.process_hours(point.processes)
    return row


def document_row(point: Point, progress: Optional[Progress]) -> dict[str, Any]:
    """A point's row from its progress document alone, with no ScalingRun to read (`scalingrun report` of a
    sweep): the document's state stands for the phase, its figures for status.training."""
    state = progress.state if progress is not None and "state" in progress.model_fields_set else None
    phase = Phase.succeeded.value if state == ProgressState.succeeded.value else state
    return point_row(point, phase, training_status(progress), progress if phase == Phase.succeeded.value else None)


def add_scaling(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """speedup and efficiency of every row with a time per epoch, against the first row."""
    base = rows[0] if rows else {}
    for row in rows:
        row.pop("speedup", None)
        row.pop("efficiency", None)
        if base.get("secondsPerEpoch") and row.get("secondsPerEpoch"):
            speedup = base["secondsPerEpoch"] / row["secondsPerEpoch"]
            scale = row["processes"] / base["processes"]
            row["speedup"] = round(speedup, 3)
            row["efficiency"] = round(speedup / scale, 3)
    return rows


def recommend(rows: list[dict[str, Any]], threshold: float, tolerance: float) -> Optional[dict[str, Any]]:
    """The largest point (most processes) with efficiency >= threshold and val_accuracy within tolerance of the
    best; None while no point has both figures, or when none qualifies."""
    done = [r for r in rows if r.get("phase") == Phase.succeeded.value and r.get("efficiency") is not None
            and r.get("bestValAccuracy") is not None]
    if not done:
        return None
    best = max(r["bestValAccuracy"] for r in done)
    eps = 1e-9
    good = [r for r in done if r["efficiency"] >= threshold - eps and r["bestValAccuracy"] >= best - tolerance - eps]
    if not good:
        return None
    pick = max(good, key=lambda r: r["processes"])
    reasons = []
    for r in sorted(done, key=lambda r: r["processes"]):
        if r["processes"] <= pick["processes"]:
            continue
        why = []
        if r["efficiency"] < threshold - eps:
            why.append(f"efficiency {r['efficiency']:.2f} < {threshold:g}")
        if r["bestValAccuracy"] < best - tolerance - eps:
            why.append(f"val_accuracy {r['bestValAccuracy']:.4f} more than {tolerance:g} below the best {best:.4f}")
        reasons.append(f"{workers_text(r['workers'])}: " + " and ".join(why))
    message = (f"{workers_text(pick['workers'])} ({processes_text(pick['processes'])}): speedup {pick['speedup']:.2f}, efficiency "
               f"{pick['efficiency']:.2f} >= {threshold:g}, val_accuracy {pick['bestValAccuracy']:.4f} within "
               f"{tolerance:g} of the best {best:.4f}")
    if reasons:
        message += "; not larger: " + "; ".join(reasons)
    return {"run": pick["run"], "workers": pick["workers"], "processes": pick["processes"], "message": message}


def workers_text(count: int) -> str:
    return f"{count} worker" + ("" if count == 1 else "s")


def processes_text(count: int) -> str:
    return f"{count} process" + ("" if count == 1 else "es")


def sweep_phase(points: list[Point], children: dict[str, Optional[dict[str, Any]]]) -> tuple[str, str]:
    """(phase, message) of the sweep from its children."""
    phases = {p.name: _phase(children.get(p.name)) for p in points}
    failed = [p for p in points if phases[p.name] == Phase.failed.value]
    active = [p for p in points if children.get(p.name) is not None and phases[p.name] not in TERMINAL_RUN]
    if failed:
        child = children[failed[0].name] or {}
        cause = (child.get("status") or {}).get("message") or "see kubectl describe srun " + failed[0].name
        message = (f"point {failed[0].name} ({workers_text(failed[0].workers)}) failed: {cause}; no further point "
                   f"starts. Fix the cause and create the sweep again.")
        if active:
            return SweepPhase.running.value, message + f" Waiting for {', '.join(p.name for p in active)}."
        return SweepPhase.failed.value, message
    if all(phases[p.name] == Phase.succeeded.value for p in points):
        return SweepPhase.succeeded.value, f"all {len(points)} points succeeded"
    if not any(children.get(p.name) for p in points):
        return SweepPhase.pending.value, "creating the first point"
    running = ", ".join(f"{p.name} ({phases[p.name] or 'created'})" for p in active) or "none"
    return SweepPhase.running.value, f"running: {running}"


def progress_text(points: list[Point], children: dict[str, Optional[dict[str, Any]]]) -> str:
    done = sum(1 for p in points if _phase(children.get(p.name)) in TERMINAL_RUN)
    return f"{done}/{len(points)}"


def scaling(sweep: ScalingSweep, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], Optional[dict[str, Any]]]:
    """The rows with speedup and efficiency, and the recommendation: what the sweep's status, `scalingrun
    report` and `scalingrun sweep --local` show."""
    add_scaling(rows)
    return rows, recommend(rows, sweep.spec.efficiency_threshold, sweep.spec.accuracy_tolerance)


# --- the decision ------------------------------------------------------------------------------------


def decide_sweep(snapshot: Snapshot, settings: Settings = Settings()) -> Decision:
    """What to do about the sweep in `snapshot.obj`. Raises NeedMore for a fact the snapshot lacks."""
    body = snapshot.obj
    meta = body["metadata"]
    current = body.get("status") or {}
    update = StatusUpdate(current, meta.get("generation"), snapshot.now, phases=SWEEP_PHASES)
    if current.get("phase") in SWEEP_PHASES.terminal and not may_revalidate(current, update.generation):
        return Decision(phase=current["phase"], desired=current)  # finished: a point deleted later stays so
    try:
        sweep = parse_scalingsweep({"apiVersion": API_VERSION, "kind": SWEEP_KIND, "metadata": meta,
                                    "spec": body.get("spec")}, settings.allow_host_path)
    except InvalidScalingRun as exc:
        message = "; ".join(str(e) for e in exc.errors[:10]) + ". Fix the spec (the sweep is retried on edit)."
        update.fail(INVALID_SPEC, message)
        update.desired["message"] = f"{INVALID_SPEC}: {message}"
        return _decision(update)
    if (get_condition(update.desired["conditions"], FAILED) or {}).get("reason") == INVALID_SPEC:
        update.condition(FAILED, "False", "SpecValid", "the spec is valid")
        update.desired.pop("completionTime", None)
    namespace = meta.get("namespace") or "default"
    points = sweep_points(sweep)
    children = {p.name: snapshot.need(Child(KIND, p.name)) for p in points}
    actions: list[Any] = []
    claims = Claims(body, namespace)
    for point in points:
        found = children[point.name]
        if found is None:
            claims.free(KIND, point.name)
            continue
        verdict, adoption = claims.claim(found, build_point_run(sweep, point, namespace))
        if adoption is not None:
            actions.append(adoption)
        if verdict == FOREIGN:
            children[point.name] = None  # not counted as a point, and not created while another holds the name
    conflict = claims.settle(update, "the sweep's points are its own", named_only=False)
    for point in points_to_start(points, children, sweep.spec.max_parallel):
        if (KIND, point.name) not in claims.owned:
            continue
        children[point.name] = build_point_run(sweep, point, namespace)
        actions.append(Create(children[point.name], Event(
            "Normal", "PointCreated",
            f"ScalingRun {point.name}: {workers_text(point.workers)}, {processes_text(point.processes)}")))
    rows = [_row(snapshot, current, point, children[point.name]) for point in points]
    update.desired["points"] = add_scaling(rows)
    update.desired["progress"] = progress_text(points, children)
    phase, message = sweep_phase(points, children)
    if phase in SWEEP_PHASES.terminal:
        recommendation = recommend(rows, sweep.spec.efficiency_threshold, sweep.spec.accuracy_tolerance)
        if recommendation:
            update.desired["recommendation"] = recommendation
            message += f"; recommended: {recommendation['message']}"
        else:
            update.desired.pop("recommendation", None)
            message += "; no point qualifies for a recommendation"
    update.set_phase(phase, message)
    if phase == SweepPhase.failed.value and (get_condition(update.desired["conditions"], FAILED) or {}).get(
            "status") != "True":
        update.condition(FAILED, "True", POINT_FAILED, message)
    update.desired["message"] = message
    return _decision(update, actions, settings.conflict_recheck_seconds if conflict else None)


def _decision(update: StatusUpdate, actions: list[Any] = (), recheck_in: Optional[float] = None) -> Decision:
    return Decision(phase=update.phase, actions=tuple(actions), status=update.patch(), desired=update.desired,
                    events=tuple(update.events), recheck_in=recheck_in)


def _row(snapshot: Snapshot, current: dict[str, Any], point: Point, child: Optional[dict[str, Any]]) -> dict[str, Any]:
    status = (child or {}).get("status") or {}
    phase = status.get("phase") if child else None
    previous = next((r for r in current.get("points") or [] if r.get("run") == point.name), None)
    if previous and previous.get("phase") == Phase.succeeded.value and previous.get("wallSeconds"):
        return {k: v for k, v in previous.items() if k not in ("speedup", "efficiency")}  # final: no re-read
    progress = None
    if phase == Phase.succeeded.value:
        progress = _progress(snapshot, child)
    return point_row(point, phase, status.get("training"), progress)


def _progress(snapshot: Snapshot, child: dict[str, Any]) -> Optional[Progress]:
    try:
        run = parse_scalingrun(child)
    except InvalidScalingRun:
        return None
    found: Read = snapshot.need(Document(progress_uri(run), store_of(run), PROGRESS,
                                          run=child["metadata"]["name"]))
    return found.document
