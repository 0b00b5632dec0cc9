"""The feature cache's forward pass under the multi-worker-mirrored engine (MirroredEngine.local_forward), on a
model whose BatchNorm has known moving statistics (sync-on-read variables, as in every built-in base).

`workers`, under mpirun: the workers run different numbers of batches, as shards of different sizes do; each
checks its outputs and prints its rank. `replicas`, one process with MirroredStrategy over 2 logical CPUs: each
batch is split between the replicas and joined back in order, rows fewer than replicas included."""

import sys

import numpy as np
import tensorflow as tf

from scalingrun_trainer.frameworks.keras.feature_cache import extractor
from scalingrun_trainer.engines.keras_mirrored.train import replicas_forward

mode, SIDE = sys.argv[1], 2
if mode == "workers":
    from scalingrun_trainer.core.mpi import MpiWorld
    from scalingrun_trainer.engines.keras_mirrored.train import make_strategy

    world = MpiWorld()
    strategy, _ = make_strategy(world)
    rank, sizes = world.rank, ([5, 3, 1] if world.rank == 0 else [4])
else:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    rank, sizes = 0, [5, 1, 2]

with strategy.scope():
    pixels = tf.keras.Input((SIDE, SIDE, 3), dtype="uint8")
    flat = tf.keras.layers.Flatten()(tf.keras.layers.Rescaling(1.0)(pixels))
    normalization = tf.keras.layers.BatchNormalization(epsilon=0.0)
    model = tf.keras.Model(pixels, normalization(flat, training=False))
width = SIDE * SIDE * 3
mean, variance = np.arange(width, dtype=np.float32), np.full(width, 4.0, np.float32)
normalization.moving_mean.assign(mean)
normalization.moving_variance.assign(variance)

extract = extractor(model, SIDE, lambda forward: replicas_forward(strategy, forward))
rng = np.random.default_rng(rank)
for rows in sizes:
    batch = rng.integers(0, 256, (rows, SIDE, SIDE, 3), dtype=np.uint8)
    expected = (batch.reshape(rows, width).astype(np.float32) - mean) / 2.0
    np.testing.assert_allclose(extract(batch), expected, rtol=1e-6)
print(f"forward ok on rank {rank}: batches of {sizes} rows", flush=True)
