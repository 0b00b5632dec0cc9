"""Run under mpirun: the multi-worker-mirrored engine's strategy and input path on a dataset of known rows.

Each worker's dataset holds its own rows (worker r: values r*1000 + i), batched per replica, as the trainer's
reader hands them over. One distributed step reports, over all replicas, the rows a step takes and their sum, and
the engine's scaled run; rank 0 prints them."""

import json
import sys

import tensorflow as tf
from tensorflow.python.eager import context

from scalingrun_trainer.core.mpi import MpiWorld
from scalingrun_trainer.core.scaling import scale_run
from scalingrun_trainer.engines.keras_mirrored.train import MirroredEngine, make_strategy

batch, rows, base_learning_rate = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
world = MpiWorld()
strategy, local_rank = make_strategy(world)
engine = MirroredEngine(world, strategy, local_rank)


def per_worker():
    values = tf.range(rows // world.size, dtype=tf.int64) + 1000 * world.rank
    return tf.data.Dataset.from_tensor_slices(values).batch(batch, drop_remainder=True)


data = iter(engine.distribute(per_worker))


@tf.function
def step(batch_values):
    def replica(values):
        return tf.shape(values, out_type=tf.int64)[0], tf.reduce_sum(values)

    taken, total = strategy.run(replica, args=(batch_values,))
    return (strategy.reduce(tf.distribute.ReduceOp.SUM, taken, axis=None),
            strategy.reduce(tf.distribute.ReduceOp.SUM, total, axis=None))


taken, total = step(next(data))
scaled = scale_run(rows, batch, base_learning_rate, "linear", engine.replicas)
if world.rank == 0:
    print(json.dumps({"replicas": engine.replicas, "workers": world.size, "stepRows": int(taken),
                      "stepSum": int(total), "effectiveBatchSize": scaled.effective_batch_size,
                      "learningRate": scaled.learning_rate, "stepsPerEpoch": scaled.steps_per_epoch,
                      "heartbeatTimeoutMs": context.context().coordination_service.heartbeat_timeout_in_ms}),
          flush=True)
