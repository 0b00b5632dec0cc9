"""The Keras + MultiWorkerMirroredStrategy trainer run as the tests run it: its config, the mpirun command (Horovod
made unimportable in its processes: this engine must not need it), its environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scalingrun_operator.builders.config import build_trainer_config
from scalingrun_operator.schema.validation import parse_scalingrun

BUCKET = "mirrored"
SIZE = 32


@pytest.fixture(scope="module")
def without_horovod(tmp_path_factory) -> dict[str, str]:
    """Environment in which `import horovod` fails in every process (a sitecustomize on PYTHONPATH)."""
    folder = tmp_path_factory.mktemp("no-horovod")
    (folder / "sitecustomize.py").write_text("import sys\nsys.modules['horovod'] = None\n")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))}


def write_config(path: Path, server, dataset: str, run_location: str, tracking: dict | None = None,
                 model: dict | None = None, **training) -> Path:
    spec = {
        "apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun", "metadata": {"name": "mirrored-test"},
        "spec": {
            "storage": {"endpoint": server.endpoint, "credentialsSecret": "unused-locally"},
            "dataset": {"source": f"s3://{BUCKET}/jpeg", "output": dataset, "imageSize": SIZE},
            "model": {"base": "mobilenet_v2", "weights": "none", "dropout": 0.1, **(model or {})},
            "training": {"strategy": "multi-worker-mirrored", "batchSizePerWorker": 16, "maxEpochs": 2,
                         "checkpoint": {"location": run_location}, **training},
            "workers": {"replicas": 2, "gpusPerWorker": 0},
            **({"tracking": tracking} if tracking else {}),
        },
    }
    path.write_text(json.dumps(build_trainer_config(parse_scalingrun(spec))))
    return path


def command(mpirun: list[str], config: Path, env: dict[str, str]) -> list[str]:
    forwarded = [arg for name in env for arg in ("-x", name)]
    return [*mpirun, *forwarded, sys.executable, "-m", "scalingrun_trainer.cli", "train", "--config", str(config)]


def environment(server, *extra: dict[str, str]) -> dict[str, str]:
    env = {**server.env(), "TF_CPP_MIN_LOG_LEVEL": "2"}
    for more in extra:
        env.update(more)
    return env


def run_training(mpirun, server, config: Path, *extra: dict[str, str], timeout: int = 600):
    env = environment(server, *extra)
    return subprocess.run(command(mpirun, config, env), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env})
