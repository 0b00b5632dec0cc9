"""A command run's trainer config (the config fixture) and the keys a progress document carries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalingrun_operator.schema.validation import parse_scalingrun
from scalingrun_operator.builders.config import build_trainer_config
from scalingrun_trainer.preprocess.parquet_table import TableParams, inspect_table, write_manifest
from tests.support.parquet_table import SIDE, write_table


# Every key of our trainers' progress.json (trainer/scalingrun_trainer/progress.py).
PROGRESS_KEYS = {"state", "epoch", "maxEpochs", "metrics", "bestEpoch", "bestMetrics", "imagesPerSecond",
                 "elapsedSeconds", "learningRate", "effectiveBatchSize", "processes", "modelUri", "error",
                 "mlflowRunId", "resumedFromEpoch", "history", "batchSizePerWorker", "inputWaitFraction",
                 "gpuUtilization", "inputHistory"}


@pytest.fixture
def config(tmp_path) -> Path:
    """A command run's trainer config, as the operator renders it, over a small Parquet table."""
    root = write_table(tmp_path / "table")
    output = tmp_path / "dataset"
    table = TableParams(str(root), str(output), SIDE, "pixels", "y", readers=2)
    write_manifest(table, inspect_table(table))
    run = parse_scalingrun({
        "apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun", "metadata": {"name": "sdk-unit"},
        "spec": {"dataset": {"source": str(root), "output": str(output), "imageSize": SIDE, "format": "parquet",
                             "columns": {"image": "pixels", "label": "y"}},
                 "model": {"params": {"width": 4}},
                 "training": {"command": ["python", "train.py"], "batchSizePerWorker": 8, "maxEpochs": 3,
                              "learningRateScaling": "sqrt", "earlyStopping": {"monitor": "val_accuracy"}},
                 "workers": {"replicas": 2, "gpusPerWorker": 0}}})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(build_trainer_config(run)))
    return path
