"""The reporting side of the SDK: rank 0 writes the same progress.json (and MLflow run) as our trainers, so that
status, `kubectl get srun`, sweeps, InputBound and the report work for a script of the user's own.

One Session per process (the SDK's module functions share it, as `hvd.init()` does); other ranks hold one too,
which writes nothing.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any, Callable, Optional

from scalingrun_api.config import TrainerConfig
from scalingrun_api.heartbeat import HEARTBEAT_FILE
from scalingrun_api.progress import PROGRESS_FILE
from ..core.heartbeat import HeartbeatWriter
from ..core.input_wait import input_entry
from ..core.progress import EpochRecorder, ProgressWriter
from ..core.session import error_line
from ..core.tracking import RunTracker, start_tracking
from ..storage import open_location
from .context import Context


class Session:
    """Rank 0's progress document and tracker for one run; every method is a no-op on other ranks."""

    def __init__(self, context: Context, config: TrainerConfig, log: Callable[[str], None] = print):
        self.context = context
        self.log = log if context.is_chief else (lambda line: None)
        self.finished = False
        self.readers: list[Any] = []  # Petastorm readers (or batches with close()) the SDK opened: stopped at finish()
        self._lock = threading.Lock()
        self.progress: Optional[ProgressWriter] = None
        self.tracker: Optional[RunTracker] = None
        self.recorder: Optional[EpochRecorder] = None
        self.heartbeat = HeartbeatWriter(None, rank=context.rank)
        if not context.is_chief:
            return
        run_root = open_location(context.run_location, config.storage.endpoint, config.storage.region)
        self.heartbeat = HeartbeatWriter(run_root.join(HEARTBEAT_FILE), rank=0, pushed=True)  # the run's own
        self.heartbeat.beat("starting")
        # No collective here (the SDK knows no MPI): rank 0 alone meets a tracking error, raises, and mpirun stops
        # the other ranks.
        self.tracker = start_tracking(config, 0, run_root.uri, _run_params(context), None, self.log, lambda e: e)
        self.progress = ProgressWriter(
            run_root.join(PROGRESS_FILE), max_epochs=context.max_epochs, processes=context.size,
            learning_rate=context.learning_rate, effective_batch_size=context.effective_batch_size,
            mlflow_run_id=self.tracker.run_id if self.tracker else None,
            batch_size_per_worker=context.batch_size_per_worker)
        self.progress.start()
        # The best epoch by earlyStopping.monitor (the script's own early stopping, if any, is not ours to know).
        self.recorder = EpochRecorder(self.progress, config.training.early_stopping.monitor, early_stopping=False,
                                      tracker=self.tracker, log=self.log)

    def beat(self, step: Optional[int] = None, epoch: Optional[int] = None, phase: str = "training") -> None:
        """The script's loop is alive (rank 0 writes heartbeat.json, at most every 30 s)."""
        with self._lock:
            self.heartbeat.beat(phase, step=step, epoch=epoch)

    def report_epoch(self, epoch: int, metrics: dict[str, float], images_per_second: float,
                     input_wait_fraction: Optional[float] = None) -> None:
        self.beat(epoch=epoch)
        if self.recorder is None:
            return
        figures = input_entry(epoch, input_wait_fraction, None) if input_wait_fraction is not None else None
        with self._lock:
            self.recorder.record(epoch, {str(k): float(v) for k, v in metrics.items()}, images_per_second,
                                 input_figures=figures)

    def finish(self, model_uri: Optional[str] = None) -> None:
        self.stop_readers()
        if self.finished:
            return
        self.finished = True
        if self.progress is None:
            return
        with self._lock:
            self.progress.finish("succeeded", model_uri=model_uri)
        if self.tracker is not None:
            progress = self.progress.progress
            self.tracker.finish("FINISHED", best_epoch=progress.best_epoch, best_metrics=progress.best_metrics,
                                model_uri=model_uri)

    def fail(self, error: str) -> None:
        """The script's exception, on the run: progress.json's error (status, the Failed condition) and MLflow.
        Also after finish(): the script's exit code fails the MPIJob, and the document must say why."""
        self.finished = True
        if self.progress is None or self.progress.progress.state == "failed":
            return
        with self._lock:
            self.progress.finish("failed", model_uri=self.progress.progress.model_uri, error=error)
        if self.tracker is not None:
            self.tracker.finish("FAILED", error=error)

    def stop_readers(self) -> None:
        while self.readers:
            reader = self.readers.pop()
            if hasattr(reader, "close"):  # lightning.data.TrainBatches: its prefetching thread, then its reader
                reader.close()
            else:
                reader.stop()
                reader.join()


def install_excepthook(session: Session) -> None:
    """An exception that escapes the script is reported on the run (rank 0), printed as Python would, and ends the
    process at once (os._exit(1)) when it is one rank of several, or when a thread that is not a daemon (a data
    reader's) would keep it alive. Python's own way out hangs there: mpi4py's exit handler runs MPI_Finalize, a
    fence that waits for the other ranks, which wait for this one in their first collective (DDP's rendezvous), so
    the rank never exits non-zero and mpirun never stops the others. Measured: a Lightning script whose rank 1
    raised at start-up hung in ompi_mpi_finalize for as long as it was left."""
    previous = sys.excepthook

    def hook(kind, value, traceback):
        if not issubclass(kind, KeyboardInterrupt):
            try:
                session.fail(error_line(value))
            except Exception as exc:  # noqa: BLE001 - the original error must still be printed
                print(f"scalingrun sdk: could not report the error on the run: {exc}", file=sys.stderr)
        previous(kind, value, traceback)
        if threading.current_thread() is threading.main_thread() and (
                session.context.size > 1 or _threads_holding_exit()):
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)

    sys.excepthook = hook


def _threads_holding_exit() -> list[str]:
    """Threads other than this one that Python would wait for before it exits."""
    return [t.name for t in threading.enumerate()
            if t is not threading.current_thread() and not t.daemon and t.is_alive()]


def _run_params(context: Context) -> dict[str, Any]:
    """MLflow parameters of a command run: what the SDK derived, and the command itself."""
    training = context.config.training
    return {
        "command": json.dumps(training.command), "framework": training.framework,
        "imageSize": context.image_size, "classes": context.num_classes, "dataset": context.dataset.uri,
        "datasetFingerprint": context.dataset.fingerprint, "trainRows": context.dataset.rows["train"],
        "validationRows": context.dataset.rows["validation"], "processes": context.size,
        "batchSizePerWorker": context.batch_size_per_worker, "effectiveBatchSize": context.effective_batch_size,
        "learningRate": context.learning_rate, "stepsPerEpoch": context.steps_per_epoch,
        "maxEpochs": context.max_epochs, **{f"param.{k}": v for k, v in context.params.items()},
    }
