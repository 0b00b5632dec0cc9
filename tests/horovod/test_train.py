"""The trainer under real `horovodrun -np 2` on CPU, reading Parquet from a real S3 server."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from pyarrow import fs as pafs

from tests.support.env import require
from tests.support.training import (
    assert_saved_keras_model_is_the_whole_network_with_the_best_head, keras_scores, kill_the_whole_job, saved_keras_model,
    validation_split,
)
from scalingrun_trainer.core.tracking import MlflowClient
from tests.support.horovodrun import horovodrun
from tests.support.stall import TEST_TIMEOUT_SECONDS, frozen_mpirun
from tests.support.horovod_train import (  # noqa: F401 (fixtures)
    BUCKET, SIZE, dataset, read_json, run_training, s3, train_command, write_config,
)

pytestmark = [pytest.mark.horovod, pytest.mark.s3]
# How far the cached head's epoch losses may be from the whole network's (the test that compares them says why).
LOSS_TOLERANCE = 0.05
PRETRAINED = {"base": "efficientnet_lite0", "weights": "imagenet"}


def test_two_ranks_train_report_checkpoint_and_save(s3_server, dataset, tmp_path):
    run = f"s3://{BUCKET}/runs/basic"
    # A trainable base: the whole network trains on images every epoch (the other tests' frozen base caches).
    result = run_training(s3_server, write_config(tmp_path, s3_server, dataset, run, model={"trainableBase": True},
                                                  maxEpochs=2))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # Only rank 0 reports; the effective values are logged at start.
    assert "[0]<stdout>:scalingrun-trainer: 2 processes x batch 16 = effective batch 32; learning rate 0.002" in result.stdout
    assert not re.search(r"\[1\]<stdout>:epoch", result.stdout)
    progress = read_json(s3_server, f"{run}/progress.json")
    assert progress["state"] == "succeeded" and progress["processes"] == 2
    assert progress["devices"] == {"kind": "cpu", "count": 0}  # what rank 0 trains on (no GPU here)
    assert progress["effectiveBatchSize"] == 32 and progress["learningRate"] == pytest.approx(0.002)
    assert [h["epoch"] for h in progress["history"]] == list(range(1, progress["epoch"] + 1))
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(progress["metrics"])
    assert progress["imagesPerSecond"] > 0 and progress["bestEpoch"] in range(1, progress["epoch"] + 1)
    assert progress["modelUri"] == f"{run}/model/model.keras"
    assert progress["featureCache"] == {
        "used": False, "reason": "spec.model.trainableBase is true: the base's features change every step"}
    assert "feature cache" not in result.stdout and "cached features" not in result.stdout
    state = read_json(s3_server, f"{run}/checkpoints/state.json")
    assert state["epoch"] == progress["epoch"]
    fs = s3(s3_server)
    assert fs.get_file_info(f"{BUCKET}/runs/basic/model/model.keras").size > 100_000
    events = fs.get_file_info(pafs.FileSelector(f"{BUCKET}/runs/basic/tensorboard", recursive=True))
    assert any("tfevents" in i.base_name for i in events)  # TensorBoard logs, from rank 0 only


@pytest.mark.parametrize("feature_cache", ["auto", "off"])
def test_early_stopping_stops_both_ranks_on_the_same_epoch(s3_server, dataset, tmp_path, feature_cache):
    run = f"s3://{BUCKET}/runs/early-{feature_cache}"
    # An unreachable minDelta: no epoch after the first counts as an improvement.
    config = write_config(tmp_path, s3_server, dataset, run, maxEpochs=8, featureCache=feature_cache,
                          earlyStopping={"monitor": "val_loss", "patience": 1, "minDelta": 100.0})
    result = run_training(s3_server, config)
    assert result.returncode == 0, result.stderr[-3000:]
    progress = read_json(s3_server, f"{run}/progress.json")
    assert progress["epoch"] == 2 and progress["bestEpoch"] == 1
    assert progress["bestMetrics"]["val_loss"] == pytest.approx(progress["history"][0]["val_loss"], rel=1e-4)
    assert "Epoch 2: early stopping" in result.stdout
    cache = progress["featureCache"]
    if feature_cache == "auto":
        # Both ranks cached their shards of both splits (240 images, 1280 float32 features each) once.
        assert cache["used"] is True and cache["rows"] == 240 and cache["bytes"] == 240 * 1280 * 4
        assert cache["seconds"] > 0 and cache["onDisk"] is False and "reason" not in cache
        assert result.stdout.count("feature cache: the frozen base ran once over 240 images") == 1
        assert re.search(r"\[0\]<stdout>:epoch 2/8: .*cached features", result.stdout)
    else:
        assert cache == {"used": False, "reason": "spec.training.featureCache is off"}
        assert "feature cache" not in result.stdout and "cached features" not in result.stdout
    # The saved model is the whole network (uint8 pixels in, probabilities out) with the best epoch's head.
    assert_saved_keras_model_is_the_whole_network_with_the_best_head(s3_server, run, tmp_path, SIZE,
                                                                     "mobilenetv2_1.00_32")


def test_the_cached_head_trains_the_same_network_as_whole_images(s3_server, dataset, tmp_path):
    """One process each, so that the reported validation figures are over the whole split, not a mean of ranks'."""
    histories = {}
    for mode in ("auto", "off"):
        run = f"s3://{BUCKET}/runs/same-{mode}"
        folder = tmp_path / mode
        folder.mkdir()
        # ImageNet weights: a head on a random base stays at chance, which any features or labels would match.
        config = write_config(folder, s3_server, dataset, run, model=PRETRAINED, maxEpochs=2, featureCache=mode,
                              earlyStopping={"enabled": False})
        result = run_training(s3_server, config, processes=1)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        progress = read_json(s3_server, f"{run}/progress.json")
        assert progress["featureCache"]["used"] is (mode == "auto"), progress["featureCache"]
        histories[mode] = progress["history"]
        if mode == "auto":
            # Exactness: the saved whole network, run on the validation images, scores what the head scored on the
            # cached features of the last epoch (float32 rounding apart; an argmax near a tie may flip).
            pixels, labels = validation_split(s3_server, dataset, SIZE)
            loss, accuracy = keras_scores(saved_keras_model(s3_server, run, folder), pixels, labels)
            assert loss == pytest.approx(progress["metrics"]["val_loss"], rel=1e-4)
            assert accuracy == pytest.approx(progress["metrics"]["val_accuracy"], abs=1.01 / len(labels))
    # The same network from the same initial weights, on batches drawn in another order (the cache's seeded
    # permutations, the reader's shuffled row groups) with other dropout masks: the epochs' losses differ by that
    # sampling noise only, measured 0.02-0.03 (LOSS_TOLERANCE is about twice that), while both learn more than
    # that tolerance in two epochs; a head on wrong features or labels stays near ln 10 = 2.303, 0.1 above.
    cached, whole = histories["auto"], histories["off"]
    for epoch_cached, epoch_whole in zip(cached, whole):
        assert epoch_cached["loss"] == pytest.approx(epoch_whole["loss"], abs=LOSS_TOLERANCE), (cached, whole)
        assert epoch_cached["val_loss"] == pytest.approx(epoch_whole["val_loss"], abs=LOSS_TOLERANCE), (cached, whole)
    for history in (cached, whole):
        assert history[-1]["loss"] < history[0]["loss"] - LOSS_TOLERANCE, history


