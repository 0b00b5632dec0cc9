"""bench/chaos.py's schedule and invariants (bench/chaos_plan.py, bench/chaos_invariants.py): the same seed gives the
same schedule, and each invariant flags a crafted bad history and passes a good one."""

from __future__ import annotations

import pytest

from bench.chaos_faults import filter_text
from bench.chaos_invariants import (
    NO_TORCH, RunRecord, Sample, SweepRecord, counted_once_under_cause, each_epoch_once,
    ends_succeeded_or_failed_by_faults, expected_counts, measure_recovery, model_and_checkpoints_stored, models_load,
    models_loaded_line, never_silent_past, nothing_left_behind, rss_under, sweeps_recommend_or_fail_by_faults,
)
from bench.chaos_pace import (
    UNMEASURED_MIN_LEFT, drain_seconds, min_left, parse_slots, run_seconds, seconds_per_epoch, slot_cycle,
)
from bench.chaos_plan import COUNTED_AS, DEFAULT_MIX, KINDS, Applied, Fault, figures, parse_mix, percentile, schedule
from bench.chaos_store import load_model

SLOTS = ["keras", "lightning", "elastic", "keras"]


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another():
    first = schedule(7, 5, 12, SLOTS, DEFAULT_MIX)
    assert first == schedule(7, 5, 12, SLOTS, DEFAULT_MIX)
    assert first != schedule(8, 5, 12, SLOTS, DEFAULT_MIX)
    assert 10 <= len(first) <= 12 and [f.at for f in first] == sorted(f.at for f in first)
    assert all(60 <= f.at < 300 for f in first)


def test_a_schedule_aims_capacity_drops_at_elastic_runs_and_spaces_each_kind():
    plan = schedule(3, 30, 60, SLOTS, DEFAULT_MIX)
    assert {f.target for f in plan if f.kind == "capacity_drop"} == {2}
    assert all(f.target is None for f in plan if f.kind in ("kubelet_restart", "operator_killed", "store_killed",
                                                            "watch_broken"))
    for kind in KINDS:
        mine = [f for f in plan if f.kind == kind]
        assert all(b.at >= a.at + a.hold for a, b in zip(mine, mine[1:])), mine
    assert {f.kind for f in plan} == set(KINDS) and all(f.at < 30 * 60 for f in plan)
    crowded = schedule(1, 2, 20, SLOTS, {"kubelet_restart": 1})  # 20 s or more each, 60 s to fit them in
    assert 2 <= len(crowded) < 20 and all(f.at < 120 for f in crowded)
    assert not [f for f in schedule(3, 30, 60, ["keras"], DEFAULT_MIX) if f.kind == "capacity_drop"]


def test_a_mix_names_known_kinds_with_integer_weights():
    assert parse_mix("worker_deleted=3, operator_killed") == {"worker_deleted": 3, "operator_killed": 1}
    for bad, said in (("reboot=1", "unknown fault kind 'reboot'"), ("worker_deleted=x", "must be an integer"),
                      ("worker_deleted=0", "no fault with a weight above 0")):
        with pytest.raises(ValueError, match=said):
            parse_mix(bad)


def test_percentiles_are_nearest_rank():
    assert percentile([], 0.5) is None
    assert percentile([5, 1, 3], 0.5) == 3 and percentile(list(range(1, 101)), 0.95) == 95


def test_figures_count_what_took_hold_and_came_back_per_kind():
    fault = Fault(60, "worker_deleted", 0)
    applied = [Applied(fault, "a", True, 100, epoch_before=4, resumed_from=3, back_after=40),
               Applied(fault, "a", True, 300, epoch_before=6, resumed_from=6, back_after=60),
               Applied(fault, None, False, 500, why_not="no worker")]
    got = figures(applied)["worker_deleted"]
    assert (got["scheduled"], got["took"], got["recovered"], got["back_p50_s"], got["back_p95_s"]) == (3, 2, 2, 40, 60)
    assert (got["redone_epochs_mean"], got["redone_epochs_max"]) == (0.5, 1)


def failed(reason: str) -> list[dict]:
    return [{"type": "Failed", "status": "True", "reason": reason, "message": "..."}]


def test_a_run_may_end_failed_only_by_faults_beyond_its_limit():
    good = [RunRecord("ok", "keras", "Succeeded"),
            RunRecord("limit", "keras", "Failed", failed("MaxInterruptionsExceeded"))]
    assert ends_succeeded_or_failed_by_faults(good) == []
    bad = [RunRecord("code", "keras", "Failed", failed("TrainingFailed")), RunRecord("stuck", "keras", "Training")]
    assert [line.split(":")[0] for line in ends_succeeded_or_failed_by_faults(bad)] == ["code", "stuck"]


