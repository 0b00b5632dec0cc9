"""One Lightning callback for what the Keras engines do in ../keras/callbacks.py: early stopping that restores the
best weights and survives restarts, per-epoch progress and MLflow (rank 0), checkpoints to the run's storage
(rank 0), in that order, after each epoch's validation. Every rank takes the same decisions from the same
all-reduced metrics, so all stop on the same epoch. After every training step, the preemption check
(core/preemption.py): a SIGTERM on any rank stops every rank at the same step with a checkpoint there.

A resumed epoch that starts at a step (a checkpoint on a preemption notice) is Lightning's first epoch, shortened
to its rest (data.EpochLengths); `first_step` counts the steps before it, for the step numbers and the rate."""

from __future__ import annotations

import copy
import io
from typing import Any, Optional

import pytorch_lightning as pl
import torch

from ...core.checkpoints import CheckpointState, CheckpointStore, EarlyStoppingState
from ...core.early_stopping import EarlyStoppingRule
from ...core.collective import Collective
from ...core.heartbeat import HeartbeatWriter
from ...core.preemption import Preempted, PreemptionNotice
from ...core.stall import StallWatch
from ...core.progress import EpochRecorder, EpochTimer


class EarlyStopping:
    """core.early_stopping's rule over a torch module: keeps the best epoch's weights (restored when training stops,
    early or at maxEpochs); its state and best weights go into every checkpoint."""

    def __init__(self, rule: EarlyStoppingRule, restore_best_weights: bool):
        self.rule, self.restore_best_weights = rule, restore_best_weights
        self.best_weights: Optional[dict[str, torch.Tensor]] = None

    @property
    def best_epoch(self) -> Optional[int]:
        return self.rule.best_epoch

    def update(self, epoch: int, metrics: dict[str, float], module: torch.nn.Module) -> bool:
        """Counts epoch (1-based); True when training must stop (the best weights are then restored)."""
        verdict = self.rule.update(epoch, metrics)
        if verdict.improved and self.restore_best_weights:
            self.best_weights = copy.deepcopy({k: v.detach().cpu() for k, v in module.state_dict().items()})
        if verdict.stop:
            self.restore(module)
        return verdict.stop

    def restore(self, module: torch.nn.Module) -> None:
        if self.restore_best_weights and self.best_weights is not None:
            module.load_state_dict(self.best_weights)

    def state(self) -> EarlyStoppingState:
        return self.rule.state()

    def resume_from(self, state: EarlyStoppingState, best_weights: Optional[dict]) -> None:
        self.rule.resume_from(state)
        self.best_weights = best_weights


class EpochEnd(pl.Callback):
    """After each epoch's validation: metrics over all ranks, early stopping, then (rank 0) the epoch's record
    (progress.json, MLflow, the log line) and a checkpoint every N epochs. Epochs are counted from the resumed one."""

    def __init__(self, *, initial_epoch: int, images_per_epoch: int, early_stopping: Optional[EarlyStopping],
                 recorder: Optional[EpochRecorder], checkpointer: Optional["Checkpointer"], skipped_images: int = 0):
        self.initial_epoch, self.images_per_epoch = initial_epoch, images_per_epoch
        self.skipped_images = skipped_images  # of the resumed epoch, trained before its checkpoint
        self.early_stopping, self.recorder, self.checkpointer = early_stopping, recorder, checkpointer
        self.epoch = initial_epoch
        self.timer = EpochTimer()

    def on_train_epoch_start(self, trainer, pl_module):
        self.timer.epoch_started()

    def on_validation_epoch_start(self, trainer, pl_module):
        self.timer.validation_started()

    def on_train_epoch_end(self, trainer, pl_module):
        self.epoch = self.initial_epoch + trainer.current_epoch + 1
        skipped = self.skipped_images if trainer.current_epoch == 0 else 0
        rate = self.timer.images_per_second(self.images_per_epoch - skipped)
        metrics = pl_module.epoch_metrics()
        stop = self.early_stopping.update(self.epoch, metrics, pl_module) if self.early_stopping else False
        if stop:
            trainer.should_stop = True
        if self.recorder is None:
            return
        self.recorder.record(self.epoch, metrics, rate, stopped=stop,
                             early_stopping_best=self.early_stopping.best_epoch if self.early_stopping else None)
        if self.checkpointer is not None and (self.epoch % self.checkpointer.every_epochs == 0 or stop):
            self.checkpointer.save(self.epoch, pl_module, trainer.optimizers[0], self.early_stopping)

    def on_train_end(self, trainer, pl_module):
        if self.early_stopping is not None and not trainer.should_stop:
            self.early_stopping.restore(pl_module)  # maxEpochs reached: the best epoch's weights, as Keras'
        if self.checkpointer is not None:
            self.checkpointer.finish(self.epoch, pl_module, trainer.optimizers[0], self.early_stopping)


