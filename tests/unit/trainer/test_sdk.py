"""The SDK's contract without a launcher: context() from the rendered config, rank 0's progress document (the same
keys our trainers write), other ranks silent, an escaping exception reported on the run. Each case runs a script in
its own process, as a rank would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.parquet_table import SIDE
from tests.support.sdk import PROGRESS_KEYS, config  # noqa: F401 (fixtures)


def run_rank(config: Path, script: str, rank: int = 0, size: int = 2) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "SCALINGRUN_CONFIG": str(config), "OMPI_COMM_WORLD_RANK": str(rank),
           "OMPI_COMM_WORLD_SIZE": str(size), "OMPI_COMM_WORLD_LOCAL_RANK": str(rank),
           "OMPI_COMM_WORLD_LOCAL_SIZE": str(size)}
    if "PYTHONPATH" in os.environ:  # the sources under test, where they are not the installed ones
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run([sys.executable, "-c", "from scalingrun_trainer import sdk\n" + textwrap.dedent(script)],
                          capture_output=True, text=True, env=env, timeout=120)


def progress_of(config: Path) -> dict:
    location = json.loads(config.read_text())["runLocation"]
    return json.loads(Path(location, "progress.json").read_text())


def test_context_describes_the_rank_the_data_and_the_scaled_values(config):
    result = run_rank(config, """
        import json
        ctx = sdk.context()
        print(json.dumps({"rank": ctx.rank, "size": ctx.size, "local": ctx.local_rank, "lr": ctx.learning_rate,
                          "batch": ctx.batch_size_per_worker, "effective": ctx.effective_batch_size,
                          "steps": ctx.steps_per_epoch, "classes": ctx.num_classes, "image": ctx.image_column,
                          "label": ctx.label_column, "train": ctx.train_location, "files": ctx.train_files,
                          "params": ctx.params, "command": ctx.spec["training"]["command"],
                          "options": ctx.storage_options, "size_px": ctx.image_size}))
    """, rank=1)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.splitlines()[-1])
    table = str(config.parent / "table")
    assert (seen["rank"], seen["size"], seen["local"]) == (1, 2, 1)
    assert (seen["batch"], seen["effective"], seen["steps"]) == (8, 16, 40 // 16)
    assert seen["lr"] == pytest.approx(0.001 * 2 ** 0.5)  # sqrt scaling for 2 processes
    assert (seen["classes"], seen["image"], seen["label"], seen["size_px"]) == (3, "pixels", "y", SIDE)
    assert seen["train"] == f"{table}/train" and seen["files"] == [f"file://{table}/train/part-0.parquet"]
    assert seen["params"] == {"width": 4} and seen["command"] == ["python", "train.py"] and seen["options"] == {}


def test_rank_0_writes_the_same_progress_document_as_our_trainers(config):
    result = run_rank(config, """
        sdk.report_epoch(1, {"loss": 1.2, "val_loss": 1.0, "val_accuracy": 0.40}, 120.0, input_wait_fraction=0.5)
        sdk.report_epoch(2, {"loss": 0.9, "val_loss": 1.1, "val_accuracy": 0.55}, 130.0, input_wait_fraction=0.4)
        sdk.report_epoch(3, {"loss": 0.7, "val_loss": 0.8, "val_accuracy": 0.50}, 140.0)
        sdk.finish("file:///models/m.keras")
    """)
    assert result.returncode == 0, result.stderr
    progress = progress_of(config)
    assert set(progress) == PROGRESS_KEYS
    assert (progress["state"], progress["epoch"], progress["maxEpochs"], progress["processes"]) == (
        "succeeded", 3, 3, 2)
    assert progress["bestEpoch"] == 2 and progress["bestMetrics"]["val_accuracy"] == 0.55  # monitor val_accuracy
    assert [h["epoch"] for h in progress["history"]] == [1, 2, 3] and progress["imagesPerSecond"] == 140.0
    assert progress["modelUri"] == "file:///models/m.keras" and progress["error"] is None
    assert [e["inputWaitFraction"] for e in progress["inputHistory"]] == [0.5, 0.4]
    assert (progress["effectiveBatchSize"], progress["batchSizePerWorker"]) == (16, 8)
    assert "epoch 2/3: loss=0.9000 val_loss=1.1000 val_accuracy=0.5500 (130 img/s, input wait 40%)" in result.stdout


def test_the_scripts_loop_beats_on_rank_0_only(config):
    script = """
        sdk.context()
        sdk.run._session.heartbeat.phase_floor = 0  # the first beat after "starting" is written at once
        sdk.heartbeat(1, 0)
        sdk.heartbeat(7, 0)  # within the interval: not written
        sdk.report_epoch(1, {"loss": 1.0}, 10.0)
    """
    location = Path(json.loads(config.read_text())["runLocation"])
    assert run_rank(config, script, rank=1).returncode == 0
    assert not (location / "heartbeat.json").exists()
    result = run_rank(config, script)
    assert result.returncode == 0, result.stderr
    beat = json.loads((location / "heartbeat.json").read_text())
    assert (beat["phase"], beat["step"], beat["epoch"], beat["rank"]) == ("training", 1, 0, 0)
    assert beat["time"] >= beat["attemptStarted"] > 0


def test_other_ranks_write_nothing(config):
    result = run_rank(config, """
        sdk.report_epoch(1, {"loss": 1.0}, 10.0)
        sdk.finish()
        raise RuntimeError("rank 1 fails")
    """, rank=1)
    assert result.returncode == 1 and "rank 1 fails" in result.stderr
    location = json.loads(config.read_text())["runLocation"]
    assert not Path(location, "progress.json").exists() and "epoch 1" not in result.stdout


def test_an_escaping_exception_is_the_runs_error(config):
    result = run_rank(config, """
        sdk.report_epoch(1, {"loss": 1.0, "val_loss": 1.0}, 10.0)
        import numpy
        numpy.zeros((2, 3)) @ numpy.zeros((2, 3))
    """)
    assert result.returncode == 1 and "Traceback" in result.stderr  # Python's own report is kept
    progress = progress_of(config)
    assert progress["state"] == "failed" and progress["epoch"] == 1
    assert progress["error"].startswith("ValueError: matmul: Input operand 1 has a mismatch")


def test_without_a_config_the_error_says_how_to_run_the_script(tmp_path):
    result = run_rank(tmp_path / "absent.json", "sdk.context()")
    assert result.returncode == 1
    assert "cannot read the run's trainer config" in result.stderr and "SCALINGRUN_CONFIG" in result.stderr


def test_importing_the_sdk_loads_no_framework():
    code = ("import sys\nfrom scalingrun_trainer import sdk\n"
            "print(sorted(m for m in ('tensorflow', 'torch', 'horovod', 'kopf', 'mpi4py') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr


def test_the_sdks_tf_readers_read_this_ranks_share_of_the_table(config):
    result = run_rank(config, """
        import json
        ctx = sdk.context()
        train = [(x.shape.as_list(), x.dtype.name, y.dtype.name) for x, y in sdk.tf_dataset("train").take(3)]
        rows = sum(int(y.shape[0]) for _, y in sdk.tf_dataset("validation"))
        sdk.finish()
        print(json.dumps({"train": train, "rows": rows, "batch": ctx.batch_size_per_worker, "side": ctx.image_size}))
    """, rank=1)
    assert result.returncode == 0, result.stderr[-3000:]
    read = json.loads(result.stdout.strip().splitlines()[-1])
    assert read["train"] == [[[read["batch"], read["side"], read["side"], 3], "uint8", "int32"]] * 3
    assert 0 < read["rows"] < 20  # rank 1's share of the table's 20 validation rows
