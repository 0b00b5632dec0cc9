"""Keras callbacks: early stopping that can resume, per-epoch reporting, checkpoints (rank 0 only)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from .input_wait import GpuSampler, InputClock, StepTimes, input_entry
from .progress import ProgressWriter
from .storage import Location
from .tracking import RunTracker


class ResumableEarlyStopping(tf.keras.callbacks.EarlyStopping):
    """EarlyStopping plus a stopping threshold, a state that survives restarts, and restoring the best
    weights also when maxEpochs ends the training (Keras restores them only when it stops early)."""

    def __init__(self, *, stopping_threshold: Optional[float] = None, **kwargs):
        super().__init__(**kwargs)
        self.stopping_threshold = stopping_threshold
        self._resumed: Optional[dict] = None

    @property
    def best_epoch_number(self) -> Optional[int]:
        """1-based epoch of the best monitored value; None before any epoch counted."""
        return self.best_epoch + 1 if np.isfinite(self.best) else None

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)  # resets wait, best and best_weights
        if self._resumed and self._resumed.get("bestEpoch"):
            self.wait = self._resumed["wait"]
            self.best = self._resumed["best"]
            self.best_epoch = self._resumed["bestEpoch"] - 1
            self.best_weights = self._resumed.get("bestWeights")

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        current = self.get_monitor_value(logs)
        if current is None or self.stopping_threshold is None or self.model.stop_training:
            return
        if self.monitor_op(current, self.stopping_threshold) or current == self.stopping_threshold:
            self.stopped_epoch = epoch
            self.model.stop_training = True
            if self.restore_best_weights and self.best_weights is not None:
                self.model.set_weights(self.best_weights)

    def on_train_end(self, logs=None):
        super().on_train_end(logs)
        if self.restore_best_weights and self.best_weights is not None and not self.stopped_epoch:
            self.model.set_weights(self.best_weights)

    def state(self) -> dict[str, Any]:
        return {"wait": int(self.wait), "best": float(self.best), "bestEpoch": self.best_epoch_number}

    def resume_from(self, state: dict[str, Any], best_weights: Optional[list[np.ndarray]]) -> None:
        self._resumed = {**state, "bestWeights": best_weights}


class InputWaitMeter(tf.keras.callbacks.Callback):
    """Every rank: the epoch's input-wait share and GPU utilisation (method in input_wait.py). Runs before
    the EpochReporter, which reads `latest`; `combine(wait, gpu)` merges the ranks' figures (collective)."""

    def __init__(self, clock: InputClock, gpu: Optional[GpuSampler] = None, combine=None,
                 timer=time.perf_counter):
        super().__init__()
        self.clock, self.gpu, self.combine, self.timer = clock, gpu, combine, timer
        self.times = StepTimes()
        self.latest: Optional[dict] = None
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
    """Measures training throughput (validation excluded) and writes the progress document."""

    def __init__(self, progress: ProgressWriter, images_per_epoch: int, monitor: str,
                 early_stopping: Optional[ResumableEarlyStopping], log=print, tracker: Optional[RunTracker] = None,
                 input_meter: Optional[InputWaitMeter] = None):
        super().__init__()
        self.progress = progress
        self.input_meter = input_meter
        self.tracker = tracker
        self.images_per_epoch = images_per_epoch
        self.monitor = monitor
        self.early_stopping = early_stopping
        self.log = log
        self._epoch_start = self._train_end = 0.0
        self.best: tuple[Optional[int], dict] = (None, {})

    def resume(self, history: list[dict], best_epoch: Optional[int]) -> None:
        """The best epoch so far: early stopping's when it ran, else the best monitored value."""
        for entry in history:
            metrics = {k: v for k, v in entry.items() if k not in ("epoch", "imagesPerSecond")}
            if entry["epoch"] == best_epoch or (
                best_epoch is None and _better(self.monitor, metrics.get(self.monitor), self.best[1].get(self.monitor))
            ):
                self.best = (entry["epoch"], metrics)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.monotonic()
        self._train_end = 0.0

    def on_test_begin(self, logs=None):
        self._train_end = self._train_end or time.monotonic()

    def on_epoch_end(self, epoch, logs=None):
        seconds = (self._train_end or time.monotonic()) - self._epoch_start
        rate = self.images_per_epoch / max(seconds, 1e-9)
        metrics = {k: float(v) for k, v in (logs or {}).items() if k != "lr"}
        if self.early_stopping is not None:
            if self.early_stopping.best_epoch_number == epoch + 1:
                self.best = (epoch + 1, metrics)
        elif self.best[0] is None or _better(self.monitor, metrics.get(self.monitor), self.best[1].get(self.monitor)):
            self.best = (epoch + 1, metrics)
        figures = self.input_meter.latest if self.input_meter is not None else None
        self.progress.epoch(epoch + 1, metrics, rate, self.best[0], self.best[1], input_figures=figures)
        if self.tracker is not None:
            self.tracker.epoch(epoch + 1, metrics, rate)
        shown = " ".join(f"{k}={v:.4f}" for k, v in metrics.items())
        extra = ""
        if figures and figures.get("inputWaitFraction") is not None:
            extra += f", input wait {figures['inputWaitFraction']:.0%}"
        if figures and figures.get("gpuUtilization") is not None:
            extra += f", GPU {figures['gpuUtilization']:.0f}%"
        self.log(f"epoch {epoch + 1}/{self.progress.document['maxEpochs']}: {shown} ({rate:.0f} img/s{extra})")


