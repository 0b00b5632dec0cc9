"""Rank 0's progress document, `<runLocation>/progress.json`, that the operator mirrors into status.

Written atomically at the start, after every epoch and at the end: {"state": running|succeeded|failed,
"epoch", "maxEpochs", "metrics", "bestEpoch", "bestMetrics", "imagesPerSecond", "elapsedSeconds",
"learningRate", "effectiveBatchSize", "processes", "modelUri", "error", "mlflowRunId", "resumedFromEpoch",
"history", "batchSizePerWorker", "batchSizeProbe", "inputWaitFraction", "gpuUtilization", "inputHistory"}.

"batchSizeProbe" ({"chosen", "seconds", "stoppedBy", "table"}) is there when batchSizePerWorker was auto.
"inputWaitFraction" and "gpuUtilization" are the last epoch's (see input_wait.py; no gpuUtilization on CPU);
"inputHistory" keeps them for the last epochs of this attempt: [{"epoch", "inputWaitFraction", "gpuUtilization"}].

A training resumed from a checkpoint starts the document where that checkpoint left off (its epoch, that
epoch's metrics and throughput, the best epoch so far), so "epoch" never goes back to 0 during a resumed
attempt; "resumedFromEpoch" is that epoch, None for a fresh start. "elapsedSeconds" counts this attempt.
"""

from __future__ import annotations

import json
import time
from typing import Any, Optional

from .input_wait import HISTORY_EPOCHS
from .storage import Location


class ProgressWriter:
    def __init__(self, location: Location, *, max_epochs: int, processes: int, learning_rate: float,
                 effective_batch_size: int, history: Optional[list[dict]] = None, mlflow_run_id: Optional[str] = None,
                 resumed_from_epoch: Optional[int] = None, batch_size_per_worker: Optional[int] = None,
                 batch_size_probe: Optional[dict] = None):
        self.location = location
        self.started = time.monotonic()
        self.document: dict[str, Any] = {
            "state": "running", "epoch": resumed_from_epoch or 0, "maxEpochs": max_epochs, "metrics": {},
            "bestEpoch": None, "bestMetrics": {}, "imagesPerSecond": None, "elapsedSeconds": 0.0,
            "learningRate": learning_rate, "effectiveBatchSize": effective_batch_size, "processes": processes,
            "modelUri": None, "error": None, "mlflowRunId": mlflow_run_id, "resumedFromEpoch": resumed_from_epoch,
            "history": list(history or []), "batchSizePerWorker": batch_size_per_worker,
            "inputWaitFraction": None, "gpuUtilization": None, "inputHistory": [],
        }
        if batch_size_probe is not None:
            self.document["batchSizeProbe"] = batch_size_probe
        resumed = self._history_entry(resumed_from_epoch)
        if resumed:
            self.document.update(metrics=_metrics_of(resumed), imagesPerSecond=resumed.get("imagesPerSecond"))

    def _history_entry(self, epoch: Optional[int]) -> Optional[dict]:
        if not epoch:
            return None
        return next((h for h in self.document["history"] if h.get("epoch") == epoch), None)

    def _write(self) -> None:
        self.document["elapsedSeconds"] = round(time.monotonic() - self.started, 2)
        self.location.write_bytes_atomic(json.dumps(self.document, indent=1).encode())

    def start(self, best_epoch: Optional[int] = None) -> None:
        """Writes the first document; best_epoch: the best epoch so far of a resumed training."""
        best = self._history_entry(best_epoch)
        if best:
            self.document.update(bestEpoch=best_epoch, bestMetrics=_metrics_of(best))
        self._write()

    def epoch(self, epoch: int, metrics: dict[str, float], images_per_second: float,
              best_epoch: Optional[int], best_metrics: dict[str, float], input_figures: Optional[dict] = None) -> None:
        metrics = _rounded(metrics)
        if input_figures is not None:
            self.document.update(inputWaitFraction=input_figures.get("inputWaitFraction"),
                                 gpuUtilization=input_figures.get("gpuUtilization"))
            self.document["inputHistory"] = [*self.document["inputHistory"], input_figures][-HISTORY_EPOCHS:]
        self.document.update(epoch=epoch, metrics=metrics, imagesPerSecond=round(images_per_second, 1),
                             bestEpoch=best_epoch, bestMetrics=_rounded(best_metrics))
        self.document["history"].append({"epoch": epoch, **metrics, "imagesPerSecond": round(images_per_second, 1)})
        self._write()

    def finish(self, state: str, model_uri: Optional[str] = None, error: Optional[str] = None) -> None:
        self.document.update(state=state, modelUri=model_uri, error=error)
        self._write()


def _metrics_of(entry: dict) -> dict[str, float]:
    return {k: v for k, v in entry.items() if k not in ("epoch", "imagesPerSecond")}


def _rounded(metrics: dict[str, float]) -> dict[str, float]:
    return {k: round(float(v), 6) for k, v in metrics.items()}
