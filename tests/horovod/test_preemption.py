"""A preemption notice under real `mpirun -np 2` (Keras + Horovod): SIGTERM to one rank mid-epoch ends the run at
the next step with a checkpoint at that step, and the resumed run trains the rest of that epoch, each row once."""

from __future__ import annotations

import os
import sys

import pytest

from tests.support.horovod_train import BUCKET, dataset, write_config  # noqa: F401 (fixtures)
from tests.support.mpirun import mpirun  # noqa: F401 (fixture)
from tests.support.preemption import BATCH, preempt_and_resume

pytestmark = [pytest.mark.horovod, pytest.mark.s3]


def test_a_sigterm_mid_epoch_checkpoints_at_the_next_step_and_the_resumed_epoch_sees_each_row_once(
        s3_server, dataset, mpirun, tmp_path):
    run = f"s3://{BUCKET}/runs/preempted"
    config = write_config(tmp_path, s3_server, dataset, run, maxEpochs=3, batchSizePerWorker=BATCH,
                          earlyStopping={"enabled": False})
    command = [*mpirun, sys.executable, "-m", "scalingrun_trainer.cli", "train", "--config", str(config)]
    preempt_and_resume(command, {**os.environ, **s3_server.env(), "TF_CPP_MIN_LOG_LEVEL": "2"}, s3_server, run,
                       tmp_path)
