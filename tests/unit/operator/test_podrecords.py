"""A run of 1,024 workers: its status stays small (counts by phase and reason, the pods that need a look, a
compact record of every pod), and interruptions are still counted once, across operator restarts too."""

from __future__ import annotations

import copy
import json

from scalingrun_operator.decide import podrecords
from tests.support.decide_world import World, config_map, done, job, manifest, mpijob, progress, training_status
from tests.support.decide_pods import pod, waiting

WORKERS = 1024
KIB = 1024


def uid(name: str, generation: str = "a") -> str:
    """A uid like the API server's, different in its first 8 characters for each pod and generation."""
    import hashlib
    digest = hashlib.sha1(f"{name}/{generation}".encode()).hexdigest()
    return f"{digest[:8]}-{digest[8:12]}-4{digest[13:16]}-a{digest[17:20]}-{digest[20:32]}"


def big_run(status: dict, **worker_changes: dict) -> World:
    pods = [pod("demo-train-launcher-aaaaa", "launcher", uid=uid("launcher"))]
    for index in range(WORKERS):
        name = f"demo-train-worker-{index}"
        pods.append(worker_changes.get(name) or pod(name, "worker", uid=uid(name)))
    for p in pods:
        p["spec"]["nodeName"] = "node-1"
    return World(status=status, pods=pods, manifest=manifest(), progress=progress(),
                 children={"ConfigMap": config_map(), "Job": job(done("Complete"), succeeded=2),
                           "MPIJob": mpijob(done("Running"))})


def size(status: dict) -> int:
    return len(json.dumps(status, separators=(",", ":")).encode())


def test_a_thousand_workers_are_summarised_and_the_status_stays_under_64_kib():
    first = big_run(training_status(pods=[])).decide()
    training = first.desired["training"]
    assert size(dict(first.desired)) < 64 * KIB, size(dict(first.desired))
    assert training["podSummary"]["total"] == WORKERS + 1
    assert training["podSummary"]["phases"] == {"Running": WORKERS + 1}
    assert training["pods"] == [] and training["podSummary"]["needingALook"] == 0
    assert len(training["podRecords"].split()) == WORKERS + 1
    assert first.events == ()


def test_the_pods_that_need_a_look_are_listed_first_and_at_most_32():
    status = big_run(training_status(pods=[])).decide().desired
    pending = {f"demo-train-worker-{i}": pod(f"demo-train-worker-{i}", "worker", uid=uid(f"demo-train-worker-{i}"),
                                             phase="Pending", containers=waiting("worker", "ImagePullBackOff"))
               for i in range(100, 150)}
    crashed = "demo-train-worker-7"
    pending[crashed] = pod(crashed, "worker", uid=uid(crashed), containers=[
        {"name": "worker", "restartCount": 1, "state": {"running": {}},
         "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}])
    decision = big_run(copy.deepcopy(dict(status)), **pending).decide()
    training = decision.desired["training"]
    # The worker restarted, and the launcher's restart it causes is counted with it: both before those not running.
    assert [p["name"] for p in training["pods"]][:2] == ["demo-train-launcher-aaaaa", crashed]
    assert {p["name"] for p in training["pods"][2:]} < set(pending)
    assert len(training["pods"]) == podrecords.LOOK_AT_MOST
    summary = training["podSummary"]
    assert summary["needingALook"] == 52 and summary["listed"] == 32
    assert summary["phases"] == {"Pending": 50, "Running": WORKERS + 1 - 50}
    assert summary["reasons"] == {"ImagePullBackOff": 50, "OOMKilled": 1}
    assert [e.reason for e in decision.events].count("WorkerPodLost") == 1
    assert decision.desired["training"]["workerPodsLost"] == 1
    assert size(dict(decision.desired)) < 64 * KIB


def test_a_worker_replaced_is_counted_once_from_the_compact_record_as_after_an_operator_restart():
    status = dict(big_run(training_status(pods=[])).decide().desired)
    name = "demo-train-worker-512"
    replaced = pod(name, "worker", uid=uid(name, "b"))
    # Only status carries over (a restarted operator has no memory): the record says another uid.
    decision = big_run(copy.deepcopy(status), **{name: replaced}).decide()
    assert [e.reason for e in decision.events] == ["WorkerPodLost"]
    assert name in decision.events[0].message and "was replaced" in decision.events[0].message
    assert decision.desired["training"]["workerPodsLost"] == 1
    again = big_run(copy.deepcopy(dict(decision.desired)), **{name: replaced}).decide()
    assert again.events == (), "counted once"
    assert again.desired["training"]["workerPodsLost"] == 1


def test_a_small_run_keeps_one_full_record_a_pod():
    records = [{"name": f"demo-train-worker-{i}", "uid": uid(str(i)), "role": "worker", "restarts": 0, "lost": False}
               for i in range(podrecords.SUMMARY_AFTER)]
    status: dict = {"podRecords": "stale", "podSummary": {"total": 1}}
    podrecords.keep(status, records, [], "demo-train")
    assert status == {"pods": records}


def test_the_compact_record_reads_back_what_was_written():
    records = [{"name": "demo-train-launcher-x7k2p", "uid": uid("l"), "role": "launcher", "restarts": 2, "lost": False},
               *({"name": f"demo-train-worker-{i}", "uid": uid(str(i)), "role": "worker", "restarts": i % 3,
                  "lost": i == 5} for i in range(100))]
    status: dict = {}
    podrecords.keep(status, records, [], "demo-train")
    back = podrecords.records_of(status, "demo-train")
    assert [{**r, "uid": r["uid"][:8]} for r in records] == back
    assert all(podrecords.same_uid(b["uid"], r["uid"]) for b, r in zip(back, records))
    assert not podrecords.same_uid(back[1]["uid"], uid("1", "b"))
