"""Kueue as Kueue expects: a run with runPolicy.kueueQueueName gets its MPIJob created suspended (Kueue admits it by
resuming it), Queued while Kueue holds it, and the operator changes the MPIJob's suspend only when the user changes
spec.runPolicy.suspend; a preemption (Kueue suspends an admitted MPIJob, its pods go) is no interruption."""

from __future__ import annotations

import copy
from typing import Any

from scalingrun_operator.schema.validation import parse_scalingrun
from scalingrun_operator.builders import build_mpijob, build_preprocess_job
from scalingrun_operator.decide.snapshot import Create, Patch
from tests.support.decide_world import (
    SPEC, World, actions, condition, conditions, config_map, done, job, manifest, mpijob, progress, training_status,
)
from tests.support.specs import run_document
from tests.support.decide_run import RECORDS, training_pods

QUEUE = "team-a"


def kueue_spec(**run_policy: Any) -> dict:
    spec = copy.deepcopy(SPEC)
    spec.setdefault("runPolicy", {}).update(kueueQueueName=QUEUE, **run_policy)
    return spec


def held(*conds: dict, suspend: bool = True) -> dict:
    obj = mpijob(*conds, suspend=suspend)
    obj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = QUEUE
    return obj


def kueue_world(mpijob_obj: dict, status: dict, pods: list, spec: dict, **changes: Any) -> World:
    return World(status=status, pods=pods, spec=spec, pinned=False, manifest=manifest(), progress=progress(),
                 children={"ConfigMap": config_map(), "Job": job(done("Complete"), succeeded=2), "MPIJob": mpijob_obj},
                 **changes)


