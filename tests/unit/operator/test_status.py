"""The operator's pure decisions: conditions and phases, pinned spec, dataset reuse, Job/MPIJob states,
progress mirroring, and the messages a user reads. No cluster, no storage."""

from __future__ import annotations

import copy
import datetime as dt

import pytest

from scalingrun_api.shipped import worker_command
from scalingrun_operator.schema.validation import parse_scalingrun
from scalingrun_operator.builders import locations
from scalingrun_operator.decide import pinning, preprocessing as dataset, progress as mirror
from scalingrun_operator.decide.mpijob_state import MPIJobState, mpijob_failure_message, mpijob_state, suspend_patch
from scalingrun_operator.decide.status import StatusUpdate, may_revalidate, merge_patch, set_condition
from scalingrun_operator.documents import parse_manifest, parse_progress
from tests.support.decide_world import merge_patched

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
T1 = T0 + dt.timedelta(minutes=5)

DOC = {
    "apiVersion": "scalingrun.dev/v1alpha1",
    "kind": "ScalingRun",
    "metadata": {"name": "demo", "namespace": "ml"},
    "spec": {
        "storage": {"credentialsSecret": "creds"},
        "dataset": {"source": "s3://data/raw", "output": "s3://data/parquet", "imageSize": 96,
                    "validationFraction": 0.2, "sampleFraction": 0.5, "seed": 7,
                    "preprocessing": {"parallelism": 4}},
        "workers": {"replicas": 3, "gpusPerWorker": 2},
    },
}


def make_run(**dataset_overrides):
    doc = copy.deepcopy(DOC)
    doc["spec"]["dataset"].update(dataset_overrides)
    return parse_scalingrun(doc)


# --- conditions and phases ---------------------------------------------------------------------------


def test_condition_keeps_transition_time_and_position_while_status_is_unchanged():
    conditions = set_condition([], "Preprocessed", "Unknown", "Running", "0 of 4", 1, T0)
    conditions = set_condition(conditions, "Trained", "Unknown", "Waiting", "", 1, T0)
    again = set_condition(conditions, "Preprocessed", "Unknown", "Running", "2 of 4", 1, T1)
    assert [c["type"] for c in again] == ["Preprocessed", "Trained"]
    assert again[0]["lastTransitionTime"] == "2026-01-01T12:00:00Z" and again[0]["message"] == "2 of 4"
    done = set_condition(again, "Preprocessed", "True", "Preprocessed", "ok", 2, T1)
    assert done[0]["lastTransitionTime"] == "2026-01-01T12:05:00Z" and done[0]["observedGeneration"] == 2


def test_unchanged_status_gives_no_patch():
    update = StatusUpdate({}, generation=1, moment=T0)
    update.set_phase("Pending")
    update.condition("Preprocessed", "Unknown", "Running", "x")
    written = update.patch()
    again = StatusUpdate(written, generation=1, moment=T1)
    again.set_phase("Pending")
    again.condition("Preprocessed", "Unknown", "Running", "x")
    assert again.patch() is None and again.events == []


def test_each_phase_change_is_one_event_and_failure_is_a_warning():
    update = StatusUpdate({}, generation=3, moment=T0)
    update.set_phase("Pending")
    update.set_phase("Pending")
    update.set_phase("Preprocessing", "Job demo-preprocess")
    update.fail("PreprocessingFailed", "2 of 4 shards failed")
    assert [(e.type, e.reason) for e in update.events] == [
        ("Normal", "Pending"), ("Normal", "Preprocessing"), ("Warning", "Failed")]
    assert update.events[-1].message == "Preprocessing -> Failed: PreprocessingFailed: 2 of 4 shards failed"
    patch = update.patch()
    assert patch["phase"] == "Failed" and patch["completionTime"] == "2026-01-01T12:00:00Z"
    assert patch["observedGeneration"] == 3
    failed = [c for c in patch["conditions"] if c["type"] == "Failed"][0]
    assert (failed["status"], failed["reason"]) == ("True", "PreprocessingFailed")


def test_only_an_invalid_spec_failure_is_looked_at_again_and_only_after_an_edit():
    invalid = {"phase": "Failed", "observedGeneration": 1,
               "conditions": [{"type": "Failed", "status": "True", "reason": "InvalidSpec"}]}
    assert not may_revalidate(invalid, 1)
    assert may_revalidate(invalid, 2)
    training_failed = copy.deepcopy(invalid)
    training_failed["conditions"][0]["reason"] = "MPIJobFailed"
    assert not may_revalidate(training_failed, 2)


