"""The Lightning trainer run as the tests run it: a dataset fixture, its config, the command, its documents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalingrun_operator.schema.validation import parse_scalingrun
from scalingrun_operator.builders.config import build_trainer_config
from tests.support.operator import read_json  # noqa: F401 - the train tests' reader
from tests.support.training import preprocessed_fashion_mnist


BUCKET = "lightning"


SIZE = 32


@pytest.fixture(scope="module")
def dataset(s3_server) -> str:
    """Fashion-MNIST, 24 images per class, preprocessed for 2 readers (the preprocessing is shared)."""
    return preprocessed_fashion_mnist(s3_server, BUCKET, per_class=24, size=SIZE)


def write_config(path: Path, server, dataset: str, run_location: str, tracking: dict | None = None,
                 **training) -> Path:
    spec = {
        "apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun", "metadata": {"name": "lightning-test"},
        "spec": {
            "storage": {"endpoint": server.endpoint, "credentialsSecret": "unused-locally"},
            "dataset": {"source": f"s3://{BUCKET}/jpeg", "output": dataset, "imageSize": SIZE},
            "model": {"base": "efficientnet_lite0", "weights": "imagenet", "dropout": 0.1},
            "training": {"framework": "pytorch-lightning", "batchSizePerWorker": 16, "maxEpochs": 2,
                         "checkpoint": {"location": run_location}, **training},
            "workers": {"replicas": 2, "gpusPerWorker": 0},
            **({"tracking": tracking} if tracking else {}),
        },
    }
    path.write_text(json.dumps(build_trainer_config(parse_scalingrun(spec))))
    return path


def command(mpirun: list[str], python: str, config: Path) -> list[str]:
    return [*mpirun, python, "-m", "scalingrun_trainer.cli", "train", "--config", str(config)]


