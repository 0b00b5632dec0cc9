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


@pytest.mark.parametrize("spec,processes,micro,accumulation", [
    (4, 4, 32, 1), (4, 8, 32, 1), (4, 2, 32, 2), (4, 1, 32, 4), (4, 3, 21, 2), (3, 2, 24, 2), (8, 3, 28, 3),
])
def test_a_smaller_world_keeps_the_spec_effective_batch_by_accumulation(spec, processes, micro, accumulation):
    run = scale_run(100_000, 32, 0.001, "linear", processes, spec_processes=spec)
    assert (run.batch_size_per_worker, run.accumulation) == (micro, accumulation)
    full = scale_run(100_000, 32, 0.001, "linear", spec)
    asked = 32 * max(spec, processes)
    # Exact where the replicas divide the spec's count; else the largest batch within the asked one.
    assert asked - processes * accumulation < run.effective_batch_size <= asked
    if spec % processes == 0 or processes > spec:
        assert (run.effective_batch_size, run.steps_per_epoch, run.learning_rate) == (
            (full.effective_batch_size, full.steps_per_epoch, full.learning_rate) if processes <= spec else
            (asked, 100_000 // asked, pytest.approx(0.001 * processes)))
    # The learning rate follows the effective batch, not the replica count.
    assert run.learning_rate == pytest.approx(0.001 * run.effective_batch_size / 32)
    assert run.micro_steps_per_epoch == run.steps_per_epoch * accumulation


@pytest.mark.parametrize("rule", ["linear", "sqrt", "none"])
def test_every_rule_follows_the_effective_batch_when_shrunk(rule):
    shrunk = scale_run(10_000, 16, 0.01, rule, processes=1, spec_processes=4)
    full = scale_run(10_000, 16, 0.01, rule, processes=4)
    assert shrunk.learning_rate == pytest.approx(full.learning_rate)
    assert "x 4 accumulated = effective batch 64" in shrunk.describe()
    auto = scale_auto_run(10_000, 64, 0.01, rule, processes=2, spec_processes=4)
    assert auto.learning_rate == pytest.approx(scale_auto_run(10_000, 64, 0.01, rule, processes=4).learning_rate)