# --- pinned spec -------------------------------------------------------------------------------------


def test_pinned_spec_ignores_changes_but_not_suspend():
    started = {"dataset": {"source": "s3://a/raw", "imageSize": 96}, "workers": {"replicas": 2},
               "runPolicy": {"suspend": False, "backoffLimit": 3}}
    pinned = pinning.pin(started)
    edited = copy.deepcopy(started)
    edited["workers"]["replicas"] = 4
    edited["dataset"]["imageSize"] = 128
    edited["runPolicy"]["suspend"] = True
    effective = pinning.effective_spec(edited, pinned)
    assert effective["workers"]["replicas"] == 2 and effective["dataset"]["imageSize"] == 96
    assert effective["runPolicy"] == {"suspend": True, "backoffLimit": 3}
    assert pinning.ignored_changes(edited, pinned) == ["spec.dataset.imageSize", "spec.workers.replicas"]
    only_suspend = copy.deepcopy(started)
    only_suspend["runPolicy"]["suspend"] = True
    assert pinning.ignored_changes(only_suspend, pinned) == []
    assert "spec.workers.replicas" in pinning.ignored_message(["spec.workers.replicas"])


def test_without_a_pin_the_current_spec_is_used():
    spec = {"workers": {"replicas": 2}}
    assert pinning.effective_spec(spec, None) == spec
    assert pinning.effective_spec(spec, "not json") == spec
    assert pinning.ignored_changes(spec, None) == []


# --- dataset -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides,workers", [
    ({}, (3, 2)),
    ({"imageSize": 299, "validationFraction": 0.1, "sampleFraction": 1.0, "seed": 42}, (1, 0)),
    ({"imageSize": 32, "validationFraction": 0.05, "sampleFraction": 0.01, "seed": 0}, (8, 1)),
])
def test_dataset_parameters_equal_the_trainers(overrides, workers):
    """The reuse check compares with what the trainer's preprocessing writes: the two must agree."""
    from scalingrun_trainer.preprocess.source import Params

    doc = copy.deepcopy(DOC)
    doc["spec"]["dataset"].update(overrides)
    doc["spec"]["workers"].update(replicas=workers[0], gpusPerWorker=workers[1])
    run = parse_scalingrun(doc)
    d = run.spec.dataset
    params = Params(source=d.source, output=d.output, image_size=d.image_size,
                    validation_fraction=d.validation_fraction, sample_fraction=d.sample_fraction, seed=d.seed,
                    max_readers=workers[0] * max(workers[1], 1))
    assert dataset.dataset_parameters(run) == params.dataset_parameters()


def manifest(run, **changes):
    out = {"fingerprint": "abc", "parameters": dataset.dataset_parameters(run), "source": run.spec.dataset.source,
           "classes": ["cat", "dog"], "shards": 4, "written": {"train": 90, "validation": 10}, "skipped": 3}
    out.update(changes)
    return parse_manifest(out)


def test_dataset_present_needs_same_source_and_parameters():
    run = make_run()
    assert dataset.dataset_present(run, manifest(run))
    assert not dataset.dataset_present(run, None)
    assert not dataset.dataset_present(run, manifest(run, source="s3://data/other"))
    other = dataset.dataset_parameters(make_run(imageSize=128))
    assert not dataset.dataset_present(run, manifest(run, parameters=other))
    assert "imageSize 128 -> 96" in dataset.mismatch(run, manifest(run, parameters=other))
    assert "s3://data/other" in dataset.mismatch(run, manifest(run, source="s3://data/other"))
    assert dataset.mismatch(run, manifest(run)) == ""


def test_preprocessing_status_from_manifest():
    run = make_run()
    assert dataset.preprocessing_status(manifest(run), "demo-preprocess", reused=False) == {
        "jobName": "demo-preprocess", "reused": False, "fingerprint": "abc", "imagesWritten": 100,
        "imagesSkipped": 3, "shards": 4, "classes": 2}
    assert "jobName" not in dataset.preprocessing_status(manifest(run), None, reused=True)
    # A grown tree: the shards whose files did not change were kept, and status and message say how many.
    grown = manifest(run, shardsReused=3)
    assert dataset.preprocessing_status(grown, "demo-preprocess", reused=False)["shardsReused"] == 3
    assert "3 of 4 shards kept from the earlier dataset" in dataset.preprocessed_message(run, grown, reused=False)
    assert "kept from" not in dataset.preprocessed_message(run, manifest(run), reused=False)


