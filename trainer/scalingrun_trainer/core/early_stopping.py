"""spec.training.earlyStopping's rule, the same for every framework: Keras' EarlyStopping (patience, min_delta,
checked from the second epoch on) plus a stopping threshold, with counters that survive restarts. A framework's
callback feeds it each epoch's averaged metrics and keeps the best epoch's weights when it says so (restoring them
when training stops, early or at maxEpochs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .checkpoints import EarlyStoppingState
from .progress import better


@dataclass(frozen=True)
class Verdict:
    improved: bool  # the best so far: keep this epoch's weights
    stop: bool  # training ends after this epoch


class EarlyStoppingRule:
    def __init__(self, monitor: str, patience: int, min_delta: float, stopping_threshold: Optional[float] = None):
        self.monitor, self.patience, self.min_delta = monitor, patience, min_delta
        self.stopping_threshold = stopping_threshold
        self.wait = 0
        self.best: Optional[float] = None
        self.best_epoch: Optional[int] = None  # 1-based

    def update(self, epoch: int, metrics: dict[str, float]) -> Verdict:
        """Counts epoch (1-based) from its metrics; an epoch without the monitored metric counts for nothing."""
        current = metrics.get(self.monitor)
        if current is None:
            return Verdict(improved=False, stop=False)
        self.wait += 1
        improved = better(self.monitor, current, self.best, self.min_delta)
        if improved:
            self.best, self.best_epoch, self.wait = current, epoch, 0
        waited = not improved and self.wait >= self.patience and epoch > 1
        return Verdict(improved, waited or self.reached(current))

    def reached(self, current: float) -> bool:
        """The stopping threshold: accuracies at or above it, losses at or below."""
        if self.stopping_threshold is None:
            return False
        if "acc" in self.monitor:
            return current >= self.stopping_threshold
        return current <= self.stopping_threshold

    def state(self) -> EarlyStoppingState:
        return EarlyStoppingState(wait=self.wait, best=self.best, best_epoch=self.best_epoch)

    def resume_from(self, state: EarlyStoppingState) -> None:
        """The counters a checkpoint kept; none before any epoch had the monitored metric."""
        if state.best_epoch is not None:
            self.wait, self.best, self.best_epoch = state.wait, state.best, state.best_epoch
