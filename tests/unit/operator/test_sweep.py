"""ScalingSweep, pure parts: validation, the points' ScalingRuns, which point starts when, the table
(speedup, efficiency, worker-hours), the recommendation, the CRD and the report."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from PIL import Image

from scalingrun_operator.schema.crd import build_sweep_crd, render_chart_sweep_crd_template, render_sweep_crd_yaml
from scalingrun_operator.schema.validation import InvalidScalingRun, parse_scalingrun, parse_scalingsweep
from scalingrun_operator.schema.sweep import SWEEP_LABEL, Point, build_point_run, sweep_points
from scalingrun_operator.builders.config import total_processes
from scalingrun_operator.cli import main
from scalingrun_operator.decide import preprocessing as dataset
from scalingrun_operator.decide.sweep import (
    add_scaling, point_row, points_to_start, progress_text, recommend, sweep_phase,
)
from scalingrun_operator.local.sweep import oversubscribed_note
from scalingrun_operator.report.sweep import render_sweep_report
from scalingrun_operator.documents import parse_progress

ROOT = Path(__file__).resolve().parents[3]

SWEEP = {
    "apiVersion": "scalingrun.dev/v1alpha1",
    "kind": "ScalingSweep",
    "metadata": {"name": "demo"},
    "spec": {
        "workers": [1, 2, 4],
        "template": {
            "storage": {"credentialsSecret": "s3-creds"},
            "dataset": {"source": "s3://bucket/raw", "output": "s3://bucket/parquet"},
            "training": {"baseLearningRate": 0.001, "learningRateScaling": "linear"},
            "workers": {"replicas": 7, "gpusPerWorker": 1},
        },
    },
}


def sweep(**spec):
    doc = copy.deepcopy(SWEEP)
    doc["spec"].update(spec)
    return parse_scalingsweep(doc)


# --- validation and the points ---------------------------------------------------------------------


def test_defaults():
    s = sweep()
    assert (s.spec.max_parallel, s.spec.efficiency_threshold, s.spec.accuracy_tolerance) == (1, 0.7, 0.01)


@pytest.mark.parametrize("change, field, words", [
    ({"workers": [1, 2, 2]}, "spec.workers", "unique; repeated: [2]"),
    ({"workers": []}, "spec.workers", "at least 1"),
    ({"workers": [0, 1]}, "spec.workers[0]", "greater than or equal to 1"),
    ({"gpusPerWorker": [1]}, "spec.gpusPerWorker", "one entry per point: 3"),
    ({"maxParallel": 0}, "spec.maxParallel", "greater than or equal to 1"),
    ({"efficiencyThreshold": 1.5}, "spec.efficiencyThreshold", "less than or equal to 1"),
    ({"typo": 1}, "spec.typo", "unknown field"),
])
def test_bad_sweeps_name_the_field(change, field, words):
    with pytest.raises(InvalidScalingRun) as caught:
        sweep(**change)
    assert any(e.path == field and words in e.message for e in caught.value.errors), caught.value.errors


def test_template_errors_are_named_under_spec_template_once():
    doc = copy.deepcopy(SWEEP)
    doc["spec"]["template"]["dataset"]["output"] = "s3://bucket/raw/out"
    doc["spec"]["template"]["training"]["batchSizePerWorker"] = 0
    with pytest.raises(InvalidScalingRun) as caught:
        parse_scalingsweep(doc)
    paths = [e.path for e in caught.value.errors]
    assert paths == ["spec.template.training.batchSizePerWorker"]  # schema errors first, once for all points
    doc["spec"]["template"]["training"]["batchSizePerWorker"] = 8
    with pytest.raises(InvalidScalingRun) as caught:
        parse_scalingsweep(doc)
    assert [e.path for e in caught.value.errors] == ["spec.template.dataset.output"]


def test_sweep_name_must_leave_room_for_the_point_names():
    doc = copy.deepcopy(SWEEP)
    doc["metadata"]["name"] = "a" * 38
    with pytest.raises(InvalidScalingRun) as caught:
        parse_scalingsweep(doc)
    assert [e.path for e in caught.value.errors] == ["metadata.name"]
    assert "a" * 38 + "-w1" in caught.value.errors[0].message


def test_points_are_children_with_their_worker_count_and_one_dataset():
    s = sweep(gpusPerWorker=[1, 2, 2])
    points = sweep_points(s)
    assert [(p.name, p.workers, p.gpus_per_worker, p.processes) for p in points] == [
        ("demo-w1", 1, 1, 1), ("demo-w2", 2, 2, 4), ("demo-w4", 4, 2, 8)]
    runs = [parse_scalingrun(build_point_run(s, p, "ns")) for p in points]
    assert [r.spec.workers.replicas for r in runs] == [1, 2, 4]
    assert runs[0].metadata.namespace == "ns" and runs[0].metadata.model_extra["labels"][SWEEP_LABEL] == "demo"
    # The learning-rate rule stays the template's; the trainer scales it by each point's processes.
    assert {(r.spec.training.base_learning_rate, r.spec.training.learning_rate_scaling) for r in runs} == {
        (0.001, "linear")}
    # Every point describes the same dataset, laid out for the largest point: the first preprocesses, the rest reuse.
    assert len({str(dataset.dataset_parameters(r)) for r in runs}) == 1
    assert dataset.dataset_parameters(runs[0])["minRowGroupsPerSplit"] == 16
    # ... while each point keeps its own checkpoints and progress.
    s = sweep()
    s.spec.template.training.checkpoint.location = "s3://bucket/ckpt"
    assert [build_point_run(s, p)["spec"]["training"]["checkpoint"]["location"] for p in sweep_points(s)] == [
        "s3://bucket/ckpt/demo-w1", "s3://bucket/ckpt/demo-w2", "s3://bucket/ckpt/demo-w4"]


def test_multi_worker_mirrored_points_count_one_process_per_pod():
    """MultiWorkerMirroredStrategy runs one process per worker pod that drives all of its GPUs: a point's processes
    (and so its workerHours, speedup and dataset layout) are its pods, as the MPIJob's slotsPerWorker says."""
    s = sweep(gpusPerWorker=[1, 2, 2])
    s.spec.template.training.strategy = "multi-worker-mirrored"
    points = sweep_points(s)
    assert [(p.workers, p.gpus_per_worker, p.processes) for p in points] == [(1, 1, 1), (2, 2, 2), (4, 2, 4)]
    runs = [parse_scalingrun(build_point_run(s, p, "ns")) for p in points]
    assert [total_processes(r) for r in runs] == [p.processes for p in points]
    assert runs[0].spec.dataset.preprocessing.readers == 4


