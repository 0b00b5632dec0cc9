"""Operator hardening on a real kube-apiserver (+ GC) and SeaweedFS: deletable while the operator is down,
a deleted child counted and recreated, and no per-run API requests while nothing changes.

Each test starts (and kills) its own operator for its own namespaces; the helpers are test_operator's.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from scalingrun_api import models

from tests.support.operator import (
    Cluster, Operator, SECRET, bucket, manifest_for, new_run, progress, progress_uri, reach_training,
    start_training_pod, wait_for,
)

pytestmark = pytest.mark.k8s

PREFIX = "srh"  # namespaces of this module; each test's operator serves only its own


@pytest.fixture
def namespaces(api_client, s3_server, request, scalingrun_crd, mpijob_crd):
    """new(): a fresh namespace with the storage Secret; all of them are deleted afterwards."""
    core = client.CoreV1Api(api_client)
    made: list[str] = []

    def new() -> Cluster:
        name = f"{PREFIX}-{request.node.name.lower().replace('_', '-')[5:25].strip('-')}-{uuid.uuid4().hex[:5]}"
        core.create_namespace({"metadata": {"name": name}})
        core.create_namespaced_secret(name, {"metadata": {"name": SECRET}, "stringData": {
            "AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}})
        made.append(name)
        return Cluster(api_client, name)

    yield new
    for name in made:
        try:
            core.delete_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


def _operator(kubeconfig: str, tmp_path, clusters: list[Cluster], **env: str) -> Operator:
    # Checks every second and rechecks every second: a per-run timer, were there one, would be loud here.
    return Operator(kubeconfig, tmp_path / f"operator-{uuid.uuid4().hex[:4]}.log", [c.ns for c in clusters],
                    "--standalone", env={"SCALINGRUN_POLL_INTERVAL_SECONDS": "1",
                                         "SCALINGRUN_RECHECK_INTERVAL_SECONDS": "1", **env})


def _finalizers(cluster: Cluster, name: str) -> list[str]:
    return cluster.run(name)["metadata"].get("finalizers") or []


def _gone(call) -> bool:
    try:
        call()
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


# --- 1. deletable while the operator is down --------------------------------------------------------


def test_runs_and_their_namespace_are_deleted_while_the_operator_is_down(namespaces, kubeconfig, bucket, s3_server,
                                                                         tmp_path):
    first, second = namespaces(), namespaces()
    op = _operator(kubeconfig, tmp_path, [first, second])
    seen: dict[str, list[str]] = {}

    def phase_without_finalizer(cluster: Cluster, name: str, phase: str):
        def check():
            run = cluster.run(name)
            seen.setdefault(f"{name} {(run.get('status') or {}).get('phase')}", []).extend(
                run["metadata"].get("finalizers") or [])
            return (run.get("status") or {}).get("phase") == phase
        wait_for(check, what=f"{name} {phase}", operator=op)

    try:
        op.start()
        # Through every phase: no finalizer ever.
        created = first.create_run(new_run(first.ns, "whole", s3_server))
        phase_without_finalizer(first, "whole", "Preprocessing")
        reach_training(first, bucket, "whole", op)
        phase_without_finalizer(first, "whole", "Training")
        first.patch_run("whole", {"spec": {"runPolicy": {"suspend": True}}})
        phase_without_finalizer(first, "whole", "Suspended")
        first.patch_run("whole", {"spec": {"runPolicy": {"suspend": False}}})
        phase_without_finalizer(first, "whole", "Training")
        bucket.put_json(progress_uri(created), progress("succeeded", 5, modelUri="s3://x/model"))
        first.set_mpijob_condition("whole-train", "Succeeded", "MPIJobSucceeded", "done")
        phase_without_finalizer(first, "whole", "Succeeded")
        bad = new_run(first.ns, "broken", s3_server)
        del bad["spec"]["storage"]["credentialsSecret"]
        first.create_run(bad)
        phase_without_finalizer(first, "broken", "Failed")

        # Runs in Training and in Preprocessing when the operator dies.
        first.create_run(new_run(first.ns, "busy", s3_server))
        reach_training(first, bucket, "busy", op)
        second.create_run(new_run(second.ns, "inns", s3_server))
        reach_training(second, bucket, "inns", op)
        second.create_run(new_run(second.ns, "early", s3_server))
        phase_without_finalizer(second, "early", "Preprocessing")
        time.sleep(3)  # a timer or daemon would have run by now, and its finalizer with it
        for cluster, name in ((first, "busy"), (second, "inns"), (second, "early")):
            seen[f"{name} at the kill"] = _finalizers(cluster, name)
        assert all(not f for f in seen.values()), seen
        op.kill()

        started = time.monotonic()
        first.delete_run("busy")
        wait_for(lambda: _gone(lambda: first.run("busy")), what="the run deleted with no operator", timeout=10)
        first.delete_run("whole")
        wait_for(lambda: _gone(lambda: first.run("whole")), what="the succeeded run deleted", timeout=10)
        run_seconds = time.monotonic() - started
        client.CoreV1Api(first.core.api_client).delete_namespace(second.ns)
        wait_for(lambda: _gone(lambda: second.core.read_namespace(second.ns)),
                 what=f"namespace {second.ns} deleted with no operator", timeout=60)
        print(f"runs deleted in {run_seconds:.1f} s, namespace in {time.monotonic() - started:.1f} s")
    finally:
        op.stop()


# --- 3. a child deleted mid-run ----------------------------------------------------------------------


def test_a_deleted_child_is_reported_counted_and_recreated_until_max_interruptions(namespaces, kubeconfig, bucket,
                                                                                  s3_server, tmp_path):
    cluster = namespaces()
    op = _operator(kubeconfig, tmp_path, [cluster])

    def training() -> dict:
        return cluster.status("deleted").get("training") or {}

    def child_deleted_events() -> list[str]:
        return [m for t, r, m in cluster.events("deleted") if (t, r) == ("Warning", "ChildDeleted")]

    try:
        op.start()
        created = cluster.create_run(new_run(cluster.ns, "deleted", s3_server, training={"maxInterruptions": 2}))
        assert created["spec"]["training"]["maxInterruptions"] == 2

        # The preprocessing Job is deleted while it runs: reported, counted, recreated.
        job = wait_for(lambda: cluster.job("deleted-preprocess"), what="the Job", operator=op)
        wait_for(cluster.phase_is("deleted", "Preprocessing"), what="Preprocessing", operator=op)
        cluster.batch.delete_namespaced_job("deleted-preprocess", cluster.ns, propagation_policy="Background")
        condition = wait_for(lambda: cluster.condition("deleted", "ChildDeleted"), what="ChildDeleted", operator=op)
        assert condition["status"] == "True" and condition["reason"] == "JobDeleted"
        assert "Job deleted-preprocess was deleted" in condition["message"]
        assert "1 of the 2 allowed (spec.training.maxInterruptions)" in condition["message"]
        assert training()["restarts"] == 1
        again = wait_for(lambda: (cluster.job("deleted-preprocess") or {}).get("metadata", {}).get("uid")
                         not in (None, job["metadata"]["uid"]), what="a new Job", operator=op)
        assert again
        cluster.wait_events("deleted", lambda ev: len([r for _, r, _ in ev if r == "ChildDeleted"]) == 1, op)

        # Training at epoch 3; the MPIJob is deleted (kubectl delete mpijob).
        bucket.put_json(f"{created['spec']['dataset']['output']}/_manifest.json", manifest_for(created))
        cluster.complete_job("deleted-preprocess", succeeded=2)
        wait_for(cluster.phase_is("deleted", "Training"), what="Training", operator=op)
        cluster.set_mpijob_condition("deleted-train", "Running", "", "")
        bucket.put_json(progress_uri(created), progress("running", 3))
        wait_for(lambda: training().get("epoch") == 3, what="epoch 3", operator=op)
        old_uid = cluster.mpijob("deleted-train")["metadata"]["uid"]
        cluster.custom.delete_namespaced_custom_object("kubeflow.org", "v2beta1", cluster.ns, "mpijobs",
                                                       "deleted-train")
        status = wait_for(lambda: training().get("restarts") == 2 and training().get("mpiJobUid") not in (None, old_uid)
                          and training(), what="the MPIJob counted and recreated", operator=op)
        assert cluster.mpijob("deleted-train")["metadata"]["uid"] == status["mpiJobUid"]
        assert status["epoch"] == 3, "the epoch shown never goes back"
        condition = cluster.condition("deleted", "ChildDeleted")
        assert condition["reason"] == "MPIJobDeleted" and "MPIJob deleted-train was deleted" in condition["message"]
        assert "resumes from the last checkpoint" in condition["message"]
        assert cluster.status("deleted")["phase"] == "Training"
        cluster.wait_events("deleted", lambda ev: len([r for _, r, _ in ev if r == "ChildDeleted"]) == 2, op)

        # The resumed trainer's first document starts at its checkpoint's epoch: status keeps epoch 3.
        bucket.put_json(progress_uri(created), progress("running", 2, resumedFromEpoch=2, learningRate=0.004))
        wait_for(lambda: training().get("learningRate") == 0.004, what="the resumed document read", operator=op)
        assert training()["epoch"] == 3

        # Deleted again while the operator is down: counted once on its return, and over the limit.
        op.kill()
        cluster.custom.delete_namespaced_custom_object("kubeflow.org", "v2beta1", cluster.ns, "mpijobs",
                                                       "deleted-train")
        op.start()
        status = wait_for(cluster.phase_is("deleted", "Failed"), what="Failed over maxInterruptions", operator=op)
        assert status["training"]["restarts"] == 3 and status["training"]["epoch"] == 3
        failed = cluster.condition("deleted", "Failed")
        assert failed["reason"] == "MaxInterruptionsExceeded"
        for part in ("3 interruptions by the infrastructure (childDeleted 3) exceed spec.training.maxInterruptions (2)",
                     "MPIJob deleted-train was deleted",
                     "resumes from its last checkpoint"):
            assert part in failed["message"], failed["message"]
        time.sleep(2)
        assert cluster.mpijob("deleted-train") is None, "no new MPIJob once the run failed"
        assert len(child_deleted_events()) == 3
        assert cluster.status("deleted")["training"]["restarts"] == 3
    finally:
        op.stop()


# --- 5. quiet at rest ---------------------------------------------------------------------------------

# Requests that a reconcile of one run makes (or that a per-run timer would). A 1.20 API server counts a GET
# of a custom resource as LIST; kopf re-lists only when a watch ends (every 300 s), not within the window.
_PER_RUN = {*((resource, verb) for resource in ("scalingruns", "mpijobs") for verb in ("GET", "LIST", "PATCH", "POST")),
            ("jobs", "GET"), ("secrets", "GET"), ("configmaps", "GET"), ("pods", "LIST"), ("events", "POST")}


def _request_counts(api_client) -> dict[tuple[str, str], float]:
    """apiserver_request_total by (resource, verb), from the API server's own /metrics."""
    response = api_client.call_api("/metrics", "GET", auth_settings=["BearerToken"], _preload_content=False,
                                   _return_http_data_only=True)
    counts: dict[tuple[str, str], float] = {}
    for line in response.data.decode().splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
        key = (labels.get("resource", ""), labels.get("verb", ""))
        counts[key] = counts.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, from /proc (reported, not asserted)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _per_run_requests(before: dict, after: dict) -> dict[tuple[str, str], float]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in _PER_RUN if after.get(k, 0) - before.get(k, 0) > 0}


