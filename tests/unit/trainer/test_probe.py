"""batchSizePerWorker: auto: the knee choice, the doubling probe, and backing off at out-of-memory."""

from __future__ import annotations

import pytest

from scalingrun_trainer.core.probe import (
    ProbeError, ProbeResult, candidate_sizes, choose_knee, probe_ceiling, run_probe,
)
from scalingrun_trainer.frameworks.keras.probe import is_out_of_memory, keras_measure


def rows(*pairs):
    return [{"batchSize": b, "imagesPerSecond": r} for b, r in pairs]


@pytest.mark.parametrize("table,knee", [
    (rows((8, 100), (16, 180), (32, 290), (64, 310), (128, 312)), 64),   # 310 >= 0.95 x 312; 290 is not
    (rows((8, 100), (16, 200), (32, 400)), 32),                           # still growing: the largest
    (rows((8, 500), (16, 480), (32, 300)), 8),                            # the smallest is already the best
    (rows((8, 96), (16, 100)), 8),                                        # within 5 %: the smaller wins
    (rows((8, 100), (16, 200)) + [{"batchSize": 32, "outOfMemory": True}], 16),
])
def test_the_knee_is_the_smallest_size_within_5_percent_of_the_best(table, knee):
    assert choose_knee(table) == knee


def test_no_measured_size_is_an_error():
    with pytest.raises(ValueError, match="no batch size"):
        choose_knee([{"batchSize": 8, "outOfMemory": True}])


def test_sizes_double_up_to_the_ceiling():
    assert candidate_sizes(8, 512) == [8, 16, 32, 64, 128, 256, 512]
    assert candidate_sizes(8, 100) == [8, 16, 32, 64]
    assert candidate_sizes(8, 5) == [5]
    assert probe_ceiling(train_rows=192, processes=2) == 96 and probe_ceiling(10_000_000, 1) == 512


class FakeOOM(Exception):
    pass


def fake_device(oom_at: int, rates: dict[int, float]):
    tried = []

    def measure(size):
        tried.append(size)
        if size >= oom_at:
            raise FakeOOM(f"OOM at {size}")
        return rates[size]
    return measure, tried


def test_the_probe_stops_at_out_of_memory_and_picks_below_it():
    measure, tried = fake_device(64, {8: 100.0, 16: 190.0, 32: 200.0})
    result = run_probe(measure, candidate_sizes(8, 512), lambda e: isinstance(e, FakeOOM))
    assert tried == [8, 16, 32, 64]  # nothing larger after the OOM
    assert result.stopped_by == "outOfMemory" and result.chosen == 16
    assert result.table[-1] == {"batchSize": 64, "outOfMemory": True}
    assert "64: OOM" in result.describe() and "chose 16" in result.describe()
    # What a checkpoint keeps, so that a resumed training keeps the size.
    assert ProbeResult.from_document(result.document()) == ProbeResult(16, result.table, "outOfMemory",
                                                                       round(result.seconds, 2))


def test_an_oom_at_the_first_size_backs_off_by_halving():
    measure, tried = fake_device(4, {1: 10.0, 2: 18.0})
    result = run_probe(measure, [8, 16], lambda e: isinstance(e, FakeOOM))
    assert tried == [8, 4, 2] and result.chosen == 2
    assert [r["batchSize"] for r in result.table] == [2, 4, 8]


def test_nothing_fits_is_a_clear_error_and_other_errors_propagate():
    measure, _ = fake_device(1, {})
    with pytest.raises(ProbeError, match="even batch size 1 ran out of memory.*spec.workers.memory"):
        run_probe(measure, [2], lambda e: isinstance(e, FakeOOM))

    def broken(size):
        raise ValueError("not a memory problem")
    with pytest.raises(ValueError, match="not a memory problem"):
        run_probe(broken, [8], lambda e: isinstance(e, FakeOOM))


def test_a_real_keras_probe_backs_off_from_an_injected_resource_exhausted_error():
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.Input((8, 8, 3), dtype="uint8"), tf.keras.layers.Rescaling(1 / 255),
                                 tf.keras.layers.Flatten(), tf.keras.layers.Dense(4, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    result = run_probe(keras_measure(model, 8, 4, oom_at=32), candidate_sizes(8, 512), is_out_of_memory)
    assert [r["batchSize"] for r in result.table] == [8, 16, 32]
    assert result.table[-1]["outOfMemory"] and all(r["imagesPerSecond"] > 0 for r in result.table[:2])
    assert result.chosen in (8, 16) and result.stopped_by == "outOfMemory" and result.seconds > 0
    assert is_out_of_memory(tf.errors.ResourceExhaustedError(None, None, "OOM")) and not is_out_of_memory(ValueError())