def test_job_state_from_conditions():
    assert dataset.job_state({"spec": {"completions": 4}, "status": {"succeeded": 1}}) == dataset.JobState(
        "Running", succeeded=1, completions=4)
    failed = dataset.job_state({"spec": {"completions": 4}, "status": {"succeeded": 3, "failed": 9, "conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "limit",
         "lastTransitionTime": "2026-01-01T12:00:00Z"}]}})
    assert (failed.state, failed.reason, failed.failed, failed.finished_at) == ("Failed", "BackoffLimitExceeded", 9, T0)
    complete = dataset.job_state({"status": {"completionTime": "2026-01-01T12:05:00Z", "conditions": [
        {"type": "Complete", "status": "True"}]}})
    assert complete.state == "Complete" and complete.finished_at == T1


def test_preprocessing_failure_message_is_actionable():
    run = make_run()
    state = dataset.JobState("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit",
                             succeeded=3, failed=9, completions=4)
    done = dataset.shard_progress(["shard-00000-of-00004.json", "shard-00001-of-00004.json",
                                   "shard-00002-of-00004.json", "shard-00000-of-00002.json"], 4)
    assert done == 3
    message = dataset.preprocessing_failure_message(run, "ml", "demo-preprocess", state, done)
    assert "Job demo-preprocess failed (BackoffLimitExceeded: Job has reached the specified backoff limit)" in message
    assert "3 of 4 shards succeeded, 9 pod failures" in message
    assert "3 of 4 shard manifests written under s3://data/parquet/_shards" in message
    assert "kubectl logs -n ml -l job-name=demo-preprocess" in message
    assert "shard manifests" not in dataset.preprocessing_failure_message(run, "ml", "j", state, None)


# --- training ----------------------------------------------------------------------------------------


def test_mpijob_state_finished_condition_wins():
    def mpijob(*conditions, suspend=False):
        return {"spec": {"runPolicy": {"suspend": suspend}}, "status": {"conditions": [
            {"type": t, "status": s, "reason": r, "message": m} for t, s, r, m in conditions]}}

    assert mpijob_state({}).state == "Pending"
    assert mpijob_state(mpijob(("Created", "True", "", ""), ("Running", "True", "", ""))).state == "Running"
    failed = mpijob_state(mpijob(("Running", "False", "", ""), ("Failed", "True", "MPIJobFailed", "exit 1")))
    assert (failed.state, failed.reason, failed.message, failed.finished) == ("Failed", "MPIJobFailed", "exit 1", True)
    suspended = mpijob_state(mpijob(("Created", "True", "", ""), suspend=True))
    assert suspended.suspended and suspend_patch(True, suspended) is None
    assert suspend_patch(False, suspended) == {"spec": {"runPolicy": {"suspend": False}}}
    assert suspend_patch(True, failed) is None, "a finished MPIJob is left alone"


def test_training_status_mirrors_progress_and_drops_junk():
    progress = {"state": "running", "epoch": 2, "maxEpochs": 10, "metrics": {"loss": 0.4, "val_accuracy": 0.9,
                                                                         "note": "text"},
                "bestEpoch": None, "bestMetrics": {"val_accuracy": 0.9}, "imagesPerSecond": 512.5,
                "elapsedSeconds": 60.0, "learningRate": float("nan"), "effectiveBatchSize": 256, "processes": 8,
                "modelUri": None, "error": None}
    assert mirror.training_status(parse_progress(progress)) == {
        "epoch": 2, "maxEpochs": 10, "imagesPerSecond": 512.5, "effectiveBatchSize": 256, "processes": 8,
        "metrics": {"loss": 0.4, "val_accuracy": 0.9}, "bestMetrics": {"val_accuracy": 0.9},
        "processHours": round(8 * 60 / 3600, 4)}  # 8 processes x 60 s: process-hours, as a sweep's workerHours
    assert mirror.training_status(None) == {}
    assert mirror.training_status(parse_progress({**progress, "mlflowRunId": "4f1c"}))["mlflowRunId"] == "4f1c"
    assert "mlflowRunId" not in mirror.training_status(parse_progress({**progress, "mlflowRunId": 7}))
    assert mirror.model_uri(parse_progress({"modelUri": "s3://m/model"})) == "s3://m/model"
    assert mirror.model_uri(parse_progress({"modelUri": None})) is None


