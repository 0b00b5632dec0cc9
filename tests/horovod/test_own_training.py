"""training.command with real processes: the team's own Keras + Horovod script (examples/custom-training, on the
SDK's context/report_epoch/finish only) runs under `mpirun -np 2` through the quick start; its status and progress
document are as complete as our trainer's, a ScalingSweep of it fills its table, and an exception in the script
fails the run with its message."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.quickstart import example_spec, run_quickstart, team_package, trained
from tests.support.sdk import PROGRESS_KEYS

pytestmark = [pytest.mark.horovod, pytest.mark.s3]
ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "examples/custom-training"


@pytest.fixture(scope="module")
def state(tmp_path_factory) -> Path:
    """One quick-start state for the module: the JPEGs are uploaded and preprocessed once, then reused."""
    return tmp_path_factory.mktemp("quickstart")


def quickstart(state: Path, spec: dict, tmp_path: Path, *extra: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return run_quickstart(spec, tmp_path / f"{spec['metadata']['name']}.yaml", state, 100,
                          {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(PACKAGE)}, *extra, timeout=timeout)


def team_script(**training) -> dict:
    return example_spec(PACKAGE / "quickstart.yaml", **{"batchSizePerWorker": 32, "maxEpochs": 3, **training})


def test_the_teams_script_trains_and_reports_like_our_trainer(state, tmp_path):
    result = quickstart(state, team_script(), tmp_path)
    line = trained(result, 3, done="3")
    out = result.stdout + result.stderr
    assert "training: " in out and "-np 2" in out and "python -m teamtrain.keras_horovod" in out
    print(f"team script (Keras + Horovod, SDK), 2 processes, 3 epochs: val_accuracy {line.group(3)}, "
          f"{line.group(4)} img/s")
    status = json.loads((state / "runs/quickstart-team-script/status.json").read_text())
    assert status["phase"] == "Succeeded"
    training = status["training"]
    assert (training["epoch"], training["maxEpochs"], training["processes"]) == (3, 3, 2)
    assert (training["effectiveBatchSize"], training["batchSizePerWorker"]) == (64, 32)
    assert training["learningRate"] == pytest.approx(0.002) and training["imagesPerSecond"] > 0
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(training["metrics"])
    assert status["modelUri"].endswith("/runs/quickstart-team-script/model/model.keras")
    # The progress document itself, read from the quick start's S3 server: every key our trainer writes.
    progress = _progress(state, status["modelUri"].rsplit("/model/", 1)[0] + "/progress.json")
    assert set(progress) == PROGRESS_KEYS and progress["state"] == "succeeded"
    assert [h["epoch"] for h in progress["history"]] == [1, 2, 3]
    report = state / "reports" / "quickstart-team-script-report.md"
    assert re.search(r"^\| 3 (\*\*best\*\* )?\| ", report.read_text(), re.M)  # the report's row of epoch 3


def test_a_sweep_of_the_teams_script_fills_its_table(state, tmp_path):
    result = quickstart(state, team_script(maxEpochs=2), tmp_path, "--sweep", "1,2", timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads((state / "sweeps/quickstart-team-script/status.json").read_text())["points"]
    assert [r["workers"] for r in rows] == [1, 2]
    for row in rows:
        assert row["phase"] == "Succeeded" and row["epochs"] == 2
        assert 0 <= row["bestValAccuracy"] <= 1 and row["imagesPerSecond"] > 0 and row["secondsPerEpoch"] > 0
    assert re.search(r"recommended: \d workers?", result.stdout), result.stdout[-2000:]


def test_an_exception_in_the_script_fails_the_run_with_its_message(state, tmp_path):
    # Every rank raises once rank 0's epoch report is written (a file says so): a rank 1 that raised first had mpirun
    # stop rank 0 before its report in a CI run, and the status had no epoch.
    reported = tmp_path / "rank-0-reported"
    package = team_package(tmp_path, "brokentrain", "train",
                           "import os, pathlib, time\n"
                           "from scalingrun_trainer import sdk\n"
                           "ctx = sdk.context()\n"
                           "sdk.report_epoch(1, {'loss': 2.0}, 100.0)\n"
                           "reported = pathlib.Path(os.environ['RANK_0_REPORTED'])\n"
                           "if ctx.rank == 0:\n"
                           "    reported.touch()\n"
                           "deadline = time.monotonic() + 300\n"
                           "while not reported.exists() and time.monotonic() < deadline:\n"
                           "    time.sleep(0.1)\n"
                           "raise RuntimeError(f'the team forgot a file (rank {ctx.rank} of {ctx.size})')\n")
    spec = team_script(command=["python", "-m", "brokentrain.train"])
    spec["metadata"]["name"] = "quickstart-broken-script"
    result = run_quickstart(spec, tmp_path / "broken.yaml", state, 100,
                            {"PYTHONPATH": str(package), "RANK_0_REPORTED": str(reported)}, timeout=600)
    assert result.returncode != 0
    status = json.loads((state / "runs/quickstart-broken-script/status.json").read_text())
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    # The run's failure is named by rank 0's report, or by the exit of the rank that stopped first (under load, rank 1
    # may exit before rank 0 has written its report): either way with the script's own error.
    assert re.search(r"trainer reported: RuntimeError: the team forgot a file \(rank 0 of 2\)|TrainerExited: rank "
                     r"(\d) exited with code 1: RuntimeError: the team forgot a file \(rank \1 of 2\)",
                     failed["message"]), failed
    assert status["training"]["epoch"] == 1 and "modelUri" not in status


def _progress(state: Path, uri: str) -> dict:
    from pyarrow import fs as pafs

    from scalingrun_operator.local.s3server import S3Server

    keys = json.loads((state / "credentials.json").read_text())
    server = S3Server(state / "seaweedfs", keys["accessKey"], keys["secretKey"])
    server.start()
    try:
        s3 = server.filesystem()
        assert isinstance(s3, pafs.S3FileSystem)
        return json.loads(s3.open_input_stream(uri[len("s3://"):]).read())
    finally:
        server.stop()
