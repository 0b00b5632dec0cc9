"""The points of a ScalingSweep and the child ScalingRun of each: pure, no I/O.

Every point gets the template with its worker count (the trainer scales the learning rate by the
template's rule), its own run location, and one dataset layout for the largest point
(dataset.preprocessing.readers), so that the first point's preprocessing serves them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from scalingrun_api.engines import engine
from scalingrun_api.models import API_VERSION, KIND, MANAGED_BY, ScalingSweep

SWEEP_LABEL = "scalingrun.dev/sweep"
POINT_LABEL = "scalingrun.dev/sweep-workers"


@dataclass(frozen=True)
class Point:
    name: str  # the child ScalingRun
    workers: int
    gpus_per_worker: int
    slots_per_worker: int  # training processes per worker pod: the engine's rule (scalingrun_api.engines)

    @property
    def processes(self) -> int:
        return self.workers * self.slots_per_worker


def point_name(sweep_name: str, workers: int) -> str:
    return f"{sweep_name}-w{workers}"


def sweep_points(sweep: ScalingSweep) -> list[Point]:
    """One point per worker count, in spec order (the first is the baseline)."""
    spec = sweep.spec
    gpus = spec.gpus_per_worker or [spec.template.workers.gpus_per_worker] * len(spec.workers)
    chosen = engine(spec.template.training.framework, spec.template.training.strategy)
    return [Point(point_name(sweep.metadata.name, w), w, g, chosen.slots_per_worker(g))
            for w, g in zip(spec.workers, gpus)]


def build_point_run(sweep: ScalingSweep, point: Point, namespace: Optional[str] = None) -> dict[str, Any]:
    """The child ScalingRun of `point` (owner reference added by the operator when it creates it)."""
    spec = sweep.spec.template.model_dump(mode="json", by_alias=True, exclude_none=True)
    spec["workers"].update(replicas=point.workers, gpusPerWorker=point.gpus_per_worker)
    largest = max(p.processes for p in sweep_points(sweep))
    preprocessing = spec["dataset"].setdefault("preprocessing", {})
    preprocessing["readers"] = max(largest, preprocessing.get("readers") or 0)
    checkpoint = spec["training"].setdefault("checkpoint", {})
    if checkpoint.get("location"):  # one location per point: points must not resume from each other
        checkpoint["location"] = f"{checkpoint['location'].rstrip('/')}/{point.name}"
    metadata: dict[str, Any] = {"name": point.name, "labels": {
        SWEEP_LABEL: sweep.metadata.name, POINT_LABEL: str(point.workers),
        "app.kubernetes.io/name": "scalingrun", **MANAGED_BY}}
    if namespace or sweep.metadata.namespace:
        metadata["namespace"] = namespace or sweep.metadata.namespace
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}