def test_a_plain_run_keeps_its_own_dataset_layout():
    run = parse_scalingrun(build_point_run(sweep(), sweep_points(sweep())[0]))
    run.spec.dataset.preprocessing.readers = None
    run.spec.workers.replicas = 3
    assert dataset.dataset_parameters(run)["minRowGroupsPerSplit"] == 6


# --- which point starts when -----------------------------------------------------------------------

POINTS = [Point("demo-w1", 1, 1, 1), Point("demo-w2", 2, 1, 1), Point("demo-w4", 4, 1, 1)]


def child(phase, preprocessed=True, message=None):
    conditions = [{"type": "Preprocessed", "status": "True" if preprocessed else "Unknown"}]
    return {"status": {"phase": phase, "conditions": conditions, "message": message}}


def names(points):
    return [p.name for p in points]


def test_first_point_alone_until_its_dataset_is_there():
    assert names(points_to_start(POINTS, {}, 1)) == ["demo-w1"]
    assert names(points_to_start(POINTS, {"demo-w1": child("Preprocessing", False)}, 3)) == []


def test_points_one_after_another():
    assert names(points_to_start(POINTS, {"demo-w1": child("Training")}, 1)) == []
    assert names(points_to_start(POINTS, {"demo-w1": child("Succeeded")}, 1)) == ["demo-w2"]
    done = {"demo-w1": child("Succeeded"), "demo-w2": child("Training")}
    assert names(points_to_start(POINTS, done, 1)) == []
    done["demo-w2"] = child("Succeeded")
    assert names(points_to_start(POINTS, done, 1)) == ["demo-w4"]
    done["demo-w4"] = child("Pending", False)
    assert names(points_to_start(POINTS, done, 1)) == []


def test_max_parallel_allows_more_once_preprocessed():
    assert names(points_to_start(POINTS, {"demo-w1": child("Training")}, 2)) == ["demo-w2"]
    assert names(points_to_start(POINTS, {"demo-w1": child("Training")}, 3)) == ["demo-w2", "demo-w4"]


def test_a_failed_point_stops_the_sweep():
    children = {"demo-w1": child("Succeeded"), "demo-w2": child("Failed", message="MPIJobFailed: OOMKilled")}
    assert points_to_start(POINTS, children, 1) == []
    phase, message = sweep_phase(POINTS, children)
    assert phase == "Failed" and "point demo-w2 (2 workers) failed: MPIJobFailed: OOMKilled" in message
    assert progress_text(POINTS, children) == "2/3"


def test_sweep_phase():
    assert sweep_phase(POINTS, {})[0] == "Pending"
    assert sweep_phase(POINTS, {"demo-w1": child("Training")}) == ("Running", "running: demo-w1 (Training)")
    assert sweep_phase(POINTS, {p.name: child("Succeeded") for p in POINTS})[0] == "Succeeded"


# --- the table and the recommendation --------------------------------------------------------------


