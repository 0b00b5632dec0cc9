"""A ScalingSweep: its points as child ScalingRuns, one after another, and the scaling table.

The pure part (which points to start, one row per point, speedup, efficiency, the recommendation)
serves the operator and `scalingrun sweep --local` alike. The reconcile is level-triggered like the
run's (handlers/reconcile.py): it reads the sweep and its children as they are, creates the points
that may start (create-or-adopt, owned by the sweep, so that deleting the sweep deletes them), and
writes status with the resourceVersion it read. It needs no finalizer, timer or daemon: the events
of the child ScalingRuns trigger it.

Speedup compares time per epoch (training wall time / epochs run), not the whole run: early
stopping may end points after different numbers of epochs.
"""

from __future__ import annotations

import logging
import statistics
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from scalingrun_api.models import API_VERSION, SWEEP_KIND, Phase, ScalingSweep, SweepPhase
from ..api.validation import InvalidScalingRun, parse_scalingrun, parse_scalingsweep
from ..builders.sweep import SWEEP_LABEL, Point, build_point_run, sweep_points
from ..status import FAILED, INVALID_SPEC, PREPROCESSED, READY, get_condition, now, rfc3339, set_condition
from ..storage import StorageError, read_json
from .training import progress_uri

if TYPE_CHECKING:
    from ..config import Config
    from ..k8s import Kube

log = logging.getLogger(__name__)

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
              progress: Optional[dict[str, Any]]) -> dict[str, Any]:
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
    best = training.get("bestMetrics") or {}
    for source, target in (("val_accuracy", "bestValAccuracy"), ("val_loss", "bestValLoss")):
        if _number(best.get(source)) is not None:
            row[target] = round(float(best[source]), 4)
    if progress:
        speeds = [_number(h.get("imagesPerSecond")) for h in progress.get("history") or []]
        speeds = [s for s in speeds if s]
        if speeds:
            row["imagesPerSecond"] = round(statistics.median(speeds), 1)
        wall, epochs = _number(progress.get("elapsedSeconds")), _number(progress.get("epoch"))
        if wall and epochs:
            row["epochs"] = int(epochs)
            row["wallSeconds"] = round(wall, 1)
            row["secondsPerEpoch"] = round(wall / epochs, 2)
            row["workerHours"] = round(point.processes * wall / 3600, 4)
    return row


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


# --- the reconcile -------------------------------------------------------------------------------

_locks_guard = threading.Lock()
_locks: dict[tuple[str, str], threading.Lock] = {}


