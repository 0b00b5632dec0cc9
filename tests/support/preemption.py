"""A preemption notice under a real launcher, for every Keras engine's test: SIGTERM to rank 1 only, mid-epoch;
what the run saved; the resumed run; which rows each rank drew (SCALINGRUN_DIAGNOSTIC_BATCH_LOG)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from pyarrow import fs as pafs

from scalingrun_api.heartbeat import PREEMPTED_EXIT_CODE
from scalingrun_trainer.core.feature_cache import BATCH_LOG_ENV
from scalingrun_trainer.core.input_wait import READER_DELAY_ENV
from scalingrun_trainer.core.preemption import RANK_PIDS_DIR_ENV
from tests.support.operator import read_json

BATCH = 4  # per rank: about 25 steps per epoch of the tests' 240 images
SIGNAL_AT_STEP = 8  # of the second epoch, as rank 0 draws its batches


def batch_log(folder: Path, rank: int) -> list[tuple[int, int, list[int]]]:
    """(epoch, step, rows) of every training batch rank `rank` drew."""
    path = folder / f"rank-{rank}.log"
    if not path.exists():
        return []
    lines = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [(int(fields[0]), int(fields[1]), [int(r) for r in fields[2:]]) for fields in lines]


def rank_pid(pids: Path, rank: int) -> int:
    """The pid of Open MPI rank `rank`, among those the trainer noted (core/preemption.py)."""
    for entry in pids.iterdir():
        try:
            environ = Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in environ:
            return int(entry.name)
    raise AssertionError(f"no pid file of rank {rank} in {pids}: {sorted(p.name for p in pids.iterdir())}")


def preempt_and_resume(command: list[str], env: dict[str, str], s3_server, run: str, tmp_path: Path) -> None:
    """Runs `command` (mpirun of the trainer, maxEpochs 3, batchSizePerWorker BATCH, cached features) until rank 0
    draws the second epoch's SIGNAL_AT_STEP-th batch, sends rank 1 alone SIGTERM, checks what was saved, runs it
    again, and checks that the resumed epoch went on from the step saved with each of its rows once."""
    first_log, second_log, pids = tmp_path / "batches-1", tmp_path / "batches-2", tmp_path / "pids"
    env = {**env, RANK_PIDS_DIR_ENV: str(pids), READER_DELAY_ENV: "0.1"}  # slow steps: the signal lands mid-epoch
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
    steps = int(re.search(r"(\d+) steps per epoch", text).group(1))
    state = read_json(s3_server, f"{run}/checkpoints/state.json")
    assert state["epoch"] == 1 and 0 < state["step"] < steps, state  # inside the second epoch
    stopped = state["step"]
    assert state["checkpoint"] == f"epoch-00001-step-{stopped:05d}" and not state["finished"]
    bucket_path = run[len("s3://"):]
    folders = s3_server.filesystem().get_file_info(pafs.FileSelector(f"{bucket_path}/checkpoints"))
    assert sorted(i.base_name for i in folders) == [state["checkpoint"], "state.json"]  # the epoch's was replaced
    # Both ranks stopped after the same step; rank 1, which got the signal, at the step boundary after it: none of
    # the steps trained before the notice is lost, at most the one in flight when it came.
    assert len(re.findall(rf"preempted: every rank stopped after step {stopped} of epoch 2", text)) == 2, text[-3000:]
    noticed = [int(n) for n in re.findall(r"SIGTERM arrived here after step (\d+) of epoch 2", text)]
    assert len(noticed) == 1 and 0 <= stopped - noticed[0] <= 1, (noticed, stopped)

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
        # (c) the epoch's steps once each, and its rows once each: those trained before plus those after
        assert [s for _, s, _ in before + resumed] == list(range(steps))
        rows = [row for _, _, batch in before + resumed for row in batch]
        assert len(rows) == steps * BATCH and len(set(rows)) == len(rows)
        assert [s for e, s, _ in after if e == 2] == list(range(steps))  # the next epoch from its first step


# --- the SDK's step_boundary (scripts of the user's own: each rank writes `epoch step` to rank-N after each step) ---


def script_position(out: Path, rank: int) -> tuple[int, int]:
    """(epoch, step) rank `rank` of a test script last wrote after a step; (-1, 0) before its first."""
    try:
        epoch, step = (out / f"rank-{rank}").read_text().split()
    except (OSError, ValueError):
        return -1, 0
    return int(epoch), int(step)


def stop_script_mid_epoch(process: subprocess.Popen, out: Path, pids: Path, at: tuple[int, int] = (1, 5),
                          timeout: float = 300) -> tuple[str, tuple[int, int]]:
    """Once rank 0 of `process` (the script under mpirun, output piped) passed `at`, SIGTERM to rank 1 alone; its
    output once it ended, and where rank 1 was when the signal was sent."""
    try:
        deadline = time.monotonic() + timeout
        while script_position(out, 0) < at:
            assert process.poll() is None, process.stdout.read()
            assert time.monotonic() < deadline, f"the script did not reach {at} in {timeout:.0f} s"
            time.sleep(0.05)
        noticed = script_position(out, 1)
        os.kill(rank_pid(pids, 1), signal.SIGTERM)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return output, noticed


def check_script_stopped(process: subprocess.Popen, output: str, out: Path, noticed: tuple[int, int],
                         steps: int) -> None:
    """Both ranks exited PREEMPTED_EXIT_CODE after the same step of the second epoch, the step rank 0's save() wrote,
    at or after the one rank 1 had reached when it got the signal; neither trained a step past it."""
    assert process.returncode == PREEMPTED_EXIT_CODE, output[-3000:]
    epoch, step, writer = map(int, (out / "saved").read_text().split())
    assert (epoch, writer) == (1, 0) and noticed[1] <= step < steps, (noticed, step)
    assert len(re.findall(rf"every rank stopped after step {step} of epoch 2", output)) == 2, output[-3000:]
    assert script_position(out, 0) == script_position(out, 1) == (1, step)
