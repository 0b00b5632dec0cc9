"""One Lightning callback for what the Keras trainer does in callbacks.py: early stopping that restores the
best weights and survives restarts, per-epoch progress and MLflow (rank 0), checkpoints to the run's storage
(rank 0), in that order, after each epoch's validation. Every rank takes the same decisions from the same
all-reduced metrics, so all stop on the same epoch."""

from __future__ import annotations

import copy
import io
import json
import time
from typing import Any, Callable, Optional

import pytorch_lightning as pl
import torch

from ..progress import ProgressWriter, better
from ..storage import Location
from ..tracking import RunTracker


class EarlyStopping:
    """Keras' EarlyStopping semantics (patience, min_delta, restore_best_weights also at maxEpochs) plus a
    stopping threshold; its state and best weights go into every checkpoint."""

    def __init__(self, monitor: str, patience: int, min_delta: float, restore_best_weights: bool,
                 stopping_threshold: Optional[float]):
        self.monitor, self.patience, self.min_delta = monitor, patience, min_delta
        self.restore_best_weights, self.stopping_threshold = restore_best_weights, stopping_threshold
        self.wait, self.best, self.best_epoch = 0, None, None
        self.best_weights: Optional[dict[str, torch.Tensor]] = None

    def update(self, epoch: int, metrics: dict[str, float], module: torch.nn.Module) -> bool:
        """Counts epoch (1-based); True when training must stop (the best weights are then restored)."""
        current = metrics.get(self.monitor)
        self.wait += 1
        if better(self.monitor, current, self.best, self.min_delta):
            self.best, self.best_epoch, self.wait = current, epoch, 0
            if self.restore_best_weights:
                self.best_weights = copy.deepcopy({k: v.detach().cpu() for k, v in module.state_dict().items()})
        reached = current is not None and self.stopping_threshold is not None and (
            current >= self.stopping_threshold if "acc" in self.monitor else current <= self.stopping_threshold)
        stop = reached or (self.wait >= self.patience and epoch > 1)
        if stop:
            self.restore(module)
        return stop

    def restore(self, module: torch.nn.Module) -> None:
        if self.restore_best_weights and self.best_weights is not None:
            module.load_state_dict(self.best_weights)

    def state(self) -> dict[str, Any]:
        return {"wait": self.wait, "best": self.best, "bestEpoch": self.best_epoch}

    def resume_from(self, state: dict[str, Any], best_weights: Optional[dict]) -> None:
        self.wait, self.best, self.best_epoch = state.get("wait", 0), state.get("best"), state.get("bestEpoch")
        self.best_weights = best_weights


class EpochEnd(pl.Callback):
    """After each epoch's validation: metrics over all ranks, early stopping, then (rank 0) progress.json,
    MLflow, the log line and a checkpoint every N epochs. Epochs are counted from the resumed one."""

    def __init__(self, *, initial_epoch: int, images_per_epoch: int, monitor: str,
                 early_stopping: Optional[EarlyStopping], progress: Optional[ProgressWriter],
                 tracker: Optional[RunTracker], checkpointer: Optional["Checkpointer"], log: Callable[[str], None],
                 best: tuple[Optional[int], dict]):
        self.initial_epoch, self.images_per_epoch, self.monitor = initial_epoch, images_per_epoch, monitor
        self.early_stopping, self.progress, self.tracker = early_stopping, progress, tracker
        self.checkpointer, self.say, self.best = checkpointer, log, best
        self.epoch = initial_epoch
        self._epoch_start = self._train_end = 0.0

    def on_train_epoch_start(self, trainer, pl_module):
        self._epoch_start, self._train_end = time.monotonic(), 0.0

    def on_validation_epoch_start(self, trainer, pl_module):
        self._train_end = self._train_end or time.monotonic()

    def on_train_epoch_end(self, trainer, pl_module):
        self.epoch = self.initial_epoch + trainer.current_epoch + 1
        rate = self.images_per_epoch / max((self._train_end or time.monotonic()) - self._epoch_start, 1e-9)
        metrics = pl_module.epoch_metrics()
        stop = False
        if self.early_stopping is not None:
            stop = self.early_stopping.update(self.epoch, metrics, pl_module)
            if self.early_stopping.best_epoch == self.epoch:
                self.best = (self.epoch, metrics)
        elif self.best[0] is None or better(self.monitor, metrics.get(self.monitor), self.best[1].get(self.monitor)):
            self.best = (self.epoch, metrics)
        if stop:
            trainer.should_stop = True
        if self.progress is None:
            return
        self.progress.epoch(self.epoch, metrics, rate, self.best[0], self.best[1])
        if self.tracker is not None:
            self.tracker.epoch(self.epoch, metrics, rate)
        shown = " ".join(f"{k}={v:.4f}" for k, v in metrics.items())
        self.say(f"epoch {self.epoch}/{self.progress.document['maxEpochs']}: {shown} ({rate:.0f} img/s)"
                 + (f"; early stopping, best epoch {self.best[0]}" if stop else ""))
        if self.checkpointer is not None and (self.epoch % self.checkpointer.every_epochs == 0 or stop):
            self.checkpointer.save(self.epoch, pl_module, trainer.optimizers[0], self.early_stopping)

    def on_train_end(self, trainer, pl_module):
        if self.early_stopping is not None and not trainer.should_stop:
            self.early_stopping.restore(pl_module)  # maxEpochs reached: the best epoch's weights, as Keras'
        if self.checkpointer is not None:
            self.checkpointer.finish(self.epoch, pl_module, trainer.optimizers[0], self.early_stopping)


