"""The feature cache under every Keras engine (the rules: ../core/feature_cache.py): the base's forward pass that
fills it, and the cached batches as tf.data pipelines for the head (models.TransferNetwork.head)."""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ...core.feature_cache import FeatureCacheData


class ModelWeights:
    """A Keras model's weights as core.feature_cache.Weights."""

    def __init__(self, model):
        self.model = model

    def get(self) -> list[np.ndarray]:
        return self.model.get_weights()

    def set(self, value: list[np.ndarray]) -> None:
        self.model.set_weights(value)


def extractor(features_model, image_size: int,
              local: Callable[[Callable], Callable] = lambda forward: forward) -> Callable[[np.ndarray], np.ndarray]:
    """uint8 (n, side, side, 3) pixels -> float32 (n, width) pooled features, traced once for any n; `local`: the
    engine's way of running it on this process alone (KerasEngine.local_forward)."""
    import tensorflow as tf

    def forward(pixels):
        return features_model(pixels, training=False)

    traced = tf.function(local(forward), input_signature=[tf.TensorSpec((None, image_size, image_size, 3), tf.uint8)])
    return lambda pixels: traced(pixels).numpy()


def _dataset(batches: Callable, width: int):
    import tensorflow as tf

    signature = (tf.TensorSpec((None, width), tf.float32), tf.TensorSpec((None,), tf.int64))
    return tf.data.Dataset.from_generator(batches, output_signature=signature)


def train_dataset(cache: FeatureCacheData, *, first_epoch: int, steps: int, batch_size: int, clock=None,
                  delay: float = 0.0, first_step: int = 0, count: Optional[int] = None):
    """Batches of (features, labels), `steps` per epoch from step `first_step` of `first_epoch` on: endless, or
    `count` of them (the rest of a resumed epoch: nothing of the next one is drawn ahead); clock and delay as the
    reader's (keras/data.py): the input-wait stamp, and the diagnostic delay per batch."""
    import itertools

    import tensorflow as tf

    data = _dataset(lambda: itertools.islice(cache.train_batches(first_epoch, steps, batch_size, first_step), count),
                    cache.width)
    if delay > 0:
        from .input_clock import delay_batches

        data = delay_batches(data, delay)
    data = data.prefetch(tf.data.AUTOTUNE)
    return clock.attach(data) if clock is not None else data


def validation_dataset(cache: FeatureCacheData, *, batch_size: int):
    """This rank's validation features in order, once per iteration."""
    import tensorflow as tf

    return _dataset(lambda: cache.validation_batches(batch_size), cache.width).prefetch(tf.data.AUTOTUNE)
