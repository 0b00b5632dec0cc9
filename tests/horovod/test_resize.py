"""A run resized to fewer processes than its spec's (issue 42): the Horovod engine accumulates gradients, so that
the effective batch, the learning rate and the updates per epoch stay the full-size run's, and the resumed epochs
see every training row once."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.horovod_train import BUCKET, dataset, write_config  # noqa: F401 (fixtures)
from tests.support.horovodrun import horovodrun
from tests.support.mpirun import mpirun  # noqa: F401 (fixture)
from tests.support.preemption import batch_log
from tests.support.training import epoch_saved_before_a_rank_was_killed
from scalingrun_trainer.core.feature_cache import BATCH_LOG_ENV
from scalingrun_trainer.core.input_wait import READER_DELAY_ENV

pytestmark = [pytest.mark.horovod]
HERE = Path(__file__).parent
HEADING = re.compile(r"(\d+) processes x batch (\d+)(?: x (\d+) accumulated)? = effective batch (\d+); "
                     r"learning rate ([\d.e-]+); (\d+) steps per epoch")


def test_accumulated_micro_batches_update_once_per_k_and_equal_one_large_batch():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([horovodrun(), "-np", "1", "-H", "localhost:1", "--gloo", sys.executable,
                             str(HERE / "accumulation_worker.py")], capture_output=True, text=True, timeout=300,
                            env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found = json.loads(re.search(r"RESULT (.*)", result.stdout).group(1))
    assert found["changed"] == [2, 4]  # an update after every second micro-batch, none between
    assert found["moved"] > 1e-3 and found["difference"] < 1e-6, found  # the same as 2 batches of 16


@pytest.mark.s3
def test_a_run_shrunk_from_2_to_1_process_keeps_the_batch_the_updates_and_every_row_once(s3_server, dataset,
                                                                                            tmp_path, mpirun):
    run = f"s3://{BUCKET}/runs/shrunk"
    env = {**os.environ, **s3_server.env(), "TF_CPP_MIN_LOG_LEVEL": "2"}
    # 200 training rows in updates of 2 x 20: 5 per epoch, each rank's shard once. Slow steps, many epochs: a rank
    # is killed while the run trains, after its first checkpoint.
    config = write_config(tmp_path, s3_server, dataset, run, maxEpochs=30, batchSizePerWorker=20,
                          earlyStopping={"enabled": False})
    train = [sys.executable, "-m", "scalingrun_trainer.cli", "train", "--config", str(config)]
    saved = epoch_saved_before_a_rank_was_killed([*mpirun, *train], {**env, READER_DELAY_ENV: "0.1"},
                                                 s3_server, run, deadline_s=400, exit_s=120)
    assert 1 <= saved < 30
    log = tmp_path / "batches"
    # The operator's resize: the same spec (workers.replicas 2), one process started (a lower maxEpochs keeps the
    # test short).
    write_config(tmp_path, s3_server, dataset, run, maxEpochs=saved + 2, batchSizePerWorker=20,
                 earlyStopping={"enabled": False})
    one = [*mpirun[:mpirun.index("-np")], "-np", "1", *mpirun[mpirun.index("-np") + 2:]]
    resumed = subprocess.run([*one, *train], capture_output=True, text=True, timeout=400,
                             env={**env, BATCH_LOG_ENV: str(log)})
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    processes, micro, accumulation, effective, rate, steps = HEADING.search(resumed.stdout).groups()
    # The 2-process run's: 20 x 2 = 40 per update, linear rate 0.002, 200 // 40 = 5 updates per epoch.
    assert (processes, micro, accumulation, effective, steps) == ("1", "20", "2", "40", "5")
    assert float(rate) == pytest.approx(0.002)
    drawn = batch_log(log, 0)
    for epoch in (saved, saved + 1):
        batches = [(step, rows) for e, step, rows in drawn if e == epoch]
        assert [step for step, _ in batches] == list(range(10))  # 5 updates x 2 micro-batches
        rows = [row for _, batch in batches for row in batch]
        assert sorted(rows) == list(range(200))  # every training row once
