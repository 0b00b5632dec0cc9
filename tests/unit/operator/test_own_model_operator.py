"""The operator's side of "your own model": the MPIJob of a training.command, the check Job of a Parquet table,
and decide on that check (what it made, what it said), all pure: rendered objects and decide on a world."""

from __future__ import annotations

import copy
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from scalingrun_operator.schema.validation import parse_scalingrun
from scalingrun_operator.builders import build_children, build_preprocess_job
from scalingrun_operator.builders.common import CONFIG_FILE
from scalingrun_operator.builders.config import build_trainer_config
from scalingrun_operator.decide.preprocessing import dataset_parameters
from scalingrun_trainer.cli import build_parser
from scalingrun_trainer.preprocess.parquet_table import TableParams
from tests.support.decide_world import NS, SPEC, World, actions, conditions, done, manifest, mpijob, owned, progress
from tests.support.decide_run import preprocess_pod, training

ROOT = Path(__file__).resolve().parents[3]
TABLE = {**SPEC["dataset"], "format": "parquet", "source": "s3://data/table", "columns": {"image": "px", "label": "y"}}
del TABLE["preprocessing"]


def load(path: str):
    return parse_scalingrun(yaml.safe_load((ROOT / path).read_text()))


def launcher_argv(run) -> list[str]:
    mpijob = build_children(run, "ml")[2]
    container = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    return shlex.split(container["command"][2])


