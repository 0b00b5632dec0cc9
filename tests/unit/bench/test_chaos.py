"""bench/chaos.py's schedule and invariants (bench/chaos_plan.py, bench/chaos_invariants.py): the same seed gives the
same schedule, and each invariant flags a crafted bad history and passes a good one."""

from __future__ import annotations

import pytest

from bench.chaos_invariants import (
    RunRecord, Sample, counted_once_under_cause, each_epoch_once, ends_succeeded_or_failed_by_faults,
    expected_counts, measure_recovery, model_and_checkpoints_stored, never_silent_past, nothing_left_behind, rss_under,
)
from bench.chaos_plan import DEFAULT_MIX, KINDS, Applied, Fault, figures, parse_mix, percentile, schedule

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
    assert all(f.target is None for f in plan if f.kind in ("kubelet_restart", "operator_killed", "store_killed"))
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
