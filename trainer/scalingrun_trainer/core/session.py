"""One attempt of a run on one rank, as every engine makes it: the checks before training (the dataset, the class
count, the checkpoint to resume, a run already finished), MLflow's start, the progress document, the finish, and
the error wrapper that stops every rank with a one-line cause and marks progress and MLflow failed.

What an engine gives it: a `Collective` (its rank, world size and broadcast/all-reduce) and its name for messages.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
import uuid
from typing import Any, Callable, Optional

import numpy as np
from scalingrun_api.config import TrainerConfig
from scalingrun_api.heartbeat import HEARTBEAT_FILE, PREEMPTED_EXIT_CODE
from scalingrun_api.progress import PROGRESS_FILE, Devices, FeatureCache
from ..storage import open_location
from .builder import BuilderError, network_name
from .checkpoints import CheckpointState, CheckpointStore
from .collective import Collective
from .dataset import Dataset, DatasetError, check_shardable, open_dataset
from .feature_cache import FeatureCacheData, Weights, build_feature_cache, reason_not_used, share
from .heartbeat import HeartbeatWriter
from .preemption import Preempted, PreemptionNotice
from .probe import ProbeError
from .progress import Best, ProgressWriter, best_so_far, push_recorded
from .scaling import ScaledRun
from .stall import StallWatch, collective_timeout, silent_peer
from .tracking import RunTracker, TrackingError, start_tracking
from .weights import ModelError, WeightsError


class TrainingError(RuntimeError):
    """A configuration or data problem; every rank exits with its one-line cause."""


# What stops an attempt with a one-line cause instead of a traceback.
EXPECTED_ERRORS = (TrainingError, DatasetError, ModelError, WeightsError, BuilderError, TrackingError, ProbeError,
                   ValueError, OSError)


def error_line(exc: BaseException) -> str:
    """How a run's status shows an error: its type and the first line of its message."""
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def leave_now(code: int) -> None:
    """Ends this process with `code` without finalizing MPI (see Attempt.run), its output flushed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Attempt:
    """One rank's attempt. `engine` names it in error lines ("" for the original Keras + Horovod trainer's);
    `trained_on` adds the engine's facts to what a checkpoint must match to be resumed."""

    def __init__(self, config: TrainerConfig, world: Collective, *, engine: str = "",
                 trained_on: Optional[dict[str, Any]] = None):
        self.config, self.world, self.engine = config, world, engine
        self.rank, self.size = world.rank, world.size
        self.endpoint, self.region = config.storage.endpoint, config.storage.region
        self.extra_trained_on = trained_on or {}
        self.progress: Optional[ProgressWriter] = None  # rank 0's, once training starts
        self.devices: Optional[Devices] = None  # what this rank trains on: the engine says, before start_progress
        self.tracker: Optional[RunTracker] = None
        self.run_root = open_location(config.run_location, self.endpoint, self.region)
        self.checkpoints = CheckpointStore(self.run_root.join("checkpoints"), commit=self.rank == 0)
        # Every rank beats from its loop (the longest gap); rank 0 writes heartbeat.json and pushes it.
        self.heartbeat = HeartbeatWriter(self.run_root.join(HEARTBEAT_FILE) if self.rank == 0 else None,
                                         rank=self.rank, pushed=True)
        self.stall_watch: Optional[StallWatch] = None  # from watch_peers(), armed at the first training step
        self.state: Optional[CheckpointState] = None
        self.scaled: Optional[ScaledRun] = None  # set by the training once it scaled the run
        self.dataset: Optional[Dataset] = None
        self.classes = 0
        self.started = time.monotonic()
        # None when the head trains on cached features (core/feature_cache.py), else why not.
        self.feature_cache_reason = reason_not_used(config)
        # SIGTERM: a checkpoint at the next training step (core/preemption.py); installed by run().
        self.notice = PreemptionNotice(leave_now)

    def log(self, line: str) -> None:
        """Rank 0 speaks for all."""
        if self.rank == 0:
            print(line, flush=True)

    @property
    def initial_epoch(self) -> int:
        return self.state.epoch if self.state else 0

    @property
    def initial_step(self) -> int:
        """Updates of epoch initial_epoch already trained (a checkpoint written on a preemption notice). A checkpoint
        of another effective batch (a resize whose replicas do not divide the spec's: core/scaling.py) counts in
        its own updates: the step that follows the rows it trained."""
        if not self.state:
            return 0
        written, now = self.state.effective_batch_size, self.scaled.effective_batch_size if self.scaled else None
        if written and now and written != now:
            return self.state.step * written // now
        return self.state.step

    @property
    def caches_features(self) -> bool:
        return self.feature_cache_reason is None

    @property
    def trained_on(self) -> dict[str, Any]:
        # "input": checkpoints of models that took float input (before uint8 + in-model normalisation) are not resumed.
        # "features": a head trained on cached features keeps the head's best weights only (Keras).
        cached = {"features": "cached"} if self.caches_features else {}
        return {"dataset": self.dataset.fingerprint, "base": network_name(self.config.model), "classes": self.classes,
                "input": "uint8", **cached, **self.extra_trained_on}

    def run(self, train: Callable[[], int]) -> int:
        """`train()`'s exit code; an expected error is printed on every rank as one line, and rank 0 marks
        progress.json and the MLflow run failed with it.

        A rank that fails among others leaves at once (leave_now): a normal exit finalizes MPI (mpi4py, Horovod),
        which waits for every other rank, so a rank failing alone, or beside a frozen one, would wait for ever
        instead of letting mpirun stop the others."""
        self.notice.install()
        try:
            code = self._run(train)
        except Exception as exc:  # noqa: BLE001 - printed as Python would, then the rank leaves
            if self.size == 1:
                raise
            traceback.print_exc()
            peer = silent_peer(exc)
            if peer is not None:
                where = f"{self.engine}, " if self.engine else ""
                print(f"scalingrun-trainer train ({where}rank {self.rank}/{self.size}): rank {peer} stopped answering "
                      f"({type(exc).__name__}: its heartbeat to the other ranks timed out)", file=sys.stderr,
                      flush=True)
            leave_now(1)
        finally:
            self.notice.uninstall()
        if code and self.size > 1:
            leave_now(code)
        return code

    def _run(self, train: Callable[[], int]) -> int:
        try:
            self.heartbeat.beat("starting")
            return train()
        except Preempted as preempted:
            self.stop_watching()
            where = f"{self.engine}, " if self.engine else ""
            print(f"scalingrun-trainer train ({where}rank {self.rank}/{self.size}): {preempted}", file=sys.stderr,
                  flush=True)
            return PREEMPTED_EXIT_CODE
        except EXPECTED_ERRORS as exc:
            self.stop_watching()
            message = error_line(exc)
            where = f"{self.engine}, " if self.engine else ""
            print(f"scalingrun-trainer train ({where}rank {self.rank}/{self.size}): error: {message}",
                  file=sys.stderr, flush=True)
            if self.progress is None and self.rank == 0 and isinstance(exc, BuilderError):
                self.progress = self._before_training()  # the document the operator quotes in the Failed condition
            if self.progress is not None:
                self.progress.finish("failed", error=message)
            if self.tracker is not None:
                self.tracker.finish("FAILED", error=message)
            return 2
        finally:
            self.stop_watching()

    def watch_peers(self) -> Optional[StallWatch]:
        """Every rank, just before training (a collective: rank 0 names this attempt's roll call): the watch that
        stops this rank when its loop makes no step for the collective timeout (core/stall.py). None with one
        rank or the watch turned off; the engine's callbacks arm it at the first step."""
        timeout = collective_timeout()
        token = self.world.broadcast(f"{int(time.time())}-{uuid.uuid4().hex[:8]}" if self.rank == 0 else None,
                                     "stall_watch")
        if self.size > 1 and timeout:
            self.stall_watch = StallWatch(self.heartbeat, self.run_root.join("stalls", token), rank=self.rank,
                                          size=self.size, timeout=timeout)
        return self.stall_watch

    def stop_watching(self) -> None:
        if self.stall_watch is not None:
            self.stall_watch.disarm()

    def open(self, readers: Optional[int] = None) -> bool:
        """The dataset (sharded over `readers`, default every rank), the class count, and the checkpoint to resume;
        False when the run already finished (nothing to train)."""
        self.dataset = open_dataset(self.config.dataset.output, self.endpoint, self.region)
        check_shardable(self.dataset, readers or self.size)
        self.classes = len(self.dataset.classes)
        wanted = self.config.model.num_classes
        if wanted and wanted != self.classes:
            raise TrainingError(f"model.numClasses is {wanted} but the dataset has {self.classes} classes "
                                f"({', '.join(self.dataset.classes[:5])}...): remove numClasses or fix the data")
        state = self.checkpoints.load() if self.config.training.resume else None
        if state and state.trained_on != self.trained_on:
            self.log(f"the checkpoint in {self.checkpoints.root.uri} is for another dataset, model or engine "
                     f"({state.trained_on}): starting from scratch")
            state = None
        self.state = state
        if state and state.finished:
            self.log(f"run already finished after epoch {state.epoch} (see {self.run_root.uri}/{PROGRESS_FILE}): "
                     "nothing to train; use a new run name to train again")
            if self.rank == 0:
                push_recorded(self.run_root.join(PROGRESS_FILE))
            return False
        return True

    def run_params(self, scaled: ScaledRun, **extra: Any) -> dict[str, Any]:
        """What an MLflow user compares runs by: the spec's choices and the values scaling derived."""
        model, training, dataset = self.config.model, self.config.training, self.dataset
        stopping = training.early_stopping
        network = {"builder": model.builder, **{f"param.{k}": v for k, v in (model.params or {}).items()}} \
            if model.builder else {"base": model.base, "weights": model.weights, "dropout": model.dropout,
                                   "trainableBase": model.trainable_base}
        return {
            **network, "imageSize": dataset.image_size, "classes": self.classes,
            "dataset": dataset.uri, "datasetFingerprint": dataset.fingerprint, "trainRows": dataset.rows["train"],
            "validationRows": dataset.rows["validation"], "processes": self.size,
            "batchSizePerWorker": scaled.batch_size_per_worker, "effectiveBatchSize": scaled.effective_batch_size,
            "baseLearningRate": training.base_learning_rate, "learningRateScaling": training.learning_rate_scaling,
            "learningRate": scaled.learning_rate, "stepsPerEpoch": scaled.steps_per_epoch,
            "optimizer": training.optimizer, "maxEpochs": training.max_epochs, "earlyStopping": stopping.enabled,
            "earlyStoppingMonitor": stopping.monitor, "earlyStoppingPatience": stopping.patience,
            "featureCache": training.feature_cache, "featureCacheUsed": self.caches_features, **extra,
        }

    def start_tracking(self, scaled: ScaledRun, **params: Any) -> Optional[RunTracker]:
        """Rank 0 opens (on resume, reopens) the MLflow run; its failure stops every rank."""
        self.tracker = start_tracking(self.config, self.rank, self.run_root.uri, self.run_params(scaled, **params),
                                      self.state.mlflow_run_id if self.state else None, self.log,
                                      lambda error: self.world.broadcast(error, "mlflow_start"))
        return self.tracker

    def best_so_far(self) -> Best:
        """The best epoch before this attempt (None for a fresh start)."""
        if not self.state:
            return None, {}
        stopping = self.state.early_stopping
        return best_so_far(self.state.history, stopping.best_epoch if stopping else None,
                           self.config.training.early_stopping.monitor)

    def start_progress(self, scaled: ScaledRun, probe: Optional[dict] = None) -> ProgressWriter:
        """Rank 0: the first progress document (at the resumed epoch, when resuming)."""
        state = self.state
        self.progress = ProgressWriter(
            self.run_root.join(PROGRESS_FILE), max_epochs=self.config.training.max_epochs, processes=self.size,
            learning_rate=scaled.learning_rate, effective_batch_size=scaled.effective_batch_size,
            history=state.history if state else None, mlflow_run_id=self.tracker.run_id if self.tracker else None,
            resumed_from_epoch=state.epoch if state else None, batch_size_per_worker=scaled.batch_size_per_worker,
            batch_size_probe=probe, feature_cache=FeatureCache(used=self.caches_features,
                                                                reason=self.feature_cache_reason),
            devices=self.devices)
        self.progress.start(best_epoch=self.best_so_far()[0])
        resized = (f"; written by {state.processes} processes, now {self.size}"
                   if state and state.processes and state.processes != self.size else "")
        if state and state.step:
            self.log(f"resuming at step {self.initial_step} of epoch {state.epoch + 1} (a checkpoint written on a "
                     f"preemption notice{resized}) from {self.checkpoints.root.uri}")
        elif state:
            self.log(f"resuming after epoch {state.epoch}{resized} from {self.checkpoints.root.uri}")
        return self.progress

    def _before_training(self) -> ProgressWriter:
        """Rank 0's progress document for a failure before training (a model.builder that breaks its contract):
        no learning rate or batch yet, the history of a resumed run kept."""
        state = self.state
        return ProgressWriter(self.run_root.join(PROGRESS_FILE), max_epochs=self.config.training.max_epochs,
                              processes=self.size, learning_rate=None, effective_batch_size=None,
                              history=state.history if state else None,
                              resumed_from_epoch=state.epoch if state else None)

    def resume_facts(self, **extra: Any) -> dict[str, Any]:
        """What every checkpoint of this attempt records besides the epoch: what it was trained on (a checkpoint is
        resumed only by a run with the same data, model and engine) and the MLflow run a resumed training
        continues."""
        size = {"processes": self.size, "effective_batch_size": self.scaled.effective_batch_size} if self.scaled else {}
        return {"trained_on": self.trained_on, "mlflow_run_id": self.tracker.run_id if self.tracker else None, **size,
                **extra}

    def succeed(self, model_uri: str) -> None:
        """Rank 0: the final progress document and MLflow status, and the last line."""
        self.progress.finish("succeeded", model_uri=model_uri)
        progress = self.progress.progress
        if self.tracker is not None:
            self.tracker.finish("FINISHED", best_epoch=progress.best_epoch, best_metrics=progress.best_metrics,
                                model_uri=model_uri)
        self.log(f"done in {time.monotonic() - self.started:.0f} s: best epoch {progress.best_epoch} "
                 f"{progress.best_metrics}; model {model_uri}")


