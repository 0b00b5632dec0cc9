"""The preprocessed Parquet dataset and the rules every engine's reader follows.

Petastorm readers shard by row group: the row groups are shuffled with one seed, the same on every rank, and then
split into disjoint shards (cur_shard = rank, shard_count = readers), so every rank reads a random, disjoint share.
Training readers loop forever (`num_epochs=None`; the engine counts `steps_per_epoch` batches): a Petastorm bug
drops rows from shuffled finite readers. Validation is read completely, unshuffled, once per epoch.
"""

from __future__ import annotations

import itertools
import json
import math
import posixpath
import sys
import warnings
from dataclasses import dataclass, field
from typing import Optional

import pyarrow as pa
import pyarrow.parquet as pq

from scalingrun_api.manifest import MANIFEST_FILE, DatasetManifest
from ..storage import Location, open_location, s3fs_options


class DatasetError(RuntimeError):
    """The dataset cannot be used as configured; the message says why and what to do."""


SPLITS = ("train", "validation")  # the dataset's folders, in preprocessing's order
# The columns our preprocessing writes; a Parquet table of the user's (dataset.format parquet) names its own.
DEFAULT_COLUMNS = {"image": "image", "label": "label"}


@dataclass(frozen=True)
class Dataset:
    uri: str  # the folder the files are relative to: dataset.output, or a Parquet table's source
    classes: list[str]
    rows: dict[str, int]
    files: dict[str, list[str]]
    row_groups: dict[str, int]
    image_size: int
    fingerprint: str
    endpoint: Optional[str] = None
    columns: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_COLUMNS))

    def urls(self, split: str) -> list[str]:
        base = self.uri.rstrip("/")
        if base.startswith("/"):
            base = "file://" + base
        return [posixpath.join(base, name) for name in self.files[split]]

    def storage_options(self) -> Optional[dict]:
        """Petastorm's s3fs options; keys (and, without an endpoint, AWS_ENDPOINT_URL) come from the environment."""
        if not self.uri.startswith("s3://"):
            return None
        return s3fs_options(self.endpoint)


def open_dataset(uri: str, endpoint: Optional[str] = None, region: Optional[str] = None) -> Dataset:
    """Reads the manifest the preprocessing wrote, and counts row groups for sharding."""
    root = open_location(uri, endpoint, region)
    manifest_at = root.join(MANIFEST_FILE)
    try:
        document = json.loads(manifest_at.read_bytes())
    except (FileNotFoundError, OSError) as exc:
        raise DatasetError(f"no dataset manifest at {manifest_at.uri} ({type(exc).__name__}): "
                           "run the preprocessing first") from None
    manifest = DatasetManifest.read(document)  # the one reader of the manifest, the operator's too
    if manifest is None or "imageSize" not in manifest.parameters or any(s not in manifest.files for s in SPLITS):
        raise DatasetError(f"{manifest_at.uri} is not a complete dataset manifest (it names no image size or not "
                           f"the files of each split {', '.join(SPLITS)}): run the preprocessing again")
    # A Parquet table's manifest (dataset.format parquet) names where its files are, and its columns.
    data_root = manifest.data_root or uri
    files_at = open_location(data_root, endpoint, region) if data_root != uri else root
    row_groups = {split: sum(_row_groups(files_at.join(name)) for name in manifest.files[split]) for split in SPLITS}
    return Dataset(uri=data_root, classes=manifest.classes, rows=manifest.written, files=manifest.files,
                   row_groups=row_groups, image_size=manifest.parameters["imageSize"],
                   fingerprint=manifest.fingerprint, endpoint=endpoint,
                   columns={**DEFAULT_COLUMNS, **(manifest.columns or {})})


def _row_groups(location: Location) -> int:
    with location.fs.open_input_file(location.path) as f:
        return pq.ParquetFile(f).metadata.num_row_groups


def check_shardable(dataset: Dataset, readers: int) -> None:
    """Petastorm shards by row group: every reader (one per process) needs at least one of each split."""
    for split in SPLITS:
        if dataset.row_groups[split] < readers:
            raise DatasetError(
                f"{split} has {dataset.row_groups[split]} row groups for {readers} processes, so some "
                f"would get no data: preprocess again for {readers} readers (it writes >= 2 row groups "
                "per reader when there are enough rows) or use fewer processes"
            )


