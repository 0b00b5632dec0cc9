"""Keras + Horovod: one process per GPU, launched by horovodrun or mpirun. Horovod broadcasts rank 0's initial
variables, averages the gradients (DistributedOptimizer) and the epoch's metrics (before early stopping reads
them, so that every rank stops on the same epoch); the rest is the shared Keras flow (../keras/training.py)."""

from __future__ import annotations

import os
from typing import Any

from scalingrun_api.config import TrainerConfig
from scalingrun_api.engines import horovod_stall_env
from ...core.stall import engine_timeout
from ...frameworks.keras.engine import KerasEngine
from ...frameworks.keras.training import train as train_keras


class HorovodWorld:
    """Horovod's collectives as a core.session.Collective."""

    def __init__(self, hvd):
        self.hvd = hvd
        self.rank, self.size = hvd.rank(), hvd.size()

    def broadcast(self, value: Any, name: str) -> Any:
        import horovod.tensorflow as hvd_tf

        return hvd_tf.broadcast_object(value, root_rank=0, name=name)

    def allreduce(self, values: list[float], op: str, name: str) -> list[float]:
        import horovod.tensorflow as hvd_tf
        import tensorflow as tf

        reduced = hvd_tf.allreduce(tf.constant(values, tf.float64), op={"max": hvd_tf.Max, "sum": hvd_tf.Sum}[op],
                                   name=name)
        return [float(value) for value in reduced.numpy()]


class HorovodEngine(KerasEngine):
    def __init__(self, hvd):
        super().__init__(HorovodWorld(hvd), hvd.local_rank())
        self.hvd = hvd

    def distributed_optimizer(self, optimizer, accumulation: int = 1):
        # Horovod accumulates locally and all-reduces the averaged gradients every `accumulation` backward passes.
        return self.hvd.DistributedOptimizer(optimizer, backward_passes_per_step=accumulation,
                                             average_aggregated_gradients=True)

    def first_callbacks(self) -> list:
        return [self.hvd.callbacks.BroadcastGlobalVariablesCallback(0), self.hvd.callbacks.MetricAverageCallback()]


def _pin_gpu(local_rank: int) -> None:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[local_rank % len(gpus)], "GPU")


def train(config: TrainerConfig) -> int:
    import horovod.tensorflow.keras as hvd

    for name, value in horovod_stall_env(engine_timeout()).items():
        os.environ.setdefault(name, value)  # the MPIJob's (or the user's) own settings win
    hvd.init()
    _pin_gpu(hvd.local_rank())
    return train_keras(config, HorovodEngine(hvd))
