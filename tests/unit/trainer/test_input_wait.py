"""The input-wait share: step sums, the stamp in a real tf.data pipeline, GPU index mapping, the progress history."""

from __future__ import annotations

import json
import time

import pytest

from scalingrun_trainer.core.input_wait import (
    READER_DELAY_ENV, GpuSampler, StepTimes, input_entry, physical_gpu_index, reader_delay,
)
from scalingrun_trainer.core.progress import ProgressWriter
from scalingrun_trainer.frameworks.keras.input_clock import InputClock, delay_batches
from scalingrun_trainer.storage import open_location


def test_the_share_is_waiting_time_over_step_time():
    times = StepTimes()
    times.add(begin=0.0, arrival=0.3, end=1.0)   # waited 0.3 of 1.0
    times.add(begin=1.0, arrival=1.0, end=1.5)   # the batch was ready
    times.add(begin=2.0, arrival=1.9, end=2.5)   # a stamp from before this step: not this step's batch
    times.add(begin=3.0, arrival=None, end=3.5)
    assert times.steps == 2 and times.fraction() == pytest.approx(0.3 / 1.5)
    assert StepTimes().fraction() is None


def test_the_stamp_is_taken_when_the_consumer_takes_the_batch_not_when_it_is_made():
    import tensorflow as tf

    clock = InputClock()
    data = tf.data.Dataset.from_tensor_slices((tf.zeros((4, 2, 2, 3), tf.uint8), tf.zeros((4,), tf.int32)))
    data = clock.attach(data.batch(1).prefetch(4))
    iterator = iter(data)
    next(iterator)
    time.sleep(0.3)  # the prefetch has the next batches ready by now
    asked = time.perf_counter()
    next(iterator)
    assert clock.last >= asked


def test_a_delayed_reader_is_slow_on_purpose(monkeypatch):
    import tensorflow as tf

    data = tf.data.Dataset.from_tensor_slices((tf.zeros((3, 2), tf.uint8), tf.zeros((3,), tf.int32))).batch(1)
    started = time.perf_counter()
    assert len(list(delay_batches(data, 0.1))) == 3
    assert time.perf_counter() - started >= 0.3
    monkeypatch.setenv(READER_DELAY_ENV, "0.25")
    assert reader_delay() == 0.25
    monkeypatch.setenv(READER_DELAY_ENV, "slow")
    with pytest.raises(ValueError, match=f"{READER_DELAY_ENV} must be a number of seconds"):
        reader_delay()
    monkeypatch.delenv(READER_DELAY_ENV)
    assert reader_delay() == 0.0


@pytest.mark.parametrize("local_rank,count,visible,index", [
    (0, 4, None, 0), (5, 4, None, 1), (1, 8, "6,7", 7), (2, 8, "6,7", 6), (0, 2, "GPU-uuid", 0),
])
def test_the_gpu_nvml_reads_is_the_one_the_rank_was_pinned_to(local_rank, count, visible, index):
    assert physical_gpu_index(local_rank, count, visible) == index


def test_progress_keeps_a_short_input_history_and_the_probe(tmp_path):
    probe = {"chosen": 16, "seconds": 3.2, "stoppedBy": "outOfMemory",
             "table": [{"batchSize": 8, "imagesPerSecond": 90.0}, {"batchSize": 16, "imagesPerSecond": 170.0},
                       {"batchSize": 32, "outOfMemory": True}]}
    progress = ProgressWriter(open_location(str(tmp_path / "progress.json")), max_epochs=20, processes=2,
                              learning_rate=0.001, effective_batch_size=32, batch_size_per_worker=16,
                              batch_size_probe=probe)
    progress.start()
    for epoch in range(1, 13):
        progress.epoch(epoch, {"loss": 1.0}, 100.0, 1, {"loss": 1.0},
                       input_figures=input_entry(epoch, 0.41234, 55.55 if epoch > 6 else None))
    document = json.loads((tmp_path / "progress.json").read_text())
    assert document["batchSizePerWorker"] == 16 and document["batchSizeProbe"] == probe
    assert [e["epoch"] for e in document["inputHistory"]] == list(range(3, 13))  # the last 10
    assert document["inputHistory"][0] == {"epoch": 3, "inputWaitFraction": 0.4123}
    assert document["inputWaitFraction"] == 0.4123 and document["gpuUtilization"] == 55.5
    # The metrics history stays metrics only (a resume reads metrics from it).
    assert document["history"][-1] == {"epoch": 12, "loss": 1.0, "imagesPerSecond": 100.0}


def test_the_gpu_figure_exists_exactly_where_nvml_finds_a_gpu():
    import pynvml  # the pinned nvidia-ml-py

    try:
        pynvml.nvmlInit()
        gpus = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError:  # no driver (CPU machines): no figure, no error
        gpus = 0
    sampler = GpuSampler.open(0)
    if not gpus:
        assert sampler is None
        return
    sampler.interval = 0.05
    sampler.start()
    time.sleep(0.2)
    assert 0 <= sampler.stop() <= 100
