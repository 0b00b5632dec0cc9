"""The trainer tests' shared steps: preprocessed Fashion-MNIST in S3, a rank killed after its first checkpoint,
the saved Keras model checked against the best epoch's head."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def preprocessed_fashion_mnist(s3_server, bucket: str, per_class: int, size: int) -> str:
    """Fashion-MNIST JPEGs uploaded to `bucket`, preprocessed for 2 readers (20 % validation); the Parquet's URI."""
    import sys

    from scalingrun_operator.local.sample_data import fashion_mnist_jpegs

    s3_server.create_bucket(bucket)
    fs = s3_server.filesystem()
    for relative, data in fashion_mnist_jpegs(per_class):
        with fs.open_output_stream(f"{bucket}/jpeg/{relative}") as stream:
            stream.write(data)
    output = f"s3://{bucket}/parquet"
    result = subprocess.run(
        [sys.executable, "-m", "scalingrun_trainer.cli", "preprocess", "--source", f"s3://{bucket}/jpeg",
         "--output", output, "--image-size", str(size), "--max-readers", "2", "--validation-fraction", "0.2"],
        capture_output=True, text=True, env={**os.environ, **s3_server.env()}, timeout=300)
    assert result.returncode == 0, result.stderr
    return output


def kill_a_rank_after_the_first_checkpoint(job: subprocess.Popen, s3_server, state_at: str, deadline_s: float,
                                           exit_s: float) -> None:
    """Waits for the run's first committed checkpoint (`state_at`, bucket/key), then kills one of the two ranks
    (not mpirun), as a worker pod's loss kills the job, and waits for the job to end."""
    import signal
    import time

    import psutil
    from pyarrow import fs as pafs

    deadline = time.monotonic() + deadline_s
    try:
        while time.monotonic() < deadline and job.poll() is None:
            if s3_server.filesystem().get_file_info(state_at).type == pafs.FileType.File:
                break
            time.sleep(0.2)
        ranks = [p for p in psutil.Process(job.pid).children(recursive=True) if "scalingrun_trainer.cli" in
                 " ".join(p.cmdline())]
        assert len(ranks) == 2, "both ranks should be running after the first checkpoint"
        ranks[-1].kill()
        job.wait(timeout=exit_s)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


def kill_the_whole_job(job: subprocess.Popen) -> None:
    """SIGKILL to the job and every process under it at once, as a lost machine ends them. Killing the job's process
    group is not that: horovodrun starts the ranks in groups of their own and, when it dies, sends them SIGTERM,
    which the trainer takes for a preemption notice and answers with a checkpoint."""
    import signal

    import psutil

    try:
        below = psutil.Process(job.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        below = []
    os.killpg(job.pid, signal.SIGKILL)
    for process in below:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    job.wait()
    psutil.wait_procs(below, timeout=30)


def epoch_saved_before_a_rank_was_killed(command: list[str], env: dict[str, str], s3_server, run: str,
                                          deadline_s: float, exit_s: float) -> int:
    """The training `command` (2 ranks; `run`, s3://..., its run location) run with `env`, a rank killed after the
    first checkpoint (kill_a_rank_after_the_first_checkpoint): the job failed; the epoch that checkpoint saved."""
    import json

    job = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                           env=env)
    state_at = f"{run[len('s3://'):]}/checkpoints/state.json"
    kill_a_rank_after_the_first_checkpoint(job, s3_server, state_at, deadline_s=deadline_s, exit_s=exit_s)
    assert job.returncode != 0
    return json.loads(s3_server.filesystem().open_input_stream(state_at).read())["epoch"]


def the_one_mlflow_run(mlflow_server, experiment: str, progress: dict) -> tuple[dict, dict, dict, list[dict]]:
    """The experiment's one MLflow run, the one progress.json names, finished: its info, data, params and val_loss
    history."""
    from scalingrun_trainer.core.tracking import MlflowClient

    client = MlflowClient(mlflow_server.uri, username=mlflow_server.username, password=mlflow_server.password)
    runs = client.call("POST", "runs/search", {"experiment_ids": [client.experiment_id(experiment)]})["runs"]
    assert [r["info"]["run_id"] for r in runs] == [progress["mlflowRunId"]]
    info, data = runs[0]["info"], runs[0]["data"]
    assert info["status"] == "FINISHED"
    params = {p["key"]: p["value"] for p in data["params"]}
    history = client.call("GET", "metrics/get-history", {"run_id": info["run_id"], "metric_key": "val_loss"})["metrics"]
    return info, data, params, history


def saved_keras_model(s3_server, run: str, folder: Path):
    """The Keras run's model.keras (under the run location `run`, s3://...), loaded with plain Keras."""
    import tensorflow as tf

    model_file = folder / "model.keras"
    model_file.write_bytes(s3_server.filesystem().open_input_stream(f"{run}/model/model.keras"[len("s3://"):]).read())
    # compile=False: the file's optimizer may be Horovod's DistributedOptimizer, which plain Keras cannot rebuild.
    return tf.keras.models.load_model(model_file, compile=False)


def assert_saved_keras_model_is_the_whole_network_with_the_best_head(s3_server, run: str, folder: Path, size: int,
                                                                     base_layer: str):
    """The Keras run's saved model is the whole network (uint8 pixels in, the base, probabilities out) with the head
    of the best epoch, as its last checkpoint kept it (best.npz); returns the model."""
    import json

    import numpy as np

    fs = s3_server.filesystem()
    state = json.loads(fs.open_input_stream(f"{run}/checkpoints/state.json"[len("s3://"):]).read())
    assert state["bestWeights"], state
    best_file = folder / "best.npz"
    best_file.write_bytes(fs.open_input_stream(f"{run}/checkpoints/{state['checkpoint']}/best.npz"[len("s3://"):]).read())
    with np.load(best_file) as saved:
        best = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    model = saved_keras_model(s3_server, run, folder)
    assert model.input.dtype == "uint8" and tuple(model.input.shape) == (None, size, size, 3)
    assert model.get_layer("preprocess_input") and model.get_layer(base_layer)
    kernel, bias = model.get_layer("head").get_weights()
    np.testing.assert_array_equal(kernel, best[-2])
    np.testing.assert_array_equal(bias, best[-1])
    pixels = np.random.default_rng(0).integers(0, 256, (4, size, size, 3), dtype=np.uint8)
    np.testing.assert_allclose(model.predict(pixels, verbose=0).sum(axis=1), 1.0, rtol=1e-5)
    return model


def validation_split(s3_server, dataset: str, size: int):
    """The whole validation split of a preprocessed dataset (s3://...) as uint8 pixels and labels, read with pyarrow
    alone."""
    import json

    import numpy as np
    import pyarrow.parquet as pq

    fs, root = s3_server.filesystem(), dataset[len("s3://"):]
    manifest = json.loads(fs.open_input_stream(f"{root}/_manifest.json").read())
    tables = [pq.read_table(fs.open_input_file(f"{root}/{name}"), columns=["image", "label"])
              for name in manifest["files"]["validation"]]
    pixels = np.stack([np.frombuffer(image, np.uint8) for t in tables for image in t.column("image").to_pylist()])
    labels = np.array([label for t in tables for label in t.column("label").to_pylist()])
    return pixels.reshape(-1, size, size, 3), labels


def keras_scores(model, pixels, labels) -> "tuple[float, float]":
    """A saved Keras classifier's mean cross-entropy and accuracy on the given images."""
    import numpy as np
    import tensorflow as tf

    probabilities = model.predict(pixels, verbose=0)
    loss = float(tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, probabilities)))
    return loss, float(np.mean(probabilities.argmax(axis=1) == labels))
