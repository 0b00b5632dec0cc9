"""model.builder with Keras + Horovod, real processes: the team's own CNN (examples/custom-model) learns on the
quick-start data through the quick start itself; a builder that breaks the contract fails every rank before any
training step with the builder, the image and the error; a killed rank's builder run resumes from its checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from pyarrow import fs as pafs

from tests.support.horovod_train import BUCKET, dataset, read_json, s3, train_command, write_config  # noqa: F401
from tests.support.quickstart import example_spec, run_quickstart, team_package, trained

pytestmark = [pytest.mark.horovod, pytest.mark.s3]
ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "examples/custom-model"
# What "learns" means here: 10 classes (chance 0.10), 1,353 training images of 32 px, 5 epochs from scratch.
LEARNED = 0.45


def builder_config(tmp_path: Path, server, data: str, run: str, builder: str, **training) -> Path:
    path = write_config(tmp_path, server, data, run, **training)
    config = json.loads(path.read_text())
    config["model"] = {"builder": builder, "params": {"width": 16}, "numClasses": None}
    config["image"] = "team/custom-model:test"
    path.write_text(json.dumps(config))
    return path


def env_with_package(server) -> dict[str, str]:
    return {**os.environ, **server.env(), "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(PACKAGE)}


def test_the_teams_keras_network_learns_on_the_quickstart_data(tmp_path):
    spec = example_spec(PACKAGE / "quickstart.yaml", batchSizePerWorker=32, maxEpochs=5)
    state = tmp_path / "state"
    result = run_quickstart(spec, tmp_path / "team-cnn.yaml", state, 150,
                            {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(PACKAGE)})
    line = trained(result, 5)
    assert "phase: Succeeded" in result.stdout
    print(f"team CNN (Keras builder), 2 processes, 5 epochs: best val_accuracy {line.group(3)}, "
          f"{line.group(4)} img/s")
    assert float(line.group(3)) >= LEARNED
    status = json.loads((state / "runs/quickstart-team-cnn/status.json").read_text())
    assert status["phase"] == "Succeeded" and status["modelUri"].endswith("/runs/quickstart-team-cnn/model/model.keras")
    assert "2 processes x batch 32 = effective batch 64; learning rate 0.002" in result.stdout


@pytest.mark.parametrize("builder,words", [
    ("teamnets.absent:build", "cannot import teamnets.absent (is the package in the image, or on PYTHONPATH / "
                              "--python-path locally?): ModuleNotFoundError"),
    ("teamnets.keras_cnn:absent", "module teamnets.keras_cnn has no function absent"),
    ("teamnets.torch_cnn:build", "cannot import teamnets.torch_cnn"),  # torch is not in the Keras environment
])
def test_a_builder_that_breaks_the_contract_fails_every_rank_before_training(s3_server, dataset, tmp_path, builder,
                                                                              words):
    run = f"s3://{BUCKET}/runs/bad-builder-{builder.replace(':', '-').replace('.', '-')}"
    config = builder_config(tmp_path, s3_server, dataset, run, builder)
    result = subprocess.run(train_command(config), capture_output=True, text=True, timeout=400,
                            env=env_with_package(s3_server))
    assert result.returncode != 0
    expected = f"spec.model.builder {builder!r} in image team/custom-model:test: {words}"
    for rank in (0, 1):
        assert f"[{rank}]<stderr>:scalingrun-trainer train (rank {rank}/2): error: BuilderError: {expected}" in \
            result.stderr + result.stdout, result.stderr[-3000:]
    fs = s3(s3_server)
    root = run[len("s3://"):]
    assert fs.get_file_info(f"{root}/model").type == pafs.FileType.NotFound  # nothing for modelUri
    assert fs.get_file_info(f"{root}/checkpoints").type == pafs.FileType.NotFound  # no epoch ran
    # Rank 0's progress document carries the error (the operator's Failed condition quotes it), and no epoch.
    progress = read_json(s3_server, f"{run}/progress.json")
    assert progress["state"] == "failed" and progress["error"].startswith(f"BuilderError: {expected}")
    assert (progress["epoch"], progress["history"], progress["modelUri"]) == (0, [], None)


def test_a_wrong_output_shape_is_named_with_the_shape_wanted(s3_server, dataset, tmp_path):
    package = team_package(
        tmp_path, "wrongnets", "nets",
        "import tensorflow as tf\n"
        "def build(input_shape, num_classes, width=8):\n"
        "    inputs = tf.keras.Input(input_shape)\n"
        "    x = tf.keras.layers.GlobalAveragePooling2D()(tf.keras.layers.Conv2D(width, 3)(inputs))\n"
        "    return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes + 1)(x))\n")
    config = builder_config(tmp_path, s3_server, dataset, f"s3://{BUCKET}/runs/wrong-shape", "wrongnets.nets:build")
    result = subprocess.run(train_command(config), capture_output=True, text=True, timeout=400,
                            env={**env_with_package(s3_server), "PYTHONPATH": str(package)})
    assert result.returncode != 0
    assert ("the network returned shape (2, 11) for a batch of 2 NHWC images; it must return logits of shape "
            "(batch, num_classes) = (2, 10)") in result.stderr + result.stdout


def _rank_process(config: Path, rank: int):
    """The training process of one Horovod rank of this config."""
    for process in psutil.process_iter(["cmdline"]):
        try:
            if str(config) in (process.info["cmdline"] or []) and "scalingrun_trainer.cli" in process.info["cmdline"] \
                    and process.environ().get("HOROVOD_RANK") == str(rank):
                return process
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def test_a_killed_rank_resumes_the_builder_run_from_its_checkpoint(s3_server, dataset, tmp_path):
    run = f"s3://{BUCKET}/runs/builder-resume"
    config = builder_config(tmp_path, s3_server, dataset, run, "teamnets.keras_cnn:build", maxEpochs=5,
                            earlyStopping={"enabled": False})
    env = env_with_package(s3_server)
    first = subprocess.Popen(train_command(config), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env, start_new_session=True)
    fs, deadline = s3(s3_server), time.monotonic() + 300
    state_at = f"{BUCKET}/runs/builder-resume/checkpoints/state.json"
    try:
        while time.monotonic() < deadline and first.poll() is None:
            if fs.get_file_info(state_at).type == pafs.FileType.File and \
                    read_json(s3_server, f"s3://{state_at}")["epoch"] >= 2:
                victim = _rank_process(config, 1)
                assert victim is not None, "rank 1's process not found"
                victim.send_signal(signal.SIGKILL)  # one rank lost, as with a worker pod
                break
            time.sleep(0.3)
        first.wait(timeout=120)  # the other rank and horovodrun end on their own
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert first.returncode != 0
    saved = read_json(s3_server, f"s3://{state_at}")["epoch"]
    assert 2 <= saved < 5, "the first attempt should have been killed mid-training"
    second = subprocess.run(train_command(config), capture_output=True, text=True, timeout=400, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resuming after epoch {saved}" in second.stdout
    progress = read_json(s3_server, f"{run}/progress.json")
    assert progress["resumedFromEpoch"] == saved and progress["state"] == "succeeded"
    assert [h["epoch"] for h in progress["history"]] == [1, 2, 3, 4, 5]
    state = read_json(s3_server, f"s3://{state_at}")
    assert state["trainedOn"]["base"] == 'teamnets.keras_cnn:build({"width": 16})'
    assert progress["modelUri"] == f"{run}/model/model.keras"
