"""model.builder with PyTorch Lightning, real processes: the team's own torch CNN (examples/custom-model) learns on
the quick-start data through the quick start; a builder that breaks the contract fails every rank before training,
with rank 0's failed progress document."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from scalingrun_trainer.preprocess.parquet_table import inspect_table, write_manifest
from tests.support.lightning_train import BUCKET, command, dataset, read_json, write_config  # noqa: F401
from tests.support.parquet_table import SIDE, write_table
from tests.support.parquet_table import params as table_params
from tests.support.quickstart import example_spec, run_quickstart, team_package, trained

pytestmark = [pytest.mark.lightning, pytest.mark.s3]
ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "examples/custom-model"
LEARNED = 0.45  # 10 classes (chance 0.10), 1,353 training images of 32 px, 5 epochs from scratch


def test_the_teams_torch_network_learns_on_the_quickstart_data(tmp_path, lightning_python):
    spec = example_spec(PACKAGE / "quickstart-lightning.yaml", batchSizePerWorker=32, maxEpochs=5)
    state = tmp_path / "state"
    result = run_quickstart(spec, tmp_path / "team-cnn-lightning.yaml", state, 150,
                            {"PYTHONPATH": str(PACKAGE), "SCALINGRUN_LIGHTNING_PYTHON": lightning_python})
    line = trained(result, 5)
    assert "phase: Succeeded" in result.stdout
    print(f"team CNN (Lightning builder), 2 processes, 5 epochs: best val_accuracy {line.group(3)}, "
          f"{line.group(4)} img/s")
    assert float(line.group(3)) >= LEARNED
    status = json.loads((state / "runs/quickstart-team-cnn-lightning/status.json").read_text())
    assert status["modelUri"].endswith("/runs/quickstart-team-cnn-lightning/model/model.pt")


def test_a_torch_builder_with_a_wrong_output_fails_every_rank_before_training(s3_server, dataset, tmp_path, mpirun,
                                                                             lightning_python):
    package = team_package(tmp_path, "wrongnets", "nets",
                           "from torch import nn\n"
                           "def build(input_shape, num_classes):\n"  # forgets to pool: (batch, classes, H, W)
                           "    return nn.Conv2d(input_shape[2], num_classes, 1)\n")
    run = f"s3://{BUCKET}/runs/wrong-torch-builder"
    config = write_config(tmp_path / "config.json", s3_server, dataset, run)
    document = json.loads(config.read_text())
    document["model"] = {"builder": "wrongnets.nets:build"}
    document["image"] = "team/custom-model:test-lightning"
    config.write_text(json.dumps(document))
    result = subprocess.run(command([*mpirun, "-x", "PYTHONPATH"], lightning_python, config), capture_output=True,
                            text=True, timeout=300,
                            env={**os.environ, **s3_server.env(), "PYTHONPATH": str(package)})
    assert result.returncode != 0
    expected = ("BuilderError: spec.model.builder 'wrongnets.nets:build' in image team/custom-model:test-lightning: "
                "the network returned shape (2, 10, 32, 32) for a batch of 2 NCHW images; it must return logits of "
                "shape (batch, num_classes) = (2, 10)")
    for rank in (0, 1):
        assert f"(pytorch-lightning, rank {rank}/2): error: {expected}" in result.stderr, result.stderr[-3000:]
    progress = read_json(s3_server, f"{run}/progress.json")
    assert progress["state"] == "failed" and progress["error"] == expected and progress["epoch"] == 0
    assert progress["modelUri"] is None


READ_TABLE = """
import hashlib, json, sys
from scalingrun_trainer.core.dataset import open_dataset
from scalingrun_trainer.frameworks.lightning.data import TrainBatches, ValidationBatches

dataset = open_dataset(sys.argv[1])
train = TrainBatches(dataset, rank=0, size=1, batch_size=8, steps=2, seed=0, shuffle_rows=16)
try:
    trained = [(str(x.dtype), tuple(x.shape), str(y.dtype)) for x, y in train]
finally:
    train.close()
validation = ValidationBatches(dataset, rank=0, size=1, batch_size=8, seed=0)
rows = sorted([hashlib.sha1(image.numpy().tobytes()).hexdigest(), int(label)]
              for x, y in validation for image, label in zip(x, y))
print(json.dumps({"train": trained, "validation": rows}))
"""


@pytest.mark.parametrize("image_type", [pa.binary(), pa.binary(SIDE * SIDE * 3)], ids=["binary", "fixed-size"])
def test_the_lightning_reader_reads_a_pyarrow_tables_own_columns(tmp_path, lightning_python, image_type):
    root = write_table(tmp_path / "table", image_type=image_type, label_type=pa.int8())  # columns pixels and y
    write_manifest(table_params(root, tmp_path), inspect_table(table_params(root, tmp_path)))
    result = subprocess.run([lightning_python, "-c", READ_TABLE, str(tmp_path / "out")], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    read = json.loads(result.stdout.strip().splitlines()[-1])
    assert read["train"] == [["torch.uint8", [8, SIDE, SIDE, 3], "torch.int64"]] * 2
    validation = pq.read_table(root / "validation")
    images, labels = validation.column("pixels").to_pylist(), validation.column("y").to_pylist()
    expected = sorted([hashlib.sha1(image).hexdigest(), label] for image, label in zip(images, labels))
    assert read["validation"] == expected
