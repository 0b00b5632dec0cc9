"""Rank 0's progress document, `<runLocation>/progress.json` (its schema: scalingrun_api.progress.Progress), that
the operator mirrors into status; and what every engine does after an epoch: pick the best epoch so far, write the
document, log to MLflow and print one line (EpochRecorder).

Written atomically at the start, after every epoch and at the end. A training resumed from a checkpoint starts
the document where that checkpoint left off (its epoch, that epoch's metrics and throughput, the best epoch so
far), so "epoch" never goes back to 0 during a resumed attempt.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Callable, Optional

from scalingrun_api.progress import (
    INPUT_HISTORY_EPOCHS, BatchSizeProbe, Devices, Epoch, FeatureCache, InputEpoch, Progress, ProgressState,
)
from scalingrun_api.status_push import PROGRESS
from ..storage import Location
from .status_push import FINAL_FLUSH_SECONDS, status_pusher

if TYPE_CHECKING:
    from .tracking import RunTracker

Best = tuple[Optional[int], dict[str, float]]  # (1-based epoch, its metrics); (None, {}) before any epoch


class ProgressWriter:
    def __init__(self, location: Location, *, max_epochs: int, processes: int, learning_rate: float,
                 effective_batch_size: int, history: Optional[list[dict]] = None, mlflow_run_id: Optional[str] = None,
                 resumed_from_epoch: Optional[int] = None, batch_size_per_worker: Optional[int] = None,
                 batch_size_probe: Optional[dict] = None, feature_cache: Optional[FeatureCache] = None,
                 devices: Optional[Devices] = None):
        self.location = location
        self.started = time.monotonic()
        self.progress = Progress(
            state=ProgressState.running, epoch=resumed_from_epoch or 0, max_epochs=max_epochs, elapsed_seconds=0.0,
            learning_rate=learning_rate, effective_batch_size=effective_batch_size, processes=processes,
            mlflow_run_id=mlflow_run_id, resumed_from_epoch=resumed_from_epoch,
            history=[Epoch.model_validate(entry) for entry in history or []],
            batch_size_per_worker=batch_size_per_worker,
            batch_size_probe=None if batch_size_probe is None else BatchSizeProbe.model_validate(batch_size_probe),
            feature_cache=feature_cache, devices=devices,
        )
        resumed = self.progress.history_entry(resumed_from_epoch)
        if resumed:
            self.progress.metrics, self.progress.images_per_second = resumed.metrics, resumed.images_per_second

    def history(self) -> list[dict]:
        """The metrics history as the document has it (a checkpoint keeps it, to resume the document)."""
        return [entry.model_dump(by_alias=True) for entry in self.progress.history]

    def _write(self) -> None:
        self.progress.elapsed_seconds = round(time.monotonic() - self.started, 2)
        document = self.progress.document()
        pusher = status_pusher()
        if pusher is not None:
            pusher.push(PROGRESS, document)  # to the operator at once, beside the durable record
        self.location.write_bytes_atomic(json.dumps(document, indent=1).encode())

    def start(self, best_epoch: Optional[int] = None) -> None:
        """Writes the first document; best_epoch: the best epoch so far of a resumed training."""
        best = self.progress.history_entry(best_epoch)
        if best:
            self.progress.best_epoch, self.progress.best_metrics = best_epoch, best.metrics
        self._write()

    def feature_cache_built(self, feature_cache: FeatureCache) -> None:
        """The cache's figures, once every rank has built its share (before the first epoch of the attempt)."""
        self.progress.feature_cache = feature_cache
        self._write()

    def epoch(self, epoch: int, metrics: dict[str, float], images_per_second: float,
              best_epoch: Optional[int], best_metrics: dict[str, float],
              input_figures: Optional[InputEpoch] = None) -> None:
        metrics, rate, progress = _rounded(metrics), round(images_per_second, 1), self.progress
        if input_figures is not None:
            progress.input_wait_fraction = input_figures.input_wait_fraction
            progress.gpu_utilization = input_figures.gpu_utilization
            progress.input_history = [*progress.input_history, input_figures][-INPUT_HISTORY_EPOCHS:]
        progress.epoch, progress.metrics, progress.images_per_second = epoch, metrics, rate
        progress.best_epoch, progress.best_metrics = best_epoch, _rounded(best_metrics)
        progress.history.append(Epoch(epoch=epoch, images_per_second=rate, **metrics))
        self._write()

    def finish(self, state: str, model_uri: Optional[str] = None, error: Optional[str] = None) -> None:
        self.progress.state, self.progress.model_uri, self.progress.error = ProgressState(state).value, model_uri, error
        self._write()
        pusher = status_pusher()
        if pusher is not None:
            pusher.flush(FINAL_FLUSH_SECONDS)  # the last document before the process (and its daemon thread) ends


