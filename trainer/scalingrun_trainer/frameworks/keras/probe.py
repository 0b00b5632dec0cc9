"""batchSizePerWorker: auto under Keras (the rules: ../core/probe.py). Rank 0 alone trains a throwaway copy of the
model, outside any distribution strategy, while the other ranks wait for its choice."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Callable, Optional

from ...core.probe import (
    MAX_STEPS, MIN_SECONDS, MIN_STEPS, OOM_AT_ENV, PROBE_START, ProbeError, ProbeResult, candidate_sizes, probe_ceiling,
    run_probe,
)

if TYPE_CHECKING:
    from ...core.session import Attempt


def probe_batch_size(attempt: "Attempt", build_model: Callable[[], object], replicas: int) -> ProbeResult:
    """Rank 0 probes a compiled model from `build_model()`; every rank gets its result, or its error."""
    import tensorflow as tf

    result, error = None, None
    if attempt.rank == 0:
        oom_at = os.environ.get(OOM_AT_ENV)
        dataset = attempt.dataset
        try:
            model = build_model()
            sizes = candidate_sizes(PROBE_START, probe_ceiling(dataset.rows["train"], replicas))
            result = run_probe(keras_measure(model, dataset.image_size, attempt.classes,
                                             oom_at=int(oom_at) if oom_at else None,
                                             beat=lambda steps: attempt.heartbeat.beat("probe", step=steps)),
                               sizes, is_out_of_memory)
            attempt.log(f"scalingrun-trainer: {result.describe()}")
        except Exception as exc:  # noqa: BLE001 - every rank must hear of it, or the others wait forever
            error = f"batchSizePerWorker auto: {type(exc).__name__}: {exc}".splitlines()[0]
        finally:
            model = None
            tf.keras.backend.clear_session()  # the probe's model and its memory go before the real one
    result, error = attempt.world.broadcast((result, error), "batch_size_probe")
    if error:
        raise ProbeError(error)
    return result


def is_out_of_memory(exc: BaseException) -> bool:
    import tensorflow as tf

    if isinstance(exc, (tf.errors.ResourceExhaustedError, MemoryError)):
        return True
    # cuDNN and XLA report allocation failures as internal errors.
    text = str(exc).lower()
    return isinstance(exc, tf.errors.InternalError) and ("out of memory" in text or "alloc" in text)


def keras_measure(model, image_size: int, classes: int, oom_at: Optional[int] = None,
                  clock: Callable[[], float] = time.perf_counter,
                  beat: Callable[[int], object] = lambda steps: None) -> Callable[[int], float]:
    """images/s of `model.train_on_batch` at a batch size (a compiled, throwaway model); `beat(steps so far)` after
    every step (the heartbeat)."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    taken = 0

    def measure(batch_size: int) -> float:
        nonlocal taken
        if oom_at is not None and batch_size >= oom_at:
            raise tf.errors.ResourceExhaustedError(
                None, None, f"OOM when allocating a batch of {batch_size} ({OOM_AT_ENV}={oom_at})")
        images = rng.integers(0, 256, (batch_size, image_size, image_size, 3), dtype=np.uint8)
        labels = rng.integers(0, classes, (batch_size,), dtype=np.int32)
        model.train_on_batch(images, labels)  # warm-up: traces the step for this shape
        taken += 1
        beat(taken)
        steps, started = 0, clock()
        while steps < MIN_STEPS or (steps < MAX_STEPS and clock() - started < MIN_SECONDS):
            model.train_on_batch(images, labels)  # returns numbers: the step has finished
            steps += 1
            taken += 1
            beat(taken)
        return batch_size * steps / (clock() - started)

    return measure
