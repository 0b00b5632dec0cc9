"""Keras callbacks, the same under every Keras engine: early stopping that can resume, the input-wait meter, the
per-epoch report (rank 0) and checkpoints (written by rank 0; under an engine whose saving is a collective, every
rank writes a local copy that only rank 0 commits)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
from typing import Callable, Iterator, Optional

import numpy as np
import tensorflow as tf
from scalingrun_api.progress import InputEpoch

from ...core.checkpoints import CheckpointState, CheckpointStore, EarlyStoppingState
from ...core.early_stopping import EarlyStoppingRule
from ...core.heartbeat import HeartbeatWriter
from ...core.preemption import Preempted, PreemptionNotice
from ...core.stall import StallWatch
from ...core.input_wait import GpuSampler, StepTimes, input_entry
from ...core.progress import EpochRecorder, EpochTimer
from .input_clock import InputClock


class ResumableEarlyStopping(tf.keras.callbacks.Callback):
    """core.early_stopping's rule over Keras: keeps the best epoch's weights and restores them when training stops,
    early or at maxEpochs (Keras' own EarlyStopping restores them only when it stops early)."""

    def __init__(self, rule: EarlyStoppingRule, restore_best_weights: bool, verbose: int = 0):
        super().__init__()
        self.rule, self.restore_best_weights, self.verbose = rule, restore_best_weights, verbose
        self.best_weights: Optional[list[np.ndarray]] = None
        self.stopped_epoch: Optional[int] = None  # 0-based, as Keras counts
        # True during the fit of a resumed epoch's remaining steps: training goes on in a second fit.
        self.train_end_held = False

    @property
    def best_epoch_number(self) -> Optional[int]:
        """1-based epoch of the best monitored value; None before any epoch counted."""
        return self.rule.best_epoch

    def on_epoch_end(self, epoch, logs=None):
        current = (logs or {}).get(self.rule.monitor)
        if current is None:
            return
        if self.restore_best_weights and self.best_weights is None:
            self.best_weights = self.model.get_weights()  # no epoch better than the first: the first's
        verdict = self.rule.update(epoch + 1, {self.rule.monitor: float(current)})
        if verdict.improved and self.restore_best_weights:
            self.best_weights = self.model.get_weights()
        if verdict.stop:
            self.stopped_epoch = epoch
            self.model.stop_training = True
            if self.verbose and self.restore_best_weights and self.best_weights is not None:
                print(f"Restoring model weights from the end of the best epoch: {self.rule.best_epoch}.", flush=True)
            self._restore()

    def on_train_end(self, logs=None):
        if self.train_end_held:
            return
        if self.stopped_epoch is None:
            self._restore()  # maxEpochs reached
        elif self.verbose:
            print(f"Epoch {self.stopped_epoch + 1}: early stopping", flush=True)

    def _restore(self) -> None:
        if self.restore_best_weights and self.best_weights is not None:
            self.model.set_weights(self.best_weights)

    def state(self) -> EarlyStoppingState:
        return self.rule.state()

    def resume_from(self, state: EarlyStoppingState, best_weights: Optional[list[np.ndarray]]) -> None:
        self.rule.resume_from(state)
        if state.best_epoch is not None:
            self.best_weights = best_weights


class InputWaitMeter(tf.keras.callbacks.Callback):
    """Every rank: the epoch's input-wait share and GPU utilisation (method in core/input_wait.py). Runs before
    the EpochReporter, which reads `latest`; `combine(wait, gpu)` merges the ranks' figures (collective)."""

    def __init__(self, clock: InputClock, gpu: Optional[GpuSampler] = None, combine=None,
                 timer=time.perf_counter):
        super().__init__()
        self.clock, self.gpu, self.combine, self.timer = clock, gpu, combine, timer
        self.times = StepTimes()
        self.latest: Optional[InputEpoch] = None
        self._begin = 0.0
        self._traced = False

    def on_epoch_begin(self, epoch, logs=None):
        self.times = StepTimes()
        if self.gpu is not None:
            self.gpu.start()

    def on_train_batch_begin(self, batch, logs=None):
        self._begin = self.timer()

    def on_train_batch_end(self, batch, logs=None):
        end = self.timer()
        if not self._traced:  # the first step traces the graph: neither input nor compute
            self._traced = True
            return
        self.times.add(self._begin, self.clock.last, end)

    def on_epoch_end(self, epoch, logs=None):
        wait = self.times.fraction()
        gpu = self.gpu.stop() if self.gpu is not None else None
        if self.combine is not None:
            wait, gpu = self.combine(wait, gpu)
        self.latest = input_entry(epoch + 1, wait, gpu)


class EpochReporter(tf.keras.callbacks.Callback):
    """Rank 0: measures training throughput (validation excluded) and records the epoch (core.progress)."""

    def __init__(self, recorder: EpochRecorder, images_per_epoch: int,
                 early_stopping: Optional[ResumableEarlyStopping], input_meter: Optional[InputWaitMeter] = None,
                 images_skipped: Callable[[int], int] = lambda epoch: 0):
        super().__init__()
        self.recorder, self.images_per_epoch = recorder, images_per_epoch
        self.early_stopping, self.input_meter = early_stopping, input_meter
        self.images_skipped = images_skipped  # by the epoch a training resumed inside: not trained in this attempt
        self.timer = EpochTimer()

    def on_epoch_begin(self, epoch, logs=None):
        self.timer.epoch_started()

    def on_test_begin(self, logs=None):
        self.timer.validation_started()

    def on_epoch_end(self, epoch, logs=None):
        metrics = {k: float(v) for k, v in (logs or {}).items() if k != "lr"}
        self.recorder.record(
            epoch + 1, metrics, self.timer.images_per_second(self.images_per_epoch - self.images_skipped(epoch)),
            early_stopping_best=self.early_stopping.best_epoch_number if self.early_stopping else None,
            input_figures=self.input_meter.latest if self.input_meter is not None else None)


class Heartbeat(tf.keras.callbacks.Callback):
    """Every rank, last of the callbacks: beats after every training and validation step and at each epoch's end
    (the writer throttles; rank 0's writes heartbeat.json). `step`: steps since the run's start (epoch x steps).
    The stall watch, if any, is armed at the first step (the first graph build is not watched) until the end."""

    def __init__(self, heartbeat: HeartbeatWriter, steps_per_epoch: int, watch: Optional[StallWatch] = None,
                 position: Optional["StepPosition"] = None):
        super().__init__()
        self.heartbeat, self.steps_per_epoch, self.watch = heartbeat, steps_per_epoch, watch
        self.position = position or StepPosition()
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self.heartbeat.beat("training", step=epoch * self.steps_per_epoch + self.position.skipped(epoch), epoch=epoch)

    def on_train_batch_end(self, batch, logs=None):
        step = self._epoch * self.steps_per_epoch + self.position.step(self._epoch, batch)
        self.heartbeat.beat("training", step=step, epoch=self._epoch)
        if self.watch is not None:
            self.watch.arm()

    def on_test_batch_end(self, batch, logs=None):
        self.heartbeat.beat("validation")

    def on_epoch_end(self, epoch, logs=None):
        self.heartbeat.beat("training", step=(epoch + 1) * self.steps_per_epoch, epoch=epoch + 1)

    def on_train_end(self, logs=None):
        if self.watch is not None:
            self.watch.disarm()


class StepPosition:
    """Where a resumed epoch starts: the fit of its remaining steps counts its batches from 0, the run from `first`."""

    def __init__(self, epoch: int = 0, first: int = 0):
        self.epoch, self.first = epoch, first

    def skipped(self, epoch: int) -> int:
        return self.first if epoch == self.epoch else 0

    def step(self, epoch: int, batch: int) -> int:
        """Steps of `epoch` done after Keras' `batch` (0-based, of this fit's epoch)."""
        return self.skipped(epoch) + batch + 1


class PreemptionCheck(tf.keras.callbacks.Callback):
    """Every rank, after each training step (core/preemption.py): the ranks agree whether any saw SIGTERM; if so the
    checkpointer's rank(s) write the checkpoint at this step, every rank waits for it and raises Preempted out of
    fit, before validation and the epoch's end (the epoch is not done). An epoch's last step is not a stop: its end
    (validation, the records, the epoch's checkpoint) follows, and the next step's check stops.

    With gradient accumulation Keras' steps are micro-batches: the check runs after each update only (every
    `accumulation` micro-batches, the same on every rank), and the checkpoint counts updates, so that a resume at
    another world size starts at the same update."""

    def __init__(self, notice: PreemptionNotice, world, steps_per_epoch: int,
                 checkpointer: Optional["Checkpointer"], position: Optional[StepPosition] = None,
                 accumulation: int = 1):
        super().__init__()
        self.notice, self.world, self.steps_per_epoch = notice, world, steps_per_epoch
        self.checkpointer, self.position = checkpointer, position or StepPosition()
        self.accumulation = accumulation
        self._epoch = 0

    def on_train_begin(self, logs=None):
        self.notice.armed = True

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        micro = self.position.step(self._epoch, batch)
        step = micro // self.accumulation
        self.notice.done = (self._epoch, step)
        if micro % self.accumulation or micro >= self.steps_per_epoch or not self.notice.agreed(self.world):
            return
        if self.checkpointer is not None:
            self.checkpointer.save(self._epoch, step=step)
        self.notice.committed(self.world)
        raise Preempted(self._epoch, step, self.notice.noticed_at)


class Checkpointer(tf.keras.callbacks.Callback):
    """Every N epochs: model + optimizer (tf.train.Checkpoint), best weights and the early-stopping state, into the
    run's CheckpointStore. Where saving is a collective (MultiWorkerMirroredStrategy's variables), every rank writes
    its local copy and only the store that commits (rank 0's) keeps one; the others' are removed at once."""

    def __init__(self, store: CheckpointStore, checkpoint: tf.train.Checkpoint, every_epochs: int,
                 early_stopping: Optional[ResumableEarlyStopping], history: Callable[[], list[dict]],
                 resume_facts: dict):
        super().__init__()
        self.store, self.checkpoint, self.every_epochs = store, checkpoint, every_epochs
        self.early_stopping, self.history, self.resume_facts = early_stopping, history, resume_facts
        self._epoch = 0
        self.train_end_held = False  # as ResumableEarlyStopping's

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every_epochs == 0 or self.model.stop_training:
            self.save(epoch + 1)

    def on_train_end(self, logs=None):
        if not self.train_end_held:
            self.store.finish(self._epoch + 1, lambda: self.save(self._epoch + 1, finished=True))

    def save(self, epoch: int, finished: bool = False, step: int = 0) -> None:
        """`epoch` epochs trained, and `step` steps of the next (a checkpoint on a preemption notice)."""
        workdir = tempfile.mkdtemp(prefix="ckpt-")
        try:
            prefix = self.checkpoint.write(os.path.join(workdir, "ckpt"))
            best = self.early_stopping.best_weights if self.early_stopping else None
            self.store.save(epoch, self._files(workdir, best), history=self.history(),
                            early_stopping=self.early_stopping.state() if self.early_stopping else None,
                            best_weights=best is not None, resume_facts=self.resume_facts,
                            prefix=os.path.basename(prefix), finished=finished, step=step)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    @staticmethod
    def _files(workdir: str, best: Optional[list[np.ndarray]]) -> Iterator[tuple[str, bytes]]:
        """The checkpoint's files and best.npz, read one at a time (only by a store that commits)."""
        if best is not None:
            np.savez(os.path.join(workdir, "best.npz"), *best)
        for name in sorted(os.listdir(workdir)):
            with open(os.path.join(workdir, name), "rb") as f:
                yield name, f.read()


def restore(store: CheckpointStore, state: CheckpointState,
            checkpoint: tf.train.Checkpoint) -> Optional[list[np.ndarray]]:
    """Loads model + optimizer into `checkpoint`'s objects; returns the saved best weights, if any.

    The optimizer's slots are created at its first step and restored then (deferred restoration), so
    the downloaded files must outlive this call: they are removed when the process exits.
    """
    from pyarrow import fs as pafs

    workdir = tempfile.mkdtemp(prefix="restore-")
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    folder = store.folder(state)
    for info in folder.fs.get_file_info(pafs.FileSelector(folder.path)):
        with open(os.path.join(workdir, info.base_name), "wb") as f:
            f.write(folder.join(info.base_name).read_bytes())
    checkpoint.read(os.path.join(workdir, state.prefix)).expect_partial()
    if not state.best_weights:
        return None
    with np.load(os.path.join(workdir, "best.npz")) as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]