class Heartbeat(pl.Callback):
    """Every rank: beats after every training and validation step and at each epoch's end (the writer throttles;
    rank 0's writes heartbeat.json). `step`: steps since the run's start, resumed epochs included. The stall
    watch, if any, is armed at the first step until the end of training."""

    def __init__(self, heartbeat: HeartbeatWriter, steps_per_epoch: int, initial_epoch: int,
                 watch: Optional[StallWatch] = None, first_step: int = 0):
        self.heartbeat, self.steps_per_epoch, self.initial_epoch = heartbeat, steps_per_epoch, initial_epoch
        self.watch, self.first_step = watch, first_step

    def _epoch(self, trainer) -> int:
        return self.initial_epoch + trainer.current_epoch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        epoch = self._epoch(trainer)
        step = epoch_step(trainer, batch_idx, self.first_step)
        self.heartbeat.beat("training", step=epoch * self.steps_per_epoch + step, epoch=epoch)
        if self.watch is not None:
            self.watch.arm()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.heartbeat.beat("validation")

    def on_train_epoch_end(self, trainer, pl_module):
        epoch = self._epoch(trainer) + 1
        self.heartbeat.beat("training", step=epoch * self.steps_per_epoch, epoch=epoch)

    def on_train_end(self, trainer, pl_module):
        if self.watch is not None:
            self.watch.disarm()


def epoch_step(trainer, batch_idx: int, first_step: int) -> int:
    """Steps of the current epoch done after Lightning's `batch_idx`: a resumed epoch's count from its first step."""
    return (first_step if trainer.current_epoch == 0 else 0) + batch_idx + 1


class PreemptionCheck(pl.Callback):
    """Every rank, after each training step (core/preemption.py): the ranks agree whether any saw SIGTERM; if so
    rank 0 writes the checkpoint at this step, every rank waits for it and raises Preempted out of fit, before
    validation and the epoch's end. An epoch's last step is not a stop: its end (validation, the records, the
    epoch's checkpoint) follows, and the next step's check stops. Last in the callbacks: the step's beat first."""

    def __init__(self, notice: PreemptionNotice, world: Collective, steps_per_epoch: int, initial_epoch: int,
                 first_step: int, checkpointer: Optional["Checkpointer"], early_stopping: Optional[EarlyStopping],
                 accumulation: int = 1):
        # Steps here are micro-batches; a stop and its checkpoint fall on an optimizer update (every
        # `accumulation` micro-batches, the same batch on every rank), and the checkpoint counts updates.
        self.notice, self.world, self.steps_per_epoch = notice, world, steps_per_epoch
        self.initial_epoch, self.first_step, self.accumulation = initial_epoch, first_step, accumulation
        self.checkpointer, self.early_stopping = checkpointer, early_stopping

    def on_train_start(self, trainer, pl_module):
        # Lightning registered its SIGTERM handler just before this hook (Trainer._run): ours replaces it.
        self.notice.reclaim()
        self.notice.armed = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        epoch, step = self.initial_epoch + trainer.current_epoch, epoch_step(trainer, batch_idx, self.first_step)
        if step % self.accumulation:  # mid-update: the gradients of this update are not applied yet
            return
        update = step // self.accumulation
        self.notice.done = (epoch, update)
        if step >= self.steps_per_epoch or not self.notice.agreed(self.world):
            return
        if self.checkpointer is not None:
            self.checkpointer.save(epoch, pl_module, trainer.optimizers[0], self.early_stopping, step=update)
        self.notice.committed(self.world)
        raise Preempted(epoch, update, self.notice.noticed_at)


class Checkpointer:
    """Rank 0: `epoch-NNNNN/checkpoint.pt` (model, optimizer, best weights) in the run's CheckpointStore."""

    def __init__(self, store: CheckpointStore, every_epochs: int, history, resume_facts: dict[str, Any]):
        self.store, self.every_epochs, self.history, self.resume_facts = store, every_epochs, history, resume_facts

    def save(self, epoch: int, module: torch.nn.Module, optimizer, early_stopping: Optional[EarlyStopping],
             finished: bool = False, step: int = 0) -> None:
        """`epoch` epochs trained, and `step` steps of the next (a checkpoint on a preemption notice)."""
        buffer = io.BytesIO()
        torch.save({"model": module.state_dict(), "optimizer": optimizer.state_dict(),
                    "best": early_stopping.best_weights if early_stopping else None}, buffer)
        self.store.save(epoch, [("checkpoint.pt", buffer.getvalue())], history=self.history(),
                        early_stopping=early_stopping.state() if early_stopping else None,
                        best_weights=bool(early_stopping and early_stopping.best_weights is not None),
                        resume_facts=self.resume_facts, finished=finished, step=step)

    def finish(self, epoch: int, module, optimizer, early_stopping: Optional[EarlyStopping]) -> None:
        """Marks the run finished, so that a rerun of the same run does not train again."""
        self.store.finish(epoch, lambda: self.save(epoch, module, optimizer, early_stopping, finished=True))


def load_checkpoint(store: CheckpointStore, state: CheckpointState) -> dict[str, Any]:
    """The checkpoint state.json points to: {"model", "optimizer", "best"} (read by every rank)."""
    data = store.folder(state).join("checkpoint.pt").read_bytes()
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
