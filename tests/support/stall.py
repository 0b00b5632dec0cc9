"""A frozen rank under real mpirun, for every engine's test: wait until the run's heartbeat shows training under
way and advancing, SIGSTOP rank 1 (alive and silent, as a hung GPU's process or a paused container is), and wait
for mpirun to end."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.operator import read_json

# The short watch the tests train under (production: 300 s), so that a stall ends in about a minute. 20 s ended a
# CI run's training before the freeze: a step there waited longer on a loaded machine. SCALINGRUN_TEST_STALL_TIMEOUT=300
# measures the default (then give the tests' exit wait more room too).
TEST_TIMEOUT_SECONDS = int(os.environ.get("SCALINGRUN_TEST_STALL_TIMEOUT", "45"))
# How long a test waits for mpirun after the freeze: generous, the assertion is on the exit, not the time.
EXIT_WAIT_SECONDS = 300 + 2 * TEST_TIMEOUT_SECONDS


@dataclass
class FrozenRun:
    returncode: int
    seconds: float  # from SIGSTOP to mpirun's exit
    heartbeats: list[dict] = field(default_factory=list)  # the distinct documents seen before the freeze


def _ranks(job: subprocess.Popen) -> dict[int, "psutil.Process"]:  # noqa: F821
    import psutil

    ranks = {}
    for process in psutil.Process(job.pid).children(recursive=True):
        try:
            if "scalingrun_trainer.cli" in " ".join(process.cmdline()):
                ranks[int(process.environ()["OMPI_COMM_WORLD_RANK"])] = process
        except (psutil.Error, KeyError):
            continue
    return ranks


def freeze_rank_1_while_training(job: subprocess.Popen, s3_server, heartbeat_at: str, deadline_s: float,
                                 exit_s: float) -> FrozenRun:
    """Waits (up to deadline_s) until heartbeat.json (`heartbeat_at`, bucket/key) has been written twice during
    training, its step advancing; then freezes rank 1 and waits up to exit_s for mpirun to end. The frozen rank is
    resumed and the job killed if it does not."""
    from pyarrow import fs as pafs

    filesystem = s3_server.filesystem()
    seen: list[dict] = []
    deadline = time.monotonic() + deadline_s
    frozen = None
    try:
        while time.monotonic() < deadline and job.poll() is None:
            if filesystem.get_file_info(heartbeat_at).type == pafs.FileType.File:
                beat = read_json(s3_server, f"s3://{heartbeat_at}")
                if beat["phase"] in ("training", "validation") and (not seen or beat["time"] > seen[-1]["time"]):
                    seen.append(beat)
                if len(seen) >= 2 and seen[-1]["step"] > seen[0]["step"]:
                    break
            time.sleep(0.2)
        assert job.poll() is None, "the training ended before a rank could be frozen"
        assert len(seen) >= 2, f"the heartbeat did not advance during training within {deadline_s} s: {seen}"
        ranks = _ranks(job)
        assert sorted(ranks) == [0, 1], f"both ranks should be running: {ranks}"
        frozen = ranks[1]
        frozen.suspend()
        started = time.monotonic()
        job.wait(timeout=exit_s)
        return FrozenRun(job.returncode, time.monotonic() - started, seen)
    finally:
        if job.poll() is None:
            if frozen is not None:
                frozen.resume()
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


def frozen_mpirun(command: list[str], env: dict[str, str], s3_server, heartbeat_at: str, output: Path,
                  engine: str) -> FrozenRun:
    """The training `command` (mpirun, 2 ranks) run with `env`, its output in `output`, rank 1 frozen once training
    advances (freeze_rank_1_while_training): mpirun must end, failed, saying that rank 1 stopped answering."""
    with open(output, "w") as out:
        job = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            frozen = freeze_rank_1_while_training(job, s3_server, heartbeat_at, deadline_s=400,
                                                  exit_s=EXIT_WAIT_SECONDS)
        except AssertionError as failed:
            raise AssertionError(f"{failed}\n{first_error_and_tail(output.read_text())}") from None
    text = output.read_text()
    print(f"{engine}: mpirun exited {frozen.returncode} {frozen.seconds:.1f} s after rank 1 froze")
    assert frozen.returncode != 0, text[-3000:]
    assert "rank 1 stopped answering" in text, text[-3000:]
    return frozen


def first_error_and_tail(text: str, tail: int = 3000) -> str:
    """A failed run's output, shortened: from its first traceback or error line (the rank that failed first says
    why there, before the other ranks' consequences), and its end."""
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith("Traceback") or "Error" in line), None)
    head = "\n".join(lines[first:first + 40]) if first is not None else ""
    return f"first error:\n{head}\n...\nend:\n{text[-tail:]}"
