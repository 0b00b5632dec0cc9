"""sdk.lightning_trainer_kwargs() under the real mpirun -np 2 on one host: the Trainer it configures sees two ranks
of one node, where the habit of Horovod scripts (devices=1 per process) fails on rank 1 with Lightning's IndexError
(issue 31 item 11). And that failure ends the job instead of hanging it (issue 29): rank 1 exits, mpirun stops
rank 0, which waited for it in DDP's rendezvous."""

from __future__ import annotations

import json
import os
import subprocess

import time

import pytest

from tests.support.sdk import config

pytestmark = pytest.mark.lightning

SCRIPT = """
import json
import sys
import pytorch_lightning as pl
from pytorch_lightning.strategies import DDPStrategy
from scalingrun_trainer import sdk

quiet = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
try:  # as a script ported from Horovod writes it
    ported = pl.Trainer(accelerator="cpu", devices=1,
                        strategy=DDPStrategy(cluster_environment=sdk.lightning_mpi_environment()), **quiet)
    habit = str(ported.strategy.root_device)  # this rank's device, which fit() sets up first
except Exception as exc:
    habit = type(exc).__name__
kwargs = sdk.lightning_trainer_kwargs()
trainer = pl.Trainer(**kwargs, **quiet)
# One write per rank (print writes the text and its newline apart when unbuffered, and mpirun may put the other
# rank's line between them).
sys.stdout.write(json.dumps({"habit": habit, "rank": trainer.global_rank, "localRank": trainer.local_rank,
                             "world": trainer.world_size, "devices": kwargs["devices"], "nodes": kwargs["num_nodes"],
                             "accelerator": kwargs["accelerator"], "strategy": type(trainer.strategy).__name__,
                             "device": str(trainer.strategy.root_device)}) + "\\n")
sys.stdout.flush()
"""


def json_objects(output: str) -> list[dict]:
    """The JSON objects the ranks wrote (the lines that start with one), also when mpirun put two on one line."""
    decoder, objects = json.JSONDecoder(), []
    for line in output.splitlines():
        position = 0
        while line.startswith("{", position):
            document, position = decoder.raw_decode(line, position)
            objects.append(document)
    return objects


def test_the_trainer_kwargs_give_lightning_the_mpi_world(mpirun, lightning_python):
    result = subprocess.run([*mpirun, lightning_python, "-c", SCRIPT], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PL_DISABLE_FORK": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    seen = sorted(json_objects(result.stdout), key=lambda s: s["rank"])
    assert [(s["rank"], s["localRank"], s["world"]) for s in seen] == [(0, 0, 2), (1, 1, 2)]
    assert all((s["devices"], s["nodes"], s["strategy"]) == (2, 1, "DDPStrategy") for s in seen)
    assert seen[0]["accelerator"] in ("cpu", "gpu") and all(s["device"] for s in seen)
    assert seen[1]["habit"] == "IndexError"  # what the kwargs spare a ported script


PORTED = """
import pytorch_lightning as pl
import torch
from pytorch_lightning.strategies import DDPStrategy
from scalingrun_trainer import sdk

class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3, 2)

    def training_step(self, batch, index):
        pixels, labels = batch
        return torch.nn.functional.cross_entropy(self.layer(pixels.float().mean((1, 2))), labels % 2)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

ctx = sdk.context()
trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     strategy=DDPStrategy(cluster_environment=sdk.lightning_mpi_environment(),
                                          process_group_backend="gloo"))
trainer.fit(Tiny(), sdk.torch_batches("train"))
"""


def test_a_ported_script_whose_rank_1_raises_ends_the_job(mpirun, lightning_python, config):  # noqa: F811
    started = time.monotonic()
    result = subprocess.run([*mpirun, lightning_python, "-c", PORTED], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "SCALINGRUN_CONFIG": str(config)})
    print(f"Lightning, rank 1 raised at start-up: mpirun exited {result.returncode} after "
          f"{time.monotonic() - started:.1f} s")
    assert result.returncode != 0
    assert "IndexError: list index out of range" in result.stderr, result.stderr[-3000:]
    assert "Exit code:    1" in result.stderr  # mpirun's account of the rank that exited
