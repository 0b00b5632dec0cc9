"""A Lightning + DDP run resized from 2 processes to 1 (issue 42): the same config (workers.replicas 2), one
process started; Lightning accumulates 2 micro-batches per update, so that the optimizer takes the full-size run's
updates per epoch at its learning rate, and each resumed epoch sees every training row once."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from scalingrun_trainer.core.feature_cache import BATCH_LOG_ENV
from tests.support.lightning_train import BUCKET, command, dataset, read_json, write_config  # noqa: F401 (fixtures)
from tests.support.preemption import batch_log
from tests.support.training import epoch_saved_before_a_rank_was_killed

pytestmark = [pytest.mark.lightning, pytest.mark.s3]


def optimizer_state(server, run: str) -> tuple[dict, str]:
    """state.json and the URI of the checkpoint file it names."""
    state = read_json(server, f"{run}/checkpoints/state.json")
    return state, f"{run}/checkpoints/{state['checkpoint']}/checkpoint.pt"


def updates_and_rate(python: str, server, checkpoint: str) -> tuple[int, float]:
    script = ("import io, sys, torch\nfrom pyarrow import fs as pafs\n"
              "s3 = pafs.S3FileSystem(endpoint_override=sys.argv[2], scheme='http')\n"
              "data = torch.load(io.BytesIO(s3.open_input_stream(sys.argv[1][5:]).read()), weights_only=True)\n"
              "optimizer = data['optimizer']\n"
              "print(int(next(iter(optimizer['state'].values()))['step']), optimizer['param_groups'][0]['lr'])\n")
    result = subprocess.run([python, "-c", script, checkpoint, server.endpoint], capture_output=True, text=True,
                            env={**os.environ, **server.env()}, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    updates, rate = result.stdout.split()
    return int(updates), float(rate)


def test_a_run_shrunk_from_2_to_1_process_takes_the_same_updates_and_every_row_once(s3_server, dataset, tmp_path,
                                                                                      mpirun, lightning_python):
    run = f"s3://{BUCKET}/runs/shrunk"
    env = {**os.environ, **s3_server.env()}
    # 200 training rows in updates of 2 x 20: 5 per epoch, each rank's shard once.
    config = write_config(tmp_path / "first.json", s3_server, dataset, run, maxEpochs=30, batchSizePerWorker=20,
                          earlyStopping={"enabled": False})
    saved = epoch_saved_before_a_rank_was_killed(command(mpirun, lightning_python, config), env, s3_server, run,
                                                 deadline_s=400, exit_s=120)
    assert 1 <= saved < 30
    state, checkpoint = optimizer_state(s3_server, run)
    full_updates, full_rate = updates_and_rate(lightning_python, s3_server, checkpoint)
    # 5 updates per epoch at the linear rate of 2 processes.
    assert full_updates == 5 * saved and full_rate == pytest.approx(0.002)

    config = write_config(tmp_path / "second.json", s3_server, dataset, run, maxEpochs=saved + 2,
                          batchSizePerWorker=20, earlyStopping={"enabled": False})
    one = [*mpirun[:mpirun.index("-np")], "-np", "1", *mpirun[mpirun.index("-np") + 2:]]
    log = tmp_path / "batches"
    second = subprocess.run(command(one, lightning_python, config), capture_output=True, text=True, timeout=600,
                            env={**env, BATCH_LOG_ENV: str(log)})
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert re.search(r"1 processes x batch 20 x 2 accumulated = effective batch 40; learning rate 0\.002; "
                     r"5 steps per epoch", second.stdout), second.stdout[-3000:]
    _, checkpoint = optimizer_state(s3_server, run)
    assert updates_and_rate(lightning_python, s3_server, checkpoint) == (5 * (saved + 2), pytest.approx(0.002))
    drawn = batch_log(log, 0)
    for epoch in (saved, saved + 1):
        batches = [(step, rows) for e, step, rows in drawn if e == epoch]
        assert [step for step, _ in batches] == list(range(10))  # 5 updates x 2 micro-batches
        assert sorted(row for _, batch in batches for row in batch) == list(range(200))  # every row once
