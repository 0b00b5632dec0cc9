"""core.early_stopping: the one rule both frameworks' callbacks follow (Keras' EarlyStopping plus a threshold)."""

from __future__ import annotations

from scalingrun_trainer.core.checkpoints import EarlyStoppingState
from scalingrun_trainer.core.early_stopping import EarlyStoppingRule


def run(rule: EarlyStoppingRule, values: list) -> list[tuple[bool, bool]]:
    """(improved, stop) of each epoch up to the one that stops; None: an epoch without the monitored metric."""
    verdicts = []
    for epoch, value in enumerate(values, start=1):
        verdict = rule.update(epoch, {} if value is None else {rule.monitor: value})
        verdicts.append((verdict.improved, verdict.stop))
        if verdict.stop:
            break
    return verdicts


def test_a_loss_stops_after_patience_epochs_without_improvement_by_min_delta():
    rule = EarlyStoppingRule("val_loss", patience=2, min_delta=0.1)
    # 0.95 is better than 1.0 but not by 0.1: no improvement.
    assert run(rule, [1.0, 0.95, 0.92, 0.5]) == [(True, False), (False, False), (False, True)]
    assert (rule.best, rule.best_epoch, rule.wait) == (1.0, 1, 2)


def test_an_accuracy_improves_upwards_and_an_improvement_resets_the_wait():
    rule = EarlyStoppingRule("val_accuracy", patience=2, min_delta=0.0)
    assert run(rule, [0.5, 0.4, 0.6, 0.6, 0.55]) == [
        (True, False), (False, False), (True, False), (False, False), (False, True)]
    assert (rule.best, rule.best_epoch) == (0.6, 3)


def test_patience_zero_stops_at_the_first_epoch_without_improvement_never_on_an_improvement():
    rule = EarlyStoppingRule("val_loss", patience=0, min_delta=0.0)
    assert run(rule, [1.0, 0.9, 0.95]) == [(True, False), (True, False), (False, True)]


def test_the_threshold_stops_at_or_beyond_it_even_on_an_improvement():
    loss = EarlyStoppingRule("val_loss", patience=5, min_delta=0.0, stopping_threshold=0.5)
    assert run(loss, [0.9, 0.5]) == [(True, False), (True, True)]
    accuracy = EarlyStoppingRule("val_accuracy", patience=5, min_delta=0.0, stopping_threshold=0.8)
    assert run(accuracy, [0.7, 0.81]) == [(True, False), (True, True)]


def test_an_epoch_without_the_metric_counts_for_nothing():
    rule = EarlyStoppingRule("val_loss", patience=1, min_delta=0.0)
    assert run(rule, [1.0, None, None, 1.1]) == [(True, False), (False, False), (False, False), (False, True)]


def test_the_state_survives_a_restart():
    rule = EarlyStoppingRule("val_loss", patience=3, min_delta=0.0)
    run(rule, [1.0, 1.1, 1.2])
    assert rule.state() == EarlyStoppingState(wait=2, best=1.0, best_epoch=1)
    resumed = EarlyStoppingRule("val_loss", patience=3, min_delta=0.0)
    resumed.resume_from(rule.state())
    assert resumed.update(4, {"val_loss": 1.3}).stop
    untouched = EarlyStoppingRule("val_loss", patience=3, min_delta=0.0)
    untouched.resume_from(EarlyStoppingState(wait=2, best=None, best_epoch=None))  # no epoch had the metric
    assert untouched.state() == EarlyStoppingState()
