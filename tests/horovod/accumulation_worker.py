"""Run under horovodrun: the Horovod engine's optimizer with 2 micro-batches per update trains a small Keras model
on 4 batches of 8 rows; a plain optimizer trains the same model on the same rows as 2 batches of 16. Prints, as
JSON, after which micro-batches the weights changed and the largest difference between the two final weights."""

import json

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

from scalingrun_trainer.engines.keras_horovod.train import HorovodEngine
from scalingrun_trainer.frameworks.keras.training import _optimizer

hvd.init()
rng = np.random.default_rng(0)
images = rng.normal(size=(32, 6)).astype(np.float32)
labels = rng.integers(0, 3, size=32).astype(np.int32)


def model():
    tf.keras.utils.set_random_seed(1)
    return tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(3, activation="softmax")])


class Changes(tf.keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.changed, self.last = [], None

    def on_train_batch_begin(self, batch, logs=None):
        self.last = [w.copy() for w in self.model.get_weights()]

    def on_train_batch_end(self, batch, logs=None):
        if any(not np.array_equal(a, b) for a, b in zip(self.last, self.model.get_weights())):
            self.changed.append(batch + 1)


accumulated, changes = model(), Changes()
accumulated.compile(HorovodEngine(hvd).distributed_optimizer(_optimizer("sgd", 0.1), 2),
                    loss="sparse_categorical_crossentropy")
accumulated.fit(images, labels, batch_size=8, epochs=1, shuffle=False, callbacks=[changes], verbose=0)
plain = model()
plain.compile(_optimizer("sgd", 0.1), loss="sparse_categorical_crossentropy")
plain.fit(images, labels, batch_size=16, epochs=1, shuffle=False, verbose=0)
difference = max(float(np.abs(a - b).max()) for a, b in zip(accumulated.get_weights(), plain.get_weights()))
moved = max(float(np.abs(a - b).max()) for a, b in zip(model().get_weights(), plain.get_weights()))
print("RESULT " + json.dumps({"changed": changes.changed, "difference": difference, "moved": moved}), flush=True)
