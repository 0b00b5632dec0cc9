"""Scaling rules of the trainer: effective batch, learning rate and steps per epoch."""

import math

import pytest

from scalingrun_trainer.core.scaling import scale_auto_run, scale_run, scaled_learning_rate


@pytest.mark.parametrize("rule,processes,expected", [
    ("linear", 1, 0.001), ("linear", 8, 0.008), ("sqrt", 4, 0.002), ("sqrt", 2, 0.001 * math.sqrt(2)),
    ("none", 16, 0.001),
])
def test_learning_rate_rules(rule, processes, expected):
    assert scaled_learning_rate(0.001, rule, processes) == pytest.approx(expected)


def test_unknown_rule_and_bad_process_count_are_rejected():
    with pytest.raises(ValueError, match="cubic"):
        scaled_learning_rate(0.001, "cubic", 2)
    with pytest.raises(ValueError, match="processes"):
        scaled_learning_rate(0.001, "linear", 0)


def test_steps_cover_the_training_rows_once_per_epoch():
    run = scale_run(train_rows=10_000, batch_size_per_worker=64, base_learning_rate=0.001, rule="linear", processes=4)
    assert run.effective_batch_size == 256
    assert run.steps_per_epoch == 39  # 10000 // 256
    assert run.learning_rate == pytest.approx(0.004)
    assert "effective batch 256" in run.describe()


def test_too_little_data_for_one_batch_is_a_clear_error():
    with pytest.raises(ValueError, match="fewer than one effective batch"):
        scale_run(train_rows=100, batch_size_per_worker=64, base_learning_rate=0.001, rule="linear", processes=2)


@pytest.mark.parametrize("rule,chosen,processes,expected", [
    ("linear", 32, 4, 0.004), ("linear", 128, 2, 0.008), ("linear", 8, 1, 0.00025), ("sqrt", 128, 1, 0.002),
    ("none", 256, 8, 0.001),
])
def test_auto_batch_scales_the_learning_rate_from_the_chosen_size(rule, chosen, processes, expected):
    run = scale_auto_run(train_rows=100_000, chosen_batch_size=chosen, base_learning_rate=0.001, rule=rule,
                         processes=processes)
    assert run.batch_size_per_worker == chosen and run.effective_batch_size == chosen * processes
    assert run.learning_rate == pytest.approx(expected)
    # 32 per process is the reference: the same rate as a fixed batch of 32.
    if chosen == 32:
        assert run.learning_rate == scale_run(100_000, 32, 0.001, rule, processes).learning_rate