def test_no_per_run_api_requests_at_rest_and_progress_still_reaches_status(namespaces, kubeconfig, api_client, bucket,
                                                                           s3_server, tmp_path):
    cluster = namespaces()
    # Watches end every 3 s: kopf re-lists runs, Jobs, MPIJobs and pods about 3 times in the quiet window.
    op = _operator(kubeconfig, tmp_path, [cluster], SCALINGRUN_WATCH_TIMEOUT_SECONDS="3")
    names = [f"calm{i}" for i in range(6)]
    try:
        op.start()
        runs = {name: cluster.create_run(new_run(cluster.ns, name, s3_server)) for name in names}
        for name in names:
            reach_training(cluster, bucket, name, op)
            cluster.set_mpijob_condition(f"{name}-train", "Running", "", "")
            bucket.put_json(progress_uri(runs[name]), progress("running", 1))
        for name in names:
            wait_for(lambda: (cluster.status(name).get("training") or {}).get("epoch") == 1, what=f"{name} epoch 1",
                     operator=op)
        # Another test's namespace being emptied by the namespace controller would count too.
        core = client.CoreV1Api(api_client)
        wait_for(lambda: not [n for n in core.list_namespace().items if n.status.phase == "Terminating"],
                 what="no namespace terminating", timeout=120)
        time.sleep(3)  # the last events of the set-up settle

        # Nothing changes for 10 s, with checks every second and three re-lists: no request about any run.
        before, cpu = _request_counts(api_client), _cpu_seconds(op.process.pid)
        time.sleep(10)
        after, cpu = _request_counts(api_client), _cpu_seconds(op.process.pid) - cpu
        print(f"operator CPU at rest: {cpu * 100:.1f} m (10 s, {len(names)} runs, a check per run per second)")
        quiet = _per_run_requests(before, after)
        everything = {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0) > 0}
        print(f"all API requests in the 10 s: {everything}")
        print(f"per-run API requests in 10 s at rest with {len(names)} runs: {sum(quiet.values()):.0f} {quiet}")
        # A re-list is one LIST per kind, whatever the number of runs; a reconcile per run would read each run's
        # Secret (and the run and its MPIJob, which a 1.20 server counts as LIST) every time.
        relists = {k: v for k, v in quiet.items() if k[1] == "LIST" and v <= 10 / 3 + 2}
        assert not {k: v for k, v in quiet.items() if k not in relists}, f"requests at rest: {quiet}\n{op.log_tail()}"

        # Progress still reaches status, for the run whose document changed.
        bucket.put_json(progress_uri(runs["calm2"]), progress("running", 2))
        wait_for(lambda: (cluster.status("calm2").get("training") or {}).get("epoch") == 2, what="calm2 epoch 2",
                 timeout=15, operator=op)
        assert [(cluster.status(n).get("training") or {}).get("epoch") for n in names] == [1, 1, 2, 1, 1, 1]
        time.sleep(2)
        # One reconcile of that run, not of all four (reads of runs are the test's own polling too).
        changed = _per_run_requests(after, _request_counts(api_client))
        reconciles = {k: v for k, v in changed.items() if k[1] != "LIST"}
        # Its Secret is read again only when the operator's copy of the keys is over 30 s old (cluster/latest.py).
        assert reconciles.pop(("secrets", "GET"), 0) <= 1, changed
        assert reconciles == {("scalingruns", "PATCH"): 1}, changed  # the status written
    finally:
        op.stop()


