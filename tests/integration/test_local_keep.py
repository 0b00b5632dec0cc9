"""The local quick start keeps what it made: the progress document and the model are copied out of its SeaweedFS
(a real one) before the store stops, and `scalingrun report -f` draws from the copy once the store is gone.
tests/horovod/test_quickstart.py checks the same through a whole reduced quick start."""

from __future__ import annotations

import json
import socket

import pytest
import yaml

from scalingrun_operator.cli import main
from scalingrun_operator.local.keep import keep, kept_progress

pytestmark = pytest.mark.s3

BUCKET = "keep"
HISTORY = [{"epoch": 1, "loss": 0.9, "accuracy": 0.6, "val_loss": 0.8, "val_accuracy": 0.7, "imagesPerSecond": 50.0},
           {"epoch": 2, "loss": 0.5, "accuracy": 0.8, "val_loss": 0.6, "val_accuracy": 0.8, "imagesPerSecond": 52.0}]


def _progress(model_uri: str) -> dict:
    return {"state": "succeeded", "epoch": 2, "maxEpochs": 2, "bestEpoch": 2, "processes": 2, "effectiveBatchSize": 32,
            "learningRate": 0.002, "elapsedSeconds": 10.0, "bestMetrics": {"val_accuracy": 0.8, "val_loss": 0.6},
            "modelUri": model_uri, "history": HISTORY}


def test_the_progress_document_and_the_model_are_copied_out_of_the_store(s3_server, tmp_path):
    s3_server.create_bucket(BUCKET)
    store = s3_server.filesystem()
    run = f"s3://{BUCKET}/runs/demo"
    document = json.dumps(_progress(f"{run}/model/model.keras")).encode()
    for key, data in ((f"{run}/progress.json", document), (f"{run}/model/model.keras", b"weights" * 1000)):
        with store.open_output_stream(key[len("s3://"):]) as stream:
            stream.write(data)

    kept = keep(f"{run}/progress.json", tmp_path / "demo", store)
    assert kept.progress == tmp_path / "demo" / "progress.json" and kept.progress.read_bytes() == document
    assert kept.model == tmp_path / "demo" / "model" / "model.keras"
    assert kept.model.read_bytes() == b"weights" * 1000
    assert kept_progress("demo", workdir=tmp_path / "demo") == kept.progress
    # Nothing there (a run stopped before training): nothing kept, nothing made.
    assert keep(f"s3://{BUCKET}/runs/none/progress.json", tmp_path / "none", store).progress is None
    assert not (tmp_path / "none").exists()


def test_report_draws_from_the_kept_copy_once_the_store_is_gone(tmp_path, capsys):
    with socket.socket() as probe:  # a port nothing listens on: the store has stopped
        probe.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{probe.getsockname()[1]}"
    run_file = tmp_path / "quickstart.yaml"
    run_file.write_text(yaml.safe_dump({
        "apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun", "metadata": {"name": "quickstart"},
        "spec": {"storage": {"endpoint": endpoint, "credentialsSecret": "s3"},
                 "dataset": {"source": "s3://quickstart/raw", "output": "s3://quickstart/parquet"}}}))
    arguments = ["report", "-f", str(run_file), "--workdir", str(tmp_path / "work"), "-o", str(tmp_path / "out")]
    assert main(arguments) == 1, "no copy: the store's error"
    assert "cannot read s3://quickstart/parquet/runs/quickstart/progress.json" in capsys.readouterr().err

    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "progress.json").write_text(json.dumps(_progress("s3://quickstart/model.keras")))
    assert main(arguments) == 0
    err = capsys.readouterr().err
    assert f"drawing from {tmp_path / 'work' / 'progress.json'}, which the local run kept" in err
    assert "| 2 **best** |" in (tmp_path / "out" / "quickstart-report.md").read_text()
