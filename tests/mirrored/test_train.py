"""The Keras + MultiWorkerMirroredStrategy trainer under real `mpirun -np 2` on CPU (TensorFlow's ring all-reduce
between two worker processes), reading Parquet from a real S3 server. Horovod is made unimportable in its
processes: this engine must not need it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pyarrow import fs as pafs

from scalingrun_trainer.core.scaling import scale_run
from scalingrun_trainer.core.stall import engine_timeout
from tests.support.training import assert_saved_keras_model_is_the_whole_network_with_the_best_head, keras_scores, epoch_saved_before_a_rank_was_killed, preprocessed_fashion_mnist, the_one_mlflow_run, validation_split
from tests.support.operator import read_json
from tests.support.stall import TEST_TIMEOUT_SECONDS, first_error_and_tail, frozen_mpirun
from tests.support.mirrored_train import (  # noqa: F401 (a fixture)
    BUCKET, SIZE, command, environment, run_training, without_horovod, write_config,
)

pytestmark = [pytest.mark.mirrored, pytest.mark.s3]
HERE = Path(__file__).resolve().parent
# ImageNet weights: a head on a random base stays near chance, which any features would score alike.
PRETRAINED = {"base": "efficientnet_lite0", "weights": "imagenet"}


@pytest.fixture(scope="module")
def dataset(s3_server) -> str:
    """Fashion-MNIST, 24 images per class, preprocessed for 2 readers."""
    return preprocessed_fashion_mnist(s3_server, BUCKET, per_class=24, size=SIZE)


def listing(server, uri: str) -> list[str]:
    selector = pafs.FileSelector(uri[len("s3://"):], recursive=True)
    prefix = len(uri[len("s3://"):]) + 1
    return sorted(info.path[prefix:] for info in server.filesystem().get_file_info(selector)
                  if info.type == pafs.FileType.File)


@pytest.mark.parametrize("feature_cache", ["auto", "off"])
def test_two_workers_train_stop_early_on_the_same_epoch_and_keep_one_checkpoint_set(
        s3_server, dataset, tmp_path, mpirun, without_horovod, feature_cache):
    run = f"s3://{BUCKET}/runs/early-{feature_cache}"
    # An unreachable minDelta: no epoch after the first counts as an improvement, so epoch 2 stops it.
    config = write_config(tmp_path / "config.json", s3_server, dataset, run, model=PRETRAINED, maxEpochs=6,
                          featureCache=feature_cache,
                          earlyStopping={"monitor": "val_loss", "patience": 1, "minDelta": 100.0})
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    result = run_training(mpirun, s3_server, config, without_horovod, {"TMPDIR": str(scratch)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    # Two workers, one replica each on CPU: the effective batch and the learning rate are Horovod's for 2 processes.
    assert out.count("scalingrun-trainer: 2 replicas x batch 16 = effective batch 32; learning rate 0.002") == 1, out
    assert out.count("epoch 1/6:") == 1 and "epoch 2/6:" in out and "epoch 3/6" not in out
    assert "Epoch 2: early stopping" in out
    progress = read_json(s3_server, f"{run}/progress.json")
    assert progress["state"] == "succeeded" and progress["processes"] == 2 and progress["epoch"] == 2
    assert progress["devices"] == {"kind": "cpu", "count": 0}  # what rank 0 trains on (no GPU here)
    assert progress["effectiveBatchSize"] == 32 and progress["learningRate"] == pytest.approx(0.002)
    assert [h["epoch"] for h in progress["history"]] == [1, 2] and progress["bestEpoch"] == 1
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(progress["metrics"])
    assert progress["modelUri"] == f"{run}/model/model.keras"
    assert [e["epoch"] for e in progress["inputHistory"]] == [1, 2] and 0 <= progress["inputWaitFraction"] <= 1
    # One checkpoint set, written once (the chief's): the last epoch's folder and state.json, no temporary objects.
    files = listing(s3_server, f"{run}/checkpoints")
    assert {f.split("/")[0] for f in files} == {"epoch-00002", "state.json"}, files
    assert sorted(f.split("/")[1] for f in files if "/" in f) == [
        "best.npz", "ckpt.data-00000-of-00001", "ckpt.index"], files
    state = read_json(s3_server, f"{run}/checkpoints/state.json")
    assert state["epoch"] == 2 and state["finished"] and state["earlyStopping"]["bestEpoch"] == 1
    assert state["trainedOn"]["strategy"] == "multi-worker-mirrored"
    assert listing(s3_server, f"{run}/model") == ["model.keras"]
    # Every worker wrote local copies (saving is a collective here), its cache's too; none is left behind.
    assert not [p for p in scratch.rglob("*") if p.is_file()], list(scratch.rglob("*"))
    cache = progress["featureCache"]
    if feature_cache == "auto":
        # Both workers cached their shards of both splits (240 images, 1280 float32 features each) once.
        assert cache["used"] is True and cache["rows"] == 240 and cache["bytes"] == 240 * 1280 * 4
        assert cache["seconds"] > 0 and cache["onDisk"] is False and "reason" not in cache
        assert out.count("feature cache: the frozen base ran once over 240 images") == 1
        assert re.search(r"epoch 2/6: .*cached features", out), out
    else:
        assert cache == {"used": False, "reason": "spec.training.featureCache is off"}
        assert "feature cache" not in out and "cached features" not in out
    # The saved model is the whole network with the best epoch's head (epoch 1's, restored), and on the validation
    # images it scores what epoch 1 reported: the strategy sums the metrics over every replica's rows, each row
    # once, so the figures are the whole split's (float32 rounding apart; an argmax near a tie may flip).
    saved = assert_saved_keras_model_is_the_whole_network_with_the_best_head(
        s3_server, run, tmp_path, SIZE, "efficientnet_lite0")
    pixels, labels = validation_split(s3_server, dataset, SIZE)
    loss, accuracy = keras_scores(saved, pixels, labels)
    assert loss == pytest.approx(progress["history"][0]["val_loss"], rel=1e-4)
    assert accuracy == pytest.approx(progress["history"][0]["val_accuracy"], abs=1.01 / len(labels))


@pytest.mark.mlflow
def test_a_killed_worker_resumes_after_the_last_checkpoint_in_the_same_mlflow_run(
        s3_server, mlflow_server, dataset, tmp_path, mpirun, without_horovod):
    run = f"s3://{BUCKET}/runs/resume"
    tracking = {"mlflowTrackingUri": mlflow_server.uri, "experimentName": "mirrored-resume"}
    config = write_config(tmp_path / "first.json", s3_server, dataset, run, tracking, maxEpochs=30,
                          earlyStopping={"enabled": False})
    env = environment(s3_server, mlflow_server.env(), without_horovod)
    saved = epoch_saved_before_a_rank_was_killed(command(mpirun, config, env), {**os.environ, **env}, s3_server, run,
                                                 deadline_s=500, exit_s=180)
    assert 1 <= saved < 30
    # The rerun (same run, a lower maxEpochs to keep the test short) continues after the saved epoch.
    config = write_config(tmp_path / "second.json", s3_server, dataset, run, tracking, maxEpochs=saved + 2,
                          earlyStopping={"enabled": False})
    second = run_training(mpirun, s3_server, config, mlflow_server.env(), without_horovod)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"resuming after epoch {saved}" in second.stdout
    # The resumed attempt built its feature cache again before its first epoch (the default, auto).
    assert second.stdout.count("feature cache: the frozen base ran once over 240 images") == 1
    assert f"epoch {saved + 1}/{saved + 2}:" in second.stdout and "epoch 1/" not in second.stdout
    progress = read_json(s3_server, f"{run}/progress.json")
    assert progress["resumedFromEpoch"] == saved and progress["epoch"] == saved + 2 and progress["state"] == "succeeded"
    assert progress["featureCache"]["used"] is True and progress["featureCache"]["rows"] == 240
    assert [h["epoch"] for h in progress["history"]] == list(range(1, saved + 3))
    assert {f.split("/")[0] for f in listing(s3_server, f"{run}/checkpoints")} == {
        f"epoch-{saved + 2:05d}", "state.json"}
    # MLflow: one run, from rank 0 only, continued after the kill, finished with the model URI.
    _, data, params, history = the_one_mlflow_run(mlflow_server, "mirrored-resume", progress)
    assert params["strategy"] == "multi-worker-mirrored" and params["replicas"] == "2" and params["processes"] == "2"
    assert params["featureCache"] == "auto" and params["featureCacheUsed"] == "True"
    assert sorted({m["step"] for m in history}) == list(range(1, saved + 3))
    assert {t["key"]: t["value"] for t in data["tags"]}["scalingrun.dev/model-uri"] == f"{run}/model/model.keras"


def test_auto_batch_size_and_a_slow_reader_show_in_progress(s3_server, dataset, tmp_path, mpirun, without_horovod):
    run = f"s3://{BUCKET}/runs/auto-slow"
    config = write_config(tmp_path / "config.json", s3_server, dataset, run, batchSizePerWorker="auto", maxEpochs=2,
                          earlyStopping={"enabled": False})
    # Sizes >= 32 raise TensorFlow's ResourceExhaustedError, as a too-small GPU would; every batch waits 1 s (a
    # step of batch 16 took up to 0.3 s on the loaded 2-core machine, where a 0.3 s wait measured only 21%).
    result = run_training(mpirun, s3_server, config, without_horovod,
                          {"SCALINGRUN_PROBE_OOM_AT": "32", "SCALINGRUN_DIAGNOSTIC_READER_DELAY": "1.0"})
    assert result.returncode == 0, result.stdout[-3000:] + first_error_and_tail(result.stderr)
    progress = read_json(s3_server, f"{run}/progress.json")
    probe = progress["batchSizeProbe"]
    assert [row["batchSize"] for row in probe["table"]] == [8, 16, 32] and probe["stoppedBy"] == "outOfMemory"
    chosen = probe["chosen"]
    assert chosen in (8, 16) and progress["batchSizePerWorker"] == chosen
    assert progress["effectiveBatchSize"] == 2 * chosen
    assert progress["learningRate"] == pytest.approx(0.001 * 2 * chosen / 32)
    assert result.stdout.count("scalingrun-trainer: batch-size probe") == 1  # one worker probes
    # The probe measured the whole network; the head then trained on the cached features, batch by batch delayed.
    assert progress["featureCache"]["used"] is True
    history = progress["inputHistory"]
    assert [entry["epoch"] for entry in history] == [1, 2]
    # Load-proof: every batch each rank trained on (2 epochs of 192 images over 2 ranks) passed the reader's 1 s
    # delay, as the reader counted; the share's size is load's (a step slower than the delay hides it), so it is only
    # required to be measured.
    held = {int(rank): int(n) for rank, n in re.findall(r"rank (\d): reader delay held (\d+) training batches",
                                                         result.stdout)}
    assert sorted(held) == [0, 1] and min(held.values()) >= 2 * 192 // (2 * chosen), (held, result.stdout[-3000:])
    assert all(entry["inputWaitFraction"] is not None and 0 <= entry["inputWaitFraction"] <= 1
               for entry in history), history
    assert "input wait" in result.stdout


def test_a_frozen_rank_ends_the_run_naming_it(s3_server, dataset, tmp_path, mpirun, without_horovod):
    """Worker 1 SIGSTOPped during training: mpirun exits non-zero, and the worker that still answers says which did
    not (the stall watch, core/stall.py, under a short timeout; TensorFlow's collective timeout comes later)."""
    run = f"s3://{BUCKET}/runs/frozen"
    config = write_config(tmp_path / "config.json", s3_server, dataset, run, maxEpochs=500,
                          earlyStopping={"enabled": False})
    env = environment(s3_server, without_horovod, {"SCALINGRUN_COLLECTIVE_TIMEOUT_SECONDS": str(TEST_TIMEOUT_SECONDS)})
    frozen_mpirun(command(mpirun, config, env), {**os.environ, **env}, s3_server,
                  f"{BUCKET}/runs/frozen/heartbeat.json", tmp_path / "output", "multi-worker-mirrored")


def test_clear_error_on_every_rank_for_a_missing_dataset(s3_server, dataset, tmp_path, mpirun, without_horovod):
    config = write_config(tmp_path / "config.json", s3_server, f"s3://{BUCKET}/no-such-dataset",
                          f"s3://{BUCKET}/runs/missing")
    result = run_training(mpirun, s3_server, config, without_horovod, timeout=300)
    assert result.returncode != 0
    for rank in (0, 1):
        assert (f"(keras multi-worker-mirrored, rank {rank}/2): error: DatasetError: no dataset manifest at "
                f"s3://{BUCKET}/no-such-dataset/_manifest.json") in result.stderr


@pytest.mark.parametrize("launch", ["workers", "replicas"])
def test_the_feature_caches_forward_pass_runs_on_each_workers_own_batches(mpirun, launch):
    """Workers with different numbers of batches (shards of different sizes) each compute their features without
    waiting for the others; one worker's replicas share a batch and give its rows back in order."""
    script = [sys.executable, str(HERE / "forward_worker.py"), launch]
    result = subprocess.run([*mpirun, *script] if launch == "workers" else script, capture_output=True, text=True,
                            timeout=120, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # Searched, not split in lines: mpirun may join the two ranks' lines.
    assert sorted(re.findall(r"forward ok on rank (\d)", result.stdout)) == (
        ["0", "1"] if launch == "workers" else ["0"]), result.stdout


@pytest.mark.parametrize("batch", [4, 16])
def test_the_effective_batch_counts_every_replica_as_horovod_counts_processes(mpirun, batch):
    """Each replica takes batchSizePerWorker rows of its own worker's shard a step; the scaled learning rate is
    Horovod's for as many processes as there are replicas."""
    rows, base = 64 * batch, 0.001
    result = subprocess.run([*mpirun, sys.executable, str(HERE / "batch_worker.py"), str(batch), str(rows), str(base)],
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    seen = json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])
    horovod = scale_run(rows, batch, base, "linear", processes=2)  # 2 Horovod processes, one GPU each
    assert seen["replicas"] == seen["workers"] == 2
    assert seen["stepRows"] == seen["effectiveBatchSize"] == horovod.effective_batch_size == 2 * batch
    assert seen["learningRate"] == pytest.approx(horovod.learning_rate) and seen["stepsPerEpoch"] == horovod.steps_per_epoch
    # Worker 0's first batch (0..batch-1) and worker 1's (1000..1000+batch-1): disjoint shards, no rebatching.
    assert seen["stepSum"] == sum(range(batch)) + sum(range(1000, 1000 + batch))
    # TensorFlow's coordination service waits for a silent worker as long as the engine's collective timeout, not
    # its own 10 s, which a busy node's starved worker overran (CI: "Task ... heartbeat timeout").
    assert seen["heartbeatTimeoutMs"] == int(engine_timeout() * 1000) > 10_000