def push_recorded(location: Location) -> bool:
    """Pushes the document a finished run ended with (a rerun trains nothing and writes nothing), so that whoever
    takes status from pushes (the operator with its endpoint on, the local runner) learns how it ended; whether it
    was sent. Nothing to push where no endpoint is set or the document cannot be read."""
    pusher = status_pusher()
    if pusher is None:
        return False
    try:
        document = json.loads(location.read_bytes())
    except (OSError, ValueError):
        return False
    pusher.push(PROGRESS, document)
    return pusher.flush(FINAL_FLUSH_SECONDS)


def _rounded(metrics: dict[str, float]) -> dict[str, float]:
    return {k: round(float(v), 6) for k, v in metrics.items()}


def better(monitor: str, value: Optional[float], best: Optional[float], min_delta: float = 0.0) -> bool:
    """Accuracies improve upwards, losses downwards, by more than min_delta (Keras' rule)."""
    if value is None:
        return False
    if best is None:
        return True
    return value - min_delta > best if "acc" in monitor else value + min_delta < best


def best_so_far(history: list[dict], best_epoch: Optional[int], monitor: str) -> Best:
    """The best epoch of a resumed training: early stopping's when it ran, else the best monitored value."""
    best: Best = (None, {})
    for entry in (Epoch.model_validate(item) for item in history):
        if entry.epoch == best_epoch or (
                best_epoch is None and better(monitor, entry.metrics.get(monitor), best[1].get(monitor))):
            best = (entry.epoch, entry.metrics)
    return best


class EpochTimer:
    """Training throughput of an epoch, validation excluded: from its start until its validation begins."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._start = self._train_end = 0.0

    def epoch_started(self) -> None:
        self._start, self._train_end = self.clock(), 0.0

    def validation_started(self) -> None:
        self._train_end = self._train_end or self.clock()

    def images_per_second(self, images: int) -> float:
        return images / max((self._train_end or self.clock()) - self._start, 1e-9)


class EpochRecorder:
    """Rank 0, after each epoch: the best epoch so far (early stopping's when it runs, else the best monitored
    value), the progress document, MLflow and one log line."""

    def __init__(self, progress: ProgressWriter, monitor: str, *, early_stopping: bool,
                 tracker: Optional["RunTracker"] = None, log: Callable[[str], None] = print, best: Best = (None, {})):
        self.progress, self.monitor, self.early_stopping = progress, monitor, early_stopping
        self.tracker, self.log, self.best = tracker, log, best

    def record(self, epoch: int, metrics: dict[str, float], images_per_second: float, *,
               early_stopping_best: Optional[int] = None, input_figures: Optional[InputEpoch] = None,
               stopped: bool = False) -> None:
        """`epoch` is 1-based; early_stopping_best: early stopping's best epoch after this one; stopped: early
        stopping ends the training with this epoch (said on the line, for engines whose framework does not)."""
        if self.early_stopping:
            if early_stopping_best == epoch:
                self.best = (epoch, metrics)
        elif self.best[0] is None or better(self.monitor, metrics.get(self.monitor), self.best[1].get(self.monitor)):
            self.best = (epoch, metrics)
        self.progress.epoch(epoch, metrics, images_per_second, self.best[0], self.best[1], input_figures=input_figures)
        if self.tracker is not None:
            self.tracker.epoch(epoch, metrics, images_per_second)
        shown = " ".join(f"{k}={v:.4f}" for k, v in metrics.items())
        extra = ""
        if input_figures is not None and input_figures.input_wait_fraction is not None:
            extra += f", input wait {input_figures.input_wait_fraction:.0%}"
        if input_figures is not None and input_figures.gpu_utilization is not None:
            extra += f", GPU {input_figures.gpu_utilization:.0f}%"
        if self.progress.progress.feature_cache and self.progress.progress.feature_cache.used:
            extra += ", cached features"
        self.log(f"epoch {epoch}/{self.progress.progress.max_epochs}: {shown} ({images_per_second:.0f} img/s{extra})"
                 + (f"; early stopping, best epoch {self.best[0]}" if stopped else ""))