def test_a_shipped_functions_digest_and_folder_are_in_the_training_status_from_its_command():
    shipped = copy.deepcopy(DOC)
    folder = "s3://data/parquet/runs/demo/function/" + "ab" * 32
    shipped["spec"]["training"] = {"command": worker_command(folder, "sha256:" + "ab" * 32, ["--ddp-world"])}
    assert mirror.base_training_status(parse_scalingrun(shipped), "demo-train", 3)["function"] == {
        "location": folder, "digest": "sha256:" + "ab" * 32}
    script = copy.deepcopy(DOC)
    script["spec"]["training"] = {"command": ["python", "-m", "teamtrain.keras_horovod", folder, "--digest", "x"]}
    assert "function" not in mirror.base_training_status(parse_scalingrun(script), "demo-train", 3)
    assert "function" not in mirror.base_training_status(make_run(), "demo-train", 3)


def test_progress_uri_follows_run_location():
    run = make_run()
    assert locations.progress_uri(run) == "s3://data/parquet/runs/demo/progress.json"


def test_mpijob_failure_message_has_cause_progress_and_next_step():
    state = MPIJobState("Failed", "MPIJobFailed", "launcher exited 1")
    message = mpijob_failure_message("ml", "demo-train", state, parse_progress({
        "epoch": 3, "maxEpochs": 10, "error": "ResourceExhausted: OOM"}))
    assert "MPIJob demo-train failed (MPIJobFailed: launcher exited 1)" in message
    assert "epoch 3 of 10" in message and "ResourceExhausted: OOM" in message
    assert "kubectl logs -n ml" in message
    assert "no epoch finished" in mpijob_failure_message("ml", "x", state, None)


def test_ready_and_stalled_follow_the_phase_for_kstatus():
    from scalingrun_operator.decide.status import StatusUpdate, get_condition

    update = StatusUpdate({}, generation=1, moment=T0)
    update.set_phase("Training", "MPIJob x")
    assert get_condition(update.desired["conditions"], "Ready")["status"] == "False"
    update.set_phase("Succeeded", "done")
    ready = get_condition(update.desired["conditions"], "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Succeeded")
    assert get_condition(update.desired["conditions"], "Stalled") is None
    failed = StatusUpdate({}, generation=1, moment=T0)
    failed.fail("MPIJobFailed", "launcher exited 1")
    assert get_condition(failed.desired["conditions"], "Ready")["status"] == "False"
    stalled = get_condition(failed.desired["conditions"], "Stalled")
    assert stalled["status"] == "True" and "launcher exited 1" in stalled["message"]


# --- resumed attempts --------------------------------------------------------------------------------


def test_the_epoch_never_goes_back_while_the_mpijob_is_the_same():
    shown = {"mpiJobName": "demo-train", "epoch": 4, "metrics": {"val_accuracy": 0.8}, "bestEpoch": 4,
             "bestMetrics": {"val_accuracy": 0.8}, "imagesPerSecond": 100.0, "restarts": 1}
    base = {"mpiJobName": "demo-train", "processes": 6, "maxEpochs": 10}
    # An old trainer's resumed attempt starts its document at 0 with no metrics: status keeps epoch 4.
    fresh = mirror.training_status(parse_progress({"epoch": 0, "metrics": {}, "learningRate": 0.006,
                                                   "processes": 6}))
    merged = mirror.merge_training_status(shown, base, fresh, same_mpijob=True)
    assert (merged["epoch"], merged["metrics"], merged["bestEpoch"]) == (4, {"val_accuracy": 0.8}, 4)
    assert merged["learningRate"] == 0.006 and merged["restarts"] == 1
    # The resumed attempt reports where it resumed, then moves on.
    resumed = mirror.training_status(parse_progress({"epoch": 4, "resumedFromEpoch": 4, "metrics": {"val_accuracy": 0.8}}))
    assert mirror.merge_training_status(shown, base, resumed, True)["resumedFromEpoch"] == 4
    later = mirror.training_status(parse_progress({"epoch": 5, "metrics": {"val_accuracy": 0.85}, "resumedFromEpoch": 4}))
    merged = mirror.merge_training_status(shown, base, later, True)
    assert (merged["epoch"], merged["metrics"]) == (5, {"val_accuracy": 0.85})
    # A new MPIJob (the old one deleted and recreated) starts from what its trainer says, counters too.
    merged = mirror.merge_training_status(shown, base, fresh, same_mpijob=False)
    assert merged["epoch"] == 0 and "restarts" not in merged and "bestEpoch" not in merged