def progress(epochs, seconds, accuracy, loss=0.5, speeds=(100.0, 200.0, 210.0)):
    return {"state": "succeeded", "epoch": epochs, "elapsedSeconds": seconds, "history": [
        {"epoch": i + 1, "imagesPerSecond": s} for i, s in enumerate(speeds)]}


def training(accuracy, loss=0.5, batch=32, lr=0.001):
    return {"effectiveBatchSize": batch, "learningRate": lr, "epoch": 3, "imagesPerSecond": 99.0,
            "bestMetrics": {"val_accuracy": accuracy, "val_loss": loss}}


def table(measured):
    """measured: (point, epochs, wall seconds, best val_accuracy) per point."""
    rows = [point_row(p, "Succeeded", training(acc), parse_progress(progress(epochs, wall, acc)))
            for p, epochs, wall, acc in measured]
    return add_scaling(rows)


def test_rows_speedup_efficiency_and_worker_hours():
    rows = table([(POINTS[0], 10, 1000.0, 0.90), (POINTS[1], 10, 550.0, 0.895), (POINTS[2], 8, 320.0, 0.89)])
    assert [r["secondsPerEpoch"] for r in rows] == [100.0, 55.0, 40.0]
    assert [r["speedup"] for r in rows] == [1.0, 1.818, 2.5]  # per epoch: the 4-worker point stopped earlier
    assert [r["efficiency"] for r in rows] == [1.0, 0.909, 0.625]
    assert [r["workerHours"] for r in rows] == [round(1000 / 3600, 4), round(2 * 550 / 3600, 4),
                                               round(4 * 320 / 3600, 4)]
    assert rows[0]["imagesPerSecond"] == 200.0  # median of the epochs
    assert (rows[1]["workers"], rows[1]["processes"], rows[1]["epochs"], rows[1]["bestValAccuracy"]) == (2, 2, 10, 0.895)
    assert rows[1]["effectiveBatchSize"] == 32 and rows[1]["wallSeconds"] == 550.0


def test_running_point_has_no_speedup_yet():
    rows = add_scaling([point_row(POINTS[0], "Succeeded", training(0.9), parse_progress(progress(10, 1000.0, 0.9))),
                        point_row(POINTS[1], "Training", {"epoch": 2}, None), point_row(POINTS[2], None, None, None)])
    assert "speedup" not in rows[1] and rows[1]["epochs"] == 2 and rows[2] == {
        "run": "demo-w4", "workers": 4, "gpusPerWorker": 1, "processes": 4}


def test_recommendation_is_the_largest_efficient_and_accurate_point():
    rows = table([(POINTS[0], 10, 1000.0, 0.90), (POINTS[1], 10, 550.0, 0.895), (POINTS[2], 8, 320.0, 0.89)])
    pick = recommend(rows, 0.7, 0.01)
    assert (pick["run"], pick["workers"], pick["processes"]) == ("demo-w2", 2, 2)
    assert "not larger: 4 workers: efficiency 0.62 < 0.7" in pick["message"]
    assert recommend(rows, 0.6, 0.01)["workers"] == 4
    # accuracy outside the tolerance disqualifies even an efficient point
    assert recommend(rows, 0.6, 0.005)["workers"] == 2
    assert "more than 0.005 below the best 0.9000" in recommend(rows, 0.6, 0.005)["message"]
    assert recommend(rows[:1], 0.7, 0.01)["workers"] == 1
    assert recommend([], 0.7, 0.01) is None


# --- CRD, CLI, report ------------------------------------------------------------------------------


def test_sweep_crd_is_generated_and_checked_in():
    assert (ROOT / "manifests/crd/scalingrun.dev_scalingsweeps.yaml").read_text() == render_sweep_crd_yaml()
    assert (ROOT / "charts/scalingrun/templates/crd-scalingsweep.yaml").read_text() == render_chart_sweep_crd_template()
    assert "scalingrun.dev_scalingsweeps.yaml" in (ROOT / "manifests/crd/kustomization.yaml").read_text()
    crd = build_sweep_crd()
    names_ = crd["spec"]["names"]
    assert (crd["metadata"]["name"], names_["kind"], names_["plural"], names_["shortNames"]) == (
        "scalingsweeps.scalingrun.dev", "ScalingSweep", "scalingsweeps", ["ssweep"])
    version = crd["spec"]["versions"][0]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Phase", "Points", "Recommended-Workers", "Age"]
    assert version["subresources"] == {"status": {}}
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["required"] == ["template", "workers"]
    assert spec["properties"]["workers"]["items"]["minimum"] == 1
    assert spec["properties"]["maxParallel"]["default"] == 1
    assert spec["properties"]["template"]["properties"]["training"]["default"] == {}
    points = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["points"]["items"]
    assert {"speedup", "efficiency", "workerHours", "wallSeconds", "bestValAccuracy"} <= set(points["properties"])