def _lock(namespace: str, name: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault((namespace, name), threading.Lock())


def sweep_of(body: dict[str, Any]) -> Optional[str]:
    """The ScalingSweep that controls a child ScalingRun (by owner reference)."""
    for ref in (body.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == SWEEP_KIND and ref.get("apiVersion") == API_VERSION and ref.get("controller"):
            return ref.get("name")
    return None


@dataclass
class SweepReconciler:
    kube: "Kube"
    config: "Config"

    def __call__(self, namespace: str, name: str) -> Optional[str]:
        """Reconciles one sweep; returns its phase (None when it is gone)."""
        from kubernetes.client.rest import ApiException

        with _lock(namespace, name):
            for attempt in range(4):
                body = self.kube.get_sweep(namespace, name)
                if body is None or body["metadata"].get("deletionTimestamp"):
                    return None
                try:
                    return _SweepPass(self, body).run()
                except ApiException as exc:
                    if exc.status == 409 and attempt < 3:
                        continue
                    if exc.status == 403 and "being terminated" in str(exc.body):
                        return None
                    raise
        return None


class _SweepPass:
    def __init__(self, reconciler: SweepReconciler, body: dict[str, Any]):
        self.kube, self.config, self.body = reconciler.kube, reconciler.config, body
        meta = body["metadata"]
        self.namespace, self.name = meta["namespace"], meta["name"]
        self.current = body.get("status") or {}
        self.desired: dict[str, Any] = {k: v for k, v in self.current.items()}
        self.desired.setdefault("conditions", [])
        self.generation = meta.get("generation")
        self.moment = now()
        self.events: list[tuple[str, str, str]] = []

    def run(self) -> Optional[str]:
        failed = get_condition(self.desired["conditions"], FAILED) or {}
        if self.current.get("phase") in (SweepPhase.succeeded.value, SweepPhase.failed.value) and not (
                failed.get("reason") == INVALID_SPEC and (self.current.get("observedGeneration") or 0) < (
                    self.generation or 0)):
            return self.current["phase"]  # finished: a point deleted afterwards is not run again
        try:
            sweep = parse_scalingsweep({"apiVersion": API_VERSION, "kind": SWEEP_KIND,
                                        "metadata": self.body["metadata"], "spec": self.body.get("spec")})
        except InvalidScalingRun as exc:
            message = "; ".join(str(e) for e in exc.errors[:10]) + ". Fix the spec (the sweep is retried on edit)."
            self._condition(FAILED, "True", INVALID_SPEC, message)
            self._set_phase(SweepPhase.failed.value, f"{INVALID_SPEC}: {message}")
            self.desired["message"] = f"{INVALID_SPEC}: {message}"
            return self._write()
        if (get_condition(self.desired["conditions"], FAILED) or {}).get("reason") == INVALID_SPEC:
            self._condition(FAILED, "False", "SpecValid", "the spec is valid")
            self.desired.pop("completionTime", None)
        points = sweep_points(sweep)
        children = {p.name: self.kube.get_run(self.namespace, p.name) for p in points}
        for point in points:
            child = children[point.name]
            if child is not None and sweep_of(child) != self.name:
                children[point.name] = self._ensure(sweep, point)  # adopt (or wait for a foreign owner to go)
        for point in points_to_start(points, children, sweep.spec.max_parallel):
            children[point.name] = self._ensure(sweep, point)
        rows = [self._row(sweep, point, children[point.name]) for point in points]
        self.desired["points"] = add_scaling(rows)
        self.desired["progress"] = progress_text(points, children)
        phase, message = sweep_phase(points, children)
        if phase in (SweepPhase.succeeded.value, SweepPhase.failed.value):
            recommendation = recommend(rows, sweep.spec.efficiency_threshold, sweep.spec.accuracy_tolerance)
            if recommendation:
                self.desired["recommendation"] = recommendation
                message += f"; recommended: {recommendation['message']}"
            else:
                self.desired.pop("recommendation", None)
                message += "; no point qualifies for a recommendation"
        self._set_phase(phase, message)
        self.desired["message"] = message
        return self._write()

    def _ensure(self, sweep: ScalingSweep, point: Point) -> dict[str, Any]:
        child, created = self.kube.ensure_child(build_point_run(sweep, point, self.namespace), owner=self.body)
        if created:
            self.events.append(("Normal", "PointCreated",
                                f"ScalingRun {point.name}: {workers_text(point.workers)}, {processes_text(point.processes)}"))
            log.info("created ScalingRun %s/%s for sweep %s", self.namespace, point.name, self.name)
        return child

    def _row(self, sweep: ScalingSweep, point: Point, child: Optional[dict[str, Any]]) -> dict[str, Any]:
        status = (child or {}).get("status") or {}
        phase = status.get("phase") if child else None
        previous = next((r for r in self.current.get("points") or [] if r.get("run") == point.name), None)
        if previous and previous.get("phase") == Phase.succeeded.value and previous.get("wallSeconds"):
            return {k: v for k, v in previous.items() if k not in ("speedup", "efficiency")}  # final: no re-read
        progress = None
        if phase == Phase.succeeded.value:
            progress = self._progress(child)
        return point_row(point, phase, status.get("training"), progress)

    def _progress(self, child: dict[str, Any]) -> Optional[dict[str, Any]]:
        try:
            run = parse_scalingrun(child)
        except InvalidScalingRun:
            return None
        storage = run.spec.storage
        try:
            credentials = None
            if storage.credentials_secret:
                credentials = self.kube.read_credentials(self.namespace, storage.credentials_secret,
                                                         storage.access_key_id_key, storage.secret_access_key_key)
            return read_json(progress_uri(run), self.config.storage_target(storage, credentials))
        except StorageError as exc:
            log.warning("sweep %s/%s cannot read the progress of %s: %s", self.namespace, self.name,
                        run.metadata.name, exc)
            return None

    def _condition(self, type_: str, status: str, reason: str, message: str) -> None:
        self.desired["conditions"] = set_condition(self.desired["conditions"], type_, status, reason, message,
                                                   self.generation, self.moment)

    def _set_phase(self, phase: str, message: str) -> None:
        self._condition(READY, "True" if phase == SweepPhase.succeeded.value else "False", phase, message)
        if phase == SweepPhase.failed.value and (get_condition(self.desired["conditions"], FAILED) or {}).get(
                "status") != "True":
            self._condition(FAILED, "True", POINT_FAILED, message)
        if self.desired.get("phase") == phase:
            return
        previous = self.desired.get("phase")
        self.desired["phase"] = phase
        if phase != SweepPhase.pending.value:
            self.desired.setdefault("startTime", rfc3339(self.moment))
        if phase in (SweepPhase.succeeded.value, SweepPhase.failed.value):
            self.desired.setdefault("completionTime", rfc3339(self.moment))
        kind = "Warning" if phase == SweepPhase.failed.value else "Normal"
        self.events.append((kind, phase, f"{previous or 'New'} -> {phase}: {message}"))

    def _write(self) -> Optional[str]:
        if self.generation is not None:
            self.desired["observedGeneration"] = self.generation
        patch = {k: v for k, v in self.desired.items() if self.current.get(k) != v}
        patch.update({k: None for k in self.current if k not in self.desired})
        if patch:
            self.kube.patch_sweep_status(self.namespace, self.name, patch,
                                         resource_version=self.body["metadata"].get("resourceVersion"))
        for type_, reason, message in self.events:
            self.kube.post_event(self.body, type_, reason, message)
        return self.desired.get("phase")

