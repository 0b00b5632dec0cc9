"""Petastorm's PyTorch reader over the preprocessed Parquet, sharded per rank by the rules of ../core/dataset.py
(the same as the Keras reader's): an epoch is `steps_per_epoch` batches of the endless training reader; validation
is read completely, unshuffled, once per epoch. Pixels stay uint8 (the model normalises).
"""

from __future__ import annotations

import logging
from typing import Iterator

import numpy as np
import torch

from ..core.dataset import Dataset, open_reader


def _reader(dataset: Dataset, split: str, *, rank: int, size: int, seed: int, reader_threads: int):
    from petastorm.transform import TransformSpec

    side, image = dataset.image_size, dataset.columns["image"]

    def decode(frame):
        # Raw bytes to a flat uint8 vector per row (zero-copy views); the loader stacks and reshapes them.
        frame[image] = [np.frombuffer(raw, dtype=np.uint8) for raw in frame[image]]
        return frame

    return open_reader(dataset, split, shard=rank, shards=size, seed=seed, reader_threads=reader_threads,
                       transform_spec=TransformSpec(decode, edit_fields=[(image, np.uint8, (side * side * 3,), False)]))


def _loader(reader, batch_size: int, dataset: Dataset, shuffle_rows: int):
    from petastorm.pytorch import DataLoader

    side, image, label = dataset.image_size, dataset.columns["image"], dataset.columns["label"]

    def collate(rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
        pixels = torch.from_numpy(np.stack([row[image] for row in rows])).view(-1, side, side, 3)
        labels = torch.as_tensor(np.fromiter((row[label] for row in rows), dtype=np.int64, count=len(rows)))
        return pixels, labels

    return DataLoader(reader, batch_size=batch_size, collate_fn=collate, shuffling_queue_capacity=shuffle_rows)


# Reader threads per process: the decode runs in Python under the GIL, and with 4 threads the reader delivered
# half of what 1 or 2 did on 2 cores (bench/lightning.py); 2 keep some S3 requests overlapping.
class TrainBatches:
    """An endless sharded reader cut into epochs of `steps` batches (len() is what Lightning counts)."""

    def __init__(self, dataset: Dataset, *, rank: int, size: int, batch_size: int, steps: int, seed: int,
                 shuffle_rows: int = 256, reader_threads: int = 2):
        # Rows are mixed across row groups by the loader's shuffling buffer, seeded per rank.
        np.random.seed(seed + rank)
        self.reader = _reader(dataset, "train", rank=rank, size=size, seed=seed, reader_threads=reader_threads)
        self._batches = iter(_loader(self.reader, batch_size, dataset, shuffle_rows))
        self.steps = steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(self.steps):
            yield next(self._batches)

    def close(self) -> None:
        self.reader.stop()
        self.reader.join()


class ValidationBatches:
    """This rank's share of the validation split, read once per iteration by a fresh unshuffled reader."""

    def __init__(self, dataset: Dataset, *, rank: int, size: int, batch_size: int, seed: int, reader_threads: int = 2):
        self.dataset, self.rank, self.size, self.batch_size = dataset, rank, size, batch_size
        self.seed, self.reader_threads = seed, reader_threads
        logging.getLogger("petastorm").setLevel(logging.ERROR)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        reader = _reader(self.dataset, "validation", rank=self.rank, size=self.size, seed=self.seed,
                         reader_threads=self.reader_threads)
        try:
            yield from _loader(reader, self.batch_size, self.dataset, 0)
        finally:
            reader.stop()
            reader.join()