@pytest.mark.mlflow
def test_resume_continues_after_a_kill_in_the_same_mlflow_run(s3_server, mlflow_server, dataset, tmp_path):
    run = f"s3://{BUCKET}/runs/resume"
    tracking = {"mlflowTrackingUri": mlflow_server.uri, "experimentName": "hvd-resume"}
    config = write_config(tmp_path, s3_server, dataset, run, tracking, maxEpochs=5, earlyStopping={"enabled": False})
    env = {**os.environ, **s3_server.env(), **mlflow_server.env(), "TF_CPP_MIN_LOG_LEVEL": "2"}
    first = subprocess.Popen(train_command(config), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env, start_new_session=True)
    deadline = time.monotonic() + 300
    fs = s3(s3_server)
    try:
        while time.monotonic() < deadline and first.poll() is None:
            info = fs.get_file_info(f"{BUCKET}/runs/resume/checkpoints/state.json")
            if info.type == pafs.FileType.File and read_json(s3_server, f"{run}/checkpoints/state.json")["epoch"] >= 2:
                break
            time.sleep(0.5)
    finally:
        kill_the_whole_job(first)  # no rank lives on to write a checkpoint on horovodrun's parting SIGTERM
    saved = read_json(s3_server, f"{run}/checkpoints/state.json")["epoch"]
    assert 2 <= saved < 5, "the first run should have been killed mid-training"
    # The resumed attempt, watched: its first progress document (written before the first resumed epoch, which
    # takes seconds) shows the epoch it resumed from, and the epoch never goes back.
    out, err = tmp_path / "resumed.out", tmp_path / "resumed.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        second = subprocess.Popen(train_command(config), stdout=stdout, stderr=stderr, text=True, env=env,
                                  start_new_session=True)
        epochs_seen, deadline = [], time.monotonic() + 400
        while second.poll() is None:
            if time.monotonic() > deadline:
                os.killpg(second.pid, signal.SIGKILL)
                pytest.fail("the resumed training did not finish within 400 s")
            document = read_json(s3_server, f"{run}/progress.json")
            if document.get("resumedFromEpoch") == saved and document["epoch"] not in epochs_seen:
                epochs_seen.append(document["epoch"])
            time.sleep(0.1)
    assert second.returncode == 0, err.read_text()[-3000:]
    assert f"resuming after epoch {saved}" in out.read_text()
    # The resumed attempt built its feature cache again before its first epoch.
    assert "[0]<stdout>:scalingrun-trainer: feature cache: the frozen base ran once over 240 images" in out.read_text()
    assert epochs_seen[0] == saved and epochs_seen == sorted(epochs_seen), epochs_seen
    progress = read_json(s3_server, f"{run}/progress.json")
    assert [h["epoch"] for h in progress["history"]] == [1, 2, 3, 4, 5]
    assert progress["epoch"] == 5 and progress["state"] == "succeeded" and progress["resumedFromEpoch"] == saved

    # MLflow: one run, from rank 0 only, continued after the kill, with the scaled values as params.
    client = MlflowClient(mlflow_server.uri, username=mlflow_server.username, password=mlflow_server.password)
    experiment = client.experiment_id("hvd-resume")
    runs = client.call("POST", "runs/search", {"experiment_ids": [experiment]})["runs"]
    assert [r["info"]["run_id"] for r in runs] == [progress["mlflowRunId"]]
    info, data = runs[0]["info"], runs[0]["data"]
    assert info["status"] == "FINISHED" and info["run_name"] == "hvd-test"
    params = {p["key"]: p["value"] for p in data["params"]}
    assert params["processes"] == "2" and params["effectiveBatchSize"] == "32" and float(params["learningRate"]) == 0.002
    assert params["featureCache"] == "auto" and params["featureCacheUsed"] == "True"
    history = client.call("GET", "metrics/get-history", {"run_id": info["run_id"], "metric_key": "val_loss"})["metrics"]
    # The epoch after the last checkpoint may have been logged before the kill too: it then has two values,
    # and the later one (the resumed training's) is the one progress.json kept.
    assert len(history) in (5, 6)
    latest = {m["step"]: m["value"] for m in sorted(history, key=lambda m: m["timestamp"])}
    by_epoch = {h["epoch"]: h["val_loss"] for h in progress["history"]}
    assert latest == pytest.approx(by_epoch, rel=1e-4) and sorted(latest) == [1, 2, 3, 4, 5]
    assert {t["key"]: t["value"] for t in data["tags"]}["scalingrun.dev/model-uri"] == f"{run}/model/model.keras"


