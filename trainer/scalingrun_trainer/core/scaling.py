"""How batch size, learning rate and steps follow from the number of data-parallel replicas. Pure.

A replica is a Horovod or DDP process (one per GPU), or one device of a multi-worker-mirrored process (each of
its GPUs, or its CPU): the same rules for every engine, with `processes` counting replicas."""

from __future__ import annotations

import math
from dataclasses import dataclass

RULES = ("linear", "sqrt", "none")
# With batchSizePerWorker: auto, baseLearningRate counts for this batch on one process (the field's default).
REFERENCE_BATCH_SIZE = 32


def _factor(rule: str, ratio: float) -> float:
    factors = {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1}
    if rule not in factors:
        raise ValueError(f"unknown learning-rate scaling {rule!r}; expected one of {', '.join(RULES)}")
    return factors[rule]


def scaled_learning_rate(base: float, rule: str, processes: int) -> float:
    """linear: x N (Goyal et al.), sqrt: x sqrt(N) (for large batches / adaptive optimizers), none."""
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    return base * _factor(rule, processes)


@dataclass(frozen=True)
class ScaledRun:
    processes: int
    batch_size_per_worker: int
    effective_batch_size: int
    learning_rate: float
    steps_per_epoch: int

    def describe(self, replicas: str = "processes") -> str:
        """`replicas`: what the engine calls its replicas."""
        return (f"{self.processes} {replicas} x batch {self.batch_size_per_worker} = effective batch "
                f"{self.effective_batch_size}; learning rate {self.learning_rate:g}; "
                f"{self.steps_per_epoch} steps per epoch")


def scale_run(train_rows: int, batch_size_per_worker: int, base_learning_rate: float, rule: str,
              processes: int) -> ScaledRun:
    """Every process takes steps_per_epoch batches, so one epoch sees about all training rows once."""
    effective = batch_size_per_worker * processes
    if train_rows < effective:
        raise ValueError(
            f"{train_rows} training rows are fewer than one effective batch ({processes} processes x "
            f"{batch_size_per_worker}): lower batchSizePerWorker or use more data"
        )
    return ScaledRun(processes, batch_size_per_worker, effective,
                     scaled_learning_rate(base_learning_rate, rule, processes), train_rows // effective)


def scale_auto_run(train_rows: int, chosen_batch_size: int, base_learning_rate: float, rule: str,
                   processes: int) -> ScaledRun:
    """For batchSizePerWorker: auto. The user could not pick a learning rate for a batch not yet known, so
    baseLearningRate is for REFERENCE_BATCH_SIZE on one process and the rule scales it with the effective
    batch / REFERENCE_BATCH_SIZE; a fixed batch of 32 per process gives the same rate as scale_run."""
    run = scale_run(train_rows, chosen_batch_size, base_learning_rate, rule, processes)
    ratio = run.effective_batch_size / REFERENCE_BATCH_SIZE
    return ScaledRun(run.processes, run.batch_size_per_worker, run.effective_batch_size,
                     base_learning_rate * _factor(rule, ratio), run.steps_per_epoch)
