"""An elastic run (spec.workers.minReplicas) in decide: lost workers unplaced past resizeAfter shrink the run, in two
looks (the intent in status, then the MPIJob deleted), to a new MPIJob at the placeable size; never under the minimum;
every resize recorded with its cause and cost. A restart between any two looks duplicates and loses nothing."""

from __future__ import annotations

import copy
import datetime as dt

import pytest

from scalingrun_api.models import ElasticStatus, SchedulingPolicy, TrainingStatus
from scalingrun_operator.builders import build_mpijob
from scalingrun_operator.decide import elastic, pinning, time_at_size
from scalingrun_operator.decide.snapshot import Create
from scalingrun_operator.decide.status import rfc3339
from tests.support.decide_elastic import (
    NO_ROOM, PROBES, after, elastic_mpijob, elastic_run, launcher, no_resize, placed, shrunk, worker, world,
)
from tests.support.decide_world import NOW, NS, actions, conditions, done, stamp


def test_lost_workers_within_the_bound_wait_and_say_when_the_run_shrinks():
    decision = world(minutes_ago=0.5).decide()
    assert placed(decision)[:2] == ("False", "WaitingToShrink")
    assert "2 of 4 workers unplaced since" in placed(decision)[2] and "resumes with the 2" in placed(decision)[2]
    assert NO_ROOM in placed(decision)[2]
    assert decision.recheck_in is not None and decision.recheck_in <= 32  # the bound at the latest
    assert actions(decision) == [] and no_resize(decision)


def test_past_the_bound_the_intent_is_written_first_and_nothing_is_deleted():
    found = world(minutes_ago=2)
    decision = found.decide()
    assert actions(decision) == [] and decision.again
    elastic = decision.desired["training"]["elastic"]
    assert elastic["workers"] == 2
    assert {k: elastic["resizing"][k] for k in ("from", "to", "lostAt")} == {"from": 4, "to": 2, "lostAt": stamp(2)}
    assert elastic["resizing"]["cause"].startswith("workersUnplaced: 2 unplaced for 120 s")
    assert placed(decision)[:2] == ("False", "Resizing")
    assert "Shrinking" in [e.reason for e in decision.events]
    assert found.decide() == decision  # the same look twice decides the same


def test_a_shrink_runs_to_a_new_mpijob_at_the_placeable_size_counting_no_interruption():
    found = world(minutes_ago=2)
    restarts_before = found.status["training"]["restarts"]
    intent = found.decide()
    deleting = after(found, intent).decide()
    assert actions(deleting) == [("delete", "demo-train")] and deleting.again
    assert deleting.desired["training"]["mpiJobUid"] is None
    # A restart of the operator here: the same look decides the same delete (by uid: the API refuses a second one).
    assert after(copy.deepcopy(found), intent).decide().actions == deleting.actions
    gone = after(found, deleting).decide()
    assert [a for a in actions(gone) if a[1] == "MPIJob"] == [("create", "MPIJob")]
    assert "ChildDeleted" not in conditions(gone) and gone.desired["training"]["restarts"] == restarts_before
    created = [a.obj for a in gone.actions if isinstance(a, Create) and a.obj["kind"] == "MPIJob"][0]
    assert created["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    assert "-np 2 " in created["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0][
        "command"][-1]
    assert gone.desired["training"]["processes"] == 2
    found = after(found, gone)
    waiting = found.decide()
    assert placed(waiting)[:2] == ("False", "Resizing") and waiting.desired["training"]["elastic"]["resizing"]
    found.children["MPIJob"]["status"] = {"conditions": [done("Running")]}
    found.pods = [launcher("mpi-2"), worker(0, mpijob_uid="mpi-2"), worker(1, mpijob_uid="mpi-2")]
    trained = found.decide()
    elastic = trained.desired["training"]["elastic"]
    assert "resizing" not in elastic and elastic["workers"] == 2
    assert trained.status["training"]["elastic"]["resizing"] is None  # null: the merge patch deletes it there
    [resize] = elastic["resizes"]
    assert (resize["from"], resize["to"], resize["costSeconds"], resize["trainingAt"]) == (
        4, 2, 120, NOW.strftime("%Y-%m-%dT%H:%M:%SZ"))
    assert placed(trained)[:2] == ("False", "CapacityProbesOff")  # this look's operator makes no probes
    assert "training with 2 of 4 workers" in placed(trained)[2]
    assert "Resized" in [e.reason for e in trained.events]
    steady = after(found, trained).decide()
    assert steady.status is None and steady.actions == () and steady.events == ()


