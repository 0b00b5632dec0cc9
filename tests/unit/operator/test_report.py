"""`scalingrun report`: curves and a Markdown page from a progress document."""

from __future__ import annotations

import json

from PIL import Image

from scalingrun_operator.cli import main

PROGRESS = {
    "state": "succeeded", "epoch": 3, "maxEpochs": 5, "bestEpoch": 2, "processes": 2, "effectiveBatchSize": 64,
    "learningRate": 0.002, "elapsedSeconds": 12.5, "modelUri": "s3://b/run/model/model.keras",
    "bestMetrics": {"loss": 0.5, "accuracy": 0.8, "val_loss": 0.6, "val_accuracy": 0.78},
    "history": [
        {"epoch": 1, "loss": 0.9, "accuracy": 0.6, "val_loss": 0.8, "val_accuracy": 0.7, "imagesPerSecond": 100.0},
        {"epoch": 2, "loss": 0.5, "accuracy": 0.8, "val_loss": 0.6, "val_accuracy": 0.78, "imagesPerSecond": 300.0},
        {"epoch": 3, "loss": 0.4, "accuracy": 0.85, "val_loss": 0.7, "val_accuracy": 0.76, "imagesPerSecond": 310.0},
    ],
}


def test_report_from_a_progress_file(tmp_path, capsys):
    path = tmp_path / "progress.json"
    path.write_text(json.dumps(PROGRESS))
    assert main(["report", "--progress", str(path), "--name", "demo", "-o", str(tmp_path / "out")]) == 0
    assert "demo-report.png" in capsys.readouterr().out
    with Image.open(tmp_path / "out/demo-report.png") as image:
        image.verify()
    page = (tmp_path / "out/demo-report.md").read_text()
    assert "after 3 of 5 epochs (early stopping)" in page and "validation accuracy **0.7800**" in page
    assert "| 2 **best** | 0.5000 | 0.8000 | 0.6000 | 0.7800 | 300 |" in page


def test_report_shows_the_probe_and_the_input_wait(tmp_path, capsys):
    progress = {**PROGRESS, "batchSizePerWorker": 16, "inputHistory": [
        {"epoch": 2, "inputWaitFraction": 0.45, "gpuUtilization": 38.0}, {"epoch": 3, "inputWaitFraction": 0.05}],
        "batchSizeProbe": {"chosen": 16, "seconds": 4.2, "stoppedBy": "outOfMemory", "table": [
            {"batchSize": 8, "imagesPerSecond": 90.0}, {"batchSize": 16, "imagesPerSecond": 170.0},
            {"batchSize": 32, "outOfMemory": True}]}}
    path = tmp_path / "progress.json"
    path.write_text(json.dumps(progress))
    assert main(["report", "--progress", str(path), "--name", "auto", "-o", str(tmp_path / "out")]) == 0
    with Image.open(tmp_path / "out/auto-report.png") as image:
        assert image.size[0] > 1500  # a third panel: the probe
    page = (tmp_path / "out/auto-report.md").read_text()
    assert "| epoch | loss | accuracy | val_loss | val_accuracy | imagesPerSecond | input wait | GPU % |" in page
    assert "| 1 | 0.9000 | 0.6000 | 0.8000 | 0.7000 | 100 |  |  |" in page
    assert "| 2 **best** | 0.5000 | 0.8000 | 0.6000 | 0.7800 | 300 | 45% | 38 |" in page
    assert "| 3 | 0.4000 | 0.8500 | 0.7000 | 0.7600 | 310 | 5% |  |" in page
    assert "Chosen: **16** per process" in page and "the probe took 4.2 s and stopped at out-of-memory" in page
    assert "| 16 | 170 **chosen** |" in page and "| 32 | out of memory |" in page


def test_report_says_when_there_is_no_progress(tmp_path, capsys):
    assert main(["report", "--progress", str(tmp_path / "missing.json")]) == 1
    assert "no progress document" in capsys.readouterr().err
    assert main(["report"]) == 2