def cache_features(attempt: Attempt, extract: Callable[[np.ndarray], np.ndarray], batch_size: int,
                   base_weights: Optional[Weights]) -> FeatureCacheData:
    """Every rank: builds its cache with `extract`, then (a collective) the run's figures, logged and (rank 0) in
    progress.json. `base_weights`: the network's, made rank 0's first when they are random; None when the engine
    created them with rank 0's values (MultiWorkerMirroredStrategy broadcasts every variable's initial value)."""
    config = attempt.config
    if base_weights is not None and config.model.weights == "none" and not attempt.state and attempt.size > 1:
        # A randomly initialised base must be rank 0's everywhere before any rank computes features with it (without
        # the cache, the framework synchronises it at the first step, after the last use of a rank's own).
        weights = attempt.world.broadcast(base_weights.get() if attempt.rank == 0 else None, "base_weights")
        if attempt.rank:
            base_weights.set(weights)
    cache = build_feature_cache(attempt.dataset, extract, rank=attempt.rank, size=attempt.size,
                                seed=config.dataset.seed, batch_size=batch_size,
                                beat=lambda rows: attempt.heartbeat.beat("feature-cache", step=rows))
    try:
        figures = share(cache, attempt.dataset, attempt.world)
    except BaseException:
        cache.close()
        raise
    where = "on local disk" if figures.on_disk else "in memory"
    attempt.log(f"scalingrun-trainer: feature cache: the frozen base ran once over {figures.rows} images in "
                f"{figures.seconds:.1f} s; {figures.bytes / 1e6:.1f} MB of features {where}; the head trains on them")
    if attempt.progress is not None:
        attempt.progress.feature_cache_built(figures)
    return cache
