"""The ScalingSweep resource: the same ScalingRun at several worker counts, with a table and a recommendation."""

from __future__ import annotations

import datetime as dt
from enum import Enum
from typing import Annotated, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from .common import ApiModel, ObjectMeta
from .status import Condition
from .run import ScalingRunSpec

SWEEP_KIND = "ScalingSweep"
SWEEP_PLURAL = "scalingsweeps"
SWEEP_SINGULAR = "scalingsweep"
SWEEP_SHORT_NAMES = ["ssweep"]


class ScalingSweepSpec(ApiModel):
    """The same ScalingRun at several worker counts, one point after another, on one preprocessed dataset."""

    template: ScalingRunSpec = Field(
        ..., description="The ScalingRun spec of every point; each point sets workers.replicas (and "
        "workers.gpusPerWorker when given) and the learning rate follows training.learningRateScaling.")
    workers: list[Annotated[int, Field(ge=1, le=1024)]] = Field(
        ..., min_length=1, max_length=16,
        description="Worker counts, one point each, e.g. [1, 2, 4, 8]; unique. The first point is the "
        "baseline of speedup and efficiency.")
    gpus_per_worker: Optional[list[Annotated[int, Field(ge=0, le=16)]]] = Field(
        None, min_length=1, max_length=16,
        description="GPUs per worker of each point (same length as workers); default: "
        "template.workers.gpusPerWorker for every point.")
    max_parallel: int = Field(
        1, ge=1, le=16, description="Points that may run at once; 1 keeps them from competing for nodes.")
    efficiency_threshold: float = Field(
        0.7, gt=0, le=1, description="Lowest efficiency (speedup / scale) a recommended point may have.")
    accuracy_tolerance: float = Field(
        0.01, ge=0, le=1,
        description="How far below the best point's best val_accuracy a recommended point may be.")


class SweepPhase(str, Enum):
    pending = "Pending"
    running = "Running"
    succeeded = "Succeeded"
    failed = "Failed"


class SweepPoint(ApiModel):
    """One point of the sweep: its child ScalingRun and what it measured."""

    run: str = Field(..., description="Name of the child ScalingRun.")
    workers: int = Field(..., description="Worker pods.")
    gpus_per_worker: int = Field(..., description="GPUs per worker (0: CPU, one process per worker).")
    processes: int = Field(..., description="Training processes: workers x the engine's processes per worker (one per GPU; one per pod for multi-worker-mirrored).")
    phase: Optional[str] = Field(None, description="Phase of the child ScalingRun; none before it exists.")
    effective_batch_size: Optional[int] = Field(None, description="Batch size across all processes.")
    learning_rate: Optional[float] = Field(None, description="Scaled learning rate the point trained with.")
    epochs: Optional[int] = Field(None, description="Epochs run (early stopping may end a point sooner).")
    best_val_accuracy: Optional[float] = Field(None, description="val_accuracy of the best epoch.")
    best_val_loss: Optional[float] = Field(None, description="val_loss of the best epoch.")
    wall_seconds: Optional[float] = Field(None, description="Training wall time of the point, in seconds.")
    seconds_per_epoch: Optional[float] = Field(None, description="wallSeconds / epochs.")
    images_per_second: Optional[float] = Field(None, description="Median training throughput of its epochs.")
    speedup: Optional[float] = Field(
        None, description="Seconds per epoch of the first point / this point's seconds per epoch.")
    efficiency: Optional[float] = Field(
        None, description="speedup / scale, where scale = processes / the first point's processes; 1 is linear.")
    worker_hours: Optional[float] = Field(None, description="processes x wall time, in hours: the cost.")
    feature_cache: Optional[bool] = Field(
        None, description="True when the point trained the head on features its frozen base computed once.")
    feature_cache_seconds: Optional[float] = Field(
        None, description="Seconds the point spent computing those features (part of wallSeconds).")
    resized: Optional[bool] = Field(
        None, description="True when the point's ScalingRun trained at more than one worker count (an elastic run "
        "found under the point's name and adopted; a sweep's template cannot be elastic): its time and throughput "
        "would mix sizes, so the row has none, no speedup, and is never recommended.")


class SweepRecommendation(ApiModel):
    """The largest point that still scales (efficiency >= threshold) and trains as well (accuracy within tolerance)."""

    run: str = Field(..., description="The recommended point's ScalingRun.")
    workers: int = Field(..., description="Its worker count.")
    processes: int = Field(..., description="Its training processes.")
    message: str = Field(..., description="Why this point, and what the larger points lost.")


class ScalingSweepStatus(ApiModel):
    """Observed state of the sweep, written by the operator (or printed by `scalingrun sweep --local`)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    phase: Optional[SweepPhase] = Field(None, description="Pending, Running, Succeeded or Failed.")
    message: Optional[str] = Field(None, description="What the sweep is doing now, or why it stopped.")
    progress: Optional[str] = Field(None, description="Points finished / points, e.g. 2/4.")
    conditions: list[Condition] = Field(default_factory=list, description="Conditions with reasons.")
    observed_generation: Optional[int] = Field(None, description="Spec generation last acted upon.")
    points: list[SweepPoint] = Field(default_factory=list, description="One row per point, in spec order.")
    recommendation: Optional[SweepRecommendation] = Field(
        None, description="Set when every point has finished.")
    start_time: Optional[dt.datetime] = Field(None, description="When the first point started.")
    completion_time: Optional[dt.datetime] = Field(None, description="When the last point finished.")


class ScalingSweep(BaseModel):
    """A ScalingSweep resource: one child ScalingRun per worker count, with a scaling table and a recommendation."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    api_version: Literal["scalingrun.dev/v1alpha1"] = Field(..., alias="apiVersion")
    kind: Literal["ScalingSweep"]
    metadata: ObjectMeta
    spec: ScalingSweepSpec
    status: Optional[ScalingSweepStatus] = None
