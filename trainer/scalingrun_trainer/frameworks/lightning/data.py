"""The shared Petastorm reader (../core/dataset.py: open_reader, batches) as PyTorch batches, sharded per rank.

The rules of ../core/dataset.py: row groups shuffled with one seed on every rank, then split into disjoint shards
(cur_shard/shard_count); training readers loop forever (`num_epochs=None`, a Petastorm bug drops rows from
shuffled finite readers) and an epoch is `steps_per_epoch` batches; validation is read completely,
unshuffled, once per epoch. Batches are whole tensors: uint8 (N, H, W, 3) pixels (the model normalises) and
int64 labels, assembled in a background thread while the model trains, in pinned memory when a GPU is present.

Petastorm's own `petastorm.pytorch.BatchedDataLoader` is not used: its shuffling buffer copies every row that
stays in it again for each row group added (docs/benchmarks.md, "Input pipeline (Lightning)").
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Iterator, Optional

import numpy as np
import torch

from ...core.dataset import Dataset, batches, open_reader, pixel_groups
from ...core.input_wait import reader_delay

# Reader threads per process: 2 keep some S3 requests overlapping without crowding 2 cores (the pixels are
# zero-copy views: the threads only read and decompress).
READER_THREADS = 2


def _pinned_empty(shape, dtype) -> np.ndarray:
    """Page-locked batch buffers (with a GPU): the copy to the device can then run asynchronously."""
    return torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dtype)).dtype, pin_memory=True).numpy()


def _tensors(reader, dataset: Dataset, batch_size: int, shuffle_rows: int, seed, drop_remainder: bool, pinned: bool):
    for pixels, labels in batches(pixel_groups(reader, dataset), batch_size, shuffle_rows=shuffle_rows, seed=seed,
                                  drop_remainder=drop_remainder,
                                  empty=_pinned_empty if pinned else None):
        yield torch.from_numpy(pixels), torch.from_numpy(labels).long()


class _Prefetched:
    """Runs an iterator in a thread, `depth` items ahead; close() stops it, also while it waits to hand one over."""

    _END = object()

    def __init__(self, items: Iterator, depth: int = 2):
        self._queue: queue.Queue = queue.Queue(depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(items,), daemon=True, name="scalingrun-batches")
        self._thread.start()

    def _run(self, items: Iterator) -> None:
        try:
            for item in items:
                if not self._put(item):
                    return
            self._put(self._END)
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(exc)

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def __iter__(self):
        return self

    def __next__(self):
        item = self._queue.get()
        if item is self._END:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class EpochLengths:
    """Batches per epoch as Lightning counts them (len()): `steps`, but the first epoch's rest only when an attempt
    resumes at a step of it (`first_step` steps trained before a checkpoint on a preemption notice). Lightning reads
    len() when it sets an epoch's data up (reload_dataloaders_every_n_epochs=1 then: each epoch's), and also calls
    iter() there without drawing, so the count moves on at an epoch's first batch; its diagnostic delay
    (SCALINGRUN_DIAGNOSTIC_READER_DELAY) before each batch."""

    def __init__(self, steps: int, first_step: int = 0):
        self.steps, self.first_step = steps, first_step
        self.delay = reader_delay()

    def __len__(self) -> int:
        return self.steps - self.first_step

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        count, self.first_step = len(self), 0
        for _ in range(count):
            if self.delay:
                time.sleep(self.delay)
            yield self.next_batch()

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError


class TrainBatches(EpochLengths):
    """An endless sharded reader cut into epochs of `steps` batches. A resumed epoch's rest comes from where the
    reader's stream is (its order cannot be replayed): its steps are counted, its rows not replayed."""

    def __init__(self, dataset: Dataset, *, rank: int, size: int, batch_size: int, steps: int, seed: int,
                 first_step: int = 0, shuffle_rows: int = 256, reader_threads: int = READER_THREADS,
                 pinned: Optional[bool] = None):
        super().__init__(steps, first_step)
        # Rows are mixed across row groups by a shuffling buffer, seeded per rank.
        self.reader = open_reader(dataset, "train", shard=rank, shards=size, seed=seed, reader_threads=reader_threads)
        pinned = torch.cuda.is_available() if pinned is None else pinned
        self._batches = _Prefetched(_tensors(self.reader, dataset, batch_size, shuffle_rows, (seed, rank), True,
                                             pinned))

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return next(self._batches)

    def close(self) -> None:
        self._batches.close()
        self.reader.stop()
        self.reader.join()


class ValidationBatches:
    """This rank's share of the validation split, read once per iteration by a fresh unshuffled reader."""

    def __init__(self, dataset: Dataset, *, rank: int, size: int, batch_size: int, seed: int,
                 reader_threads: int = READER_THREADS, pinned: Optional[bool] = None):
        self.dataset, self.rank, self.size, self.batch_size = dataset, rank, size, batch_size
        self.seed, self.reader_threads = seed, reader_threads
        self.pinned = torch.cuda.is_available() if pinned is None else pinned
        logging.getLogger("petastorm").setLevel(logging.ERROR)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        reader = open_reader(self.dataset, "validation", shard=self.rank, shards=self.size, seed=self.seed,
                             reader_threads=self.reader_threads)
        try:
            yield from _tensors(reader, self.dataset, self.batch_size, 0, None, False, self.pinned)
        finally:
            reader.stop()
            reader.join()
