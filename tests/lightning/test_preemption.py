"""A preemption notice under real `mpirun -np 2` (PyTorch Lightning + DDP over gloo): as for the Keras engines
(tests/support/preemption.py), with Lightning's own SIGTERM handler replaced by the ranks' agreement."""

from __future__ import annotations

import os

import pytest

from tests.support.lightning_train import command, dataset, write_config  # noqa: F401 (fixtures)
from tests.support.lightning_train import BUCKET
from tests.support.preemption import BATCH, preempt_and_resume

pytestmark = [pytest.mark.lightning, pytest.mark.s3]


def test_a_sigterm_mid_epoch_checkpoints_at_the_next_step_and_the_resumed_epoch_sees_each_row_once(
        s3_server, dataset, mpirun, lightning_python, tmp_path):
    run = f"s3://{BUCKET}/runs/preempted"
    config = write_config(tmp_path / "config.json", s3_server, dataset, run, maxEpochs=3, batchSizePerWorker=BATCH,
                          earlyStopping={"enabled": False})
    preempt_and_resume(command(mpirun, lightning_python, config), {**os.environ, **s3_server.env()}, s3_server, run,
                       tmp_path)
