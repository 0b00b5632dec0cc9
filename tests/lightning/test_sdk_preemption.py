"""The SDK's LightningCallback(save=...) under real `mpirun -np 2` (DDP over gloo): a SIGTERM to rank 1 alone stops
both ranks after the same step with rank 0's checkpoint there, exit 76: Lightning's own SIGTERM handler, which
would stop rank 1 alone, is replaced at train start."""

from __future__ import annotations

import os
import subprocess

import pytest

from scalingrun_trainer.core.preemption import RANK_PIDS_DIR_ENV
from scalingrun_trainer.sdk.context import CONFIG_VARIABLE
from tests.support.preemption import check_script_stopped, stop_script_mid_epoch
from tests.support.sdk import config  # noqa: F401 (fixture)

pytestmark = pytest.mark.lightning

STEPS = 200  # per epoch and rank: 800 rows, 4 a batch, 2 ranks each reading them all (no sampler: a test's data)

SCRIPT = """
import sys, time
from pathlib import Path
import pytorch_lightning as pl
import torch
from scalingrun_trainer import sdk

out = Path(sys.argv[1])
ctx = sdk.context()


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        time.sleep(0.02)  # a step long enough for the signal to land mid-epoch
        features, labels = batch
        return torch.nn.functional.cross_entropy(self.layer(features), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Position(pl.Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        (out / f"rank-{ctx.rank}").write_text(f"{trainer.current_epoch} {batch_idx + 1}")


def save(epoch, step):
    (out / "saved").write_text(f"{epoch} {step} {ctx.rank}")


torch.manual_seed(0)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(800, 4), torch.randint(0, 2, (800,))),
                                   batch_size=4)
trainer = pl.Trainer(**sdk.lightning_trainer_kwargs(), max_epochs=3, use_distributed_sampler=False, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     callbacks=[Position(), sdk.LightningCallback(save=save)])
trainer.fit(Net(), data)
print("done", flush=True)
"""


def test_a_sigterm_to_one_rank_stops_every_rank_at_the_same_step_with_the_scripts_checkpoint(
        config, mpirun, lightning_python, tmp_path):  # noqa: F811
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, CONFIG_VARIABLE: str(config), RANK_PIDS_DIR_ENV: str(tmp_path / "pids"),
           "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen([*mpirun, lightning_python, str(script), str(tmp_path)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    output, noticed = stop_script_mid_epoch(first, tmp_path, tmp_path / "pids")
    check_script_stopped(first, output, tmp_path, noticed, steps=STEPS)
    assert "done" not in output
