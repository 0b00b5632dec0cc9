"""InputBound and the auto batch size on a real API server: the operator reads the trainer's progress
document from real S3 storage and sets the condition, the status fields and a Warning Event."""

from __future__ import annotations

import pytest

from tests.support.operator import bucket, cluster, new_run, operator, progress, progress_uri, reach_training, wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.s3]

PROBE = {"chosen": 16, "seconds": 4.2, "stoppedBy": "outOfMemory",
         "table": [{"batchSize": 8, "imagesPerSecond": 90.0}, {"batchSize": 16, "imagesPerSecond": 170.0},
                   {"batchSize": 32, "outOfMemory": True}]}


def report(bucket, run, shares):  # noqa: F811
    history = [{"epoch": i + 1, "inputWaitFraction": share} for i, share in enumerate(shares)]
    bucket.put_json(progress_uri(run), progress(
        "running", len(shares), batchSizePerWorker=16, batchSizeProbe=PROBE, inputHistory=history,
        inputWaitFraction=shares[-1], gpuUtilization=None))


def test_input_bound_after_two_slow_epochs_and_false_again_when_it_recovers(cluster, operator, bucket,  # noqa: F811
                                                                            s3_server):
    cluster.create_run(new_run(cluster.ns, "slowinput", s3_server,
                               training={"batchSizePerWorker": "auto", "input": {"readerWorkers": 2}}))
    run = cluster.run("slowinput")
    reach_training(cluster, bucket, "slowinput", operator)
    cluster.set_mpijob_condition("slowinput-train", "Running", "", "")

    def condition_is(status):
        return lambda: (cluster.condition("slowinput", "InputBound") or {}).get("status") == status

    report(bucket, run, [0.6])  # one slow epoch is not yet a pattern
    wait_for(condition_is("False"), what="InputBound False after one epoch", operator=operator)
    training = cluster.status("slowinput")["training"]
    assert training["batchSizePerWorker"] == 16 and training["batchSizeProbe"]["chosen"] == 16
    assert [row["batchSize"] for row in training["batchSizeProbe"]["table"]] == [8, 16, 32]
    assert training["batchSizeProbe"]["table"][2]["outOfMemory"] is True
    assert training["inputWaitFraction"] == 0.6 and "gpuUtilization" not in training

    report(bucket, run, [0.6, 0.55])
    wait_for(condition_is("True"), what="InputBound True", operator=operator)
    bound = cluster.condition("slowinput", "InputBound")
    assert bound["reason"] == "InputWaitHigh"
    assert "60% and 55% of its step time in epochs 1 and 2" in bound["message"]
    assert "spec.training.input.readerWorkers, now 2" in bound["message"]
    assert "spec.training.input.rowGroupCache" in bound["message"]
    assert "spec.dataset.preprocessing.parallelism" in bound["message"]
    assert [row["epoch"] for row in cluster.status("slowinput")["training"]["inputHistory"]] == [1, 2]
    cluster.wait_events("slowinput", lambda ev: [e for e in ev if e[:2] == ("Warning", "InputWaitHigh")], operator)

    report(bucket, run, [0.6, 0.55, 0.1])
    wait_for(condition_is("False"), what="InputBound False again", operator=operator)
    assert cluster.condition("slowinput", "InputBound")["reason"] == "InputKeepsUp"
    assert cluster.status("slowinput")["phase"] == "Training"
    # The Warning was posted once, when the condition turned True.
    assert len([e for e in cluster.events("slowinput") if e[1] == "InputWaitHigh"]) == 1
