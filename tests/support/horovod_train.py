"""The Horovod trainer run as the tests run it: a dataset fixture, its config, the command, its documents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyarrow import fs as pafs

from scalingrun_operator.schema.validation import parse_scalingrun
from scalingrun_operator.builders.config import build_trainer_config
from tests.support.training import preprocessed_fashion_mnist
from tests.support.horovodrun import horovodrun
from tests.support.operator import read_json  # noqa: F401 - the train tests' reader


BUCKET = "train"


SIZE = 32


def s3(server) -> pafs.S3FileSystem:
    return server.filesystem()


@pytest.fixture(scope="module")
def dataset(s3_server) -> str:
    """Fashion-MNIST, 24 images per class, preprocessed for 2 readers."""
    return preprocessed_fashion_mnist(s3_server, BUCKET, per_class=24, size=SIZE)


def write_config(tmp_path: Path, server, dataset: str, run_location: str, tracking: dict | None = None,
                 model: dict | None = None, **training) -> Path:
    spec = {
        "apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun", "metadata": {"name": "hvd-test"},
        "spec": {
            "storage": {"endpoint": server.endpoint, "credentialsSecret": "unused-locally"},
            "dataset": {"source": f"s3://{BUCKET}/jpeg", "output": dataset, "imageSize": SIZE},
            "model": {"base": "mobilenet_v2", "weights": "none", "dropout": 0.1, **(model or {})},
            "training": {"batchSizePerWorker": 16, "maxEpochs": 2, "checkpoint": {"location": run_location},
                         **training},
            "workers": {"replicas": 2, "gpusPerWorker": 0},
            **({"tracking": tracking} if tracking else {}),
        },
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(build_trainer_config(parse_scalingrun(spec))))
    return path


def train_command(config: Path, processes: int = 2) -> list[str]:
    return [horovodrun(), "-np", str(processes), "-H", f"localhost:{processes}", "--gloo", sys.executable, "-m",
            "scalingrun_trainer.cli", "train", "--config", str(config)]


def run_training(server, config: Path, timeout: int = 400, env: dict | None = None,
                 processes: int = 2) -> subprocess.CompletedProcess:
    return subprocess.run(train_command(config, processes), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **server.env(), "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})})