def test_a_lost_worker_still_going_away_or_not_yet_replaced_is_not_kept_by_the_shrink():
    """Two workers lost: worker 3's replacement waits unplaced past the bound while worker 2's pod is still in its
    grace period (the MPI operator makes a replacement once the old pod is gone), or is gone with no replacement
    yet. The run shrinks to the 2 workers a node runs, not to the MPIJob's 4 less the 1 unplaced (4 -> 3: seen on
    the node cluster, tests/e2e/test_elastic.py)."""
    for lost in ("terminating", "gone"):
        found = world(unplaced=1, minutes_ago=2)  # workers 0-2 placed, 3 unplaced
        worker_2 = next(p for p in found.pods if p["metadata"]["name"] == "demo-train-worker-2")
        if lost == "terminating":
            worker_2["metadata"]["deletionTimestamp"] = stamp(2)
        else:
            found.pods.remove(worker_2)
        assert [n for n, _, _ in elastic.unplaced_workers(found.pods, found.children["MPIJob"])] == [
            "demo-train-worker-3"]
        assert elastic.placed_workers(found.pods, found.children["MPIJob"]) == 2
        resizing = found.decide().desired["training"]["elastic"]["resizing"]
        assert (resizing["from"], resizing["to"]) == (4, 2), (lost, resizing)