@pytest.mark.parametrize("case", ["missing-dataset", "class-mismatch", "unreadable-weights",
                                  pytest.param("mlflow-credentials", marks=pytest.mark.mlflow)])
def test_clear_errors_on_every_rank(s3_server, dataset, tmp_path, case, request):
    run = f"s3://{BUCKET}/runs/error-{case}"
    config_path = write_config(tmp_path, s3_server, dataset, run)
    config = json.loads(config_path.read_text())
    env = {}
    if case == "mlflow-credentials":
        mlflow = request.getfixturevalue("mlflow_server")
        config["tracking"] = {"mlflowTrackingUri": mlflow.uri}
        env = {**mlflow.env(), "MLFLOW_TRACKING_PASSWORD": "wrong"}
        expected = f"MLflow at {mlflow.uri} answered 401"
    elif case == "missing-dataset":
        config["dataset"]["output"] = f"s3://{BUCKET}/no-such-dataset"
        expected = "no dataset manifest at s3://train/no-such-dataset/_manifest.json"
    elif case == "class-mismatch":
        config["model"]["numClasses"] = 3
        expected = "model.numClasses is 3 but the dataset has 10 classes"
    else:
        weights = tmp_path / "broken.h5"
        weights.write_bytes(b"not weights")
        config["model"]["weights"] = str(weights)
        expected = "cannot load mobilenet_v2 weights"
    config_path.write_text(json.dumps(config))
    result = run_training(s3_server, config_path, timeout=300, env=env)
    assert result.returncode != 0
    # Every rank meets the same error; the first to exit ends the run (horovodrun terminates the others), so a
    # rank may be stopped before it says so: each rank that speaks says this, and one at least does.
    output = result.stderr + result.stdout
    errors = {rank: re.findall(rf"\[{rank}\]<stderr>:scalingrun-trainer train \(rank {rank}/2\): error: (.*)", output)
              for rank in (0, 1)}
    assert any(errors.values()) and all(expected in line for lines in errors.values() for line in lines), \
        result.stderr[-2000:]


def test_a_frozen_rank_ends_the_run_naming_it(s3_server, dataset, tmp_path):
    """Rank 1 SIGSTOPped during training, under mpirun as in the MPIJob: mpirun exits non-zero, and the rank that
    still answers says which did not (the stall watch, core/stall.py, under a short timeout). Horovod alone would
    wait: a frozen rank blocks its coordination, stall check included."""
    mpirun = shutil.which("mpirun")
    require(mpirun is not None, "mpirun not found: scripts/setup.sh installs openmpi-bin")
    run = f"s3://{BUCKET}/runs/frozen"
    config = write_config(tmp_path, s3_server, dataset, run, maxEpochs=500, earlyStopping={"enabled": False})
    env = {**os.environ, **s3_server.env(), "TF_CPP_MIN_LOG_LEVEL": "2",
           "SCALINGRUN_COLLECTIVE_TIMEOUT_SECONDS": str(TEST_TIMEOUT_SECONDS)}
    command = [mpirun, *(["--allow-run-as-root"] if os.geteuid() == 0 else []), "-np", "2", "-bind-to", "none",
               sys.executable, "-m", "scalingrun_trainer.cli", "train", "--config", str(config)]
    frozen_mpirun(command, env, s3_server, f"{BUCKET}/runs/frozen/heartbeat.json", tmp_path / "output", "horovod")
