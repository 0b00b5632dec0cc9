"""The shared Petastorm reader (core/dataset.py: open_reader, batches) as tf.data pipelines, sharded per reading
process by the rules of core/dataset.py (Keras counts `steps_per_epoch` batches of the endless training reader).
Batches stay uint8: the model's first layer applies the base's normalisation (see models.build_model).
"""

from __future__ import annotations

import itertools

from ...core.dataset import Dataset, batches, open_reader, pixel_groups


def aligned_empty(shape, dtype):
    """numpy.empty on a 64-byte boundary: TensorFlow then takes the array as a tensor without copying it."""
    import numpy as np

    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(size + TENSOR_ALIGNMENT, dtype=np.uint8)
    start = -raw.ctypes.data % TENSOR_ALIGNMENT
    return raw[start:start + size].view(dtype).reshape(shape)


TENSOR_ALIGNMENT = 64  # TensorFlow's EIGEN_MAX_ALIGN_BYTES with AVX-512


BATCH_ALLOCATOR = aligned_empty


def make_dataset(dataset: Dataset, split: str, *, rank: int, size: int, batch_size: int, seed: int,
                 shuffle_buffer: int = 256, reader_threads: int = 4, row_group_cache: int = 50,
                 clock=None, delay: float = 0.0):
    """(tf.data.Dataset, reader): batches of (uint8 images, int32 labels) for this rank.

    reader_threads, row_group_cache: spec.training.input (readerWorkers, rowGroupCache). clock: an
    input_wait.InputClock that stamps each batch as the model takes it; delay: seconds added to every
    batch before the prefetch (SCALINGRUN_DIAGNOSTIC_READER_DELAY, to make the reader slow on purpose).
    """
    import numpy as np
    import tensorflow as tf

    training = split == "train"
    reader = open_reader(dataset, split, shard=rank, shards=size, seed=seed, reader_threads=reader_threads,
                         results_queue_size=row_group_cache)
    passes = itertools.count()

    def generate():
        # Validation is read once per epoch: its finite reader starts again. A training reader never ends.
        if reader.last_row_consumed:
            reader.reset()
        row_groups = ((pixels, labels.astype(np.int32, copy=False))
                      for pixels, labels in pixel_groups(reader, dataset))
        # Row groups arrive shuffled; rows are mixed across them, seeded per rank (and per pass).
        yield from batches(row_groups, batch_size, shuffle_rows=shuffle_buffer if training else 0,
                           seed=(seed, rank, next(passes)), drop_remainder=training, empty=BATCH_ALLOCATOR)

    side = dataset.image_size
    rows = batch_size if training else None
    data = tf.data.Dataset.from_generator(generate, output_signature=(
        tf.TensorSpec((rows, side, side, 3), tf.uint8), tf.TensorSpec((rows,), tf.int32)))
    if delay > 0:
        from .input_clock import delay_batches

        data = delay_batches(data, delay)
    data = data.prefetch(tf.data.AUTOTUNE)
    return (clock.attach(data) if clock is not None else data), reader
