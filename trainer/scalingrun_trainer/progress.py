"""Rank 0's progress document, `<runLocation>/progress.json`, that the operator mirrors into status.

Written atomically after every epoch and at the end: {"state": running|succeeded|failed, "epoch",
"maxEpochs", "metrics", "bestEpoch", "bestMetrics", "imagesPerSecond", "elapsedSeconds", "learningRate",
"effectiveBatchSize", "processes", "modelUri", "error", "mlflowRunId", "history"}.
"""

from __future__ import annotations

import json
import time
from typing import Any, Optional

from .storage import Location


class ProgressWriter:
    def __init__(self, location: Location, *, max_epochs: int, processes: int, learning_rate: float,
                 effective_batch_size: int, history: Optional[list[dict]] = None, mlflow_run_id: Optional[str] = None):
        self.location = location
        self.started = time.monotonic()
        self.document: dict[str, Any] = {
            "state": "running", "epoch": 0, "maxEpochs": max_epochs, "metrics": {}, "bestEpoch": None,
            "bestMetrics": {}, "imagesPerSecond": None, "elapsedSeconds": 0.0, "learningRate": learning_rate,
            "effectiveBatchSize": effective_batch_size, "processes": processes, "modelUri": None, "error": None,
            "mlflowRunId": mlflow_run_id, "history": list(history or []),
        }

    def _write(self) -> None:
        self.document["elapsedSeconds"] = round(time.monotonic() - self.started, 2)
        self.location.write_bytes_atomic(json.dumps(self.document, indent=1).encode())

    def start(self) -> None:
        self._write()

    def epoch(self, epoch: int, metrics: dict[str, float], images_per_second: float,
              best_epoch: Optional[int], best_metrics: dict[str, float]) -> None:
        metrics = _rounded(metrics)
        self.document.update(epoch=epoch, metrics=metrics, imagesPerSecond=round(images_per_second, 1),
                             bestEpoch=best_epoch, bestMetrics=_rounded(best_metrics))
        self.document["history"].append({"epoch": epoch, **metrics, "imagesPerSecond": round(images_per_second, 1)})
        self._write()

    def finish(self, state: str, model_uri: Optional[str] = None, error: Optional[str] = None) -> None:
        self.document.update(state=state, modelUri=model_uri, error=error)
        self._write()


def _rounded(metrics: dict[str, float]) -> dict[str, float]:
    return {k: round(float(v), 6) for k, v in metrics.items()}