def test_a_run_silent_in_training_past_the_limit_is_flagged():
    moving = RunRecord("moving", "keras", samples=[Sample(t, "Training", epoch=t // 50, heartbeat_at=t)
                                                   for t in range(0, 400, 10)])
    restarting = RunRecord("restarting", "keras", samples=[Sample(t, "Pending" if 100 < t < 300 else "Training", 1, 5)
                                                           for t in range(0, 400, 10)])
    assert never_silent_past(120)([moving, restarting]) == []
    silent = RunRecord("silent", "keras", samples=[Sample(t, "Training", 3, 50.0, "uid") for t in range(0, 400, 10)])
    assert never_silent_past(120)([silent]) == ["silent: Training with no progress for 390 s (limit 120 s) from 0"]


def test_each_epoch_once_flags_a_repeat_a_gap_and_a_short_history():
    good = [RunRecord("a", "keras", "Succeeded", epoch=3, history=[1, 2, 3]), RunRecord("b", "keras", "Failed")]
    assert each_epoch_once(good) == []
    bad = [RunRecord("twice", "keras", "Succeeded", epoch=3, history=[1, 2, 2, 3]),
           RunRecord("gap", "keras", "Failed", history=[1, 3]),
           RunRecord("short", "keras", "Succeeded", epoch=4, history=[1, 2, 3]),
           RunRecord("none", "keras", "Succeeded", epoch=4)]
    assert [line.split(":")[0] for line in each_epoch_once(bad)] == ["twice", "gap", "short", "none"]


def test_a_succeeded_run_needs_its_model_and_checkpoints():
    assert model_and_checkpoints_stored([RunRecord("a", "keras", "Succeeded", model_size=10, checkpoints=2),
                                         RunRecord("f", "keras", "Failed")]) == []
    no_model = RunRecord("a", "keras", "Succeeded", model_size=None, checkpoints=2)
    assert model_and_checkpoints_stored([no_model]) == ["a: model None bytes, 2 checkpoint files"]


def applied(kind: str, run: str, at: float, counted: int = 1) -> Applied:
    return Applied(Fault(at, kind, 0), run, True, at, counted=counted)


def test_counts_expected_per_cause_and_a_crowded_fault_may_be_absorbed():
    faults = [applied("worker_deleted", "a", 0), applied("worker_frozen", "a", 1000),
              applied("operator_killed", "a", 50),
              applied("capacity_drop", "b", 0, counted=2), applied("worker_deleted", "b", 10)]
    assert expected_counts(faults, "a", 60, None, 120) == {"podDeleted": (1, 1), "stalled": (1, 1)}
    assert expected_counts(faults, "b", 60, None, 120) == {"podDeleted": (0, 3)}
    assert expected_counts(faults, "a", 60, 1100, 120) == {"podDeleted": (1, 1), "stalled": (0, 1)}


def test_status_must_count_each_fault_once_under_its_cause():
    faults = [applied("worker_deleted", "a", 0), applied("worker_frozen", "a", 1000), applied("store_killed", None, 5)]
    check = counted_once_under_cause(faults, 60, 120)
    assert check([RunRecord("a", "keras", interruptions={"podDeleted": 1, "stalled": 1, "evicted": 0})]) == []
    assert check([RunRecord("a", "keras", interruptions={"podDeleted": 2, "stalled": 1})]) == \
        ["a: podDeleted counted 2, expected 1"]
    assert check([RunRecord("a", "keras", interruptions={"podDeleted": 1, "stalled": 1, "nodeLost": 1})]) == \
        ["a: nodeLost counted 1, expected 0"]
    # Where the samples show when a count rose, the line names the fault it followed.
    counts = [{}, {"stalled": 1}, {"stalled": 1}, {"stalled": 2}]
    other = RunRecord("b", "keras", interruptions={"stalled": 2},
                      samples=[Sample(at, "Training", interruptions=c) for at, c in zip((1, 70, 80, 1100), counts)])
    assert check([other]) == ["b: stalled counted 2, expected 0 (one seen 65 s after store_killed on the cluster; "
                              "one seen 100 s after worker_frozen on a)"]
    # With the operator's own account of the stall, from its Stalled Event.
    other.stall_events = ["12:00:05 no heartbeat for 61 s, over spec.training.stallTimeout (60: 60 s)"]
    assert check([other])[0].endswith("worker_frozen on a); the operator: 12:00:05 no heartbeat for 61 s, over "
                                      "spec.training.stallTimeout (60: 60 s)")


def test_a_store_outage_longer_than_stall_timeout_may_stall_the_runs_that_trained_into_it():
    outage = applied("store_killed", None, 100)
    outage.outage_s = 150.0  # 2 stallTimeouts and more: up to 1 + 2 stalls, each attempt waiting on the store
    check = counted_once_under_cause([outage], 60, 120)
    training = [Sample(at, "Training") for at in (95, 120, 300)]
    assert check([RunRecord("a", "keras", interruptions={"stalled": 3}, samples=training)]) == []
    assert check([RunRecord("a", "keras", interruptions={"stalled": 4}, samples=training)])[0].startswith(
        "a: stalled counted 4, expected 0..3")
    later = [Sample(at, "Training") for at in (400, 500)]  # started after the store was back: nothing allowed
    assert check([RunRecord("b", "keras", interruptions={"stalled": 1}, samples=later)])[0].startswith(
        "b: stalled counted 1, expected 0")
    outage.outage_s = 50.0  # within stallTimeout: the heartbeat outlives it
    assert check([RunRecord("a", "keras", interruptions={"stalled": 1}, samples=training)])[0].startswith(
        "a: stalled counted 1, expected 0")


def test_leftovers_and_rss_over_the_limit_are_flagged():
    assert nothing_left_behind([RunRecord("a", "keras", left_behind=[]), RunRecord("b", "keras")]) == []
    assert nothing_left_behind([RunRecord("a", "keras", left_behind=["pod a-train-worker-0"])]) == \
        ["a: left pod a-train-worker-0"]
    assert rss_under(512 * 2**20, [100 * 2**20, 200 * 2**20]) == []
    assert rss_under(512 * 2**20, [600 * 2**20]) == ["operator RSS peaked at 600 MiB, limit 512 MiB"]
    assert rss_under(512 * 2**20, []) == ["operator RSS never sampled"]


def test_time_back_is_to_the_first_training_heartbeat_of_the_new_attempt_and_the_work_redone_is_counted():
    # Launcher L1 until 130 s, then L2 restoring until 160 s, its heartbeats written a second before each read.
    run = RunRecord("a", "keras", samples=[
        Sample(t, "Training", 2 if t < 130 else 1, t - 1, "L1" if t < 130 else "L2",
               "restore" if 130 <= t < 160 else "training", None if t < 130 else 1) for t in range(0, 300, 3)])
    deleted = Applied(Fault(100, "worker_deleted", 0), "a", True, 100.0, launcher_before="L1", epoch_before=2)
    measure_recovery(deleted, [run], 3)
    assert (deleted.back_after, deleted.resumed_from, deleted.redone) == (61.0, 1, 1)
    kubelet = Applied(Fault(100, "kubelet_restart", None, 20), None, True, 100.0)
    measure_recovery(kubelet, [run], 3)
    assert kubelet.back_after == 22.0  # the first heartbeat written after the kubelet was back
    ended = RunRecord("c", "keras", samples=[Sample(t, "Succeeded", 2, 90, "L1", "training") for t in range(100, 300, 3)])
    kubelet = Applied(Fault(100, "kubelet_restart", None, 20), None, True, 100.0)
    measure_recovery(kubelet, [run, ended], 3)
    assert kubelet.back_after == 22.0  # the run that ended has nothing to come back to
    never = Applied(Fault(100, "worker_deleted", 0), "b", True, 100.0, launcher_before="L1", epoch_before=2)
    measure_recovery(never, [run, RunRecord("b", "keras", samples=[Sample(t, "Training", 2, 90, "L1", "training")
                                                                    for t in range(100, 300, 3)])], 3)
    assert never.back_after is None  # no new attempt seen: not back


def trained(name: str, kind: str, start: float, pace: float, epochs: int, phase: str = "Training",
            **fields) -> RunRecord:
    """A run sampled every second from `start`: 30 s to its first epoch, then one epoch each `pace` s."""
    samples = [Sample(start + t, "Training", None if t < 30 else min(epochs, 1 + int((t - 30) // pace)))
               for t in range(0, int(30 + pace * (epochs - 1)) + 1)]
    return RunRecord(name, kind, phase, samples=samples, **fields)


def test_pace_is_seconds_per_epoch_shown_and_a_new_run_needs_as_long_as_its_kind_took():
    slow = trained("k", "keras", 0, 12, 6)
    assert slow.samples[-1].epoch == 6 and seconds_per_epoch(slow) == 12.0
    assert seconds_per_epoch(RunRecord("new", "keras", samples=[Sample(0, "Pending")])) is None
    assert min_left([], "keras", 8, None) == UNMEASURED_MIN_LEFT and min_left([slow], "keras", 8, 45.0) == 45.0
    # Not finished: its start-up (30 s) plus 8 epochs at its pace; a lightning slot takes keras' pace until it has one.
    assert run_seconds([slow], "keras", 8) == pytest.approx(30 + 8 * seconds_per_epoch(slow))
    assert run_seconds([slow], "lightning", 8) == run_seconds([slow], "keras", 8)
    done = trained("d", "keras", 0, 12, 6, "Succeeded", ended_at=200.0)
    assert min_left([slow, done], "keras", 8, None) == 200.0
    # A sweep's point that ended: the sweep takes each of its points as long.
    point = trained("s-w1", "sweep", 0, 12, 6, "Succeeded", ended_at=150.0)
    assert run_seconds([point], "sweep", 6) == 300.0


def test_the_drain_waits_for_the_epochs_left_at_the_slowest_pace_of_their_kind():
    keras = trained("k", "keras", 0, 10, 5)  # at epoch 5 of 20
    slower = trained("k2", "keras", 0, 20, 3, "Succeeded")
    point = trained("s-w1", "sweep", 0, 10, 8, points_after=1)  # at 8 of 10, one point after it
    fresh = RunRecord("l", "lightning", samples=[Sample(0, "Pending")])
    assert (keras.samples[-1].epoch, seconds_per_epoch(keras), seconds_per_epoch(slower)) == (5, 10.0, 20.0)
    assert drain_seconds([keras], [keras, slower], 20, 180) == 15 * 20.0 + 180
    assert drain_seconds([point], [point], 10, 0) == (2 + 10) * 10.0
    # No epoch yet: all its epochs at any kind's slowest pace, after the slowest start-up seen (30 s).
    assert drain_seconds([fresh], [keras, slower, fresh], 20, 0) == 30 + 20 * 20.0
    assert drain_seconds([], [keras], 20, 180) == 180


def test_slots_cycle_with_a_sweep_from_five_and_can_be_named():
    assert slot_cycle(4) == ["keras", "lightning", "elastic", "keras"]
    assert slot_cycle(6) == ["keras", "lightning", "elastic", "keras", "sweep", "elastic"]
    assert parse_slots("keras, sweep") == ["keras", "sweep"]
    with pytest.raises(ValueError, match="comma-separated list of keras, lightning, elastic, sweep"):
        parse_slots("keras,mpi")


def test_a_succeeded_runs_model_must_load_unless_torch_is_missing():
    ok = RunRecord("a", "keras", "Succeeded", model_loaded="loaded, predicted (2, 2)")
    no_torch = RunRecord("b", "lightning", "Succeeded", model_loaded=NO_TORCH)
    broken = RunRecord("c", "keras", "Succeeded", model_error="ValueError: bad zip")
    assert models_load([ok, no_torch, RunRecord("f", "keras", "Failed")]) == []
    assert models_load([broken]) == ["c: model did not load: ValueError: bad zip"]
    assert models_loaded_line([ok, no_torch, broken]) == \
        f"a Succeeded run's model loads and predicts (1 of 3 loaded; 1 {NO_TORCH})"


def test_a_keras_model_loads_and_predicts_and_a_broken_file_does_not(tmp_path):
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.Input((32, 32, 3)), tf.keras.layers.Flatten(),
                                 tf.keras.layers.Dense(2, activation="softmax")])
    model.save(tmp_path / "model.keras")
    assert load_model(str(tmp_path / "model.keras"), "keras") == "loaded, predicted (2, 2)"
    (tmp_path / "bad.keras").write_bytes(b"not a model")
    with pytest.raises(Exception):
        load_model(str(tmp_path / "bad.keras"), "keras")
    if __import__("importlib").util.find_spec("torch") is None:
        assert load_model(str(tmp_path / "model.pt"), "pytorch-lightning") == NO_TORCH


def test_a_sweep_must_recommend_one_of_its_points_or_fail_by_faults():
    points = ["s-w1", "s-w2"]
    runs = [RunRecord("s-w1", "sweep", "Succeeded"), RunRecord("t-w1", "sweep", "Failed",
                                                               failed("MaxInterruptionsExceeded"))]
    good = [SweepRecord("s", points, "Succeeded", recommended="s-w2"),
            SweepRecord("t", ["t-w1", "t-w2"], "Failed", "point t-w1 failed")]
    assert sweeps_recommend_or_fail_by_faults(good, runs) == []
    bad = [SweepRecord("u", ["u-w1", "u-w2"], "Succeeded"),
           SweepRecord("v", ["v-w1", "v-w2"], "Failed", "point v-w1 failed"), SweepRecord("w", [], "Running")]
    code = [RunRecord("v-w1", "sweep", "Failed", failed("TrainingFailed"))]
    assert [line.split(":")[0] for line in sweeps_recommend_or_fail_by_faults(bad, code)] == ["u", "v", "w"]
    assert nothing_left_behind([SweepRecord("s", points, left_behind=["ScalingRun s-w2"])]) == \
        ["s: left ScalingRun s-w2"]


def test_a_broken_watch_counts_nothing_and_its_filter_names_each_api_server_address():
    assert COUNTED_AS["watch_broken"] is None
    assert filter_text([("10.0.0.1", 443), ("10.88.0.1", 16443)]) == \
        "( ( dst 10.0.0.1 and dport = 443 ) or ( dst 10.88.0.1 and dport = 16443 ) )".split()
