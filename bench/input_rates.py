"""images/s of the Lightning trainer's reader (TrainBatches: what the trainer feeds the model from) and of a bare
pyarrow read of the same train files, rounds interleaved; bench/lightning.py and bench/gpu.py measure with it.
Imported from the Lightning environment (torch, no TensorFlow)."""

from __future__ import annotations

import os
import time


def interleaved_rates(output: str, batch: int, batches: int, rounds: int) -> dict[str, list[float]]:
    """{"bare": [...], "reader": [...]}: one figure of each per round, the reader after `batches` batches."""
    import pyarrow.parquet as pq

    from scalingrun_trainer.core.dataset import open_dataset
    from scalingrun_trainer.frameworks.lightning.data import TrainBatches

    dataset = open_dataset(output)

    def bare() -> float:
        start, rows = time.perf_counter(), 0
        for name in dataset.files["train"]:
            for part in pq.ParquetFile(os.path.join(output, name)).iter_batches(batch_size=batch,
                                                                               columns=["image", "label"]):
                rows += part.num_rows
        return rows / (time.perf_counter() - start)

    def reader() -> float:
        data = TrainBatches(dataset, rank=0, size=1, batch_size=batch, steps=batches + 1, seed=0)
        try:
            iterator = iter(data)
            next(iterator)  # warm-up: reader threads, the shuffling buffer's first fill
            start, images = time.perf_counter(), 0
            for pixels, _ in iterator:
                images += pixels.shape[0]
            return images / (time.perf_counter() - start)
        finally:
            data.close()

    rates: dict[str, list[float]] = {"bare": [], "reader": []}
    for _ in range(rounds):
        rates["bare"].append(bare())
        rates["reader"].append(reader())
    return rates
