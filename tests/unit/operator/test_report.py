"""`scalingrun report`: curves and a Markdown page from a progress document."""

from __future__ import annotations

import datetime as dt
import json

import yaml
from PIL import Image

from scalingrun_operator.cli import main
from scalingrun_operator.report.run import workers_over_time

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


def _stamp(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_an_elastic_run_read_from_the_cluster_gets_its_workers_over_time(tmp_path, capsys):
    """`kubectl get scalingrun spot -o yaml` as the -f file: its status draws the worker count over time."""
    start = dt.datetime(2026, 11, 25, 10, 0, tzinfo=dt.timezone.utc)
    minutes = {"shrinkLost": 60, "shrunk": 65, "growSeen": 100, "grown": 103, "end": 130}
    at = {key: start + dt.timedelta(minutes=value) for key, value in minutes.items()}
    seconds = {4: (minutes["shrunk"] + minutes["end"] - minutes["grown"]) * 60,
               2: (minutes["grown"] - minutes["shrunk"]) * 60}
    gpus = 8
    resizes = [{"from": 4, "to": 2, "cause": "workersUnplaced: 2 unplaced | for 300 s", "lostAt": _stamp(at["shrinkLost"]),
                "trainingAt": _stamp(at["shrunk"]), "costSeconds": 300},
               {"from": 2, "to": 4, "cause": "capacityReturned", "lostAt": _stamp(at["growSeen"]),
                "trainingAt": _stamp(at["grown"]), "costSeconds": 180}]
    sizes = [{"workers": w, "seconds": s, "workerHours": round(w * s / 3600, 4),
              "gpuHours": round(w * gpus * s / 3600, 4)} for w, s in seconds.items()]
    output = tmp_path / "data"
    (output / "runs" / "spot").mkdir(parents=True)
    (output / "runs" / "spot" / "progress.json").write_text(json.dumps(PROGRESS))
    run = {"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun",
           "metadata": {"name": "spot", "resourceVersion": "9"},
           "spec": {"dataset": {"source": str(tmp_path / "raw"), "output": str(output)},
                    "workers": {"replicas": 4, "minReplicas": 2, "gpusPerWorker": gpus}},
           "status": {"phase": "Succeeded", "completionTime": _stamp(at["end"]), "training": {"elastic": {
               "workers": 4, "startedAt": _stamp(start), "resizes": resizes, "sizes": sizes}}}}
    path = tmp_path / "spot.yaml"
    path.write_text(yaml.safe_dump(run))
    assert main(["report", "-f", str(path), "-o", str(tmp_path / "out")]) == 0
    with Image.open(tmp_path / "out/spot-report.png") as image:
        assert image.size[0] > 1500  # a third panel: the workers over time
    page = (tmp_path / "out/spot-report.md").read_text()
    assert "## Workers over time (elastic)" in page
    for workers, spent in seconds.items():
        assert (f"| {workers} | {spent / 3600:.2f} | {workers * spent / 3600:.2f} | "
                f"{workers * gpus * spent / 3600:.2f} |") in page
    assert (f"| 4 -> 2 | workersUnplaced: 2 unplaced / for 300 s | {_stamp(at['shrinkLost'])} | "
            f"{_stamp(at['shrunk'])} | 300 |") in page
    del run["status"]  # a run file without status: the curves alone
    path.write_text(yaml.safe_dump(run))
    assert main(["report", "-f", str(path), "-o", str(tmp_path / "plain")]) == 0
    assert "Workers over time" not in (tmp_path / "plain/spot-report.md").read_text()


def test_the_steps_follow_the_resizes_and_end_at_the_run_end():
    start = dt.datetime(2026, 11, 25, 10, 0, tzinfo=dt.timezone.utc)
    trained = start + dt.timedelta(minutes=65)
    elastic = {"startedAt": _stamp(start), "counting": {"workers": 2, "since": _stamp(trained)},
               "resizes": [{"from": 4, "to": 2, "cause": "c", "lostAt": _stamp(start + dt.timedelta(minutes=60)),
                            "trainingAt": _stamp(trained)}]}
    now = trained + dt.timedelta(minutes=30)
    view = workers_over_time({"phase": "Training", "training": {"elastic": elastic}}, 1, now)
    assert view.steps == [(start, 4), (trained, 2), (now, 2)]
    assert [(s.workers, s.seconds) for s in view.sizes] == [(2, (now - trained).total_seconds())]
    ended = trained + dt.timedelta(minutes=10)
    view = workers_over_time({"phase": "Failed", "completionTime": _stamp(ended), "training": {"elastic": elastic}},
                             1, now)
    assert view.steps[-1] == (ended, 2) and view.sizes[0].seconds == (ended - trained).total_seconds()
    assert workers_over_time({"training": {}}, 1, now) is None
