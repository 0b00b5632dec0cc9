"""The Petastorm reader both trainers share (scalingrun_trainer.core.dataset, keras.data): sharded, every row once, pixels that are
the Parquet's bytes, batches mixed across row groups, and buffers reused only once nothing holds them."""

from __future__ import annotations

import collections
import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from scalingrun_trainer.core.dataset import (DatasetError, batches, open_dataset, open_reader, pixels_of,
                                             recycled)
from scalingrun_trainer.frameworks.keras.data import make_dataset
from scalingrun_trainer.preprocess.shards import Params, process_shard
from scalingrun_operator.local.sample_data import fashion_mnist_jpegs

SIDE = 8


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """60 Fashion-MNIST images at 8x8, written for 2 readers: row groups in class order, as preprocessing writes."""
    folder = tmp_path_factory.mktemp("data")
    for relative, data in fashion_mnist_jpegs(6):
        (folder / "jpeg" / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / "jpeg" / relative).write_bytes(data)
    process_shard(Params(str(folder / "jpeg"), str(folder / "parquet"), image_size=SIDE, validation_fraction=0.3,
                         max_readers=2), 0, 1, workers=1)
    return open_dataset(str(folder / "parquet"))


def stored_rows(dataset, split: str) -> collections.Counter:
    rows = collections.Counter()
    for name in dataset.files[split]:
        table = pq.read_table(f"{dataset.uri}/{name}", columns=["image", "label"])
        for image, label in zip(table.column("image").to_pylist(), table.column("label").to_pylist()):
            rows[(hashlib.sha1(image).hexdigest(), label)] += 1
    return rows


def rows_of(pixels: np.ndarray, labels: np.ndarray) -> collections.Counter:
    return collections.Counter((hashlib.sha1(p.tobytes()).hexdigest(), int(l)) for p, l in zip(pixels, labels))


def test_shards_are_disjoint_and_together_every_row_once_with_the_stored_pixels(dataset):
    assert dataset.row_groups["validation"] >= 2
    seen = collections.Counter()
    for rank in (0, 1):
        reader = open_reader(dataset, "validation", shard=rank, shards=2, seed=3, reader_threads=2)
        try:
            groups = list(reader)
        finally:
            reader.stop()
            reader.join()
        assert groups, f"rank {rank} got no row group"
        for group in groups:
            assert group.image.dtype == np.uint8 and group.image.shape[1:] == (SIDE, SIDE, 3)
            assert not group.image.flags.owndata  # a view of the buffer Arrow read
            seen += rows_of(group.image, group.label)
    assert seen == stored_rows(dataset, "validation")


def test_validation_is_read_whole_in_order_every_epoch(dataset):
    data, reader = make_dataset(dataset, "validation", rank=0, size=1, batch_size=4, seed=0)
    try:
        epochs = [[(x.numpy(), y.numpy()) for x, y in data] for _ in range(2)]
    finally:
        reader.stop()
        reader.join()
    for epoch in epochs:
        assert [len(y) for _, y in epoch][:-1] == [4] * (len(epoch) - 1)  # the remainder comes last
        assert sum((rows_of(x, y) for x, y in epoch), collections.Counter()) == stored_rows(dataset, "validation")
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(*epochs))


def test_training_batches_mix_classes_and_reach_every_row(dataset):
    stored = stored_rows(dataset, "train")
    # One reader thread: row groups then arrive in the seeded order, and the batches are the same every run.
    data, reader = make_dataset(dataset, "train", rank=0, size=1, batch_size=8, seed=0, shuffle_buffer=16,
                                reader_threads=1)
    try:
        assert tuple(data.element_spec[0].shape) == (8, SIDE, SIDE, 3)
        taken = list(data.take(4 * sum(stored.values()) // 8))
    finally:
        reader.stop()
        reader.join()
    assert set().union(*(rows_of(x.numpy(), y.numpy()) for x, y in taken)) == set(stored)
    # Row groups hold one or two classes each (written in class order); the buffer spans several.
    assert np.median([len(set(y.numpy().tolist())) for _, y in taken]) >= 3


def numbered_groups(sizes):
    start = 0
    for size in sizes:
        rows = np.arange(start, start + size)
        yield np.repeat(rows, 3).reshape(size, 3).astype(np.int64), rows
        start += size


def test_batches_in_order_and_the_remainder():
    out = list(batches(numbered_groups([5, 0, 3, 4]), 5))
    assert [labels.tolist() for _, labels in out] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11]]
    assert all((pixels[:, 0] == labels).all() for pixels, labels in out)
    assert [len(y) for _, y in batches(numbered_groups([5, 3, 4]), 5, drop_remainder=True)] == [5, 5]


def test_shuffled_batches_draw_from_the_whole_buffer_and_lose_nothing():
    out = list(batches(numbered_groups([10] * 6), 4, shuffle_rows=20, seed=1))
    labels = np.concatenate([y for _, y in out])
    assert sorted(labels.tolist()) == list(range(60))
    assert labels.tolist() != list(range(60))
    assert max(out[0][1]) >= 10  # the first batch already draws beyond the first row group
    assert all((pixels[:, 0] == y).all() for pixels, y in out)
    again = list(batches(numbered_groups([10] * 6), 4, shuffle_rows=20, seed=1))
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(out, again))


def test_recycled_buffers_are_reused_only_once_nothing_else_holds_them():
    allocate = recycled(np.empty)
    first = allocate((4,), np.uint8)
    first_id = id(first)
    assert id(allocate((4,), np.uint8)) != first_id  # still held
    del first
    again = allocate((4,), np.uint8)
    assert id(again) == first_id
    view = again[1:]
    del again
    assert id(allocate((4,), np.uint8)) != first_id  # a view holds it
    del view
    assert id(allocate((4,), np.uint8)) == first_id
    assert allocate((5,), np.uint8).shape == (5,)


def test_images_of_another_size_are_an_error_naming_the_fix():
    column = pa.chunked_array([pa.array([b"\0" * 12, b"\0" * 27], pa.binary())])
    with pytest.raises(DatasetError, match="preprocess the dataset again"):
        pixels_of(column)
    assert pixels_of(pa.chunked_array([pa.array([b"\1" * 12] * 2, pa.binary())])).shape == (2, 2, 2, 3)
