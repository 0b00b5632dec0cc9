"""batchSizePerWorker: auto - a short probe that finds where a larger batch stops paying. The rules, framework-free;
the Keras engines measure with keras/probe.py.

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

from scalingrun_api.progress import BatchSizeProbe, ProbedBatchSize, probe_document

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
    table: list[dict] = field(default_factory=list)  # progress.json's rows (scalingrun_api.progress.ProbedBatchSize)
    stopped_by: str = "ceiling"  # or "outOfMemory"
    seconds: float = 0.0

    def document(self) -> dict:
        """The progress document's (and status') batchSizeProbe."""
        return probe_document(BatchSizeProbe(chosen=self.chosen, seconds=round(self.seconds, 2),
                                             stopped_by=self.stopped_by, table=_rows(self.table)))

    @classmethod
    def from_document(cls, document: dict) -> "ProbeResult":
        probe = BatchSizeProbe.model_validate(document)
        return cls(int(probe.chosen), [row.model_dump(by_alias=True, exclude_defaults=True) for row in probe.table],
                   probe.stopped_by or "ceiling", float(probe.seconds or 0.0))

    def describe(self) -> str:
        cells = ", ".join(f"{row.batch_size}: OOM" if row.out_of_memory
                          else f"{row.batch_size}: {row.images_per_second:.0f} img/s" for row in _rows(self.table))
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


def _rows(table: list[dict]) -> list[ProbedBatchSize]:
    return [ProbedBatchSize.model_validate(row) for row in table]


def _row(batch_size: int, images_per_second: Optional[float] = None, out_of_memory: bool = False) -> dict:
    """A row of the table as the progress document has it."""
    return ProbedBatchSize(batch_size=batch_size, images_per_second=images_per_second,
                           out_of_memory=out_of_memory).model_dump(by_alias=True, exclude_defaults=True)


def _measured(table: list[dict]) -> list[ProbedBatchSize]:
    return [row for row in _rows(table) if row.images_per_second is not None and not row.out_of_memory]


def choose_knee(table: list[dict], tolerance: float = KNEE_TOLERANCE) -> int:
    """The smallest measured batch size whose images/s is within `tolerance` of the best one."""
    measured = _measured(table)
    if not measured:
        raise ValueError("no batch size was measured")
    best = max(row.images_per_second for row in measured)
    return min(row.batch_size for row in measured if row.images_per_second >= (1 - tolerance) * best)


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
            table.append(_row(size, images_per_second=round(float(measure(size)), 1)))
        except Exception as exc:  # noqa: BLE001 - only out-of-memory is expected; the rest is re-raised
            if not is_oom(exc):
                raise
            table.append(_row(size, out_of_memory=True))
            stopped_by = "outOfMemory"
            if not _measured(table) and size > 1:
                queue = [size // 2]  # nothing fits yet: back off below the first size
            else:
                break
    if not _measured(table):
        raise ProbeError(f"even batch size {_rows(table)[-1].batch_size} ran out of memory: give the workers more "
                         "memory (spec.workers.memory) or larger GPUs")
    table.sort(key=lambda row: ProbedBatchSize.model_validate(row).batch_size)
    return ProbeResult(choose_knee(table), table, stopped_by, clock() - started)


def probe_ceiling(train_rows: int, processes: int, ceiling: int = PROBE_CEILING) -> int:
    """No larger than the ceiling, and small enough that an epoch still has a step for every process."""
    return max(1, min(ceiling, train_rows // max(processes, 1)))
