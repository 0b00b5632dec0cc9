"""Keras + MultiWorkerMirroredStrategy started on 1 process for a spec of 2 (a run the operator resized, issue 42):
the strategy cannot accumulate, so the replica takes the 2 micro-batches of an update as one batch; the effective
batch, the learning rate, the updates per epoch and the rows of each epoch stay the 2-process run's."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from scalingrun_trainer.core.feature_cache import BATCH_LOG_ENV
from tests.support.mirrored_train import SIZE, command, environment, without_horovod, write_config  # noqa: F401
from tests.support.preemption import batch_log
from tests.support.training import preprocessed_fashion_mnist

pytestmark = [pytest.mark.mirrored, pytest.mark.s3]
BUCKET = "mirrored-resized"


@pytest.fixture(scope="module")
def dataset(s3_server) -> str:
    return preprocessed_fashion_mnist(s3_server, BUCKET, per_class=24, size=SIZE)


def test_one_process_of_a_two_process_spec_takes_the_spec_batch_rate_and_updates(s3_server, dataset, mpirun,
                                                                                 without_horovod, tmp_path):
    run = f"s3://{BUCKET}/runs/resized"
    config = write_config(tmp_path / "config.json", s3_server, dataset, run, maxEpochs=2, batchSizePerWorker=20,
                          earlyStopping={"enabled": False})
    env = environment(s3_server, without_horovod)
    one = [*mpirun[:mpirun.index("-np")], "-np", "1", *mpirun[mpirun.index("-np") + 2:]]
    log = tmp_path / "batches"
    result = subprocess.run(command(one, config, env), capture_output=True, text=True, timeout=600,
                            env={**os.environ, **env, BATCH_LOG_ENV: str(log)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # The spec's 2 x 20 per update at its linear rate; 200 training rows: 5 updates per epoch.
    assert re.search(r"1 replicas x batch 40 = effective batch 40; learning rate 0\.002; 5 steps per epoch",
                     result.stdout), result.stdout[-3000:]
    drawn = batch_log(log, 0)
    for epoch in (0, 1):
        batches = [rows for e, _, rows in drawn if e == epoch]
        assert len(batches) == 5 and sorted(row for batch in batches for row in batch) == list(range(200))
