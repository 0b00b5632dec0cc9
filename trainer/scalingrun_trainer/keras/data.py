"""Petastorm readers over the preprocessed Parquet, sharded per Horovod rank, as tf.data pipelines.

Training readers loop forever (`num_epochs=None`, Keras counts `steps_per_epoch`): a Petastorm bug
drops rows from shuffled finite readers. Row groups are shuffled with a shared seed before sharding,
so every rank gets a disjoint, random share. Validation is read completely, unshuffled, once per epoch.
Batches stay uint8: the model's first layer applies the base's normalisation (see models.build_model).
"""

from __future__ import annotations

import json
import posixpath
import warnings
from dataclasses import dataclass
from typing import Optional

import pyarrow.parquet as pq

from .preprocess import SPLITS
from .storage import Location, open_location, s3fs_options


class DatasetError(RuntimeError):
    """The dataset cannot be used as configured; the message says why and what to do."""


@dataclass(frozen=True)
class Dataset:
    uri: str
    classes: list[str]
    rows: dict[str, int]
    files: dict[str, list[str]]
    row_groups: dict[str, int]
    image_size: int
    fingerprint: str
    endpoint: Optional[str] = None

    def urls(self, split: str) -> list[str]:
        base = self.uri.rstrip("/")
        if base.startswith("/"):
            base = "file://" + base
        return [posixpath.join(base, name) for name in self.files[split]]


def open_dataset(uri: str, endpoint: Optional[str] = None, region: Optional[str] = None) -> Dataset:
    """Reads the manifest the preprocessing wrote, and counts row groups for sharding."""
    root = open_location(uri, endpoint, region)
    manifest_at = root.join("_manifest.json")
    try:
        manifest = json.loads(manifest_at.read_bytes())
    except (FileNotFoundError, OSError) as exc:
        raise DatasetError(f"no dataset manifest at {manifest_at.uri} ({type(exc).__name__}): "
                           "run the preprocessing first") from None
    row_groups = {split: sum(_row_groups(root.join(name)) for name in manifest["files"][split]) for split in SPLITS}
    return Dataset(uri=uri, classes=manifest["classes"], rows=manifest["written"], files=manifest["files"],
                   row_groups=row_groups, image_size=manifest["parameters"]["imageSize"],
                   fingerprint=manifest["fingerprint"], endpoint=endpoint)


def _row_groups(location: Location) -> int:
    with location.fs.open_input_file(location.path) as f:
        return pq.ParquetFile(f).metadata.num_row_groups


def check_shardable(dataset: Dataset, processes: int) -> None:
    """Petastorm shards by row group: every process needs at least one of each split."""
    for split in SPLITS:
        if dataset.row_groups[split] < processes:
            raise DatasetError(
                f"{split} has {dataset.row_groups[split]} row groups for {processes} processes, so some "
                f"would get no data: preprocess again for {processes} readers (it writes >= 2 row groups "
                "per reader when there are enough rows) or use fewer processes"
            )


def _storage_options(dataset: Dataset) -> Optional[dict]:
    if not dataset.uri.startswith("s3://"):
        return None
    return s3fs_options(dataset.endpoint)  # keys (and, without an endpoint, AWS_ENDPOINT_URL) from the environment


def make_dataset(dataset: Dataset, split: str, *, rank: int, size: int, batch_size: int, seed: int,
                 shuffle_buffer: int = 256, reader_threads: int = 4, row_group_cache: int = 50,
                 clock=None, delay: float = 0.0):
    """(tf.data.Dataset, reader): batches of (uint8 images, int labels) for this rank.

    reader_threads, row_group_cache: spec.training.input (readerWorkers, rowGroupCache). clock: an
    input_wait.InputClock that stamps each batch as the model takes it; delay: seconds added to every
    batch before the prefetch (SCALINGRUN_DIAGNOSTIC_READER_DELAY, to make the reader slow on purpose).
    """
    import tensorflow as tf
    from petastorm import make_batch_reader
    from petastorm.tf_utils import make_petastorm_dataset

    # petastorm 0.13 on pyarrow 10 warns about deprecated pyarrow APIs on every reader, and about
    # re-iterating the validation dataset each epoch, which is what we want.
    warnings.filterwarnings("ignore", category=FutureWarning, module="petastorm")
    warnings.filterwarnings("ignore", message="Running multiple iterations over make_petastorm_dataset")
    training = split == "train"
    reader = make_batch_reader(
        dataset.urls(split), schema_fields=["image", "label"], cur_shard=rank, shard_count=size,
        # The same seed on every rank: row groups are shuffled identically, then split into disjoint shards.
        seed=seed, shuffle_row_groups=training, num_epochs=None if training else 1,
        workers_count=reader_threads, results_queue_size=row_group_cache, storage_options=_storage_options(dataset),
    )
    side = dataset.image_size

    def decode(rows):
        # One row group at a time: a single vectorised decode_raw instead of one map call per image.
        pixels = tf.io.decode_raw(rows.image, tf.uint8)
        return tf.reshape(pixels, (-1, side, side, 3)), tf.cast(rows.label, tf.int32)

    data = make_petastorm_dataset(reader).map(decode, num_parallel_calls=tf.data.AUTOTUNE).unbatch()
    if training:
        # Row groups arrive shuffled; this mixes rows across them. uint8 keeps the buffer 4x smaller.
        data = data.shuffle(shuffle_buffer, seed=seed + rank)
    data = data.batch(batch_size, drop_remainder=training)
    if delay > 0:
        from .input_wait import delay_batches

        data = delay_batches(data, delay)
    data = data.prefetch(tf.data.AUTOTUNE)
    return (clock.attach(data) if clock is not None else data), reader
