"""sdk.KerasCallback: report_epoch for a Keras fit(), with the training throughput measured as our trainer does."""

from __future__ import annotations

from typing import Callable, Optional

import tensorflow as tf

from ..core.progress import EpochTimer
from .preemption import step_boundary
from .run import context, heartbeat, report_epoch


class KerasCallback(tf.keras.callbacks.Callback):
    """Put it after Horovod's MetricAverageCallback (so that rank 0 reports metrics averaged over the ranks):
    each epoch, report_epoch(epoch, logs, images/s of all ranks), and heartbeat(step) after every step. Throughput
    counts training batches only, not validation; an epoch's images are its batches x batch size x ranks.

    `save(epoch, step)`: the script's checkpoint at a step; given, step_boundary runs after every step (a SIGTERM
    on any rank stops every rank there, sdk/preemption.py). Keras counts a fit's batches from 0 in every epoch: a
    script that resumes inside an epoch passes `first_step`, the steps of its initial_epoch done before."""

    def __init__(self, save: Optional[Callable[[int, int], None]] = None, first_step: int = 0):
        super().__init__()
        self.ctx = context()
        self.save, self.first_step = save, first_step
        self.timer = EpochTimer()
        self._batches = self._steps = self._epoch = 0
        self._first_epoch: Optional[int] = None

    def on_train_batch_end(self, batch, logs=None):
        self._batches += 1
        self._steps += 1
        heartbeat(self._steps, self._epoch)
        if self.save is not None:
            first = self.first_step if self._epoch == self._first_epoch else 0
            step_boundary(self._epoch, first + batch + 1, self.save)

    def on_train_begin(self, logs=None):
        self._first_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        self.timer.epoch_started()
        self._batches = 0
        self._epoch = epoch
        if self._first_epoch is None:
            self._first_epoch = epoch

    def on_test_batch_end(self, batch, logs=None):
        heartbeat(self._steps, self._epoch, phase="validation")

    def on_test_begin(self, logs=None):
        self.timer.validation_started()

    def on_epoch_end(self, epoch, logs=None):
        images = self._batches * self.ctx.batch_size_per_worker * self.ctx.size
        metrics = {k: float(v) for k, v in (logs or {}).items() if k != "lr"}
        report_epoch(epoch + 1, metrics, self.timer.images_per_second(images))
