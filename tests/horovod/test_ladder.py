"""batchSizePerWorker: auto and the input-wait share, under real `horovodrun -np 2` on tiny Parquet in SeaweedFS."""

from __future__ import annotations

import re

import pytest

from tests.support.horovod_train import dataset, read_json, run_training, write_config  # noqa: F401 - fixture

pytestmark = [pytest.mark.horovod, pytest.mark.s3]
BUCKET = "train"


def test_auto_batch_size_backs_off_from_an_out_of_memory_size_and_scales_the_learning_rate(
        s3_server, dataset, tmp_path):  # noqa: F811
    run = f"s3://{BUCKET}/runs/auto-batch"
    config = write_config(tmp_path, s3_server, dataset, run, batchSizePerWorker="auto", maxEpochs=1,
                          baseLearningRate=0.001, learningRateScaling="linear")
    # Sizes >= 32 raise TensorFlow's ResourceExhaustedError, as a too-small GPU would.
    result = run_training(s3_server, config, env={"SCALINGRUN_PROBE_OOM_AT": "32"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    progress = read_json(s3_server, f"{run}/progress.json")
    probe = progress["batchSizeProbe"]
    assert [row["batchSize"] for row in probe["table"]] == [8, 16, 32]
    assert probe["table"][-1] == {"batchSize": 32, "outOfMemory": True} and probe["stoppedBy"] == "outOfMemory"
    assert all(row["imagesPerSecond"] > 0 for row in probe["table"][:2]) and probe["seconds"] > 0
    chosen = probe["chosen"]
    assert chosen in (8, 16) and progress["batchSizePerWorker"] == chosen
    # Both ranks use it; the rule scales the rate for the effective batch against 32 per process.
    assert progress["effectiveBatchSize"] == 2 * chosen
    assert progress["learningRate"] == pytest.approx(0.001 * 2 * chosen / 32)
    described = f"2 processes x batch {chosen} = effective batch {2 * chosen}"
    assert f"[0]<stdout>:scalingrun-trainer: {described}" in result.stdout
    assert "[0]<stdout>:scalingrun-trainer: batch-size probe" in result.stdout and "32: OOM" in result.stdout
    assert "[1]<stdout>:scalingrun-trainer: batch-size probe" not in result.stdout  # one worker probes
    assert progress["state"] == "succeeded"
    # The probe measured the whole network; the head then trained on cached features at the chosen size.
    assert progress["featureCache"]["used"] is True and progress["featureCache"]["rows"] == 240
    # The input figures of every epoch; no GPU here, so no utilisation.
    assert [entry["epoch"] for entry in progress["inputHistory"]] == [1]
    assert 0 <= progress["inputWaitFraction"] <= 1 and progress["gpuUtilization"] is None


DELAY = 0.3
TRAIN_IMAGES = 192  # the dataset fixture's training split: 24 images x 10 classes, less validation


def test_a_slow_reader_shows_as_a_high_input_wait_share(s3_server, dataset, tmp_path):  # noqa: F811
    run = f"s3://{BUCKET}/runs/slow-reader"
    config = write_config(tmp_path, s3_server, dataset, run, batchSizePerWorker=8, maxEpochs=2,
                          earlyStopping={"enabled": False})
    # 800 s: a hang's bound, not a verdict on speed (307-400 s in CI beside the elastic e2e, at load 60-100).
    result = run_training(s3_server, config, timeout=800, env={"SCALINGRUN_DIAGNOSTIC_READER_DELAY": str(DELAY)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    progress = read_json(s3_server, f"{run}/progress.json")
    history = progress["inputHistory"]
    assert [entry["epoch"] for entry in history] == [1, 2]
    assert progress["featureCache"]["used"] is True
    # The mechanism, which load cannot undo: every batch each rank trained on passed the reader's delay, as the
    # reader counted (it may hold a few more, prefetched); and each epoch's wait was measured. The share's size is
    # load's to decide (a step slower than DELAY hides the delay: 0.39 on a loaded CI machine), so it is not the
    # verdict; the InputBound rule over shares is unit-tested (test_input_bound.py).
    batches_per_rank = 2 * TRAIN_IMAGES // (2 * 8)  # 2 epochs of 192 images over 2 ranks of 8
    held = {int(rank): int(n) for rank, n in re.findall(r"rank (\d): reader delay held (\d+) training batches",
                                                         result.stdout)}
    assert sorted(held) == [0, 1] and min(held.values()) >= batches_per_rank, (held, result.stdout[-3000:])
    assert all(entry["inputWaitFraction"] is not None and 0 <= entry["inputWaitFraction"] <= 1
               for entry in history), history
    assert progress["inputWaitFraction"] == history[-1]["inputWaitFraction"]
    assert "input wait" in result.stdout
