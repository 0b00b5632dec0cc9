"""The SDK's preemption notice for a script of the user's own (sdk/preemption.py), under real `mpirun -np 2`: a
SIGTERM to rank 1 alone stops both ranks after the same step, rank 0's `save` writes the checkpoint there, and both
exit with PREEMPTED_EXIT_CODE; without a signal the script runs to its end and nothing is saved."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from scalingrun_api.heartbeat import PREEMPTED_EXIT_CODE
from scalingrun_trainer.core.preemption import RANK_PIDS_DIR_ENV
from tests.support.mpirun import mpirun  # noqa: F401 (fixture)
from tests.support.preemption import rank_pid

ROOT = Path(__file__).resolve().parents[3]

# A training loop of the user's own: plain Python, so that the test needs neither TensorFlow nor torch.
SCRIPT = """
import os, sys, time
from pathlib import Path
from scalingrun_trainer import sdk

out, epochs, steps = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])

def save(epoch, step):
    (out / "saved").write_text(f"{epoch} {step} {rank}")

for epoch in range(epochs):
    for step in range(1, steps + 1):
        time.sleep(0.02)  # the step
        (out / f"rank-{rank}").write_text(f"{epoch} {step}")
        sdk.step_boundary(epoch, step, save)
print(f"rank {rank} done", flush=True)
"""


def position(out: Path, rank: int) -> tuple[int, int]:
    try:
        epoch, step = (out / f"rank-{rank}").read_text().split()
    except (OSError, ValueError):
        return -1, 0
    return int(epoch), int(step)


def run(mpirun: list[str], tmp_path: Path, epochs: int, steps: int) -> subprocess.Popen:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, RANK_PIDS_DIR_ENV: str(tmp_path / "pids"),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT / "trainer")])}
    return subprocess.Popen([*mpirun, sys.executable, str(script), str(tmp_path), str(epochs), str(steps)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)


def test_a_sigterm_to_one_rank_stops_every_rank_at_the_same_step_with_rank_0s_checkpoint(mpirun, tmp_path):
    first = run(mpirun, tmp_path, epochs=3, steps=400)
    try:
        deadline = time.monotonic() + 120
        while position(tmp_path, 0) < (1, 5):
            assert first.poll() is None, first.stdout.read()
            assert time.monotonic() < deadline, "the script did not reach its second epoch in 120 s"
            time.sleep(0.05)
        noticed = position(tmp_path, 1)
        os.kill(rank_pid(tmp_path / "pids", 1), signal.SIGTERM)
        output, _ = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert first.returncode == PREEMPTED_EXIT_CODE, output
    epoch, step, writer = map(int, (tmp_path / "saved").read_text().split())
    assert (epoch, writer) == (1, 0) and noticed[1] <= step < 400, (noticed, step)
    # Both ranks stopped after that step, and neither trained a step past it.
    assert len(re.findall(rf"every rank stopped after step {step} of epoch 2", output)) == 2, output
    assert position(tmp_path, 0) == position(tmp_path, 1) == (1, step)
    assert "done" not in output


def test_without_a_signal_the_script_runs_to_its_end_and_saves_nothing(mpirun, tmp_path):
    second = run(mpirun, tmp_path, epochs=2, steps=5)
    output, _ = second.communicate(timeout=120)
    assert second.returncode == 0, output
    assert "rank 0 done" in output and "rank 1 done" in output
    assert not (tmp_path / "saved").exists() and position(tmp_path, 1) == (1, 5)