_FIXED_SIZE_BINARY = pa.binary(1).id


def pixels_of(column):
    """A binary column of equally long side x side x 3 images as one (rows, side, side, 3) uint8 array: a view of
    the Arrow buffer, no copy."""
    import numpy as np

    chunk = column.chunks[0] if column.num_chunks == 1 else column.combine_chunks()
    if chunk.type.id == _FIXED_SIZE_BINARY:  # a Parquet table of the user's may store them so: no offsets
        size = chunk.type.byte_width
        side = math.isqrt(size // 3)
        if chunk.null_count or side * side * 3 != size:
            raise DatasetError(f"images of {size} bytes (or missing): every row must hold imageSize x imageSize x 3 "
                               "bytes")
        return np.frombuffer(chunk.buffers()[1], dtype=np.uint8, count=len(chunk) * size,
                             offset=chunk.offset * size).reshape(-1, side, side, 3)
    _, offsets, data = chunk.buffers()
    offsets = np.frombuffer(offsets, dtype=np.int32, count=len(chunk) + 1, offset=4 * chunk.offset)
    lengths = np.diff(offsets)
    size = int(lengths[0])
    side = math.isqrt(size // 3)
    if chunk.null_count or (lengths != size).any() or side * side * 3 != size:
        raise DatasetError(f"images of {sorted(set(lengths.tolist()))[:3]} bytes in one row group: every row must "
                           "hold imageSize x imageSize x 3 bytes; preprocess the dataset again")
    return np.frombuffer(data, dtype=np.uint8, count=len(chunk) * size, offset=int(offsets[0])).reshape(
        -1, side, side, 3)


def _pixel_worker(image: str, label: str):
    from petastorm.arrow_reader_worker import ArrowReaderWorker

    class PixelReaderWorker(ArrowReaderWorker):
        """Petastorm's Arrow worker, ending in (pixels, labels) arrays made in the reader thread: the pixels a view
        of the buffer it read (petastorm would copy the table once by an identity `take`, then once more into
        one Python bytes object per image on the consumer's thread)."""

        def _load_rows(self, pq_file, piece, shuffle_row_drop_range):
            # The file the worker opened (piece.read would open it again); no Arrow thread pool under the reader
            # threads, which are the parallelism here (fewer hand-offs: less CPU on a busy machine).
            table = pq_file.read_row_group(piece.row_group, columns=[image, label], use_threads=False)
            if not table.num_rows:
                return {}  # falsy: nothing is published
            return {image: pixels_of(table.column(image)), label: table.column(label).to_numpy()}

    return PixelReaderWorker


def open_reader(dataset: Dataset, split: str, *, shard: int, shards: int, seed: int, reader_threads: int,
                results_queue_size: int = 50, in_order: bool = False):
    """Petastorm's reader of this rank's shard of a split, yielding (image, label) per row group: uint8
    (rows, side, side, 3) pixels and int32 labels. in_order: the shard once, unshuffled, whatever the split (the
    feature cache's pass; the shard is the same, since the seed alone decides it).

    What make_batch_reader(schema_fields=[image column, label column]) makes, with its worker ending in arrays. The same
    seed on every rank: row groups are shuffled identically, then split into disjoint shards by row group
    (cur_shard/shard_count). Training readers loop forever (num_epochs=None); validation is read once, in order.
    """
    from petastorm.cache import NullCache
    from petastorm.fs_utils import get_filesystem_and_path_or_paths
    from petastorm.reader import Reader, normalize_dataset_url_or_urls
    from petastorm.workers_pool.thread_pool import ThreadPool

    # petastorm 0.13 on pyarrow 10 warns about deprecated pyarrow APIs on every reader.
    warnings.filterwarnings("ignore", category=FutureWarning, module="petastorm")
    training = split == "train" and not in_order
    filesystem, paths = get_filesystem_and_path_or_paths(normalize_dataset_url_or_urls(dataset.urls(split)),
                                                         storage_options=dataset.storage_options())
    image, label = dataset.columns["image"], dataset.columns["label"]
    return Reader(filesystem, paths, schema_fields=[image, label], worker_class=_pixel_worker(image, label),
                  reader_pool=ThreadPool(reader_threads, results_queue_size, shuffle_rows=False, seed=seed),
                  seed=seed, shuffle_row_groups=training, num_epochs=None if training else 1,
                  cur_shard=shard, shard_count=shards, cache=NullCache(), is_batched_reader=True)


def pixel_groups(reader, dataset: Dataset):
    """(pixels, labels) per row group of a reader from open_reader: its rows are named after dataset.columns (a
    Parquet table of the user's names its own)."""
    image, label = dataset.columns["image"], dataset.columns["label"]
    return ((getattr(group, image), getattr(group, label)) for group in reader)


def validation_rows(dataset: Dataset, *, shard: int, shards: int, seed: int) -> int:
    """The rows of the validation split in shard `shard`: what its reader delivers each epoch."""
    reader = open_reader(dataset, "validation", shard=shard, shards=shards, seed=seed, reader_threads=1)
    try:
        return sum(len(labels) for _, labels in pixel_groups(reader, dataset))
    finally:
        reader.stop()
        reader.join()

def batches(row_groups, batch_size: int, *, shuffle_rows: int = 0, seed=None, drop_remainder: bool = False,
            empty=None):
    """(pixels, labels) batches from (pixels, labels) row groups, each row copied once: into its batch.

    shuffle_rows > 0: each batch is drawn at random (seeded) from a buffer of at least shuffle_rows rows that
    spans row groups (they arrive shuffled; our preprocessing mixes the classes inside one, a team's own table
    may not); 0: rows in order.
    The buffer holds the row groups themselves, not copies of their rows. empty(shape, dtype): the batches'
    allocator (numpy.empty; page-locked memory for a GPU), recycled.
    """
    import numpy as np

    rng = np.random.default_rng(seed) if shuffle_rows else None
    allocate = recycled(empty or np.empty)
    groups: dict[int, list] = {}  # id -> [pixels, labels, rows not yet taken]
    slots: list[tuple[int, int]] = []  # (group id, row) of the rows not yet taken (from `head` on, in order)
    head = 0
    source, ids, exhausted = iter(row_groups), itertools.count(), False
    while True:
        while not exhausted and len(slots) - head < max(shuffle_rows, batch_size):
            group = next(source, None)
            if group is None:
                exhausted = True
            elif len(group[1]):
                number = next(ids)
                groups[number] = [group[0], group[1], len(group[1])]
                slots.extend((number, row) for row in range(len(group[1])))
        left = len(slots) - head
        if left == 0 or (left < batch_size and drop_remainder):
            return
        count = min(batch_size, left)
        if rng is None:
            picked, head = slots[head:head + count], head + count
            if head > 4096:
                del slots[:head]
                head = 0
        else:
            chosen = rng.choice(left, count, replace=False)
            picked = [slots[i] for i in chosen]
            for i in sorted(chosen, reverse=True):  # swap-remove, from the back
                slots[i] = slots[-1]
                slots.pop()
        yield _gather(groups, picked, allocate)


def recycled(empty, keep: int = 16):
    """An allocator like empty(shape, dtype) that hands a buffer out again once only it holds it (the consumer
    dropped that batch): fresh batch-sized buffers cost page faults and the kernel's zeroing, about as much CPU
    as filling them. A buffer still referenced anywhere (a tensor made from it, a view) is never reused."""
    pool: list = []

    def allocate(shape, dtype):
        for index in range(len(pool)):
            # References: the pool's list and getrefcount's argument (pool[index] is bound to no name).
            if sys.getrefcount(pool[index]) == 2 and pool[index].shape == tuple(shape) and pool[index].dtype == dtype:
                return pool[index]
        buffer = empty(shape, dtype)
        if len(pool) < keep:
            pool.append(buffer)
        return buffer

    return allocate


def _gather(groups: dict[int, list], picked: list[tuple[int, int]], empty):
    first = groups[picked[0][0]]
    pixels = empty((len(picked), *first[0].shape[1:]), first[0].dtype)
    labels = empty((len(picked),), first[1].dtype)
    for j, (number, row) in enumerate(picked):
        group = groups[number]
        pixels[j], labels[j] = group[0][row], group[1][row]
        group[2] -= 1
        if not group[2]:
            del groups[number]  # its Arrow buffer is freed with the last view of it
    return pixels, labels