def test_a_command_runs_on_every_rank_through_the_same_launcher():
    run = load("examples/custom-training/scalingrun.yaml")
    argv = launcher_argv(run)
    args = build_parser().parse_args(argv[2:])  # exec scalingrun-trainer launch ... -- mpirun ...
    mpirun = args.command_line[1:]
    assert mpirun[:3] == ["mpirun", "-np", "2"]
    assert mpirun[-3:] == ["python", "-m", "teamtrain.keras_horovod"]  # instead of scalingrun-trainer train
    assert "-x" in mpirun and mpirun[mpirun.index("SCALINGRUN_CONFIG") - 1] == "-x"
    assert mpirun.count("PYTHONPATH") == 1  # the image's package path travels to every rank
    mpijob = build_children(run, "ml")[2]
    for role in ("Launcher", "Worker"):
        container = mpijob["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]["containers"][0]
        assert {"name": "SCALINGRUN_CONFIG", "value": CONFIG_FILE} in container["env"]
        assert container["image"] == "team/custom-training:0.1.0"
    # The trainer's run is unchanged: no SDK variable, our trainer as the command.
    plain = load("examples/quickstart.yaml")
    assert launcher_argv(plain)[-4:] == ["scalingrun-trainer", "train", "--config", CONFIG_FILE]
    assert "SCALINGRUN_CONFIG" not in launcher_argv(plain)


def test_a_command_run_still_prepares_the_data_and_hands_the_config_over():
    run = load("examples/custom-training/scalingrun.yaml")
    config_map, job, _ = build_children(run, "ml")
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[5:7] == ["scalingrun-trainer", "preprocess"]  # after `scalingrun-trainer logged --logs URI --`
    config = build_trainer_config(run)
    assert config["training"]["command"] == ["python", "-m", "teamtrain.keras_horovod"]
    assert config["model"]["base"] is None and config["image"] == "team/custom-training:0.1.0"


def test_a_parquet_table_gets_one_check_pod_in_the_preprocessing_jobs_place():
    run = parse_scalingrun({"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun",
                            "metadata": {"name": "demo", "namespace": NS}, "spec": {**SPEC, "dataset": TABLE}})
    for indexed in (True, False):
        job = build_preprocess_job(run, NS, indexed=indexed)
        container = job["spec"]["template"]["spec"]["containers"][0]
        assert container["command"] == ["scalingrun-trainer", "logged", "--logs", "s3://data/parquet/runs/demo/logs/"
                                        "preprocess", "--", "scalingrun-trainer", "inspect", "--config", CONFIG_FILE]
        assert job["spec"]["completions"] == 1 and job["metadata"]["name"] == "demo-preprocess"
        assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    logged = build_parser().parse_args(container["command"][1:])  # the trainer's CLI takes it
    args = build_parser().parse_args(logged.command_line[2:])
    assert args.config == CONFIG_FILE
    # The parameters the operator expects in the manifest are the ones the check writes.
    table = TableParams(TABLE["source"], TABLE["output"], TABLE["imageSize"], "px", "y", readers=2)
    assert dataset_parameters(run) == table.dataset_parameters()


# --- decide on a Parquet table --------------------------------------------------------------------------


def parquet_world(**changes: Any) -> World:
    world = World(pinned=False, **changes)
    world.spec["dataset"] = copy.deepcopy(TABLE)
    return world


def check_job(run_spec: dict, *conditions_: dict, **status: Any) -> dict:
    run = parse_scalingrun({"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun",
                            "metadata": {"name": "demo", "namespace": NS}, "spec": run_spec})
    return owned(build_preprocess_job(run, NS), "job-uid", conditions=list(conditions_), **status)


def table_manifest(**changes: Any) -> dict:
    run = parse_scalingrun({"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun",
                            "metadata": {"name": "demo"}, "spec": {**SPEC, "dataset": TABLE}})
    return manifest(parameters=dataset_parameters(run), source=TABLE["source"], format="parquet",
                    rowGroups={"train": 4, "validation": 2}, skipped=0, shards=None, **changes)


def test_a_new_parquet_run_makes_the_check_job():
    decision = parquet_world().decide()
    assert actions(decision) == [("create", "ConfigMap"), ("create", "Job")]
    status, reason, message = conditions(decision)["Preprocessed"]
    assert (status, reason) == ("Unknown", "Running")
    assert message == "Job demo-preprocess checks the Parquet table at s3://data/table"
    assert decision.desired["preprocessing"]["shards"] == 1


def test_a_checked_table_is_preprocessed_with_its_warnings_and_training_starts():
    world = parquet_world(manifest=table_manifest(warnings=["validation has 2 row groups for 2 processes: ..."]))
    world.children = {"Job": check_job(world.spec, done("Complete"), succeeded=1)}
    decision = world.decide()
    assert ("create", "MPIJob") in actions(decision)
    status, reason, message = conditions(decision)["Preprocessed"]
    assert (status, reason) == ("True", "Preprocessed")
    assert message.startswith("Job demo-preprocess: Parquet table at s3://data/table checked: 45 images (40 train, "
                              "5 validation) in 3 classes, row groups 4 train / 2 validation")
    assert "warning: validation has 2 row groups" in message
    assert [e.reason for e in decision.events].count("TableWarning") == 1


def test_a_table_without_its_label_column_fails_before_any_mpijob_naming_it():
    said = ("spec.dataset.columns.label: column 'y' is not in s3://data/table/train/part-0.parquet (its columns: "
            "px, target); name the label column in spec.dataset.columns.label")
    world = parquet_world(pods=[preprocess_pod(phase="Failed", containers=[{"name": "preprocess", "restartCount": 0,
                                                                             "state": {"terminated": {
                                                                                 "exitCode": 5, "reason": "Error",
                                                                                 "message": said}}}])])
    world.children = {"Job": check_job(world.spec, done("Failed", "BackoffLimitExceeded",
                                                        "Job has reached the specified backoff limit"), failed=3)}
    decision = world.decide()
    assert decision.phase == "Failed" and ("create", "MPIJob") not in actions(decision)
    status, reason, message = conditions(decision)["Failed"]
    assert (status, reason) == ("True", "ParquetTableInvalid")
    assert message.startswith(f"the Parquet table at s3://data/table does not fit this run: {said}; fix the table")
    assert "kubectl logs -n ml -l job-name=demo-preprocess" in message


def test_a_manifest_made_from_a_jpeg_tree_is_not_taken_for_a_table():
    world = parquet_world(manifest=manifest(source="s3://data/table"))  # same source URI, preprocessing's parameters
    decision = world.decide()
    assert actions(decision) == [("create", "ConfigMap"), ("create", "Job")]
    event = decision.actions[1].event
    assert event.reason == "PreprocessingAgain" and "format None -> 'parquet'" in event.message


def test_a_table_checked_before_is_reused_without_a_job():
    decision = parquet_world(manifest=table_manifest()).decide()
    assert actions(decision) == [("create", "ConfigMap"), ("create", "MPIJob")]
    status, reason, message = conditions(decision)["Preprocessed"]
    assert (status, reason) == ("True", "DatasetReused") and "Parquet table at s3://data/table checked" in message


@pytest.mark.parametrize("path", ["examples/custom-model/scalingrun.yaml", "examples/custom-model/quickstart.yaml"])
def test_a_builder_run_renders_like_any_run_with_its_image(path):
    run = load(path)
    assert launcher_argv(run)[-4:] == ["scalingrun-trainer", "train", "--config", CONFIG_FILE]
    assert build_trainer_config(run)["model"]["builder"] == "teamnets.keras_cnn:build"


# --- a builder that breaks the contract -----------------------------------------------------------------


def test_a_broken_builder_fails_the_run_naming_the_builder_the_image_the_pod_and_what_to_do():
    error = ("BuilderError: spec.model.builder 'teamnets.keras_cnn:build' in image team/custom-model:0.1.0: cannot "
             "import teamnets.keras_cnn (is the package in the image, or on PYTHONPATH / --python-path locally?): "
             "ModuleNotFoundError: No module named 'teamnets'")
    world = training(progress=progress("failed", 0, error=error, history=[], metrics={}, bestEpoch=None))
    world.children["MPIJob"] = mpijob(done("Failed", "MPIJobFailed", "launcher exited 2"))
    decision = world.decide()
    assert decision.phase == "Failed"
    status, reason, message = conditions(decision)["Failed"]
    assert (status, reason) == ("True", "ModelBuilderFailed")
    assert message.startswith("MPIJob demo-train failed (MPIJobFailed: launcher exited 2) before any training step: "
                              f"the network of spec.model.builder could not be built; trainer reported: {error}; "
                              "fix the package in the image (or the function, spec.model.params) and recreate the run")
    assert "launcher pod demo-train-launcher-aaaaa container launcher" in message
    assert "resumes from its last checkpoint" not in message  # nothing trained, nothing to resume
    assert conditions(decision)["Trained"][1] == "ModelBuilderFailed"


def test_an_error_after_training_started_is_no_builder_failure():
    world = training(progress=progress("failed", 2, error="BuilderError: something"))
    world.children["MPIJob"] = mpijob(done("Failed", "MPIJobFailed", "launcher exited 2"))
    status, reason, message = conditions(world.decide())["Failed"]
    assert reason == "MPIJobFailed" and "resumes from its last checkpoint" in message
