"""dataset.format parquet with real processes: a table written with pyarrow directly (not our preprocessing) in a
real S3 server trains through `scalingrun run --local`; a table without its label column fails before any training
process starts, naming the column."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from scalingrun_operator.local.sample_data import fashion_mnist

pytestmark = [pytest.mark.horovod, pytest.mark.s3]
ROOT = Path(__file__).resolve().parents[2]
BUCKET = "teamtable"
SIDE = 32


@pytest.fixture(scope="module")
def tables(s3_server) -> dict[str, str]:
    """Fashion-MNIST written the way a team would, with pyarrow: columns `pixels` (S x S x 3 bytes) and `y`; and the
    same table with its label column named `target` instead."""
    from PIL import Image

    s3_server.create_bucket(BUCKET)
    fs = s3_server.filesystem()
    images, labels = fashion_mnist()
    pixels = [np.asarray(Image.fromarray(255 - image).resize((SIDE, SIDE)).convert("RGB"), np.uint8).tobytes()
              for image in images[:600]]
    for name, label in (("good", "y"), ("no-label", "target")):
        for split, rows in (("train", slice(0, 500)), ("validation", slice(500, 600))):
            table = pa.table({"pixels": pa.array(pixels[rows], pa.binary()),
                              label: pa.array(labels[rows].astype(np.int64)), "id": np.arange(600)[rows]})
            with fs.open_output_stream(f"{BUCKET}/{name}/{split}/part-00000.parquet") as stream:
                pq.write_table(table, stream, row_group_size=25)
    return {name: f"s3://{BUCKET}/{name}" for name in ("good", "no-label")}


def run_local(s3_server, tmp_path: Path, source: str, name: str) -> tuple[subprocess.CompletedProcess, dict]:
    spec = {"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun", "metadata": {"name": name},
            "spec": {"storage": {"endpoint": s3_server.endpoint, "credentialsSecret": "unused-locally"},
                     "dataset": {"format": "parquet", "source": source, "output": f"s3://{BUCKET}/prepared/{name}",
                                 "imageSize": SIDE, "columns": {"image": "pixels", "label": "y"}},
                     "model": {"builder": "teamnets.keras_cnn:build", "params": {"width": 16}},
                     "training": {"batchSizePerWorker": 32, "maxEpochs": 2},
                     "workers": {"replicas": 2, "gpusPerWorker": 0}}}
    run_file = tmp_path / f"{name}.yaml"
    run_file.write_text(yaml.safe_dump(spec))
    workdir = tmp_path / "work"
    result = subprocess.run([sys.executable, "-m", "scalingrun_operator.cli", "run", "--local", "-f", str(run_file),
                             "--workdir", str(workdir), "--python-path", str(ROOT / "examples/custom-model")],
                            capture_output=True, text=True, timeout=600,
                            env={**os.environ, **s3_server.env(), "TF_CPP_MIN_LOG_LEVEL": "2"})
    return result, json.loads((workdir / "status.json").read_text())


def test_a_table_written_with_pyarrow_trains(s3_server, tables, tmp_path):
    result, status = run_local(s3_server, tmp_path, tables["good"], "pyarrow-table")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert status["phase"] == "Succeeded"
    preprocessed = next(c for c in status["conditions"] if c["type"] == "Preprocessed")
    assert preprocessed["status"] == "True" and preprocessed["message"].startswith(
        f"Job pyarrow-table-preprocess: Parquet table at {tables['good']} checked: 600 images (500 train, 100 "
        "validation) in 10 classes, row groups 20 train / 4 validation")
    assert status["preprocessing"]["imagesWritten"] == 600 and status["preprocessing"]["classes"] == 10
    assert status["training"]["epoch"] == 2 and status["training"]["processes"] == 2
    assert "500 train / 100 validation rows, 10 classes" in result.stdout
    assert status["modelUri"] == f"s3://{BUCKET}/prepared/pyarrow-table/runs/pyarrow-table/model/model.keras"
    # Nothing was copied: the trainer read the team's own files.
    fs = s3_server.filesystem()
    from pyarrow import fs as pafs

    written = fs.get_file_info(pafs.FileSelector(f"{BUCKET}/prepared/pyarrow-table", recursive=True))
    assert not [i.path for i in written if i.path.endswith(".parquet")]


def test_a_table_without_its_label_column_fails_before_training_naming_it(s3_server, tables, tmp_path):
    result, status = run_local(s3_server, tmp_path, tables["no-label"], "no-label-table")
    assert result.returncode != 0
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "ParquetTableInvalid"
    assert (f"the Parquet table at {tables['no-label']} does not fit this run: spec.dataset.columns.label: column "
            f"'y' is not in {tables['no-label']}/train/part-00000.parquet (its columns: pixels, target, id)") \
        in failed["message"]
    assert "training" not in status and "training: " not in result.stderr  # no training process was started
