"""A preemption notice under real `mpirun -np 2` (Keras + MultiWorkerMirroredStrategy): as for Horovod
(tests/support/preemption.py), with every rank writing the checkpoint (a collective) and rank 0's kept."""

from __future__ import annotations

import os

import pytest

from tests.support.mirrored_train import SIZE, command, environment, without_horovod, write_config  # noqa: F401
from tests.support.preemption import BATCH, preempt_and_resume
from tests.support.training import preprocessed_fashion_mnist

pytestmark = [pytest.mark.mirrored, pytest.mark.s3]
BUCKET = "mirrored-preempted"


@pytest.fixture(scope="module")
def dataset(s3_server) -> str:
    return preprocessed_fashion_mnist(s3_server, BUCKET, per_class=24, size=SIZE)


def test_a_sigterm_mid_epoch_checkpoints_at_the_next_step_and_the_resumed_epoch_sees_each_row_once(
        s3_server, dataset, mpirun, without_horovod, tmp_path):
    run = f"s3://{BUCKET}/runs/preempted"
    config = write_config(tmp_path / "config.json", s3_server, dataset, run, maxEpochs=3, batchSizePerWorker=BATCH,
                          earlyStopping={"enabled": False})
    env = environment(s3_server, without_horovod)
    preempt_and_resume(command(mpirun, config, env), {**os.environ, **env}, s3_server, run, tmp_path)
