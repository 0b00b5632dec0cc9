"""The Lightning trainer under real `mpirun -np 2` on CPU (DDP over gloo), reading Parquet from a real S3 server."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.support.training import epoch_saved_before_a_rank_was_killed, the_one_mlflow_run
from tests.support.stall import TEST_TIMEOUT_SECONDS, frozen_mpirun
from tests.support.lightning_train import (  # noqa: F401 (fixtures)
    BUCKET, SIZE, command, dataset, read_json, write_config,
)

pytestmark = [pytest.mark.lightning, pytest.mark.s3]


def evaluate_saved_model(python: str, server, model_uri: str, dataset: str) -> float:
    """Accuracy of the saved TorchScript model on the whole validation split, loaded with torch alone."""
    script = """
import io, json, sys
import numpy as np, pyarrow.parquet as pq, torch
from pyarrow import fs as pafs
model_uri, dataset, endpoint, size = sys.argv[1:5]
s3 = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http")
model = torch.jit.load(io.BytesIO(s3.open_input_stream(model_uri[5:]).read())).eval()
files = json.loads(s3.open_input_stream(dataset[5:] + "/_manifest.json").read())["files"]["validation"]
correct = rows = 0
for name in files:
    table = pq.read_table(s3.open_input_file(dataset[5:] + "/" + name), columns=["image", "label"])
    pixels = np.stack([np.frombuffer(b, np.uint8) for b in table.column("image").to_pylist()])
    pixels = torch.from_numpy(pixels).view(-1, int(size), int(size), 3)
    with torch.no_grad():
        predicted = model(pixels).argmax(1).numpy()
    correct += int((predicted == np.array(table.column("label").to_pylist())).sum()); rows += len(predicted)
