"""What a Keras engine supplies to the Keras training flow (training.py): how the replicas talk, the variables'
scope, the optimizer's wrapper, the first callbacks, how a dataset reaches the replicas, and whether saving is a
collective. The defaults are Horovod's shape; engines/ subclass it."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Optional

from ...core.collective import Collective


class KerasEngine:
    """What a Keras engine supplies. The defaults are a plain single-replica run per process (Horovod's shape)."""

    #: How error lines name the engine ("" keeps the original Keras + Horovod lines).
    name = ""
    #: What the start line calls the replicas the effective batch counts.
    replicas_word = "processes"
    #: True when writing a checkpoint or the model is a collective (every rank writes, rank 0's copy is kept).
    every_rank_saves = False
    #: True when creating a variable gives it rank 0's initial value on every rank (no broadcast needed after).
    variables_start_equal = False

    def __init__(self, world: Collective, local_rank: int = 0):
        self.world, self.local_rank = world, local_rank

    #: True when the optimizer's wrapper accumulates micro-batches (distributed_optimizer's `accumulation`); else a
    #: run on fewer replicas than its spec's takes the accumulated micro-batches as one batch (ScaledRun.folded).
    accumulates = True

    @property
    def replicas(self) -> int:
        """Data-parallel replicas: the effective batch's and the learning rate's multiplier."""
        return self.world.size

    def spec_replicas(self, processes: int) -> int:
        """The replicas of the spec's `processes` (workers.replicas x slots): a resized run starts fewer processes,
        each with as many replicas as now."""
        return processes * max(1, self.replicas // self.world.size)

    def trained_on(self) -> dict[str, Any]:
        """What a checkpoint must match besides the data and the model to be resumed by this engine."""
        return {}

    def run_params(self) -> dict[str, Any]:
        """The engine's own MLflow parameters."""
        return {}

    def scope(self) -> ContextManager:
        """Where the model, the optimizer and their variables are created."""
        return contextlib.nullcontext()

    def distributed_optimizer(self, optimizer, accumulation: int = 1):
        """`accumulation`: micro-batches per update (ScaledRun.accumulation), 1 unless `accumulates`."""
        return optimizer

    def first_callbacks(self) -> list:
        return []

    def distribute(self, make: Callable[[], Any]) -> Any:
        """The dataset `make()` builds, as the model's fit takes it."""
        return make()

    def local_forward(self, forward: Callable) -> Callable:
        """`forward` (inference on a batch of this process's rows, traced by the caller) as this engine runs it
        apart from the other processes, each on its own shard: as it is by default."""
        return forward

    def validation_steps(self, batches: Callable[[], int]) -> Optional[int]:
        """The validation steps every rank takes (None: each rank reads its shard to the end); `batches()` counts
        this rank's validation batches."""
        return None
