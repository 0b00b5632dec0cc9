"""The input-wait clock's TensorFlow half (the method and the figures are in ../core/input_wait.py): a stamp on each
training batch as the model takes it, and the diagnostic reader delay."""

from __future__ import annotations

import time
from typing import Optional

from ...core.input_wait import DelayedBatches


class InputClock:
    """Records when the latest training batch reached the model (see attach)."""

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.last: Optional[float] = None

    def _arrived(self):
        self.last = self.clock()
        return 0.0

    def attach(self, data):
        """`data` with a stamp on each element as the consumer takes it; `data` must end with prefetch."""
        import tensorflow as tf

        def stamp(images, labels):
            done = tf.py_function(self._arrived, [], tf.float64)
            with tf.control_dependencies([done]):
                return tf.identity(images), tf.identity(labels)

        options = tf.data.Options()
        # Keep the stamp where it is: no prefetch injected after it, no parallel map made of it.
        options.experimental_optimization.inject_prefetch = False
        options.experimental_optimization.map_parallelization = False
        return data.map(stamp).with_options(options)


def delay_batches(data, seconds: float):
    """Every batch waits `seconds` in a sequential map (the prefetch after it cannot hide a slower producer)."""
    import tensorflow as tf

    def slow(images, labels):
        done = tf.py_function(lambda: DelayedBatches.hold(seconds), [], tf.float64)
        with tf.control_dependencies([done]):
            return tf.identity(images), tf.identity(labels)

    return data.map(slow)