# --- preprocessing without Indexed Jobs ---------------------------------------------------------------


def test_a_server_without_indexed_jobs_gets_one_pod_for_every_shard():
    from scalingrun_operator.builders import build_preprocess_job

    run = make_run()  # parallelism 4
    indexed = build_preprocess_job(run, "ml")
    assert indexed["spec"]["completionMode"] == "Indexed" and indexed["spec"]["completions"] == 4
    assert "--all-shards" not in indexed["spec"]["template"]["spec"]["containers"][0]["command"]
    in_turn = build_preprocess_job(run, "ml", indexed=False)
    assert "completionMode" not in in_turn["spec"]
    assert (in_turn["spec"]["completions"], in_turn["spec"]["parallelism"]) == (1, 1)
    command = in_turn["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[-3:] == ["--shard-count", "4", "--all-shards"]
    assert dataset.runs_shards_in_turn(in_turn, 4) and not dataset.runs_shards_in_turn(indexed, 4)
    assert not dataset.lacks_completion_index(in_turn, 4) and not dataset.lacks_completion_index(indexed, 4)
    # What a 1.20 server stores when asked for an Indexed Job: the mode silently dropped.
    dropped = copy.deepcopy(indexed)
    del dropped["spec"]["completionMode"]
    assert dataset.lacks_completion_index(dropped, 4)
    assert not dataset.lacks_completion_index(build_preprocess_job(make_run(preprocessing={"parallelism": 1}),
                                                                   "ml"), 1)
    state = dataset.job_state(in_turn)
    assert dataset.job_progress_message("demo-preprocess", state, 4) == (
        "Job demo-preprocess: one pod runs the 4 shards in turn")
    note = dataset.in_turn_note(4, "v1.20.2")
    assert "this server (v1.20.2) has no Indexed Jobs" in note and "4 shards" in note and "one pod" in note
    failed = dataset.JobState("Failed", "BackoffLimitExceeded", "limit", failed=8, completions=1)
    text = dataset.preprocessing_failure_message(run, "ml", "demo-preprocess", failed, 3)
    assert "its one pod ran the 4 shards in turn" in text and "8 pod failures" in text and "of 1 shards" not in text
    assert "3 of 4 shard manifests written" in text
    message = dataset.no_completion_index_message("demo-preprocess", 4, "v1.20.2")
    assert "every pod would process shard 0" in message and "recreate the run" in message


@pytest.mark.parametrize("info,expected", [
    ({"major": "1", "minor": "20", "gitVersion": "v1.20.2"}, (1, 20, "v1.20.2")),
    ({"major": "1", "minor": "27+", "gitVersion": "v1.27.3-eks-a5565ad"}, (1, 27, "v1.27.3-eks-a5565ad")),
    ({"major": "", "minor": "", "gitVersion": "v1.31.0"}, (1, 31, "v1.31.0")),
    ({"gitVersion": "v0.0.0-master+$Format:%H$"}, (0, 0, "v0.0.0-master+$Format:%H$")),
])
def test_server_version_parsing(info, expected):
    from scalingrun_operator.cluster.api_answers import parse_version
    from scalingrun_operator.decide.snapshot import INDEXED_JOBS_SINCE

    assert parse_version(info) == expected
    assert ((1, 20) >= INDEXED_JOBS_SINCE, (1, 22) >= INDEXED_JOBS_SINCE) == (False, True)


def test_the_status_patch_removes_a_nested_key_at_its_depth_and_sends_only_what_changed():
    current = {"phase": "Training", "training": {"epoch": 2, "pods": [{"name": "a"}],
                                                 "elastic": {"workers": 2, "resizing": {"from": 4, "to": 2}}}}
    desired = {"phase": "Training", "training": {"epoch": 3, "pods": [{"name": "b"}], "elastic": {"workers": 2}},
               "message": "new"}
    patch = merge_patch(current, desired)
    assert patch == {"training": {"epoch": 3, "pods": [{"name": "b"}], "elastic": {"resizing": None}},
                     "message": "new"}
    assert merge_patched(current, patch) == desired
    for before, after in [({}, desired), (desired, {}), (current, current), ({"a": {"b": 1}}, {"a": 5}),
                          ({"a": 5}, {"a": {"b": {"c": [1]}}}), ({"a": {"b": {"c": 1, "d": 2}}}, {"a": {"b": {}}})]:
        assert merge_patched(before, merge_patch(before, after)) == after, (before, after)
