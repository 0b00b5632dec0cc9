"""Rank 0's progress document on a real (local) filesystem: a resumed training never shows epoch 0."""

from __future__ import annotations

import json

from scalingrun_trainer.core.progress import ProgressWriter
from scalingrun_trainer.storage import open_location

HISTORY = [
    {"epoch": 1, "loss": 0.9, "val_loss": 0.7, "imagesPerSecond": 100.0},
    {"epoch": 2, "loss": 0.6, "val_loss": 0.8, "imagesPerSecond": 120.0},
]


def writer(tmp_path, **kwargs) -> ProgressWriter:
    return ProgressWriter(open_location(str(tmp_path / "progress.json")), max_epochs=5, processes=2,
                          learning_rate=0.002, effective_batch_size=32, **kwargs)


def read(tmp_path) -> dict:
    return json.loads((tmp_path / "progress.json").read_text())


def test_a_resumed_training_starts_at_the_epoch_it_resumed_from(tmp_path):
    progress = writer(tmp_path, history=HISTORY, resumed_from_epoch=2)
    progress.start(best_epoch=1)
    first = read(tmp_path)
    assert first["state"] == "running" and first["epoch"] == 2 and first["resumedFromEpoch"] == 2
    assert first["metrics"] == {"loss": 0.6, "val_loss": 0.8} and first["imagesPerSecond"] == 120.0
    assert first["bestEpoch"] == 1 and first["bestMetrics"] == {"loss": 0.9, "val_loss": 0.7}
    assert first["history"] == HISTORY

    progress.epoch(3, {"loss": 0.5, "val_loss": 0.6}, 130.0, 3, {"loss": 0.5, "val_loss": 0.6})
    after = read(tmp_path)
    assert after["epoch"] == 3 and after["resumedFromEpoch"] == 2 and after["bestEpoch"] == 3
    assert [h["epoch"] for h in after["history"]] == [1, 2, 3]


def test_a_fresh_training_starts_at_epoch_0_and_says_it_did_not_resume(tmp_path):
    writer(tmp_path).start()
    first = read(tmp_path)
    assert first["epoch"] == 0 and first["resumedFromEpoch"] is None
    assert first["metrics"] == {} and first["imagesPerSecond"] is None and first["bestEpoch"] is None


def test_a_resumed_epoch_missing_from_history_keeps_the_epoch_without_inventing_metrics(tmp_path):
    writer(tmp_path, history=HISTORY[:1], resumed_from_epoch=2).start(best_epoch=None)
    first = read(tmp_path)
    assert first["epoch"] == 2 and first["metrics"] == {} and first["imagesPerSecond"] is None
    assert first["bestEpoch"] is None and first["bestMetrics"] == {}


def test_the_estimated_completion_follows_the_mean_epoch_time_and_holds_between_epochs():
    import datetime as dt

    from scalingrun_operator.decide.progress import estimated_completion
    from scalingrun_operator.documents import parse_progress

    now = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.timezone.utc)
    raw = {"epoch": 4, "maxEpochs": 10, "elapsedSeconds": 300.0, "resumedFromEpoch": 1}
    document = parse_progress(raw)
    shown = {"epoch": 4, "maxEpochs": 10}
    # 3 epochs timed in this attempt, 100 s each, 6 left.
    assert estimated_completion({}, shown, document, now) == "2026-11-25T12:10:00Z"
    # A later look at the same epoch keeps it (no status change without news)...
    later = now + dt.timedelta(minutes=3)
    assert estimated_completion({"epoch": 4, "estimatedCompletion": "2026-11-25T12:10:00Z"}, shown, document,
                                later) == "2026-11-25T12:10:00Z"
    # ... a new epoch recomputes it; nothing timed yet in this attempt, or no epoch shown, says nothing.
    assert estimated_completion({"epoch": 4, "estimatedCompletion": "x"}, {"epoch": 5, "maxEpochs": 10},
                                parse_progress({**raw, "epoch": 5, "elapsedSeconds": 400.0}), later) == "2026-11-25T12:11:20Z"
    assert estimated_completion({}, shown, parse_progress({**raw, "resumedFromEpoch": 4}), now) is None
    assert estimated_completion({}, {"maxEpochs": 10}, None, now) is None
