"""The trainer's progress document, `<runLocation>/progress.json`: rank 0 of every engine writes it after every epoch
(scalingrun_trainer.core.progress), and the operator, `scalingrun report`, the sweep and the local runner read it.

Its keys are the fields of `Progress` (camelCase on the wire) and are written nowhere else. The writer fills the
model; readers call `Progress.read(document)`, which is lenient on purpose: a value of the wrong type, a NaN or a
bool where a number belongs is left out (the field keeps its default), not the whole document refused, so that
one junk value never hides the rest of a run's progress. `Progress.read(...).model_fields_set` says which fields
the document really had.

The parts that status.training mirrors as they are (the batch-size probe, the input history, the feature cache) are
its models.
"""

from __future__ import annotations

import math
import types
import typing
from enum import Enum
from typing import Any, Optional, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from .models.status import (  # mirrored as they are
    BatchSizeProbe, Devices, FeatureCache, InputEpoch, ProbedBatchSize,
)

PROGRESS_FILE = "progress.json"
# Epochs of input figures kept in inputHistory (InputBound needs the last 2).
INPUT_HISTORY_EPOCHS = 10


class ProgressState(str, Enum):
    running = "running"
    succeeded = "succeeded"
    failed = "failed"


class Epoch(BaseModel):
    """One entry of `history`: the epoch, its metrics (the framework's names: loss, accuracy, val_loss,
    val_accuracy) as further keys, and the training throughput."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    epoch: int
    images_per_second: Optional[float] = None

    @property
    def metrics(self) -> dict[str, float]:
        return dict(self.model_extra or {})


class Progress(BaseModel):
    """progress.json. A resumed attempt starts where its checkpoint left off: `epoch` is the resumed epoch (never
    0 again), `metrics` and `imagesPerSecond` that epoch's, `resumedFromEpoch` that epoch (None for a fresh
    start); `elapsedSeconds` counts this attempt only."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore",
                              use_enum_values=True)

    state: ProgressState = ProgressState.running
    epoch: Optional[int] = None
    max_epochs: Optional[int] = None
    metrics: dict[str, float] = Field(default_factory=dict)
    best_epoch: Optional[int] = None
    best_metrics: dict[str, float] = Field(default_factory=dict)
    images_per_second: Optional[float] = None
    elapsed_seconds: Optional[float] = None
    learning_rate: Optional[float] = None
    effective_batch_size: Optional[int] = None
    processes: Optional[int] = None
    model_uri: Optional[str] = None
    error: Optional[str] = None
    mlflow_run_id: Optional[str] = Field(None, min_length=1)
    resumed_from_epoch: Optional[int] = None
    history: list[Epoch] = Field(default_factory=list)
    batch_size_per_worker: Optional[int] = None
    # Only when batchSizePerWorker was auto.
    batch_size_probe: Optional[BatchSizeProbe] = None
    # The last epoch's (see the trainer's input_wait.py; no gpuUtilization on CPU), and the last epochs' of this
    # attempt.
    input_wait_fraction: Optional[float] = None
    gpu_utilization: Optional[float] = None
    input_history: list[InputEpoch] = Field(default_factory=list)
    # Whether this attempt trains the head on cached features, and their cost (once they are computed).
    feature_cache: Optional[FeatureCache] = None
    # What rank 0 trains on (every engine's trainer; none from the SDK of a training.command).
    devices: Optional[Devices] = None

    @classmethod
    def read(cls, document: Any) -> "Progress":
        """A progress document as readers take it: every valid field, nothing else (see the module docstring)."""
        return lenient(cls, document) or cls()

    def document(self) -> dict[str, Any]:
        """The JSON document the trainer writes: every key, None included; inputHistory entries with the figures
        measured; batchSizeProbe only when the probe ran; featureCache with the figures known."""
        out = self.model_dump(by_alias=True, exclude={"batch_size_probe", "input_history", "feature_cache", "devices"})
        out["inputHistory"] = [entry.model_dump(by_alias=True, exclude_none=True) for entry in self.input_history]
        if self.batch_size_probe is not None:
            out["batchSizeProbe"] = probe_document(self.batch_size_probe)
        if self.feature_cache is not None:
            out["featureCache"] = self.feature_cache.model_dump(by_alias=True, exclude_none=True)
        if self.devices is not None:
            out["devices"] = self.devices.model_dump(by_alias=True, exclude_none=True)
        return out

    def process_hours(self, processes: Optional[int] = None) -> Optional[float]:
        """Processes (the document's, unless given) x this attempt's training time, in hours: what it cost in
        process-hours (GPU-hours when each process drives one GPU); None before both are known."""
        processes = self.processes if processes is None else processes
        if not processes or self.elapsed_seconds is None:
            return None
        return round(processes * self.elapsed_seconds / 3600, 4)

    def history_entry(self, epoch: Optional[int]) -> Optional[Epoch]:
        if not epoch:
            return None
        return next((entry for entry in self.history if entry.epoch == epoch), None)


def probe_document(probe: BatchSizeProbe) -> dict[str, Any]:
    """batchSizeProbe as the trainer writes it: a row has outOfMemory only when it ran out, imagesPerSecond only
    when measured."""
    return {**probe.model_dump(by_alias=True, exclude={"table"}),
            "table": [row.model_dump(by_alias=True, exclude_defaults=True) for row in probe.table]}


M = TypeVar("M", bound=BaseModel)


def _number(value: Any) -> Optional[float]:
    """A finite int or float; bools, strings, NaN and infinities are not numbers here."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def _lenient_value(annotation: Any, value: Any) -> tuple[bool, Any]:
    """(valid, value) for one field's value, by the field's type: numbers as `_number` (an int field takes the
    integer part), strings and bools only as themselves, dicts of numbers entry by entry, lists of models element
    by element (invalid elements dropped), models recursively."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return True, None
        (annotation,) = [arg for arg in args if arg is not type(None)]
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation in (int, float):
        number = _number(value)
        return number is not None, None if number is None else annotation(number)
    if annotation in (str, bool):
        return isinstance(value, annotation), value
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        try:
            return True, annotation(value).value
        except (ValueError, TypeError):
            return False, None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        parsed = lenient(annotation, value)
        return parsed is not None, parsed
    if origin is dict and isinstance(value, dict):
        numbers = {str(k): _number(v) for k, v in value.items()}
        return True, {k: float(v) for k, v in numbers.items() if v is not None}
    if origin is list and isinstance(value, list):
        items = [_lenient_value(args[0], item) for item in value]
        return True, [item for valid, item in items if valid]
    return False, None


def lenient(model: type[M], data: Any) -> Optional[M]:
    """`model` from a JSON object, keeping every field whose value is valid; None when `data` is not an object or
    a required field is missing or invalid. Extra keys of a model that allows them are kept when they are numbers
    (a history entry's metrics)."""
    if not isinstance(data, dict):
        return None
    values: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        key = field.alias or name
        if key in data:
            valid, value = _lenient_value(field.annotation, data[key])
            if valid:
                values[name] = value
    if model.model_config.get("extra") == "allow":
        known = {field.alias or name for name, field in model.model_fields.items()}
        values.update({key: float(value) for key, value in data.items()
                       if key not in known and isinstance(key, str) and _number(value) is not None})
    while True:
        try:
            return model.model_validate(values)
        except ValidationError as exc:  # a value the type took but a constraint refuses (an empty mlflowRunId)
            refused = {error["loc"][0] for error in exc.errors() if error["loc"]}
            if not refused & set(values) or any(model.model_fields[name].is_required() for name in refused
                                                if name in model.model_fields):
                return None
            values = {name: value for name, value in values.items() if name not in refused}
