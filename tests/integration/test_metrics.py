"""The operator's /metrics scraped while it serves runs on a real API server (docs/operations.md, "Metrics").

A run reaches Training, its trainer's progress document says epoch 2, a worker pod is deleted (an interruption):
the per-run series carry what the status says, under the run's namespace and name, and go when the run is
deleted. The operator's own series (leader, queues, reconciles, preflight) are there beside them.
"""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.operator import (  # noqa: F401 (fixtures)
    bucket, new_run, progress, progress_uri, reach_training, served, start_training_pod, wait_for,
)

pytestmark = pytest.mark.k8s

operator, cluster = served("srm")


def scrape(operator) -> dict[tuple[str, frozenset], float]:
    """Every sample the endpoint serves, keyed by name and labels."""
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(operator.metrics()) for sample in family.samples}


def run_samples(operator, namespace: str, run: str) -> dict[tuple[str, frozenset], float]:
    return {(name, labels): value for (name, labels), value in scrape(operator).items()
            if ("namespace", namespace) in labels and ("run", run) in labels}


def sample(samples: dict[tuple[str, frozenset], float], name: str, **labels: Any) -> Any:
    return next((v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls)), None)


def test_a_training_runs_series_are_scraped_and_go_with_the_run(cluster, operator, bucket, s3_server):
    created = cluster.create_run(new_run(cluster.ns, "watched", s3_server))
    reach_training(cluster, bucket, "watched", operator)
    worker = "watched-train-worker-0"
    start_training_pod(cluster, cluster.mpijob("watched-train"), "worker", worker)
    cluster.set_mpijob_condition("watched-train", "Running", "", "")
    bucket.put_json(progress_uri(created), progress("running", 2, inputWaitFraction=0.25,
                                                    devices={"kind": "gpu", "count": 1}))
    wait_for(lambda: len((cluster.status("watched").get("training") or {}).get("pods") or []) == 1,
             what="the worker recorded", operator=operator)
    cluster.delete_pod(worker)
    training = wait_for(lambda: (lambda t: t.get("epoch") == 2 and (t.get("interruptions") or {}).get("podDeleted")
                                 and t)(cluster.status("watched").get("training") or {}),
                        what="epoch 2 and the deleted pod in status", operator=operator)

    # The series follow the status (the watch event after the status write), so wait for them to catch up.
    samples = wait_for(lambda: (lambda s: sample(s, "scalingrun_run_interruptions_total", cause="podDeleted")
                                and sample(s, "scalingrun_run_epoch") == 2 and s)(
        run_samples(operator, cluster.ns, "watched")), what="the run's series at epoch 2", operator=operator)
    assert sample(samples, "scalingrun_run_phase", phase="Training") == 1
    assert [labels for (name, labels) in samples if name == "scalingrun_run_phase"] == [
        frozenset({"namespace": cluster.ns, "run": "watched", "phase": "Training"}.items())]
    assert sample(samples, "scalingrun_run_max_epochs") == training["maxEpochs"] == 5
    assert sample(samples, "scalingrun_run_images_per_second") == training["imagesPerSecond"] == 123.4
    assert sample(samples, "scalingrun_run_input_wait_ratio") == training["inputWaitFraction"] == 0.25
    assert sample(samples, "scalingrun_run_restarts_total") == training["restarts"]
    assert sample(samples, "scalingrun_run_interruptions_total", cause="podDeleted") == 1
    assert sample(samples, "scalingrun_run_gpu_hours_total") == training["gpuHours"] > 0
    assert sample(samples, "scalingrun_run_process_hours_total") == training["processHours"]
    assert sample(samples, "scalingrun_run_condition", condition="Trained") == 0  # Unknown while it trains

    everything = scrape(operator)
    assert everything[("scalingrun_leader", frozenset())] == 1  # --standalone: this replica acts
    assert everything[("scalingrun_reconciles_total", frozenset({("kind", "run")}))] >= 1
    for queue in ("triggers", "rechecks", "sweep_rechecks", "followed"):
        assert ("scalingrun_queue_depth", frozenset({("queue", queue)})) in everything, queue
    assert everything[("scalingrun_queue_depth", frozenset({("queue", "followed")}))] >= 1  # its progress.json
    for what in ("status", "child", "event"):  # every write of this run was accepted
        assert everything[("scalingrun_push_errors_total", frozenset({("what", what)}))] == 0, what

    # The start-up preflight (cluster/preflight.py): the MPIJob CRD here serves v2beta1, so no problem there.
    mpijob_api = ("scalingrun_preflight_problem", frozenset({("check", "mpijob-api")}))
    wait_for(lambda: mpijob_api in scrape(operator), what="the preflight's series", operator=operator)
    assert scrape(operator)[mpijob_api] == 0

    cluster.delete_run("watched")
    wait_for(lambda: not run_samples(operator, cluster.ns, "watched"), what="the run's series gone",
             operator=operator, describe=lambda: run_samples(operator, cluster.ns, "watched"))
