"""The feature cache (trainer/scalingrun_trainer/core/feature_cache.py) on a real Parquet dataset of real photos and
Fashion-MNIST images, with Keras' EfficientNet-Lite0 and its ImageNet weights as the frozen base."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest

from scalingrun_trainer.core.dataset import DatasetError, open_dataset
from scalingrun_trainer.core.feature_cache import (
    FeatureCacheData, FeatureStore, build_feature_cache, epoch_rows, reason_not_used, share,
)
from scalingrun_operator.local.sample_data import fashion_mnist_jpegs, photos

SIDE = 32
SEED = 42


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    """Fashion-MNIST (4 per class) and scikit-image's photos as JPEGs, preprocessed at 32 px for 2 readers."""
    root = tmp_path_factory.mktemp("feature-cache")
    source = root / "jpeg"
    for relative, data in fashion_mnist_jpegs(4):
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        (source / relative).write_bytes(data)
    (source / "photo").mkdir()
    for name, image in photos():
        buffer = io.BytesIO()
        image.convert("RGB").save(buffer, "JPEG", quality=95)
        (source / "photo" / f"{name}.jpg").write_bytes(buffer.getvalue())
    output = root / "parquet"
    result = subprocess.run(
        [sys.executable, "-m", "scalingrun_trainer.cli", "preprocess", "--source", str(source), "--output", str(output),
         "--image-size", str(SIDE), "--max-readers", "2", "--validation-fraction", "0.3", "--seed", str(SEED)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return str(output)


@pytest.fixture(scope="module")
def network(dataset):
    import tensorflow as tf

    from scalingrun_trainer.core.weights import local_weights
    from scalingrun_trainer.frameworks.keras.models import build_network

    tf.keras.utils.set_random_seed(0)
    classes = len(open_dataset(dataset).classes)
    return build_network("efficientnet_lite0", SIDE, classes, local_weights("imagenet", None, None), dropout=0.2,
                         trainable_base=False)


@pytest.fixture(scope="module")
def extract(network):
    from scalingrun_trainer.frameworks.keras.feature_cache import extractor

    return extractor(network.features, SIDE)


def split_rows(dataset: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Every row of a split, read with pyarrow alone: (uint8 pixels, labels)."""
    manifest = json.loads((Path(dataset) / "_manifest.json").read_text())
    tables = [pq.read_table(Path(dataset) / name, columns=["image", "label"]) for name in manifest["files"][split]]
    pixels = np.stack([np.frombuffer(raw, np.uint8).reshape(SIDE, SIDE, 3)
                       for table in tables for raw in table.column("image").to_pylist()])
    labels = np.concatenate([np.asarray(table.column("label").to_pylist()) for table in tables])
    return pixels, labels


def test_cached_features_are_the_frozen_bases_output_and_the_head_on_them_is_the_model(dataset, network, extract):
    data = open_dataset(dataset)
    for split in ("train", "validation"):
        pixels, labels = split_rows(dataset, split)
        expected = network.features.predict(pixels, verbose=0)
        assert np.std(expected, axis=0).mean() > 0.01  # real images give distinct features
        matched = []
        for rank in (0, 1):
            cache = build_feature_cache(data, extract, rank=rank, size=2, seed=SEED, batch_size=8)
            store = cache.stores[split]
            assert store.rows > 0 and store.features.shape == (store.rows, 1280) and not store.on_disk
            # Each cached row is the base's output for one image of the split, with that image's label.
            distance = np.abs(store.features[:, None, :] - expected[None, :, :]).max(axis=2)
            nearest = distance.argmin(axis=1)
            assert distance[np.arange(store.rows), nearest].max() < 1e-4
            assert (labels[nearest] == store.labels).all()
            matched.extend(nearest.tolist())
            # The head on cached features is the whole model on the pixels (inference: dropout off).
            np.testing.assert_allclose(network.head.predict(store.features, verbose=0),
                                       network.model.predict(pixels[nearest], verbose=0), atol=1e-5)
            cache.close()
        # The two shards are disjoint and together the whole split: every image once.
        assert sorted(matched) == list(range(len(labels)))


def test_every_epoch_draws_a_new_permutation_and_a_resumed_epoch_draws_the_same_rows():
    rows, count = 10, 4
    stream = np.concatenate([epoch_rows(rows, count, epoch, SEED, rank=0) for epoch in range(5)])
    assert len(stream) == 20
    # Passes over the shard: every row once before any repeats.
    assert sorted(stream[:10]) == list(range(10)) and sorted(stream[10:20]) == list(range(10))
    assert list(stream[:10]) != list(stream[10:20])  # a new order each pass
    assert list(epoch_rows(rows, count, 3, SEED, rank=0)) == list(stream[12:16])  # resumed at epoch 3: the same rows
    assert list(epoch_rows(rows, count, 0, SEED, rank=1)) != list(stream[:4])  # each rank its own order
    assert list(epoch_rows(rows, count, 0, SEED + 1, rank=0)) != list(stream[:4])  # the run's seed decides
    # An epoch longer than the shard wraps into the next pass.
    longer = epoch_rows(3, 5, 0, SEED, rank=0)
    assert sorted(longer[:3]) == [0, 1, 2] and len(longer) == 5


def stores(rows: int, width: int = 3) -> dict[str, FeatureStore]:
    made = {}
    for split, count in (("train", rows), ("validation", 5)):
        store = FeatureStore(limit=1 << 20)
        store.append(np.arange(count * width, dtype=np.float32).reshape(count, width), np.arange(count) % 2)
        made[split] = store.finish()
    return made


def test_epochs_of_batches_cover_the_shard_and_resume_where_they_left_off():
    cache = FeatureCacheData(stores(12), SEED, rank=0, seconds=0.0)
    batches = cache.train_batches(0, steps=2, batch_size=3)
    first = [next(batches) for _ in range(8)]  # 4 epochs of 2 batches of 3 rows: 2 passes over 12 rows
    assert all(features.shape == (3, 3) and len(labels) == 3 for features, labels in first)
    seen = np.concatenate([features[:, 0] / 3 for features, _ in first]).astype(int)
    assert sorted(seen[:12]) == sorted(seen[12:]) == list(range(12))  # each pass is the whole shard
    assert list(seen[:12]) != list(seen[12:])
    for features, labels in first:
        assert (labels == (features[:, 0] / 3).astype(int) % 2).all()  # labels stay with their features
    resumed = cache.train_batches(2, steps=2, batch_size=3)
    for (expected, _), (got, _) in zip(first[4:], [next(resumed) for _ in range(4)], strict=True):
        np.testing.assert_array_equal(got, expected)
    # Resumed at a step inside an epoch (a checkpoint on a preemption notice): the rest of that epoch's batches,
    # then the next epochs', as an uninterrupted run draws them.
    mid_epoch = cache.train_batches(1, steps=2, batch_size=3, first_step=1)
    for (expected, _), (got, _) in zip(first[3:], [next(mid_epoch) for _ in range(5)], strict=True):
        np.testing.assert_array_equal(got, expected)
    validation = list(cache.validation_batches(2))
    assert [len(labels) for _, labels in validation] == [2, 2, 1]
    np.testing.assert_array_equal(np.concatenate([f for f, _ in validation]), cache.stores["validation"].features)


def test_a_store_beyond_its_size_moves_to_local_disk_and_keeps_every_row(tmp_path):
    store = FeatureStore(limit=100, directory=str(tmp_path))
    chunks = [np.random.default_rng(i).random((3, 4), dtype=np.float32) for i in range(4)]
    store.append(chunks[0], [0, 1, 2])  # 48 bytes: in memory
    assert not store.on_disk and not list(tmp_path.iterdir())
    for index, chunk in enumerate(chunks[1:], start=1):  # 96, then 144 bytes: over the limit
        store.append(chunk, [index] * 3)
    store.finish()
    assert store.on_disk and [p.name for p in tmp_path.iterdir()] == [os.path.basename(store.path)]
    assert isinstance(store.features, np.memmap) and store.nbytes == 192 and store.rows == 12
    np.testing.assert_array_equal(store.features, np.concatenate(chunks))
    assert store.labels.tolist() == [0, 1, 2] + [1] * 3 + [2] * 3 + [3] * 3
    store.close()
    assert not list(tmp_path.iterdir())


def test_a_cache_spilled_to_disk_holds_what_one_in_memory_holds(dataset, extract, tmp_path):
    data = open_dataset(dataset)
    in_memory = build_feature_cache(data, extract, rank=1, size=2, seed=SEED, batch_size=8)
    on_disk = build_feature_cache(data, extract, rank=1, size=2, seed=SEED, batch_size=5, limit=20_000,
                                  directory=str(tmp_path))
    assert not in_memory.on_disk and on_disk.on_disk and len(list(tmp_path.iterdir())) == 2
    for split in ("train", "validation"):
        np.testing.assert_array_equal(on_disk.stores[split].features, in_memory.stores[split].features)
        np.testing.assert_array_equal(on_disk.stores[split].labels, in_memory.stores[split].labels)
    assert on_disk.nbytes == in_memory.nbytes == 4 * 1280 * sum(s.rows for s in in_memory.stores.values())
    on_disk.close()
    in_memory.close()
    assert not list(tmp_path.iterdir())


class OneProcess:
    """A world of one process (a Collective): its own values are the reduction."""

    rank, size = 0, 1

    def broadcast(self, value, name):
        return value

    def allreduce(self, values, op, name):
        return list(values)


def test_the_ranks_rows_must_add_up_to_the_dataset(dataset, extract):
    data = open_dataset(dataset)
    whole = build_feature_cache(data, extract, rank=0, size=1, seed=SEED, batch_size=16)
    figures = share(whole, data, OneProcess())
    assert figures.used and figures.rows == data.rows["train"] + data.rows["validation"]
    assert figures.bytes == whole.nbytes and figures.on_disk is False and figures.seconds >= 0
    half = build_feature_cache(data, extract, rank=0, size=2, seed=SEED, batch_size=16)  # rank 1's rows missing
    with pytest.raises(DatasetError, match=rf"the feature cache read {half.stores['train'].rows} of the "
                                           rf"{data.rows['train']} train rows over all processes"):
        share(half, data, OneProcess())


def config(feature_cache="auto", trainable_base=False, builder=None, strategy="horovod"):
    return SimpleNamespace(training=SimpleNamespace(feature_cache=feature_cache, strategy=strategy),
                           model=SimpleNamespace(trainable_base=trainable_base, builder=builder))


def test_the_cache_applies_to_a_frozen_built_in_base_only():
    assert reason_not_used(config()) is None
    assert reason_not_used(config(feature_cache="off")) == "spec.training.featureCache is off"
    assert "trainableBase is true" in reason_not_used(config(trainable_base=True))
    assert "spec.model.builder" in reason_not_used(config(builder="teamnets:build"))
    for strategy in ("ddp", "multi-worker-mirrored"):
        assert reason_not_used(config(strategy=strategy)) is None
