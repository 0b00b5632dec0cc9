"""Keras + tf.distribute.MultiWorkerMirroredStrategy: one process per worker pod, using every GPU of its pod (one
replica per GPU; one on CPU), started by mpirun like the other engines. Each process builds TF_CONFIG from the MPI
world (tf_config.py); TensorFlow's collectives all-reduce the gradients (NCCL on GPU, ring on CPU) and aggregate
the metrics, so every worker sees the same ones and early stopping stops all on the same epoch. mpi4py carries the
few other messages (the probe's result, MLflow's start, the input-wait figures). No Horovod.

Batches: every worker reads its own Petastorm shard (core/dataset.py), batched per replica, and hands it to the
strategy with distribute_datasets_from_function (no auto-sharding, AutoShardPolicy.OFF, no rebatching): each of
its replicas takes batchSizePerWorker rows a step, and the effective batch counts every replica of every worker,
as under Horovod, where a replica is a process. Validation: every worker reads its shard of the validation split,
and all take the steps of the worker with the most batches (validation_steps), so each row counts once. With the
feature cache a worker's cached features take its reader's place; the base fills the cache in the replica context
(replicas_forward), apart from the other workers.

Saving is a collective here (mirrored and sync-on-read variables are read on every worker): every worker writes
its checkpoints and the model, rank 0's copy is kept in the run's storage, the others' temporary copies removed.
"""

from __future__ import annotations

import os
from typing import Any, Callable, ContextManager, Optional

from scalingrun_api.config import TrainerConfig
from scalingrun_api.models import Strategy
from ...core.mpi import MpiWorld, local_rank_and_size
from ...core.stall import engine_timeout
from ...frameworks.keras.engine import KerasEngine
from ...frameworks.keras.training import train as train_keras
from .tf_config import TF_CONFIG, coordinate, tf_config

STRATEGY = Strategy.multi_worker_mirrored.value


class MirroredEngine(KerasEngine):
    name = f"keras {STRATEGY}"
    replicas_word = "replicas"
    every_rank_saves = True
    variables_start_equal = True  # the strategy broadcasts worker 0's initial value of every variable it creates
    # The strategy all-reduces inside apply_gradients, which cannot sit in a conditional update: a run on fewer
    # workers than its spec's takes its accumulated micro-batches as one batch per replica (the same update).
    accumulates = False

    def __init__(self, world: MpiWorld, strategy, local_rank: int):
        super().__init__(world, local_rank)
        self.strategy = strategy

    @property
    def replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    def trained_on(self) -> dict[str, Any]:
        return {"strategy": STRATEGY}

    def run_params(self) -> dict[str, Any]:
        return {"strategy": STRATEGY, "replicas": self.replicas}

    def scope(self) -> ContextManager:
        return self.strategy.scope()

    def distribute(self, make: Callable[[], Any]) -> Any:
        import tensorflow as tf

        def per_worker(context: tf.distribute.InputContext):
            options = tf.data.Options()
            options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
            return make().with_options(options)  # already this worker's shard, batched per replica

        return self.strategy.distribute_datasets_from_function(per_worker)

    def local_forward(self, forward: Callable) -> Callable:
        return replicas_forward(self.strategy, forward)

    def validation_steps(self, batches: Callable[[], int]) -> Optional[int]:
        """Every worker takes as many validation steps as the worker with the most batches has; one that runs out
        first hands its replicas empty batches (the strategy's partial-batch handling), so that the metrics count
        every row once, weighted by rows."""
        (most,) = self.world.allreduce([batches()], "max", name="validation_steps")
        return int(most)


def replicas_forward(strategy, forward: Callable) -> Callable:
    """`forward` on this worker's replicas alone, each on its slice of the batch, the results concatenated in order.

    In the replica context a variable reads its local copy. Called outside it (in the cross-replica context), a
    model reads each BatchNorm's moving statistics (sync-on-read variables) as their mean over all workers, an
    all-reduce at every call, which waits forever when the workers' shards have different numbers of batches."""
    import tensorflow as tf

    local = len(strategy.extended.worker_devices)

    def on_replicas(batch):
        rows = tf.shape(batch)[0]

        def part(context: tf.distribute.experimental.ValueContext):
            index = context.replica_id_in_sync_group % local  # replica ids run on from worker to worker
            return batch[index * rows // local:(index + 1) * rows // local]

        outputs = strategy.run(forward, args=(strategy.experimental_distribute_values_from_function(part),))
        return tf.concat(strategy.experimental_local_results(outputs), axis=0)

    return on_replicas


def _use_gpus(local_rank: int, local_size: int) -> list:
    """This process's GPUs: all of its host's, or its share when mpirun starts several processes on one host."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus and local_size > 1:
        share = max(len(gpus) // local_size, 1)
        first = (local_rank * share) % len(gpus)
        gpus = gpus[first:first + share]
        tf.config.set_visible_devices(gpus, "GPU")
    return gpus


def make_strategy(world: MpiWorld):
    """The strategy over all ranks; before any other TensorFlow work (it configures the runtime)."""
    import tensorflow as tf

    local_rank, local_size = local_rank_and_size(world.rank, world.size)
    gpus = _use_gpus(local_rank, local_size)
    # A collective's timeout bounds every collective where the stall watch is not running (core/stall.py).
    timeout = engine_timeout()
    if world.size > 1:
        os.environ[TF_CONFIG] = tf_config(world)
        if timeout:
            coordinate(world.size, timeout)
    else:
        os.environ.pop(TF_CONFIG, None)  # one worker: its local devices only, no server
    implementation = tf.distribute.experimental.CommunicationImplementation
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=implementation.NCCL if gpus else implementation.RING,
        **({"timeout_seconds": timeout} if timeout else {}))
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options), local_rank


def train(config: TrainerConfig) -> int:
    world = MpiWorld()
    strategy, local_rank = make_strategy(world)
    return train_keras(config, MirroredEngine(world, strategy, local_rank))
