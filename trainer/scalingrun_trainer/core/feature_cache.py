"""spec.training.featureCache: with a frozen built-in base, each rank runs the base once over its shard and trains
the head on the pooled features in every epoch. Framework-free: when it applies, the one pass that reads the
shard and stores the features, and the batches every epoch draws from them. An engine gives it the base's forward
pass (`extract`) and feeds the batches to its head (frameworks/keras/feature_cache.py,
frameworks/lightning/feature_cache.py); session.cache_features builds an attempt's.

Exact, not an approximation: no augmentation exists, and a frozen base runs in inference mode (BatchNorm with its
stored statistics), so an image's features never change. Dropout stays in the head, so it still draws new masks
every step.

- The shard is the training reader's (the same seed shards row groups identically), read once, in order
  (`num_epochs=1` without row-group shuffling: Petastorm drops rows from shuffled finite readers). The ranks' rows
  must add up to the split, or the cache refuses to train on a partial shard.
- Epoch e draws `steps x batch` rows from an endless stream of permutations of the shard, each seeded by
  (seed, rank, pass): every rank covers its whole shard before repeating a row, and a resumed attempt at epoch e
  draws what an uninterrupted one would have.
- Features are float32, kept in memory up to MEMORY_LIMIT bytes per rank, beyond that in a file on local disk
  (SCALINGRUN_FEATURE_CACHE_DIR, default the temp directory), memory-mapped. Every attempt builds its own cache.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any, Callable, Iterator, Optional, Protocol

import numpy as np
from scalingrun_api.config import TrainerConfig
from scalingrun_api.models import FeatureCache

from .collective import Collective
from .dataset import SPLITS, Dataset, DatasetError, batches, open_reader, pixel_groups

# Per rank: 512 MiB is about 100,000 images of a 1280-wide base (EfficientNet-Lite0, MobileNetV2), 65,000 of
# Xception's 2048; a process's memory peaks at about twice this while the last chunk is joined.
MEMORY_LIMIT = 512 * 1024 * 1024
MEMORY_LIMIT_ENV = "SCALINGRUN_FEATURE_CACHE_MEMORY_BYTES"
DIRECTORY_ENV = "SCALINGRUN_FEATURE_CACHE_DIR"


def reason_not_used(config: TrainerConfig) -> Optional[str]:
    """None when this run trains on cached features, else why not (the status says it)."""
    if config.training.feature_cache == "off":
        return "spec.training.featureCache is off"
    if config.model.trainable_base:
        return "spec.model.trainableBase is true: the base's features change every step"
    if getattr(config.model, "builder", None):
        return "spec.model.builder: a custom network has no frozen base to cache"
    return None


def memory_limit() -> int:
    value = os.environ.get(MEMORY_LIMIT_ENV, "").strip()
    if not value:
        return MEMORY_LIMIT
    try:
        return max(0, int(value))
    except ValueError:
        raise ValueError(f"{MEMORY_LIMIT_ENV} must be a number of bytes, got {value!r}") from None


class FeatureStore:
    """One split's features of this rank, appended a batch at a time: in memory while they fit in `limit` bytes,
    then in a file under `directory` (the rows kept so far move there)."""

    def __init__(self, limit: int, directory: Optional[str] = None):
        self.limit, self.directory = limit, directory
        self._chunks: list[np.ndarray] = []
        self._labels: list[np.ndarray] = []
        self._file = None
        self.path: Optional[str] = None
        self.rows, self.nbytes, self.width = 0, 0, None
        self.features: Optional[np.ndarray] = None
        self.labels: Optional[np.ndarray] = None

    @property
    def on_disk(self) -> bool:
        return self.path is not None

    def append(self, features: np.ndarray, labels: np.ndarray) -> None:
        features = np.ascontiguousarray(features, dtype=np.float32)
        if features.ndim != 2 or len(features) != len(labels):
            raise ValueError(f"features of shape {features.shape} for {len(labels)} labels")
        if self.width is None:
            self.width = features.shape[1]
        self._labels.append(np.array(labels, dtype=np.int64))  # a copy: the reader reuses its buffers
        self.rows += len(features)
        self.nbytes += features.nbytes
        if self._file is None and self.nbytes > self.limit:
            handle, self.path = tempfile.mkstemp(prefix="features-", suffix=".f32", dir=self.directory)
            self._file = os.fdopen(handle, "wb")
            for chunk in self._chunks:
                self._file.write(chunk.tobytes())
            self._chunks = []
        if self._file is not None:
            self._file.write(features.tobytes())
        else:
            self._chunks.append(features)

    def finish(self) -> "FeatureStore":
        """Makes `features` ((rows, width) float32, an array or a read-only memory map) and `labels`."""
        self.labels = np.concatenate(self._labels) if self._labels else np.zeros(0, np.int64)
        if self._file is not None:
            self._file.close()
            self.features = np.memmap(self.path, dtype=np.float32, mode="r", shape=(self.rows, self.width))
        else:
            self.features = np.concatenate(self._chunks) if self._chunks else np.zeros((0, self.width or 0), np.float32)
        self._chunks, self._labels = [], []
        return self

    def close(self) -> None:
        self.features = None
        if self.path is not None:
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass


# Diagnostic: a folder where every rank appends `epoch step row...` for each training batch it draws (the rows'
# positions in its shard), to check which rows a resumed epoch trains on.
BATCH_LOG_ENV = "SCALINGRUN_DIAGNOSTIC_BATCH_LOG"


def _batch_log(rank: int) -> Optional[Callable[[str], object]]:
    folder = os.environ.get(BATCH_LOG_ENV, "").strip()
    if not folder:
        return None
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"rank-{rank}.log")

    def write(line: str) -> None:
        with open(path, "a") as f:
            f.write(line)

    return write


def epoch_rows(rows: int, count: int, epoch: int, seed: int, rank: int) -> np.ndarray:
    """Indices of the `count` rows epoch `epoch` (0-based) trains on: positions [epoch x count, (epoch + 1) x count)
    of the stream of permutations of range(rows), pass k seeded by (seed, rank, k)."""
    if rows < 1:
        raise ValueError("no rows to draw from")
    start = epoch * count
    first, last = start // rows, (start + count - 1) // rows
    stream = np.concatenate([np.random.default_rng([seed, rank, k]).permutation(rows) for k in range(first, last + 1)])
    offset = start - first * rows
    return stream[offset:offset + count]


class FeatureCacheData:
    """This rank's cached features of both splits, and the batches its epochs train and validate on."""

    def __init__(self, stores: dict[str, FeatureStore], seed: int, rank: int, seconds: float):
        self.stores, self.seed, self.rank, self.seconds = stores, seed, rank, seconds

    @property
    def width(self) -> int:
        return int(self.stores["train"].width)

    @property
    def nbytes(self) -> int:
        return sum(store.nbytes for store in self.stores.values())

    @property
    def on_disk(self) -> bool:
        return any(store.on_disk for store in self.stores.values())

    def train_batches(self, first_epoch: int, steps: int, batch_size: int,
                      first_step: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Endless: `steps` batches per epoch from step `first_step` of `first_epoch` (0-based) on, drawn by
        epoch_rows: a training resumed at a step of an epoch trains on the rest of that epoch's rows, exactly."""
        store, epoch, first = self.stores["train"], first_epoch, first_step
        batch_log = _batch_log(self.rank)
        while True:
            order = epoch_rows(store.rows, steps * batch_size, epoch, self.seed, self.rank)
            for step in range(first, steps):
                # Sorted within the batch: a memory map reads forward; the batch's order does not matter to the loss.
                rows = np.sort(order[step * batch_size:(step + 1) * batch_size])
                if batch_log is not None:
                    batch_log(f"{epoch} {step} {' '.join(map(str, rows))}\n")
                yield store.features[rows], store.labels[rows]
            epoch, first = epoch + 1, 0

    def validation_batches(self, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """This rank's validation rows in order, once."""
        store = self.stores["validation"]
        for start in range(0, store.rows, batch_size):
            yield np.asarray(store.features[start:start + batch_size]), store.labels[start:start + batch_size]

    def close(self) -> None:
        for store in self.stores.values():
            store.close()


def shard_pixels(dataset: Dataset, split: str, *, rank: int, size: int, seed: int, batch_size: int,
                 reader_threads: int = 2) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """This rank's shard of `split` read once, in order, as uint8 (n, side, side, 3) pixel batches of `batch_size`
    rows (the last one shorter) with their labels. A batch's buffers are reused once it is dropped."""
    reader = open_reader(dataset, split, shard=rank, shards=size, seed=seed, reader_threads=reader_threads,
                         in_order=True)
    try:
        yield from batches(pixel_groups(reader, dataset), batch_size)
    finally:
        reader.stop()
        reader.join()


def build_feature_cache(dataset: Dataset, extract: Callable[[np.ndarray], np.ndarray], *, rank: int, size: int,
                        seed: int, batch_size: int, limit: Optional[int] = None,
                        directory: Optional[str] = None,
                        beat: Callable[[int], object] = lambda rows: None) -> FeatureCacheData:
    """Runs `extract` (uint8 pixels -> (n, width) float32 pooled features) over this rank's shard of both splits;
    `beat(rows so far)` after every batch (the heartbeat: a pass over a large shard takes minutes)."""
    started = time.monotonic()
    limit = memory_limit() if limit is None else limit
    directory = directory or os.environ.get(DIRECTORY_ENV) or None
    stores: dict[str, FeatureStore] = {}
    try:
        for split in SPLITS:
            store = stores[split] = FeatureStore(limit - sum(s.nbytes for s in stores.values()), directory)
            for pixels, labels in shard_pixels(dataset, split, rank=rank, size=size, seed=seed, batch_size=batch_size):
                store.append(np.asarray(extract(pixels)), labels)
                beat(sum(s.rows for s in stores.values()))
            store.finish()
    except BaseException:
        for store in stores.values():
            store.close()
        raise
    return FeatureCacheData(stores, seed, rank, time.monotonic() - started)


def share(cache: FeatureCacheData, dataset: Dataset, world: Collective) -> FeatureCache:
    """status.training.featureCache over all ranks (a collective): the slowest rank's seconds, the summed rows and
    bytes. Refuses a cache that lost rows: the ranks' rows must add up to both splits."""
    stores = cache.stores
    train, validation, nbytes, on_disk = world.allreduce(
        [stores["train"].rows, stores["validation"].rows, cache.nbytes, float(cache.on_disk)],
        "sum", "feature_cache_rows")
    (seconds,) = world.allreduce([cache.seconds], "max", "feature_cache_seconds")
    for split, rows in (("train", train), ("validation", validation)):
        if int(rows) != dataset.rows[split]:
            raise DatasetError(f"the feature cache read {int(rows)} of the {dataset.rows[split]} {split} rows over all "
                               "processes: the reader lost rows. Train with spec.training.featureCache: off and report "
                               "this")
    return FeatureCache(used=True, seconds=round(seconds, 2), rows=int(train + validation), bytes=int(nbytes),
                        on_disk=on_disk > 0)


class Weights(Protocol):
    """An engine's model weights as one picklable value."""

    def get(self) -> Any: ...

    def set(self, value: Any) -> None: ...
