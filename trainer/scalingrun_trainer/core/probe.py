"""batchSizePerWorker: auto - a short probe that finds where a larger batch stops paying.

Rank 0 alone trains a throwaway copy of the model on in-memory batches of the dataset's shape (so the
reader's speed does not blur the figure), doubling the batch size from PROBE_START: one warm-up step
(graph tracing), then timed steps. It stops at the first out-of-memory error (caught, never fatal) or at
the ceiling, and picks the knee: the smallest size within KNEE_TOLERANCE of the best images/s, since a
larger batch that is not faster only costs generalisation and memory. Every rank then uses that size.

Diagnostic: SCALINGRUN_PROBE_OOM_AT=N makes every size >= N raise TensorFlow's ResourceExhaustedError,
as a GPU that is too small would, to show the probe backing off without such a GPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

PROBE_START = 8
PROBE_CEILING = 512
KNEE_TOLERANCE = 0.05
OOM_AT_ENV = "SCALINGRUN_PROBE_OOM_AT"
MIN_STEPS, MAX_STEPS, MIN_SECONDS = 3, 20, 0.5


class ProbeError(RuntimeError):
    """No batch size fits; the message says what to do."""


@dataclass
class ProbeResult:
    chosen: int
    table: list[dict] = field(default_factory=list)  # {"batchSize", "imagesPerSecond"} or {"batchSize", "outOfMemory"}
    stopped_by: str = "ceiling"  # or "outOfMemory"
    seconds: float = 0.0

    def document(self) -> dict:
        """The progress document's (and status') batchSizeProbe."""
        return {"chosen": self.chosen, "seconds": round(self.seconds, 2), "stoppedBy": self.stopped_by,
                "table": self.table}

    @classmethod
    def from_document(cls, document: dict) -> "ProbeResult":
        return cls(int(document["chosen"]), list(document.get("table") or []), document.get("stoppedBy", "ceiling"),
                   float(document.get("seconds") or 0.0))

    def describe(self) -> str:
        cells = ", ".join(f"{row['batchSize']}: OOM" if row.get("outOfMemory")
                          else f"{row['batchSize']}: {row['imagesPerSecond']:.0f} img/s" for row in self.table)
        return (f"batch-size probe ({self.seconds:.1f} s, stopped by {self.stopped_by}): {cells}; "
                f"chose {self.chosen}")


def candidate_sizes(start: int, ceiling: int) -> list[int]:
    """start, 2 x start, ... up to the ceiling (the ceiling itself when start exceeds it)."""
    if ceiling < 1:
        raise ValueError(f"the ceiling must be >= 1, got {ceiling}")
    size, sizes = min(start, ceiling), []
    while size <= ceiling:
        sizes.append(size)
        size *= 2
    return sizes


def choose_knee(table: list[dict], tolerance: float = KNEE_TOLERANCE) -> int:
    """The smallest measured batch size whose images/s is within `tolerance` of the best one."""
    measured = [row for row in table if row.get("imagesPerSecond") is not None and not row.get("outOfMemory")]
    if not measured:
        raise ValueError("no batch size was measured")
    best = max(row["imagesPerSecond"] for row in measured)
    return min(row["batchSize"] for row in measured if row["imagesPerSecond"] >= (1 - tolerance) * best)


def run_probe(measure: Callable[[int], float], sizes: list[int], is_oom: Callable[[BaseException], bool],
              clock: Callable[[], float] = time.monotonic) -> ProbeResult:
    """Measures images/s at each size until one runs out of memory; an OOM at the first size backs off by
    halving. Errors other than out-of-memory propagate."""
    started = clock()
    table: list[dict] = []
    stopped_by = "ceiling"
    queue = list(sizes)
    while queue:
        size = queue.pop(0)
        try:
            table.append({"batchSize": size, "imagesPerSecond": round(float(measure(size)), 1)})
        except Exception as exc:  # noqa: BLE001 - only out-of-memory is expected; the rest is re-raised
            if not is_oom(exc):
                raise
            table.append({"batchSize": size, "outOfMemory": True})
            stopped_by = "outOfMemory"
            if not any("imagesPerSecond" in row for row in table) and size > 1:
                queue = [size // 2]  # nothing fits yet: back off below the first size
            else:
                break
    if not any("imagesPerSecond" in row for row in table):
        raise ProbeError(f"even batch size {table[-1]['batchSize']} ran out of memory: give the workers more "
                         "memory (spec.workers.memory) or larger GPUs")
    table.sort(key=lambda row: row["batchSize"])
    return ProbeResult(choose_knee(table), table, stopped_by, clock() - started)


def probe_ceiling(train_rows: int, processes: int, ceiling: int = PROBE_CEILING) -> int:
    """No larger than the ceiling, and small enough that an epoch still has a step for every process."""
    return max(1, min(ceiling, train_rows // max(processes, 1)))


# --- TensorFlow -----------------------------------------------------------------------------------


def is_out_of_memory(exc: BaseException) -> bool:
    import tensorflow as tf

    if isinstance(exc, (tf.errors.ResourceExhaustedError, MemoryError)):
        return True
    # cuDNN and XLA report allocation failures as internal errors.
    text = str(exc).lower()
    return isinstance(exc, tf.errors.InternalError) and ("out of memory" in text or "alloc" in text)


def keras_measure(model, image_size: int, classes: int, oom_at: Optional[int] = None,
                  clock: Callable[[], float] = time.perf_counter) -> Callable[[int], float]:
    """images/s of `model.train_on_batch` at a batch size (a compiled, throwaway model)."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)

    def measure(batch_size: int) -> float:
        if oom_at is not None and batch_size >= oom_at:
            raise tf.errors.ResourceExhaustedError(
                None, None, f"OOM when allocating a batch of {batch_size} ({OOM_AT_ENV}={oom_at})")
        images = rng.integers(0, 256, (batch_size, image_size, image_size, 3), dtype=np.uint8)
        labels = rng.integers(0, classes, (batch_size,), dtype=np.int32)
        model.train_on_batch(images, labels)  # warm-up: traces the step for this shape
        steps, started = 0, clock()
        while steps < MIN_STEPS or (steps < MAX_STEPS and clock() - started < MIN_SECONDS):
            model.train_on_batch(images, labels)  # returns numbers: the step has finished
            steps += 1
        return batch_size * steps / (clock() - started)

    return measure
