"""The training order every engine follows, written once: open the attempt (dataset, checkpoint, a run already
finished), check the user's network, scale the run, start MLflow, build the network and restore the checkpoint,
early stopping, the progress document, fit, save. A `TrainingFramework` (frameworks/keras/training.py,
frameworks/lightning/training.py) supplies each step's framework part: what it builds, restores, fits and saves.

Only rank 0 logs, records the epochs and commits checkpoints and the model (a framework whose saving is a collective
writes on every rank and commits on rank 0).
"""

from __future__ import annotations

import time
from typing import Any, Callable, ContextManager, Optional, Protocol

from .checkpoints import CheckpointState
from .early_stopping import EarlyStoppingRule
from .probe import ProbeResult
from .progress import EpochRecorder
from .scaling import ScaledRun
from .session import Attempt
from .weights import local_weights


class EarlyStopping(Protocol):
    """A framework's early-stopping callback over core.early_stopping's rule."""

    def resume_from(self, state: Any, best_weights: Any) -> None: ...


class TrainingFramework(Protocol):
    """A framework's part of each step of the order (the API's `Framework` enum only names a framework)."""

    def prepare(self) -> None:
        """Before the attempt opens: seeds, threads, checks that need no data."""

    def check_network(self) -> None:
        """The user's network (model.builder) built once and checked, before anything else touches the data."""

    def scale(self, weights: Optional[str]) -> tuple[ScaledRun, Optional[ProbeResult]]:
        """Batch size, learning rate and steps (with batchSizePerWorker auto, after the probe)."""

    def heading(self, scaled: ScaledRun) -> str:
        """The start line's first part: the engine and the scaled run."""

    def run_params(self) -> dict[str, Any]:
        """The framework's and engine's own MLflow parameters."""

    def scope(self) -> ContextManager:
        """Where the network, the optimizer and their restored state are created."""

    def build(self, scaled: ScaledRun, weights: Optional[str]) -> None: ...

    def restore(self, state: CheckpointState) -> Any:
        """Every rank: the checkpoint's model and optimizer; returns its early stopping's best weights."""

    def early_stopping(self, rule: EarlyStoppingRule, restore_best_weights: bool) -> EarlyStopping: ...

    def prepare_fit(self, scaled: ScaledRun, early_stopping: Optional[EarlyStopping],
                    recorder: Optional[EpochRecorder], history: Callable[[], list[dict]],
                    probe: Optional[dict]) -> None:
        """The callbacks around fit: early stopping, rank 0's epoch records, checkpoints, heartbeats."""

    def fit(self, scaled: ScaledRun) -> None:
        """The epochs from attempt.initial_epoch to maxEpochs."""

    def save(self) -> Optional[str]:
        """The trained model's URI on rank 0 (None elsewhere), and anything else the run keeps."""


def run_training(attempt: Attempt, framework: TrainingFramework) -> int:
    """One attempt's training on this rank, in the order every framework shares."""
    config, training, log = attempt.config, attempt.config.training, attempt.log
    framework.prepare()
    if not attempt.open():
        return 0
    framework.check_network()
    weights = local_weights(config.model.weights, attempt.endpoint, attempt.region) if config.model.base else None
    scaled, probe = framework.scale(weights)
    attempt.scaled = scaled
    dataset = attempt.dataset
    log(f"{framework.heading(scaled)}; {dataset.rows['train']} train / {dataset.rows['validation']} validation rows, "
        f"{attempt.classes} classes")
    tracker = attempt.start_tracking(scaled, **framework.run_params())

    state = attempt.state
    best_weights = None
    with framework.scope():
        framework.build(scaled, weights)
        if state:
            # Every rank reads the same checkpoint, so that all create the same optimizer state.
            attempt.heartbeat.beat("restore")
            best_weights = framework.restore(state)
            attempt.heartbeat.beat("restore")

    stopping = training.early_stopping
    early_stopping = None
    if stopping.enabled:
        rule = EarlyStoppingRule(stopping.monitor, stopping.patience, stopping.min_delta, stopping.stopping_threshold)
        early_stopping = framework.early_stopping(rule, stopping.restore_best_weights)
        if state and state.early_stopping:
            early_stopping.resume_from(state.early_stopping, best_weights)

    probe_document = probe.document() if probe else None
    progress = recorder = None
    if attempt.rank == 0:
        progress = attempt.start_progress(scaled, probe=probe_document)
        recorder = EpochRecorder(progress, stopping.monitor, early_stopping=early_stopping is not None,
                                 tracker=tracker, log=log, best=attempt.best_so_far())
    framework.prepare_fit(scaled, early_stopping, recorder, progress.history if progress else list, probe_document)

    attempt.started = time.monotonic()
    if attempt.initial_epoch < training.max_epochs:
        framework.fit(scaled)
    model_uri = framework.save()
    if attempt.rank == 0:
        attempt.succeed(model_uri)
    return 0
