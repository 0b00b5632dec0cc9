"""training.command with PyTorch Lightning, real processes: the team's own Lightning script (examples/custom-training,
on the SDK's torch readers and Lightning callback) runs under `mpirun -np 2` through the quick start, with the
Lightning venv's python, and reports as our trainer does."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.quickstart import example_spec, run_quickstart, trained
from tests.support.sdk import config

pytestmark = [pytest.mark.lightning, pytest.mark.s3]
ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "examples/custom-training"


def test_the_teams_lightning_script_trains_on_the_sdks_readers(tmp_path, lightning_python):
    spec = example_spec(PACKAGE / "quickstart-lightning.yaml", batchSizePerWorker=32, maxEpochs=3)
    state = tmp_path / "state"
    result = run_quickstart(spec, tmp_path / "script.yaml", state, 100,
                            {"PYTHONPATH": str(PACKAGE), "SCALINGRUN_LIGHTNING_PYTHON": lightning_python})
    line = trained(result, 3, done="3")
    print(f"team script (Lightning DDP, SDK readers and callback), 2 processes, 3 epochs: val_accuracy "
          f"{line.group(3)}, {line.group(4)} img/s")
    status = json.loads((state / "runs/quickstart-team-script-lightning/status.json").read_text())
    assert status["phase"] == "Succeeded"
    training = status["training"]
    assert (training["epoch"], training["processes"], training["effectiveBatchSize"]) == (3, 2, 64)
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(training["metrics"])
    # Rank 0 only reported (one line per epoch), and the script's ranks were Lightning's DDP ranks.
    assert len(re.findall(r"^epoch 1/3: ", result.stdout, re.M)) == 1
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in result.stdout + result.stderr


SDK_READERS = """
import json, threading
from scalingrun_trainer import sdk

ctx = sdk.context()
train = sdk.torch_batches("train")
epochs = [[(str(x.dtype), tuple(x.shape), str(y.dtype)) for x, y in train] for _ in range(2)]
rows = sum(len(y) for _, y in sdk.torch_batches("validation"))
sdk.finish()  # stops the train batches' prefetching thread and reader
print(json.dumps({"epochs": epochs, "steps": ctx.steps_per_epoch, "validation_rows": rows,
                  "side": ctx.image_size, "batch": ctx.batch_size_per_worker,
                  "prefetching": [t.name for t in threading.enumerate() if t.name == "scalingrun-batches"]}))
"""


def test_the_sdks_torch_readers_read_this_ranks_share_and_finish_stops_them(config, lightning_python):
    env = {"PATH": "/usr/bin:/bin", "SCALINGRUN_CONFIG": str(config), "OMPI_COMM_WORLD_RANK": "1",
           "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    result = subprocess.run([lightning_python, "-c", SDK_READERS], capture_output=True, text=True, env=env,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    read = json.loads(result.stdout.strip().splitlines()[-1])
    side, batch = read["side"], read["batch"]
    assert read["steps"] > 0 and [len(epoch) for epoch in read["epochs"]] == [read["steps"]] * 2
    assert all(b == ["torch.uint8", [batch, side, side, 3], "torch.int64"] for epoch in read["epochs"] for b in epoch)
    assert 0 < read["validation_rows"] < 20  # rank 1's share of the table's 20 validation rows
    assert read["prefetching"] == []
