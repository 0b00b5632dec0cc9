"""InputBound and the auto batch size in status: pure decisions from the trainer's progress document."""

from __future__ import annotations

import datetime as dt

import pytest

from scalingrun_api.models import TrainingStatus
from scalingrun_operator.schema.validation import parse_scalingrun
from scalingrun_operator.decide import progress as training
from scalingrun_operator.decide.status import INPUT_BOUND, StatusUpdate, get_condition
from scalingrun_operator.documents import parse_progress

RUN = parse_scalingrun({
    "apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun", "metadata": {"name": "demo", "namespace": "ml"},
    "spec": {"dataset": {"source": "/data/raw", "output": "/data/parquet", "preprocessing": {"parallelism": 6}},
             "training": {"batchSizePerWorker": "auto", "input": {"readerWorkers": 3}}},
})


def history(*shares, start=1, gpu=None):
    return [{"epoch": start + i, "inputWaitFraction": share, **({"gpuUtilization": gpu} if gpu else {})}
            for i, share in enumerate(shares)]


@pytest.mark.parametrize("shares,status", [
    ((0.1,), "False"),
    ((0.5,), "False"),              # one epoch is not yet a pattern
    ((0.5, 0.31), "True"),
    ((0.1, 0.5, 0.6), "True"),
    ((0.5, 0.6, 0.2), "False"),     # recovered
    ((0.5, 0.30), "False"),         # exceeds: 30 % itself is not over
    ((0.9, 0.05, 0.9), "False"),
])
def test_input_bound_after_two_epochs_in_a_row_over_30_percent(shares, status):
    assert training.input_bound(RUN, history(*shares))[0] == status


def test_the_message_says_what_to_try_with_the_spec_fields_and_their_values():
    status, reason, message = training.input_bound(RUN, history(0.45, 0.52, start=3, gpu=38.0))
    assert (status, reason) == ("True", "InputWaitHigh")
    assert "45% and 52% of its step time in epochs 3 and 4" in message and "GPU 38% busy" in message
    assert "spec.training.input.readerWorkers, now 3" in message
    assert "spec.training.input.rowGroupCache, now 50" in message
    assert "spec.dataset.preprocessing.parallelism, now 6" in message
    status, reason, message = training.input_bound(RUN, history(0.45, 0.1, start=3))
    assert (status, reason) == ("False", "InputKeepsUp") and "input wait 10% of step time in epoch 4" in message


def test_no_measured_epoch_sets_no_condition_and_gaps_do_not_count_as_in_a_row():
    assert training.input_bound(RUN, None) is None
    assert training.input_bound(RUN, []) is None
    assert training.input_bound(RUN, [{"epoch": 1, "gpuUtilization": 50.0}]) is None
    assert training.input_bound(RUN, [{"epoch": 2, "inputWaitFraction": 0.9},
                                      {"epoch": 4, "inputWaitFraction": 0.9}])[0] == "False"
    assert training.input_bound(RUN, [{"epoch": "x"}, "junk", {"epoch": 1, "inputWaitFraction": "high"}]) is None


def test_condition_flips_and_keeps_its_transition_time():
    update = StatusUpdate({}, 1, dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
    update.condition(INPUT_BOUND, *training.input_bound(RUN, history(0.5, 0.6)))
    first = get_condition(update.desired["conditions"], INPUT_BOUND)
    update.condition(INPUT_BOUND, *training.input_bound(RUN, history(0.5, 0.6, 0.7)))
    again = get_condition(update.desired["conditions"], INPUT_BOUND)
    assert first["status"] == again["status"] == "True"
    assert first["lastTransitionTime"] == again["lastTransitionTime"]


def test_status_mirrors_the_probe_and_the_input_figures_and_drops_junk():
    progress = {
        "epoch": 2, "batchSizePerWorker": 16, "inputWaitFraction": 0.42, "gpuUtilization": None,
        "batchSizeProbe": {"chosen": 16, "seconds": 4.5, "stoppedBy": "outOfMemory", "table": [
            {"batchSize": 8, "imagesPerSecond": 90.5}, {"batchSize": 16, "imagesPerSecond": 170.0},
            {"batchSize": 32, "outOfMemory": True}, {"batchSize": "big"}, "junk"]},
        "inputHistory": [{"epoch": 2, "inputWaitFraction": 0.42}, {"epoch": 1, "inputWaitFraction": 0.5,
                                                                   "gpuUtilization": float("nan")}],
    }
    status = training.training_status(parse_progress(progress))
    assert status["batchSizePerWorker"] == 16 and status["inputWaitFraction"] == 0.42
    assert "gpuUtilization" not in status
    assert status["batchSizeProbe"] == {"chosen": 16, "seconds": 4.5, "stoppedBy": "outOfMemory", "table": [
        {"batchSize": 8, "imagesPerSecond": 90.5, "outOfMemory": False},
        {"batchSize": 16, "imagesPerSecond": 170.0, "outOfMemory": False},
        {"batchSize": 32, "outOfMemory": True}]}
    assert status["inputHistory"] == [{"epoch": 1, "inputWaitFraction": 0.5}, {"epoch": 2, "inputWaitFraction": 0.42}]
    # What the operator writes is what the status schema describes.
    TrainingStatus.model_validate(status)
