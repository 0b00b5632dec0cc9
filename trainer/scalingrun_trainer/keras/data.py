"""Petastorm readers over the preprocessed Parquet as tf.data pipelines, sharded per reading process by the rules
of core/dataset.py (Keras counts `steps_per_epoch` batches of the endless training reader).
Batches stay uint8: the model's first layer applies the base's normalisation (see models.build_model).
"""

from __future__ import annotations

import warnings

from ..core.dataset import Dataset, open_reader


def make_dataset(dataset: Dataset, split: str, *, rank: int, size: int, batch_size: int, seed: int,
                 shuffle_buffer: int = 256, reader_threads: int = 4, row_group_cache: int = 50,
                 clock=None, delay: float = 0.0):
    """(tf.data.Dataset, reader): batches of (uint8 images, int labels) for this rank.

    reader_threads, row_group_cache: spec.training.input (readerWorkers, rowGroupCache). clock: an
    input_wait.InputClock that stamps each batch as the model takes it; delay: seconds added to every
    batch before the prefetch (SCALINGRUN_DIAGNOSTIC_READER_DELAY, to make the reader slow on purpose).
    """
    import tensorflow as tf
    from petastorm.tf_utils import make_petastorm_dataset

    # petastorm warns about re-iterating the validation dataset each epoch, which is what we want.
    warnings.filterwarnings("ignore", message="Running multiple iterations over make_petastorm_dataset")
    training = split == "train"
    reader = open_reader(dataset, split, shard=rank, shards=size, seed=seed, reader_threads=reader_threads,
                         results_queue_size=row_group_cache)
    side, image, label = dataset.image_size, dataset.columns["image"], dataset.columns["label"]

    def decode(rows):
        # One row group at a time: a single vectorised decode_raw instead of one map call per image.
        pixels = tf.io.decode_raw(getattr(rows, image), tf.uint8)
        return tf.reshape(pixels, (-1, side, side, 3)), tf.cast(getattr(rows, label), tf.int32)

    data = make_petastorm_dataset(reader).map(decode, num_parallel_calls=tf.data.AUTOTUNE).unbatch()
    if training:
        # Row groups arrive shuffled; this mixes rows across them. uint8 keeps the buffer 4x smaller.
        data = data.shuffle(shuffle_buffer, seed=seed + rank)
    data = data.batch(batch_size, drop_remainder=training)
    if delay > 0:
        from .input_clock import delay_batches

        data = delay_batches(data, delay)
    data = data.prefetch(tf.data.AUTOTUNE)
    return (clock.attach(data) if clock is not None else data), reader