# --- no timer as a safety net: a failed reconcile is tried again ------------------------------------


def test_a_reconcile_that_failed_on_a_child_event_is_tried_again_without_a_timer(namespaces, kubeconfig, bucket,
                                                                                 s3_server, tmp_path):
    from scalingrun_operator.schema.validation import parse_scalingrun
    from scalingrun_operator.builders import build_mpijob

    cluster = namespaces()
    op = _operator(kubeconfig, tmp_path, [cluster])
    try:
        op.start()
        other = cluster.create_run(new_run(cluster.ns, "other", s3_server))
        created = cluster.create_run(new_run(cluster.ns, "blocked", s3_server))
        wait_for(cluster.phase_is("blocked", "Preprocessing"), what="Preprocessing", operator=op)
        # The MPIJob's name is taken by an object another run controls: the reconcile that the Job's completion
        # starts finds it (ChildConflict, looked at again every 10 s), and kopf retries no event handler.
        foreign = build_mpijob(parse_scalingrun(created), cluster.ns)
        foreign["metadata"]["ownerReferences"] = [{
            "apiVersion": models.API_VERSION, "kind": models.KIND, "name": "other", "uid": other["metadata"]["uid"],
            "controller": True}]
        cluster.custom.create_namespaced_custom_object("kubeflow.org", "v2beta1", cluster.ns, "mpijobs", foreign)
        bucket.put_json(f"{created['spec']['dataset']['output']}/_manifest.json", manifest_for(created))
        cluster.complete_job("blocked-preprocess", succeeded=2)
        wait_for(lambda: "belongs to ScalingRun other" in op.log_tail(200), what="the foreign MPIJob noticed",
                 operator=op)
        assert cluster.status("blocked")["phase"] == "Preprocessing"

        # It goes; no event about this run announces that. The retry finds the name free.
        cluster.custom.delete_namespaced_custom_object("kubeflow.org", "v2beta1", cluster.ns, "mpijobs",
                                                       "blocked-train")
        wait_for(cluster.phase_is("blocked", "Training"), what="Training once the name is free", timeout=30,
                 operator=op)
        owner = cluster.mpijob("blocked-train")["metadata"]["ownerReferences"][0]
        assert owner["uid"] == created["metadata"]["uid"]
    finally:
        op.stop()