# A frozen base trains in inference mode: its BatchNorm statistics are still the ImageNet file's.
from scalingrun_trainer.core.weights import imagenet_weights_path
imagenet = torch.load(imagenet_weights_path(), weights_only=True)
saved = model.state_dict()
assert all(torch.equal(saved["base." + k], imagenet[k]) for k in imagenet if k.endswith("running_mean")), "BN moved"
print(correct / rows)
"""
    result = subprocess.run([python, "-c", script, model_uri, dataset, server.endpoint, str(SIZE)],
                            capture_output=True, text=True, env={**os.environ, **server.env()}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return float(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("feature_cache", ["auto", "off"])
def test_two_ranks_stop_early_on_the_same_epoch_and_save_the_best_weights(s3_server, dataset, tmp_path, mpirun,
                                                                           lightning_python, feature_cache):
    run = f"s3://{BUCKET}/runs/early-{feature_cache}"
    # An unreachable minDelta: no epoch after the first counts as an improvement, so epoch 2 stops it.
    config = write_config(tmp_path / "config.json", s3_server, dataset, run, maxEpochs=6, featureCache=feature_cache,
                          earlyStopping={"monitor": "val_loss", "patience": 1, "minDelta": 100.0})
    result = subprocess.run(command(mpirun, lightning_python, config), capture_output=True, text=True, timeout=600,
                            env={**os.environ, **s3_server.env()})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    # Rank 0 alone reports, with the scaled values; both ranks joined one gloo process group.
    assert out.count("2 processes x batch 16 = effective batch 32; learning rate 0.002") == 1, out
    assert "distributed_backend=gloo" in out + result.stderr and out.count("epoch 1/6:") == 1
    assert "epoch 2/6:" in out and "early stopping, best epoch 1" in out and "epoch 3/6" not in out
    progress = read_json(s3_server, f"{run}/progress.json")
    assert progress["state"] == "succeeded" and progress["processes"] == 2 and progress["epoch"] == 2
    assert progress["devices"] == {"kind": "cpu", "count": 0}  # what rank 0 trains on (no GPU here)
    assert progress["effectiveBatchSize"] == 32 and progress["learningRate"] == pytest.approx(0.002)
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(progress["metrics"])
    assert [h["epoch"] for h in progress["history"]] == [1, 2] and progress["imagesPerSecond"] > 0
    assert progress["bestEpoch"] == 1 and progress["bestMetrics"]["val_loss"] == progress["history"][0]["val_loss"]
    assert progress["modelUri"] == f"{run}/model/model.pt"
    cache = progress["featureCache"]
    if feature_cache == "auto":
        # Both ranks ran the frozen base once over their shards of both splits (240 images, 1280 features each).
        assert cache["used"] is True and cache["rows"] == 240 and cache["bytes"] == 240 * 1280 * 4
        assert cache["seconds"] > 0 and cache["onDisk"] is False and "reason" not in cache
        assert out.count("feature cache: the frozen base ran once over 240 images") == 1
        assert "cached features" in out.split("epoch 2/6:")[1].splitlines()[0]
    else:
        assert cache == {"used": False, "reason": "spec.training.featureCache is off"}
        assert "feature cache" not in out and "cached features" not in out
    state = read_json(s3_server, f"{run}/checkpoints/state.json")
    assert state["epoch"] == 2 and state["finished"] and state["trainedOn"]["framework"] == "pytorch-lightning"
    # The saved model is the whole network with epoch 1's weights (restored), not epoch 2's: run on the images, its
    # accuracy is epoch 1's val_accuracy (with the cache: measured on the cached features, so they are the base's).
    accuracy = evaluate_saved_model(lightning_python, s3_server, progress["modelUri"], dataset)
    assert accuracy == pytest.approx(progress["history"][0]["val_accuracy"], abs=1e-6)


@pytest.mark.mlflow
def test_a_killed_rank_resumes_from_the_last_checkpoint_in_the_same_mlflow_run(s3_server, mlflow_server, dataset,
                                                                                tmp_path, mpirun, lightning_python):
    run = f"s3://{BUCKET}/runs/resume"
    env = {**os.environ, **s3_server.env(), **mlflow_server.env()}
    tracking = {"mlflowTrackingUri": mlflow_server.uri, "experimentName": "lightning-resume"}
    config = write_config(tmp_path / "first.json", s3_server, dataset, run, tracking, maxEpochs=30,
                          earlyStopping={"enabled": False})
    saved = epoch_saved_before_a_rank_was_killed(command(mpirun, lightning_python, config), env, s3_server, run,
                                                 deadline_s=400, exit_s=120)
    assert 1 <= saved < 30
    # The rerun (same run, a lower maxEpochs to keep the test short) continues after the saved epoch.
    config = write_config(tmp_path / "second.json", s3_server, dataset, run, tracking, maxEpochs=saved + 2,
                          earlyStopping={"enabled": False})
    second = subprocess.run(command(mpirun, lightning_python, config), capture_output=True, text=True, timeout=600,
                            env=env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"resuming after epoch {saved}" in second.stdout
    # The resumed attempt built its feature cache again before its first epoch.
    assert "feature cache: the frozen base ran once over 240 images" in second.stdout
    assert f"epoch {saved + 1}/{saved + 2}:" in second.stdout and "epoch 1/" not in second.stdout
    progress = read_json(s3_server, f"{run}/progress.json")
    assert progress["resumedFromEpoch"] == saved and progress["epoch"] == saved + 2 and progress["state"] == "succeeded"
    assert [h["epoch"] for h in progress["history"]] == list(range(1, saved + 3))
    # MLflow: one run, from rank 0 only, continued after the kill, finished with the model URI.
    _, data, params, history = the_one_mlflow_run(mlflow_server, "lightning-resume", progress)
    assert params["framework"] == "pytorch-lightning" and params["processes"] == "2"
    assert sorted({m["step"] for m in history}) == list(range(1, saved + 3))
    assert {t["key"]: t["value"] for t in data["tags"]}["scalingrun.dev/model-uri"] == f"{run}/model/model.pt"


def test_a_frozen_rank_ends_the_run_naming_it(s3_server, dataset, tmp_path, mpirun, lightning_python):
    """Rank 1 SIGSTOPped during training: mpirun exits non-zero, and the ranks that still answer say which did not
    (the stall watch, core/stall.py, under a short timeout)."""
    run = f"s3://{BUCKET}/runs/frozen"
    config = write_config(tmp_path / "config.json", s3_server, dataset, run, maxEpochs=500,
                          earlyStopping={"enabled": False})
    env = {**os.environ, **s3_server.env(), "SCALINGRUN_COLLECTIVE_TIMEOUT_SECONDS": str(TEST_TIMEOUT_SECONDS)}
    frozen = frozen_mpirun(command(mpirun, lightning_python, config), env, s3_server,
                           f"{BUCKET}/runs/frozen/heartbeat.json", tmp_path / "output", "lightning")
    assert all(beat["rank"] == 0 for beat in frozen.heartbeats)


def test_clear_error_on_every_rank_for_a_missing_dataset(s3_server, dataset, tmp_path, mpirun, lightning_python):
    run = f"s3://{BUCKET}/runs/missing"
    config = write_config(tmp_path / "config.json", s3_server, f"s3://{BUCKET}/no-such-dataset", run)
    result = subprocess.run(command(mpirun, lightning_python, config), capture_output=True, text=True, timeout=300,
                            env={**os.environ, **s3_server.env()})
    assert result.returncode != 0
    for rank in (0, 1):
        assert (f"(pytorch-lightning, rank {rank}/2): error: DatasetError: no dataset manifest at "
                f"s3://{BUCKET}/no-such-dataset/_manifest.json") in result.stderr
