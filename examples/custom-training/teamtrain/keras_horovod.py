"""A team's own Keras + Horovod training script, run by spec.training.command on every rank:

    command: [python, -m, teamtrain.keras_horovod]

It uses only three calls of the SDK: sdk.context() (ranks, the prepared Parquet, the scaled batch size and
learning rate), sdk.report_epoch() (rank 0's progress.json: status, sweeps, the report) and sdk.finish(). The rest
is the team's own: it reads its share of the Parquet row groups with pyarrow, trains a small CNN with Horovod and
saves the model with fsspec.
"""

import time

import fsspec
import horovod.tensorflow.keras as hvd
import numpy as np
import pyarrow.parquet as pq
import tensorflow as tf

from scalingrun_trainer import sdk


def read_share(ctx, files):
    """This rank's row groups (every size-th one over the files) as uint8 images and int labels."""
    images, labels, group = [], [], 0
    for uri in files:
        with fsspec.open(uri, "rb", **ctx.storage_options) as f:
            parquet = pq.ParquetFile(f)
            for index in range(parquet.num_row_groups):
                if group % ctx.size == ctx.rank:
                    table = parquet.read_row_group(index, columns=[ctx.image_column, ctx.label_column])
                    images += table.column(0).to_pylist()
                    labels += table.column(1).to_pylist()
                group += 1
    side = ctx.image_size
    pixels = np.frombuffer(b"".join(images), np.uint8).reshape(-1, side, side, 3)
    return pixels, np.asarray(labels, np.int32)


def network(ctx):
    inputs = tf.keras.Input((ctx.image_size, ctx.image_size, 3), dtype=tf.uint8)
    x = tf.keras.layers.Rescaling(1 / 255)(inputs)
    for width in (16, 32, 64):
        x = tf.keras.layers.Conv2D(width, 3, padding="same", activation="relu")(x)
        x = tf.keras.layers.MaxPooling2D()(x)
    x = tf.keras.layers.GlobalAveragePooling2D()(x)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(ctx.num_classes)(x))


class Report(tf.keras.callbacks.Callback):
    """After Horovod's MetricAverageCallback: rank 0 reports the averaged metrics and the throughput."""

    def __init__(self, ctx):
        super().__init__()
        self.ctx, self.started, self.batches = ctx, 0.0, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.started, self.batches = time.monotonic(), 0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1

    def on_epoch_end(self, epoch, logs=None):
        images = self.batches * self.ctx.batch_size_per_worker * self.ctx.size
        sdk.report_epoch(epoch + 1, dict(logs), images / (time.monotonic() - self.started))


def main():
    hvd.init()
    ctx = sdk.context()
    tf.keras.utils.set_random_seed(ctx.seed)
    x, y = read_share(ctx, ctx.train_files)
    val_x, val_y = read_share(ctx, ctx.validation_files)
    train = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(y), seed=ctx.seed + ctx.rank).repeat()
    model = network(ctx)
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.Adam(ctx.learning_rate))
    model.compile(optimizer, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                 Report(ctx)]
    model.fit(train.batch(ctx.batch_size_per_worker, drop_remainder=True), steps_per_epoch=ctx.steps_per_epoch,
              epochs=ctx.max_epochs, validation_data=(val_x, val_y), validation_batch_size=ctx.batch_size_per_worker,
              callbacks=callbacks, verbose=0)
    model_uri = None
    if ctx.rank == 0:
        model.save("/tmp/model.keras")
        model_uri = f"{ctx.model_location}/model.keras"
        with open("/tmp/model.keras", "rb") as local, fsspec.open(model_uri, "wb", **ctx.storage_options) as remote:
            remote.write(local.read())
    sdk.finish(model_uri)


if __name__ == "__main__":
    main()