def test_crd_command_prints_both_crds(capsys):
    assert main(["crd"]) == 0
    kinds = [d["spec"]["names"]["kind"] for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert kinds == ["ScalingRun", "ScalingSweep"]


def test_validate_and_render_accept_sweeps(tmp_path, capsys):
    assert main(["validate", "-f", str(ROOT / "examples/sweep.yaml")]) == 0
    assert "ScalingSweep flowers-sweep is valid" in capsys.readouterr().out
    assert main(["render", "-f", str(ROOT / "examples/sweep.yaml"), "-n", "ml"]) == 0
    runs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [(r["kind"], r["metadata"]["name"], r["spec"]["workers"]["replicas"]) for r in runs] == [
        ("ScalingRun", f"flowers-sweep-w{n}", n) for n in (1, 2, 4, 8)]
    bad = copy.deepcopy(SWEEP)
    bad["spec"]["workers"] = [2, 2]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    assert main(["validate", "-f", str(path)]) == 1
    err = capsys.readouterr().err
    assert "ScalingSweep demo is invalid" in err and "spec.workers: worker counts must be unique" in err


def test_report_png_and_markdown(tmp_path):
    rows = table([(POINTS[0], 10, 1000.0, 0.90), (POINTS[1], 10, 550.0, 0.895), (POINTS[2], 8, 320.0, 0.89)])
    png, md = render_sweep_report(rows, "demo", tmp_path, recommend(rows, 0.7, 0.01), 0.7,
                                  note=oversubscribed_note(4, 2))
    with Image.open(png) as image:
        image.verify()
    page = md.read_text()
    assert "Recommendation: **2 workers** (demo-w2)" in page and "4 processes on 2 CPU cores" in page
    assert "| workers | processes | effective batch |" in page
    assert "| 2 | 2 | 32 | 0.001 | 10 | 0.8950 | 0.5000 | 550 | 55.0 | 200 | 1.82 | 0.91 | 0.306 |" in page


def test_report_command_reads_the_points_progress_documents(tmp_path, capsys):
    doc = copy.deepcopy(SWEEP)
    doc["spec"]["workers"] = [1, 2]
    doc["spec"]["template"]["dataset"] = {"source": str(tmp_path / "raw"), "output": str(tmp_path / "out")}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    for workers, seconds, accuracy in ((1, 100.0, 0.9), (2, 80.0, 0.9)):
        folder = tmp_path / "out" / "runs" / f"demo-w{workers}"
        folder.mkdir(parents=True)
        document = {**progress(5, seconds, accuracy), "bestMetrics": {"val_accuracy": accuracy, "val_loss": 0.3},
                    "processes": workers}
        (folder / "progress.json").write_text(__import__("json").dumps(document))
    assert main(["report", "-f", str(path), "-o", str(tmp_path / "report")]) == 0
    out = capsys.readouterr().out
    assert "report: " + str(tmp_path / "report" / "demo-sweep.png") in out
    page = (tmp_path / "report" / "demo-sweep.md").read_text()
    # 20 s and 16 s per epoch: speedup 1.25 on 2 processes, efficiency 0.62 < 0.7: the first point is recommended
    assert "| 2 | 2 | - | - | 5 | 0.9000 | 0.3000 | 80 | 16.0 | 200 | 1.25 | 0.62 | 0.044 |" in page
    assert "Recommendation: **1 worker** (demo-w1)" in page


def test_a_resized_point_refuses_to_mix_sizes_in_the_table():
    """A sweep's template cannot be elastic; a point run found under its name and adopted could be. Its row keeps
    the point's own figures but no time or throughput: no speedup, never the recommendation."""
    resized = {**training(0.95), "elastic": {"workers": 2, "resizes": [{"from": 4, "to": 2, "cause": "c"}]}}
    rows = add_scaling([point_row(POINTS[0], "Succeeded", training(0.90), parse_progress(progress(10, 1000.0, 0.9))),
                        point_row(POINTS[2], "Succeeded", resized, parse_progress(progress(10, 250.0, 0.95)))])
    assert rows[1]["resized"] is True and rows[1]["bestValAccuracy"] == 0.95
    assert not {"imagesPerSecond", "wallSeconds", "secondsPerEpoch", "workerHours", "speedup"} & set(rows[1])
    assert recommend(rows, 0.1, 1.0)["run"] == POINTS[0].name
    same = {**training(0.95), "elastic": {"workers": 4, "sizes": [{"workers": 4, "seconds": 250, "workerHours": 0.3}]}}
    assert "speedup" in add_scaling([rows[0], point_row(POINTS[2], "Succeeded", same,
                                                        parse_progress(progress(10, 250.0, 0.95)))])[1]
