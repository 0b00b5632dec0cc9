"""A preemption notice under real `mpirun -np 2` (Horovod): SIGTERM to one rank mid-epoch ends the run at the next
step with a checkpoint at that step, and the resumed run trains the rest of that epoch, each of its rows once."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyarrow import fs as pafs

from scalingrun_api.heartbeat import PREEMPTED_EXIT_CODE
from scalingrun_trainer.core.feature_cache import BATCH_LOG_ENV
from scalingrun_trainer.core.input_wait import READER_DELAY_ENV
from scalingrun_trainer.core.preemption import RANK_PIDS_DIR_ENV
from tests.support.horovod_train import BUCKET, dataset, read_json, s3, write_config  # noqa: F401 (fixtures)
from tests.support.mpirun import mpirun  # noqa: F401 (fixture)

pytestmark = [pytest.mark.horovod, pytest.mark.s3]

BATCH = 4  # per rank: about 25 steps per epoch of the fixture's training rows
SIGNAL_AT_STEP = 8  # of the second epoch, as rank 0 draws its batches


def batch_log(folder: Path, rank: int) -> list[tuple[int, int, list[int]]]:
    """(epoch, step, rows) of every training batch rank `rank` drew (SCALINGRUN_DIAGNOSTIC_BATCH_LOG)."""
    path = folder / f"rank-{rank}.log"
    if not path.exists():
        return []
    lines = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [(int(fields[0]), int(fields[1]), [int(r) for r in fields[2:]]) for fields in lines]


def rank_pid(pids: Path, rank: int) -> int:
    """The pid of the rank whose Open MPI rank is `rank`, among those the trainer noted (core/preemption.py)."""
    for entry in pids.iterdir():
        try:
            environ = Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in environ:
            return int(entry.name)
    raise AssertionError(f"no pid file of rank {rank} in {pids}: {sorted(p.name for p in pids.iterdir())}")


def test_a_sigterm_mid_epoch_checkpoints_at_the_next_step_and_the_resumed_epoch_sees_each_row_once(
        s3_server, dataset, mpirun, tmp_path):
    run = f"s3://{BUCKET}/runs/preempted"
    config = write_config(tmp_path, s3_server, dataset, run, maxEpochs=3, batchSizePerWorker=BATCH,
                          earlyStopping={"enabled": False})
    command = [*mpirun, sys.executable, "-m", "scalingrun_trainer.cli", "train", "--config", str(config)]
    first_log, second_log, pids = tmp_path / "batches-1", tmp_path / "batches-2", tmp_path / "pids"
    env = {**os.environ, **s3_server.env(), "TF_CPP_MIN_LOG_LEVEL": "2", RANK_PIDS_DIR_ENV: str(pids),
           READER_DELAY_ENV: "0.1"}  # slow steps, so that the signal lands well inside the epoch

    # The first attempt: SIGTERM to rank 1 only, once rank 0 draws the second epoch's SIGNAL_AT_STEP-th batch.
    out = tmp_path / "first.out"
    with open(out, "w") as stdout:
        first = subprocess.Popen(command, stdout=stdout, stderr=subprocess.STDOUT, text=True,
                                 env={**env, BATCH_LOG_ENV: str(first_log)}, start_new_session=True)
        try:
            deadline = time.monotonic() + 400
            while not any(epoch == 1 and step >= SIGNAL_AT_STEP for epoch, step, _ in batch_log(first_log, 0)):
                assert first.poll() is None, out.read_text()[-3000:]
                assert time.monotonic() < deadline, "the first attempt did not reach its second epoch in 400 s"
                time.sleep(0.05)
            os.kill(rank_pid(pids, 1), signal.SIGTERM)
            first.wait(timeout=120)
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
                first.wait()
    text = out.read_text()
    # mpirun passes on the ranks' exit code: the one the operator counts as an interruption, not a failure.
    assert first.returncode == PREEMPTED_EXIT_CODE, text[-3000:]
    state = read_json(s3_server, f"{run}/checkpoints/state.json")
    steps = int(re.search(r"(\d+) steps per epoch", text).group(1))
    assert state["epoch"] == 1 and 0 < state["step"] < steps, state  # inside the second epoch
    stopped = state["step"]
    assert state["checkpoint"] == f"epoch-00001-step-{stopped:05d}" and not state["finished"]
    folders = s3(s3_server).get_file_info(pafs.FileSelector(f"{BUCKET}/runs/preempted/checkpoints"))
    assert sorted(i.base_name for i in folders) == [state["checkpoint"], "state.json"]  # the epoch's was replaced
    # Both ranks stopped after the same step; rank 1, which got the signal, at the step boundary after it: the
    # steps lost are none of those trained before the notice, at most the one in flight when it came.
    for rank in (0, 1):
        assert f"preempted: every rank stopped after step {stopped} of epoch 2" in text, text[-3000:]
    noticed = [int(line.split("SIGTERM arrived here after step ")[1].split()[0])
               for line in text.splitlines() if "SIGTERM arrived here after step" in line]
    assert len(noticed) == 1 and 0 <= stopped - noticed[0] <= 1, (noticed, stopped)

    # The resumed attempt: it starts at that step and ends the run.
    second = subprocess.run(command, capture_output=True, text=True, timeout=400,
                            env={**env, BATCH_LOG_ENV: str(second_log)})
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"resuming at step {stopped} of epoch 2" in second.stdout
    progress = read_json(s3_server, f"{run}/progress.json")
    assert progress["state"] == "succeeded" and [h["epoch"] for h in progress["history"]] == [1, 2, 3]
    for rank in (0, 1):
        before = [(e, s, rows) for e, s, rows in batch_log(first_log, rank) if e == 1 and s < stopped]
        after = batch_log(second_log, rank)
        assert after[0][:2] == (1, stopped), after[:2]  # (a) from the step it stopped at
        resumed = [(e, s, rows) for e, s, rows in after if e == 1]
        # (c) the epoch's steps, each once, and its rows, each once: what it trained before plus what it trained after
        assert [s for _, s, _ in before + resumed] == list(range(steps))
        rows = [row for _, _, batch in before + resumed for row in batch]
        assert len(rows) == steps * BATCH and len(set(rows)) == len(rows)
        # Later epochs start from their first step.
        assert [s for e, s, _ in after if e == 2] == list(range(steps))