def test_a_run_failed_over_its_interruption_limit_suspends_its_still_running_mpijob(namespaces, kubeconfig, bucket,
                                                                                    s3_server, tmp_path):
    """A lost worker pod is an interruption too; over the limit the run fails, and its MPIJob's pods must not
    keep holding nodes: the MPIJob is suspended (the MPI operator then deletes its pods)."""
    cluster = namespaces()
    op = _operator(kubeconfig, tmp_path, [cluster])
    try:
        op.start()
        cluster.create_run(new_run(cluster.ns, "fragile", s3_server, training={"maxInterruptions": 0}))
        reach_training(cluster, bucket, "fragile", op)
        worker = "fragile-train-worker-0"
        start_training_pod(cluster, cluster.mpijob("fragile-train"), "worker", worker)
        cluster.set_mpijob_condition("fragile-train", "Running", "", "")
        wait_for(lambda: len((cluster.status("fragile").get("training") or {}).get("pods") or []) == 1,
                 what="the worker recorded", operator=op)
        assert not (cluster.mpijob("fragile-train")["spec"].get("runPolicy") or {}).get("suspend")

        cluster.delete_pod(worker)
        status = wait_for(cluster.phase_is("fragile", "Failed"), what="Failed over maxInterruptions", operator=op)
        failed = next(c for c in status["conditions"] if c["type"] == "Failed")
        assert failed["reason"] == "MaxInterruptionsExceeded", failed
        assert "1 interruption by the infrastructure (podDeleted 1) exceeds spec.training.maxInterruptions (0)" in (
            failed["message"]), failed["message"]
        suspended = wait_for(lambda: (cluster.mpijob("fragile-train")["spec"].get("runPolicy") or {}).get("suspend"),
                             what="the MPIJob suspended", operator=op)
        assert suspended is True
        cluster.wait_events("fragile", lambda ev: any(
            r == "Suspending" and "suspended because the run failed" in m for _, r, m in ev), op)
    finally:
        op.stop()
