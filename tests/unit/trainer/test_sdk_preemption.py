"""The SDK's preemption notice for a script of the user's own (sdk/preemption.py), under real `mpirun -np 2`: a
SIGTERM to rank 1 alone stops both ranks after the same step, rank 0's `save` writes the checkpoint there, and both
exit with PREEMPTED_EXIT_CODE; without a signal the script runs to its end and nothing is saved."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from scalingrun_trainer.core.preemption import RANK_PIDS_DIR_ENV
from tests.support.mpirun import mpirun  # noqa: F401 (fixture)
from tests.support.preemption import check_script_stopped, script_position, stop_script_mid_epoch

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
    output, noticed = stop_script_mid_epoch(first, tmp_path, tmp_path / "pids")
    check_script_stopped(first, output, tmp_path, noticed, steps=400)
    assert "done" not in output


def test_without_a_signal_the_script_runs_to_its_end_and_saves_nothing(mpirun, tmp_path):
    second = run(mpirun, tmp_path, epochs=2, steps=5)
    output, _ = second.communicate(timeout=120)
    assert second.returncode == 0, output
    assert "rank 0 done" in output and "rank 1 done" in output
    assert not (tmp_path / "saved").exists() and script_position(tmp_path, 1) == (1, 5)
