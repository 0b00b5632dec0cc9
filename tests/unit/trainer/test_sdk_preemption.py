"""The SDK's preemption notice for a script of the user's own (sdk/preemption.py), under real `mpirun -np 2`: a
SIGTERM to rank 1 alone stops both ranks after the same step, rank 0's `save` writes the checkpoint there, and both
exit with PREEMPTED_EXIT_CODE; without a signal the script runs to its end and nothing is saved. From a plain loop
(step_boundary) and from a Keras fit (KerasCallback(save=...); Lightning's: tests/lightning/test_sdk_preemption.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from scalingrun_trainer.core.preemption import RANK_PIDS_DIR_ENV
from tests.support.mpirun import mpirun  # noqa: F401 (fixture)
from scalingrun_trainer.sdk.context import CONFIG_VARIABLE
from tests.support.preemption import check_script_stopped, script_position, stop_script_mid_epoch
from tests.support.sdk import config  # noqa: F401 (fixture)

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


KERAS_SCRIPT = """
import sys, time
from pathlib import Path
import numpy as np
import tensorflow as tf
from scalingrun_trainer import sdk

out = Path(sys.argv[1])
ctx = sdk.context()


class Position(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.02)  # a step long enough for the signal to land mid-epoch
        (out / f"rank-{ctx.rank}").write_text(f"{self.epoch} {batch + 1}")


def save(epoch, step):
    (out / "saved").write_text(f"{epoch} {step} {ctx.rank}")


model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
rows = np.random.default_rng(0)
model.fit(rows.normal(size=(800, 4)), rows.integers(0, 2, 800), batch_size=4, epochs=3, verbose=0,
          callbacks=[Position(), sdk.KerasCallback(save=save)])
print("done", flush=True)
"""


def test_keras_callback_with_save_stops_every_rank_at_the_same_step(config, mpirun, tmp_path):  # noqa: F811
    script = tmp_path / "train.py"
    script.write_text(KERAS_SCRIPT)
    env = {**os.environ, CONFIG_VARIABLE: str(config), RANK_PIDS_DIR_ENV: str(tmp_path / "pids"),
           "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT / "trainer")])}
    first = subprocess.Popen([*mpirun, sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    output, noticed = stop_script_mid_epoch(first, tmp_path, tmp_path / "pids")
    check_script_stopped(first, output, tmp_path, noticed, steps=200)
    assert "done" not in output