def test_the_mpijob_of_a_queued_run_is_created_suspended_with_the_queue_label():
    run = parse_scalingrun(run_document(runPolicy={"kueueQueueName": QUEUE}))
    built = build_mpijob(run, "ns")
    assert built["spec"]["runPolicy"]["suspend"] is True
    assert built["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == QUEUE
    assert build_mpijob(parse_scalingrun(run_document()), "ns")["spec"]["runPolicy"]["suspend"] is False


def test_created_suspended_it_is_queued_waiting_for_admission():
    world = World(spec=kueue_spec(), pinned=False, manifest=manifest())
    decision = world.decide()
    assert actions(decision) == [("create", "ConfigMap"), ("create", "MPIJob")]
    created = [a.obj for a in decision.actions if isinstance(a, Create) and a.obj["kind"] == "MPIJob"][0]
    assert created["spec"]["runPolicy"]["suspend"] is True
    assert decision.phase == "Queued"
    assert conditions(decision)["Queued"][:2] == ("True", "WaitingForAdmission")
    assert f"LocalQueue {QUEUE}" in conditions(decision)["Queued"][2]
    assert decision.desired["training"]["suspendApplied"] is False


def test_the_operator_leaves_a_job_kueue_holds_suspended():
    status = training_status(pods=[], suspendApplied=False)
    status["phase"] = "Queued"
    decision = kueue_world(held(done("Suspended")), status, [], kueue_spec()).decide()
    assert not [a for a in decision.actions if isinstance(a, Patch)], "the operator must not un-suspend it"
    assert decision.phase == "Queued"


def test_admitted_it_trains_and_says_so():
    status = training_status(condition("Queued", "True", "WaitingForAdmission", "held"), pods=copy.deepcopy(RECORDS),
                             suspendApplied=False)
    decision = kueue_world(held(done("Running"), suspend=False), status, training_pods(), kueue_spec()).decide()
    assert actions(decision) == []
    assert decision.phase == "Training"
    assert conditions(decision)["Queued"][:2] == ("False", "Admitted")


def test_preempted_is_queued_again_and_no_interruption():
    status = training_status(pods=copy.deepcopy(RECORDS), suspendApplied=False)
    decision = kueue_world(held(done("Suspended")), status, [], kueue_spec()).decide()
    assert actions(decision) == []
    assert decision.phase == "Queued"
    assert conditions(decision)["Queued"][:2] == ("True", "Preempted")
    assert decision.desired["training"]["restarts"] == 0
    assert "WorkerPodLost" not in [e.reason for e in decision.events]


def test_the_users_own_suspend_still_applies_once():
    status = training_status(pods=copy.deepcopy(RECORDS), suspendApplied=False)
    decision = kueue_world(held(done("Running"), suspend=False), status, training_pods(),
                           kueue_spec(suspend=True)).decide()
    patches = [a for a in decision.actions if isinstance(a, Patch)]
    assert [p.patch for p in patches] == [{"spec": {"runPolicy": {"suspend": True}}}]
    assert decision.phase == "Suspended" and decision.desired["training"]["suspendApplied"] is True
    # Applied: the next look leaves the MPIJob to Kueue again, suspended or not.
    status = copy.deepcopy(dict(decision.desired))
    again = kueue_world(held(done("Running"), suspend=False), status, training_pods(), kueue_spec(suspend=True))
    assert not [a for a in again.decide().actions if isinstance(a, Patch)]


def test_the_users_resume_never_unsuspends_what_kueue_holds():
    """suspend true then false: the operator suspended the MPIJob once; setting it back to false leaves the MPIJob
    suspended for Kueue to resume on admission (a `suspend: false` from the operator would start unadmitted pods)."""
    status = training_status(condition("Suspended", "True", "Suspended", "by the user"), pods=[],
                             suspendApplied=True)
    status["phase"] = "Suspended"
    decision = kueue_world(held(done("Suspended")), status, [], kueue_spec(suspend=False)).decide()
    assert not [a for a in decision.actions if isinstance(a, Patch)], "the operator must not resume it"
    assert decision.phase == "Queued"
    assert conditions(decision)["Queued"][:2] == ("True", "WaitingForAdmission")
    assert conditions(decision)["Suspended"][:2] == ("False", "ReturnedToQueue")
    assert decision.desired["training"]["suspendApplied"] is False
    # However many looks follow, none writes suspend: false.
    again = kueue_world(held(done("Suspended")), dict(decision.desired), [], kueue_spec(suspend=False)).decide()
    assert not [a for a in again.actions if isinstance(a, Patch)]


def test_without_kueue_the_users_resume_is_applied():
    status = training_status(condition("Suspended", "True", "Suspended", "by the user"), pods=[],
                             suspendApplied=True)
    spec = copy.deepcopy(SPEC)
    obj = mpijob(done("Suspended"), suspend=True)
    decision = kueue_world(obj, status, [], spec).decide()
    assert [a.patch for a in decision.actions if isinstance(a, Patch)] == [{"spec": {"runPolicy": {"suspend": False}}}]


def test_the_preprocessing_job_is_queued_too_created_suspended_with_the_queue_label():
    run = parse_scalingrun(run_document(runPolicy={"kueueQueueName": QUEUE}))
    built = build_preprocess_job(run, "ns")
    assert built["spec"]["suspend"] is True
    assert built["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == QUEUE
    assert "kueue.x-k8s.io/queue-name" not in built["spec"]["template"]["metadata"]["labels"], "Kueue admits the job"
    plain = build_preprocess_job(parse_scalingrun(run_document()), "ns")
    assert "suspend" not in plain["spec"] and "kueue.x-k8s.io/queue-name" not in plain["metadata"]["labels"]


def test_a_preprocessing_job_kueue_holds_is_queued_and_left_suspended():
    world = World(spec=kueue_spec(), pinned=False, manifest=None)
    decision = world.decide()
    created = [a.obj for a in decision.actions if isinstance(a, Create) and a.obj["kind"] == "Job"]
    assert created and created[0]["spec"]["suspend"] is True
    assert decision.phase == "Queued"
    assert conditions(decision)["Queued"][:2] == ("True", "WaitingForAdmission")
    assert conditions(decision)["Preprocessed"][:2] == ("Unknown", "Queued")
    # The next look at the held Job patches nothing: only Kueue resumes it.
    held_job = job()
    held_job["spec"]["suspend"] = True
    again = World(spec=kueue_spec(), pinned=False, manifest=None, status=dict(decision.desired),
                  children={"ConfigMap": config_map(), "Job": held_job}).decide()
    assert not [a for a in again.actions if isinstance(a, Patch)]
    assert again.phase == "Queued"


def test_admitted_the_preprocessing_runs_and_says_so():
    status = {"phase": "Queued", "conditions": [condition("Queued", "True", "WaitingForAdmission", "held")]}
    admitted = job()
    admitted["spec"]["suspend"] = False
    decision = World(spec=kueue_spec(), pinned=False, manifest=None, status=status,
                     children={"ConfigMap": config_map(), "Job": admitted}).decide()
    assert decision.phase == "Preprocessing"
    assert conditions(decision)["Queued"][:2] == ("False", "Admitted")