def _better(monitor: str, value: Optional[float], best: Optional[float]) -> bool:
    if value is None:
        return False
    if best is None:
        return True
    return value > best if "acc" in monitor else value < best


class Checkpointer(tf.keras.callbacks.Callback):
    """Every N epochs: model + optimizer (tf.train.Checkpoint), best weights and the early-stopping
    state, under `<runLocation>/checkpoints/`. state.json is written last: it is the commit point."""

    def __init__(self, root: Location, checkpoint: tf.train.Checkpoint, every_epochs: int,
                 early_stopping: Optional[ResumableEarlyStopping], reporter: EpochReporter,
                 resume_facts: dict[str, Any]):
        super().__init__()
        self.root = root
        self.checkpoint = checkpoint
        self.every_epochs = every_epochs
        self.early_stopping = early_stopping
        self.reporter = reporter
        # trainedOn: a checkpoint is resumed only by a run with the same data and model; mlflowRunId: the
        # MLflow run a resumed training continues.
        self.resume_facts = resume_facts
        self._state: Optional[dict] = None
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every_epochs == 0 or self.model.stop_training:
            self.save(epoch + 1)

    def on_train_end(self, logs=None):
        # Marks the run finished, so that a rerun of the same run does not train again.
        if self._state and self._state["epoch"] == self._epoch + 1:
            self._write_state({**self._state, "finished": True})
        else:
            self.save(self._epoch + 1, finished=True)

    def _write_state(self, state: dict) -> None:
        self.root.join("state.json").write_bytes_atomic(json.dumps(state).encode())
        self._state = state

    def save(self, epoch: int, finished: bool = False) -> None:
        workdir = tempfile.mkdtemp(prefix="ckpt-")
        try:
            prefix = self.checkpoint.write(os.path.join(workdir, "ckpt"))
            names = [n for n in os.listdir(workdir) if n.startswith("ckpt")]
            tag = f"epoch-{epoch:05d}"
            for name in names:
                with open(os.path.join(workdir, name), "rb") as f:
                    self.root.join(tag, name).write_bytes_atomic(f.read())
            best = self.early_stopping.best_weights if self.early_stopping else None
            if best is not None:
                np.savez(os.path.join(workdir, "best.npz"), *best)
                with open(os.path.join(workdir, "best.npz"), "rb") as f:
                    self.root.join(tag, "best.npz").write_bytes_atomic(f.read())
            state = {
                "epoch": epoch, "checkpoint": tag, "prefix": os.path.basename(prefix),
                "earlyStopping": self.early_stopping.state() if self.early_stopping else None,
                "bestWeights": best is not None, "history": self.reporter.progress.document["history"],
                "finished": finished, **self.resume_facts,
            }
            self._write_state(state)
            self._remove_older(tag)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _remove_older(self, keep: str) -> None:
        from pyarrow import fs as pafs

        for info in self.root.fs.get_file_info(pafs.FileSelector(self.root.path)):
            if info.type == pafs.FileType.Directory and info.base_name.startswith("epoch-") and info.base_name != keep:
                self.root.fs.delete_dir(info.path)


def load_resume_state(root: Location) -> Optional[dict]:
    state_at = root.join("state.json")
    if not state_at.exists():
        return None
    return json.loads(state_at.read_bytes())


def restore(root: Location, state: dict, checkpoint: tf.train.Checkpoint) -> Optional[list[np.ndarray]]:
    """Loads model + optimizer into `checkpoint`'s objects; returns the saved best weights, if any.

    The optimizer's slots are created at its first step and restored then (deferred restoration), so
    the downloaded files must outlive this call: they are removed when the process exits.
    """
    import atexit

    from pyarrow import fs as pafs

    workdir = tempfile.mkdtemp(prefix="restore-")
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    folder = root.join(state["checkpoint"])
    for info in folder.fs.get_file_info(pafs.FileSelector(folder.path)):
        with open(os.path.join(workdir, info.base_name), "wb") as f:
            f.write(folder.join(info.base_name).read_bytes())
    checkpoint.read(os.path.join(workdir, state["prefix"])).expect_partial()
    if not state.get("bestWeights"):
        return None
    with np.load(os.path.join(workdir, "best.npz")) as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]
