"""sdk.LightningCallback: report_epoch for a PyTorch Lightning Trainer (here, beside the other torch code)."""

from __future__ import annotations

from typing import Callable, Optional

import pytorch_lightning as pl

from ..core.progress import EpochTimer
from .preemption import install, step_boundary
from .run import context, heartbeat, report_epoch


class LightningCallback(pl.Callback):
    """Each training epoch: report_epoch(epoch, the trainer's callback_metrics, images/s of all ranks); after every
    step, heartbeat(the trainer's global step).

    Log metrics under Keras' names (loss, accuracy, val_loss, val_accuracy) with `sync_dist=True` so that rank 0
    reports them averaged over the ranks. Throughput counts training batches only (validation runs inside the
    epoch and is left out).

    `save(epoch, step)`: the script's checkpoint at a step; given, step_boundary runs after every step (a SIGTERM
    on any rank stops every rank there, sdk/preemption.py), and Lightning's own SIGTERM handler, which stops a rank
    other than 0 alone, is replaced at train start. `first_step`: the steps of the first epoch done before (a
    script that resumes inside an epoch)."""

    def __init__(self, save: Optional[Callable[[int, int], None]] = None, first_step: int = 0):
        super().__init__()
        self.ctx = context()
        self.save, self.first_step = save, first_step
        self._first_epoch: Optional[int] = None

    def on_train_start(self, trainer, pl_module):
        self._first_epoch = trainer.current_epoch
        if self.save is not None:
            install().reclaim()  # Lightning registered its handler just before this hook
        self.timer = EpochTimer()
        self._batches = 0

    def on_train_epoch_start(self, trainer, pl_module):
        self.timer.epoch_started()
        self._batches = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._batches += 1
        heartbeat(trainer.global_step, trainer.current_epoch)
        if self.save is not None:
            first = self.first_step if trainer.current_epoch == self._first_epoch else 0
            step_boundary(trainer.current_epoch, first + batch_idx + 1, self.save)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        heartbeat(trainer.global_step, trainer.current_epoch, phase="validation")

    def on_validation_start(self, trainer, pl_module):
        self.timer.validation_started()

    def on_train_epoch_end(self, trainer, pl_module):
        images = self._batches * self.ctx.batch_size_per_worker * self.ctx.size
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
        report_epoch(trainer.current_epoch + 1, metrics, self.timer.images_per_second(images))


def mpi_environment():
    """Lightning's MPIEnvironment as our trainer uses it in an MPIJob: rank 0's IP as the main address (a worker
    pod's hostname does not resolve from the others). Pass it to DDPStrategy(cluster_environment=...)."""
    from ..frameworks.lightning.cluster import mpi_environment as environment

    return environment()