class Checkpointer:
    """Rank 0: `<runLocation>/checkpoints/epoch-NNNNN/checkpoint.pt` (model, optimizer, best weights), then
    state.json, the commit point, in the Keras trainer's shape (epoch, history, early stopping, trainedOn)."""

    def __init__(self, root: Location, every_epochs: int, progress: ProgressWriter, resume_facts: dict[str, Any]):
        self.root, self.every_epochs, self.progress, self.resume_facts = root, every_epochs, progress, resume_facts
        self._state: Optional[dict] = None

    def save(self, epoch: int, module: torch.nn.Module, optimizer, early_stopping: Optional[EarlyStopping],
             finished: bool = False) -> None:
        tag = f"epoch-{epoch:05d}"
        buffer = io.BytesIO()
        torch.save({"model": module.state_dict(), "optimizer": optimizer.state_dict(),
                    "best": early_stopping.best_weights if early_stopping else None}, buffer)
        self.root.join(tag, "checkpoint.pt").write_bytes_atomic(buffer.getvalue())
        self._write_state({
            "epoch": epoch, "checkpoint": tag, "earlyStopping": early_stopping.state() if early_stopping else None,
            "bestWeights": bool(early_stopping and early_stopping.best_weights is not None),
            "history": self.progress.document["history"], "finished": finished, **self.resume_facts,
        })
        self._remove_older(tag)

    def finish(self, epoch: int, module, optimizer, early_stopping: Optional[EarlyStopping]) -> None:
        """Marks the run finished, so that a rerun of the same run does not train again."""
        if self._state and self._state["epoch"] == epoch:
            self._write_state({**self._state, "finished": True})
        else:
            self.save(epoch, module, optimizer, early_stopping, finished=True)

    def _write_state(self, state: dict) -> None:
        self.root.join("state.json").write_bytes_atomic(json.dumps(state).encode())
        self._state = state

    def _remove_older(self, keep: str) -> None:
        from pyarrow import fs as pafs

        for info in self.root.fs.get_file_info(pafs.FileSelector(self.root.path)):
            if info.type == pafs.FileType.Directory and info.base_name.startswith("epoch-") and info.base_name != keep:
                self.root.fs.delete_dir(info.path)


def load_resume_state(root: Location) -> Optional[dict]:
    state_at = root.join("state.json")
    return json.loads(state_at.read_bytes()) if state_at.exists() else None


def load_checkpoint(root: Location, state: dict) -> dict[str, Any]:
    """The checkpoint state.json points to: {"model", "optimizer", "best"} (read by every rank)."""
    data = root.join(state["checkpoint"], "checkpoint.pt").read_bytes()
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