def test_a_resize_whose_new_workers_cannot_all_be_placed_shrinks_again_from_where_it_began():
    """4 -> 3 decided, and the MPIJob at 3 made; capacity went again, so its worker 2 waits unplaced past the bound
    (its launcher waits for every worker: the resize would never end). The run shrinks to the 2 placed, recorded
    as one resize from 4 since the first loss."""
    found = world(unplaced=1, minutes_ago=2)
    intent = found.decide()
    assert intent.desired["training"]["elastic"]["resizing"]["to"] == 3
    deleting = after(found, intent).decide()
    found = after(found, after(found, deleting).decide())
    assert found.children["MPIJob"]["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 3
    found.pods = [worker(0, mpijob_uid="mpi-2"), worker(1, mpijob_uid="mpi-2"),
                  worker(2, placed=False, minutes_ago=0.5, mpijob_uid="mpi-2")]
    assert placed(found.decide())[:2] == ("False", "Resizing")  # within the bound: the resize goes on
    found.pods[-1] = worker(2, placed=False, minutes_ago=1.5, mpijob_uid="mpi-2")
    again = found.decide()
    elastic_status = again.desired["training"]["elastic"]
    assert elastic_status["workers"] == 2
    assert {k: elastic_status["resizing"][k] for k in ("from", "to", "lostAt")} == {"from": 4, "to": 2,
                                                                                  "lostAt": stamp(2)}
    assert actions(after(found, again).decide()) == [("delete", "demo-train")]


def test_below_the_minimum_the_run_waits_and_says_so_once():
    found = world(unplaced=3, minutes_ago=5)
    decision = found.decide()
    assert placed(decision)[:2] == ("False", "BelowMinReplicas")
    assert "only 1 of 4 workers can be placed" in placed(decision)[2] and "minReplicas 2" in placed(decision)[2]
    assert "BelowMinReplicas" in [e.reason for e in decision.events]
    assert actions(decision) == [] and no_resize(decision)
    assert "BelowMinReplicas" not in [e.reason for e in after(found, decision).decide().events]


def test_all_placed_says_so_and_a_run_without_min_replicas_never_resizes():
    assert placed(world(unplaced=0).decide())[:2] == ("True", "AllPlaced")
    fixed = world(minutes_ago=30, spec_workers={"minReplicas": None, "resizeAfter": None})
    fixed.spec["workers"] = {"replicas": 4, "gpusPerWorker": 0}
    fixed.status[pinning.PINNED_FIELD] = pinning.pin(fixed.spec)
    decision = fixed.decide()
    assert "WorkersPlaced" not in conditions(decision) and actions(decision) == []


def test_pods_of_an_earlier_mpijob_are_not_counted_as_unplaced():
    found = world(unplaced=0)
    found.pods.append(worker(7, placed=False, minutes_ago=30, mpijob_uid="mpi-0"))
    assert placed(found.decide())[:2] == ("True", "AllPlaced")


def test_the_resize_is_measured_from_the_first_unplaced_pod():
    found = world(minutes_ago=2)
    found.pods[-1]["metadata"]["creationTimestamp"] = (NOW - dt.timedelta(minutes=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert found.decide().desired["training"]["elastic"]["resizing"]["lostAt"] == stamp(3)


# --- growing back: capacity probes, then a resize at the next epoch boundary ------------------------------------

def test_a_shrunk_run_keeps_a_lowest_priority_probe_per_missing_worker():
    decision = shrunk(probes=0).decide(PROBES)
    made = [a.obj for a in decision.actions if isinstance(a, Create)]
    assert [p["metadata"]["name"] for p in made] == ["demo-capacity-0", "demo-capacity-1"]
    probe = made[0]["spec"]
    assert probe["priorityClassName"] == "scalingrun-capacity-probe" and probe["containers"][0]["command"][0] == "sleep"
    run, _ = elastic_run()
    worker_spec = build_mpijob(run, NS)["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert probe["containers"][0]["resources"] == worker_spec["containers"][0]["resources"]
    assert probe["tolerations"] == worker_spec["tolerations"]
    assert placed(decision)[:2] == ("False", "Shrunk")
    assert shrunk(probes=2).decide(PROBES).actions == ()  # made once
    assert [a for a in shrunk(probes=0).decide().actions if isinstance(a, Create)] == []  # probes off: none


def test_placed_probes_make_the_run_grow_only_once_an_epoch_has_ended():
    found = shrunk(epoch=2, probes_placed=1)
    seen = found.decide(PROBES)
    assert placed(seen)[:2] == ("False", "GrowingAtEpoch") and "grows to 3 of 4 workers when epoch 3 ends" in placed(
        seen)[2]
    assert seen.desired["training"]["elastic"]["capacity"] == {"workers": 3, "seenAt": stamp(0), "seenAtEpoch": 2}
    assert actions(seen) == [] and not seen.again
    found = after(found, seen)
    assert found.decide(PROBES).status is None  # the same epoch: nothing changes
    found.progress = {**found.progress, "epoch": 3}
    grow = found.decide(PROBES)
    elastic = grow.desired["training"]["elastic"]
    assert elastic["workers"] == 3 and "capacity" not in elastic and grow.again
    assert grow.status["training"]["elastic"]["capacity"] is None
    assert (elastic["resizing"]["from"], elastic["resizing"]["to"]) == (2, 3)
    assert elastic["resizing"]["cause"].startswith("capacityReturned: demo-capacity-0 placed since")
    assert "Growing" in [e.reason for e in grow.events]
    deleting = after(found, grow).decide(PROBES)
    assert actions(deleting) == [("delete", "demo-train"), ("delete", "demo-capacity-0"), ("delete", "demo-capacity-1")]


def test_probes_go_when_the_mpijob_ends():
    found = shrunk(probes_placed=1)
    found.children["MPIJob"]["status"] = {"conditions": [done("Succeeded")], "completionTime": stamp(1)}
    found.progress = {**found.progress, "state": "succeeded"}
    assert [a for a in actions(found.decide(PROBES)) if "capacity" in a[1]] == [
        ("delete", "demo-capacity-0"), ("delete", "demo-capacity-1")]


def test_a_shrunk_run_that_fails_while_its_mpijob_still_runs_deletes_its_probes():
    found = shrunk(probes=2, probes_placed=1)
    launcher_pod = found.pods[0]
    launcher_pod["status"]["startTime"] = stamp(30)
    launcher_pod["status"].setdefault("containerStatuses", [{"name": "launcher"}])[0]["state"] = {
        "running": {"startedAt": stamp(30)}}
    # Silent for 11 minutes with onStall fail: the run fails and its MPIJob is only suspended, not ended.
    found.heartbeat = {"phase": "training", "epoch": 2, "step": 120, "rank": 0, "longestGapSeconds": 0.0,
                       "time": (NOW - dt.timedelta(minutes=11)).timestamp(),
                       "attemptStarted": (NOW - dt.timedelta(minutes=30)).timestamp()}
    found.spec["training"]["onStall"] = "fail"
    found.status[pinning.PINNED_FIELD] = pinning.pin(found.spec)
    failed = found.decide(PROBES)
    assert failed.phase == "Failed" and conditions(failed)["Failed"][1] == "TrainingStalled"
    assert actions(failed) == [("patch", "MPIJob"), ("delete", "demo-capacity-0"), ("delete", "demo-capacity-1")]


# --- the time at each size: status.training.elastic.sizes, counting, startedAt --------------------------------

def seconds_by_size(elastic: dict) -> dict[int, int]:
    return {entry["workers"]: entry["seconds"] for entry in elastic.get("sizes") or []}


def at(minutes_after_now: float) -> dt.datetime:
    return NOW + dt.timedelta(minutes=minutes_after_now)


def test_the_time_at_each_size_follows_a_shrink_to_the_end_and_agrees_with_the_step_plot():
    started, trained_again, ended = at(-40), at(1), at(31)
    found = world(unplaced=0)
    first = found.decide(now=started)
    assert first.desired["training"]["elastic"]["counting"] == {"workers": 4, "since": rfc3339(started)}
    found = after(found, first)
    assert found.decide(now=at(-20)).status is None  # a look at the same size writes nothing
    found.pods = [launcher()] + [worker(i, placed=i < 2, minutes_ago=2) for i in range(4)]
    for _ in range(3):  # the intent, the deletion, the MPIJob made again at 2
        found = after(found, found.decide())
    found.children["MPIJob"]["status"] = {"conditions": [done("Running")]}
    found.pods = [launcher("mpi-2"), worker(0, mpijob_uid="mpi-2"), worker(1, mpijob_uid="mpi-2")]
    resized = found.decide(now=trained_again)
    status = resized.desired["training"]["elastic"]
    assert seconds_by_size(status) == {4: (trained_again - started).total_seconds()}
    assert status["counting"] == {"workers": 2, "since": status["resizes"][-1]["trainingAt"]}
    found = after(found, resized)
    found.children["MPIJob"]["status"] = {"conditions": [done("Succeeded")], "completionTime": rfc3339(ended)}
    found.progress = {**found.progress, "state": "succeeded"}
    finished = found.decide(now=at(35))  # seen after the MPIJob's end: counted to its completionTime
    status = finished.desired["training"]["elastic"]
    assert "counting" not in status and finished.status["training"]["elastic"]["counting"] is None  # null: deleted
    assert seconds_by_size(status) == {4: (trained_again - started).total_seconds(),
                                       2: (ended - trained_again).total_seconds()}
    assert sum(seconds_by_size(status).values()) == (ended - started).total_seconds()
    for entry in status["sizes"]:
        assert entry["workerHours"] == round(entry["workers"] * entry["seconds"] / 3600, 4)
        assert "gpuHours" not in entry  # gpusPerWorker 0: CPU workers
    steps = time_at_size.worker_steps(ElasticStatus.model_validate(status), ended)
    from_steps: dict[int, float] = {}
    for (moment, workers), (following, _) in zip(steps, steps[1:]):
        from_steps[workers] = from_steps.get(workers, 0) + (following - moment).total_seconds()
    assert from_steps == seconds_by_size(status)  # the report's step plot and the hours say the same
    # A restart of the operator: the same look on the status as written adds nothing more, however late.
    again = after(copy.deepcopy(found), finished).decide(now=at(90))
    assert seconds_by_size((again.desired["training"].get("elastic") or {})) == seconds_by_size(status)


def test_a_suspended_mpijob_counts_at_no_size():
    found = world(unplaced=0)
    found = after(found, found.decide(now=at(-60)))
    found.children["MPIJob"]["spec"]["runPolicy"]["suspend"] = True
    found.children["MPIJob"]["status"] = {"conditions": [done("Suspended")]}
    paused = found.decide(now=at(-45))
    status = paused.desired["training"]["elastic"]
    assert "counting" not in status and seconds_by_size(status) == {4: 15 * 60}
    found = after(found, paused)
    found.children["MPIJob"]["spec"]["runPolicy"]["suspend"] = False
    found.children["MPIJob"]["status"] = {"conditions": [done("Running")]}
    resumed = found.decide(now=at(-5)).desired["training"]["elastic"]
    assert resumed["counting"] == {"workers": 4, "since": rfc3339(at(-5))}
    assert seconds_by_size(resumed) == {4: 15 * 60} and resumed["startedAt"] == rfc3339(at(-60))
    shown = time_at_size.time_at_sizes(ElasticStatus.model_validate(resumed), 2, at(0))  # the running size's time
    assert [(size.workers, size.seconds) for size in shown] == [(4, 20 * 60)]  # added, to the reader's now
    assert shown[0].gpu_hours == round(4 * 2 * shown[0].seconds / 3600, 4)  # workers x GPUs each x time


def test_time_before_the_count_began_is_never_counted_and_a_fixed_run_has_no_clock():
    status = ElasticStatus(counting={"workers": 3, "since": rfc3339(NOW)}, sizes=[time_at_size.size_time(3, 60, 1)])
    assert time_at_size.time_at_sizes(status, 1, at(-10)) == status.sizes  # a clock behind the count adds nothing
    fixed = world(unplaced=0, spec_workers={"minReplicas": None, "resizeAfter": None})
    fixed.spec["workers"] = {"replicas": 4, "gpusPerWorker": 0}
    fixed.status[pinning.PINNED_FIELD] = pinning.pin(fixed.spec)
    assert "elastic" not in fixed.decide().desired["training"]


def test_the_count_starts_with_the_look_that_makes_the_first_mpijob_unless_it_is_made_suspended():
    found = world(unplaced=0)
    found.children.pop("MPIJob")
    found.status["training"].pop("mpiJobUid", None)
    found.pods = []
    made = found.decide(now=at(-3))
    assert [a for a in actions(made) if a[1] == "MPIJob"] == [("create", "MPIJob")]
    assert made.desired["training"]["elastic"] == {"counting": {"workers": 4, "since": rfc3339(at(-3))},
                                                   "startedAt": rfc3339(at(-3))}
    found.spec["runPolicy"] = {**found.spec.get("runPolicy", {}), "suspend": True}
    found.status[pinning.PINNED_FIELD] = pinning.pin(found.spec)
    suspended = found.decide()
    [mpijob] = [a.obj for a in suspended.actions if isinstance(a, Create) and a.obj["kind"] == "MPIJob"]
    assert mpijob["spec"]["runPolicy"]["suspend"] is True  # held by nothing yet (Kueue admits it later)
    assert "counting" not in (suspended.desired["training"].get("elastic") or {})


# --- the MPIJob at a size, and the status as the API's models type it ---------------------------------------------

def test_the_mpijob_at_fewer_workers_is_built_from_the_unchanged_spec():
    """The count is the builder's argument: Worker replicas, mpirun -np and a gang's minAvailable follow it, and the
    run's spec.workers.replicas (the most, which the trainer's global batch keeps) is left as it is."""
    run, _ = elastic_run(gpusPerWorker=2)
    run.spec.run_policy.scheduling_policy = SchedulingPolicy(min_available=5)
    full, shrunk_to = build_mpijob(run, NS), build_mpijob(run, NS, workers=2)
    assert [m["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] for m in (full, shrunk_to)] == [4, 2]
    assert [m["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"] for m in (full, shrunk_to)] == [5, 3]
    command = shrunk_to["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"][-1]
    assert "-np 4 " in command  # 2 workers x 2 GPUs each
    assert run.spec.workers.replicas == 4 and run.spec.run_policy.scheduling_policy.min_available == 5
    for count in (0, 5):
        with pytest.raises(ValueError, match=f"{count} workers"):
            build_mpijob(run, NS, workers=count)


def test_every_step_of_a_shrink_and_a_grow_writes_status_the_api_types():
    """status.training as each look leaves it is a TrainingStatus (the model the CRD's status schema is generated
    from): the elastic record is the typed ElasticStatus, with nothing outside it."""
    found = world(minutes_ago=2)
    seen = []
    for _ in range(3):  # the intent, the deletion, the MPIJob made again at 2
        decision = found.decide()
        seen.append(decision.desired["training"])
        found = after(found, decision)
    found.children["MPIJob"]["status"] = {"conditions": [done("Running")]}
    found.pods = [launcher("mpi-2"), worker(0, mpijob_uid="mpi-2"), worker(1, mpijob_uid="mpi-2")]
    seen.append(found.decide().desired["training"])
    grown = shrunk(epoch=3, probes_placed=2)
    grown.status["training"]["elastic"]["capacity"] = {"workers": 4, "seenAt": stamp(5), "seenAtEpoch": 2}
    seen.append(grown.decide(PROBES).desired["training"])
    typed = [TrainingStatus.model_validate(status).elastic for status in seen]
    assert [(e.workers, e.resizing and (e.resizing.from_, e.resizing.to)) for e in typed] == [
        (2, (4, 2)), (2, (4, 2)), (2, (4, 2)), (2, None), (4, (2, 4))]
    assert typed[3].resizes[-1].cost_seconds == 120 and typed[3].resizes[-1].decided_at is None
