"""The trainer's heartbeat writer on a real (local) filesystem, with a clock the test moves: what is written when,
the longest gap between beats, and a store that refuses a write."""

from __future__ import annotations

import json

from scalingrun_api.heartbeat import HEARTBEAT_INTERVAL_SECONDS, Heartbeat
from scalingrun_trainer.core.heartbeat import PHASE_CHANGE_FLOOR_SECONDS, HeartbeatWriter
from scalingrun_trainer.storage import open_location


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def writer(tmp_path, clock: Clock, **kwargs) -> HeartbeatWriter:
    return HeartbeatWriter(open_location(str(tmp_path / "heartbeat.json")), clock=clock, monotonic=clock, **kwargs)


def read(tmp_path) -> Heartbeat:
    return Heartbeat.read(json.loads((tmp_path / "heartbeat.json").read_text()))


def test_the_first_beat_is_written_then_at_most_one_per_interval(tmp_path):
    clock = Clock()
    heartbeat = writer(tmp_path, clock)
    assert heartbeat.beat("training", step=0, epoch=0)
    first = read(tmp_path)
    assert first.phase == "training" and first.time == 1000.0 and first.attempt_started == 1000.0

    for step in range(1, 30):  # a step a second: the document stays as it was until the interval has passed
        clock.now += 1
        assert not heartbeat.beat("training", step=step, epoch=0)
    assert read(tmp_path).step == 0
    clock.now = 1000.0 + HEARTBEAT_INTERVAL_SECONDS
    assert heartbeat.beat("training", step=30, epoch=0)
    written = read(tmp_path)
    assert (written.phase, written.step, written.epoch, written.time) == ("training", 30, 0, 1030.0)
    assert heartbeat.writes == 2


def test_a_phase_change_is_written_sooner_but_not_within_the_floor(tmp_path):
    clock = Clock()
    heartbeat = writer(tmp_path, clock)
    heartbeat.beat("training", step=1, epoch=0)
    clock.now += PHASE_CHANGE_FLOOR_SECONDS / 2
    assert not heartbeat.beat("validation")  # too soon after the last write
    clock.now += PHASE_CHANGE_FLOOR_SECONDS
    assert heartbeat.beat("validation")
    assert read(tmp_path).phase == "validation" and read(tmp_path).step == 1  # the step is kept
    clock.now += PHASE_CHANGE_FLOOR_SECONDS
    assert not heartbeat.beat("validation")  # the same phase waits for the interval


def test_the_longest_gap_is_between_beats_not_writes(tmp_path):
    clock = Clock()
    heartbeat = writer(tmp_path, clock)
    heartbeat.beat("starting")
    clock.now += 12.5  # a slow phase (the first graph build) between two beats, written with a later beat
    heartbeat.beat("training", step=1, epoch=0)
    for step in range(2, 40):
        clock.now += 1
        heartbeat.beat("training", step=step, epoch=0)
    assert heartbeat.longest_gap == 12.5
    assert read(tmp_path).longest_gap_seconds == 12.5


def test_a_failing_write_never_fails_training_and_is_said_once(tmp_path):
    (tmp_path / "run").write_text("a file where the run's folder should be")
    clock, lines = Clock(), []
    heartbeat = HeartbeatWriter(open_location(str(tmp_path / "run" / "heartbeat.json")), clock=clock,
                                monotonic=clock, log=lines.append)
    assert not heartbeat.beat("starting")
    clock.now += HEARTBEAT_INTERVAL_SECONDS
    assert not heartbeat.beat("training", step=5, epoch=0)  # tried again when due, still failing: not said again
    assert len(lines) == 1 and "cannot write the heartbeat" in lines[0] and "training goes on" in lines[0]
    assert heartbeat.writes == 0


def test_a_rank_without_a_location_writes_nothing_but_counts_its_gaps(tmp_path):
    clock = Clock()
    heartbeat = HeartbeatWriter(None, rank=1, clock=clock, monotonic=clock)
    heartbeat.beat("starting")
    clock.now += 7
    assert not heartbeat.beat("training", step=1, epoch=0)
    assert heartbeat.longest_gap == 7 and heartbeat.writes == 0
    assert not list(tmp_path.iterdir())


def test_a_preprocessing_shard_beats_beside_its_manifest(tmp_path):
    from scalingrun_trainer.preprocess.shards import Params, process_shard
    from scalingrun_operator.local.sample_data import fashion_mnist_jpegs

    for relative, data in fashion_mnist_jpegs(2):
        (tmp_path / "jpeg" / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "jpeg" / relative).write_bytes(data)
    summary = process_shard(Params(str(tmp_path / "jpeg"), str(tmp_path / "parquet"), image_size=8,
                                   validation_fraction=0.3, max_readers=1), 1, 2, workers=1)
    beat = Heartbeat.read(json.loads((tmp_path / "parquet" / "_heartbeat" / "shard-00001.json").read_text()))
    # The first beat (before any image) is the one written: the shard took less than the floor.
    assert beat.phase == "preprocessing" and beat.rank == 1 and beat.attempt_started is not None
    assert sum(summary["written"].values()) > 0
