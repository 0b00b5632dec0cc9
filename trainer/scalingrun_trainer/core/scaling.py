"""How batch size, learning rate and steps follow from the number of data-parallel replicas. Pure.

A replica is a Horovod or DDP process (one per GPU), or one device of a multi-worker-mirrored process (each of
its GPUs, or its CPU): the same rules for every engine, with `processes` counting replicas.

A run resized to fewer replicas than its spec's (`spec_processes`: workers.replicas x slots, which the operator
keeps as the most) keeps the spec's effective batch by gradient accumulation: each replica takes `accumulation`
micro-batches before one optimizer update, k = ceil(spec / replicas). When the replicas do not divide the spec's
count, the micro-batch is floor(spec x batch / (replicas x k)) rows, so that the effective batch is the largest
it can be without exceeding the asked one or a replica's batch (4 spec processes of 32 on 3: k = 2, micro-batches
of 21, effective 126 instead of 128). The learning rate follows the effective batch (its ratio to one replica's
batchSizePerWorker), never the replica count, and `steps_per_epoch` counts optimizer updates: a resized epoch
takes the same updates over the same rows as the full-size one."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

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
    steps_per_epoch: int  # optimizer updates
    accumulation: int = 1  # micro-batches of batch_size_per_worker per replica and update

    @property
    def micro_steps_per_epoch(self) -> int:
        """The batches each replica takes per epoch (what a framework's loop counts)."""
        return self.steps_per_epoch * self.accumulation

    @property
    def rows_per_micro_step(self) -> int:
        return self.processes * self.batch_size_per_worker

    def folded(self) -> "ScaledRun":
        """The same update with the accumulated micro-batches taken as one batch per replica (k times the memory):
        for an engine that cannot accumulate."""
        return ScaledRun(self.processes, self.batch_size_per_worker * self.accumulation, self.effective_batch_size,
                         self.learning_rate, self.steps_per_epoch)

    def describe(self, replicas: str = "processes") -> str:
        """`replicas`: what the engine calls its replicas."""
        accumulated = f" x {self.accumulation} accumulated" if self.accumulation > 1 else ""
        return (f"{self.processes} {replicas} x batch {self.batch_size_per_worker}{accumulated} = effective batch "
                f"{self.effective_batch_size}; learning rate {self.learning_rate:g}; "
                f"{self.steps_per_epoch} steps per epoch")


def accumulation_steps(spec_processes: int, processes: int) -> int:
    """Micro-batches per update on `processes` replicas to make up `spec_processes` replicas' batch (1 at full size
    or more)."""
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    return -(-spec_processes // processes) if spec_processes > processes else 1


def _batch(batch_size_per_worker: int, spec_processes: Optional[int], processes: int) -> tuple[int, int, int]:
    """(micro-batch, accumulation, the per-replica batch the learning rate counts for 1 replica)."""
    target = spec_processes or processes
    steps = accumulation_steps(target, processes)
    if steps == 1:
        return batch_size_per_worker, 1, batch_size_per_worker
    micro = max(1, (target * batch_size_per_worker) // (processes * steps))
    return micro, steps, batch_size_per_worker


def scale_run(train_rows: int, batch_size_per_worker: int, base_learning_rate: float, rule: str,
              processes: int, spec_processes: Optional[int] = None) -> ScaledRun:
    """Every process takes steps_per_epoch updates, so one epoch sees about all training rows once. With fewer
    `processes` than `spec_processes`, by accumulation (module docstring)."""
    micro, accumulation, reference = _batch(batch_size_per_worker, spec_processes, processes)
    effective = micro * processes * accumulation
    if train_rows < effective:
        raise ValueError(
            f"{train_rows} training rows are fewer than one effective batch ({processes} processes x "
            f"{micro}{f' x {accumulation} accumulated' if accumulation > 1 else ''}): lower batchSizePerWorker or "
            "use more data"
        )
    return ScaledRun(processes, micro, effective, base_learning_rate * _factor(rule, effective / reference),
                     train_rows // effective, accumulation)


def scale_auto_run(train_rows: int, chosen_batch_size: int, base_learning_rate: float, rule: str,
                   processes: int, spec_processes: Optional[int] = None) -> ScaledRun:
    """For batchSizePerWorker: auto. The user could not pick a learning rate for a batch not yet known, so
    baseLearningRate is for REFERENCE_BATCH_SIZE on one process and the rule scales it with the effective
    batch / REFERENCE_BATCH_SIZE; a fixed batch of 32 per process gives the same rate as scale_run."""
    run = scale_run(train_rows, chosen_batch_size, base_learning_rate, rule, processes, spec_processes)
    ratio = run.effective_batch_size / REFERENCE_BATCH_SIZE
    return ScaledRun(run.processes, run.batch_size_per_worker, run.effective_batch_size,
                     base_learning_rate * _factor(rule, ratio), run.steps_per_epoch, run.accumulation)
